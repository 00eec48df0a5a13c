"""Config directories are watched, as envoyproxy/ratelimit's runtime watches its directory:
a file written, created, removed or renamed below one, or the directory's symlink swapped to
another (Kubernetes' ConfigMap update, upstream's ``RUNTIME_WATCH_ROOT``), triggers a reload.

It polls (no extra dependency, and symlink swaps are seen like any change): every
``interval`` seconds of the monotonic clock, a fingerprint of the files (real path, size,
modification time, inode) is compared with the last one. A failed reload keeps the running
config, as any reload does; the next change tries again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence

from .files import fingerprint

log = logging.getLogger("ratekeeper.service")


async def watch(
    paths: Sequence[str],
    dotfiles: bool,
    interval: float,
    reload: Callable[[], Awaitable[str | None]],
) -> None:
    """Reload whenever the files under ``paths`` change; runs until cancelled."""
    loop = asyncio.get_running_loop()
    last = await loop.run_in_executor(None, fingerprint, paths, dotfiles)
    while True:
        await asyncio.sleep(interval)
        now = await loop.run_in_executor(None, fingerprint, paths, dotfiles)
        if now != last:
            last = now
            log.info("config files changed; reloading")
            await reload()

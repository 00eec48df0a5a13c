"""Which files ``--config`` names: a file is itself; a directory is every regular file below
it, in path order, as envoyproxy/ratelimit's runtime loads its config directory (any name, not
only ``*.yaml``). Dot files and dot directories (editor swap files, Kubernetes' ``..data``
links to the same files) are skipped unless ``dotfiles`` is set (upstream's
``RUNTIME_IGNOREDOTFILES=false``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from ...errors import ConfigError


def config_files(paths: Iterable[str], dotfiles: bool = False) -> list[str]:
    """The files to read, in order; ``ConfigError`` for a path that does not exist."""
    out: list[str] = []
    for path in paths:
        p = Path(path)
        try:
            is_dir, exists = p.is_dir(), p.exists()
        except OSError as exc:  # a directory on the way that this user may not enter
            raise ConfigError(f"{path}: cannot read config path: {exc.strerror or exc}") from None
        if is_dir:
            found = sorted(_walk(p, dotfiles))
            if not found:
                raise ConfigError(f"{path}: the config directory holds no file")
            out += [str(f) for f in found]
        elif exists:
            out.append(path)
        else:
            raise ConfigError(f"{path}: cannot read config file: no such file or directory")
    return out


def _walk(root: Path, dotfiles: bool) -> Iterable[Path]:
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        if not dotfiles:
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        for name in filenames:
            if dotfiles or not name.startswith("."):
                full = Path(dirpath) / name
                if full.is_file():
                    yield full


def fingerprint(paths: Iterable[str], dotfiles: bool = False) -> tuple[object, ...]:
    """What changes when a config file is written, created, removed, or a directory's
    symlink is swapped: each file's real path, size and modification time."""
    out: list[object] = []
    for path in paths:
        out.append(os.path.realpath(path))
        try:
            files = config_files([path], dotfiles)
        except ConfigError:
            out.append(None)
            continue
        for f in files:
            try:
                st = os.stat(f)
            except OSError:
                out.append((f, None))
                continue
            out.append((f, os.path.realpath(f), st.st_size, st.st_mtime_ns, st.st_ino))
    return tuple(out)

"""``SliceBook``: what one process holds of each sliced key, and the rules for spending it.

Sans-I/O: ``local_budget`` drives it and does the store calls. Per (slot, caller key) a
``Held`` keeps the live slice (``until``, ``unspent``, ``granted``, and the ids of the grants
it is made of), settles not yet confirmed by the store (``pending``), what the store said at
the last take (``remaining``, ``reset_ms``), a rejection's hold (``blocked`` until,
``retry_at``), the key's recent demand and the debt of decisions made without the store.

- **Spend** (``spend``, the hot path): a hit whose cost the slice covers is admitted here;
  ``remaining`` is an estimate: what the store had left at the last take plus the unspent part
  (other processes' spending since is not seen). A key the store just rejected is answered
  here too, rejected, until ``blocked`` (see below), for costs above what the store said was
  left. Otherwise the store must be asked.
- **Ask** (``ask``): the next take. ``want`` is the process's own recent demand for the key
  (units per ms, averaged over takes) times ``horizon_ms``, at least the request's cost and at
  most ``max_slice``; the store caps it by what is left (``slices``: a share of it). The
  current slice is detached and settled by the same call (each grant id with what was spent
  of it), with every settle still pending.
- **A failed call** (``failed``): the store may or may not have run it. Its settles stay
  pending, and the slice it asked for is added as a settle of nothing spent; the next call
  sends them again. Settles are idempotent (``slices``), so whatever happened, the store ends
  up with exactly what was spent: nothing is lost for the window, nothing counted twice. The
  detached slice is not spent any more (the store may have taken it back). That is also why
  a failed take may be sent again at once (``local_budget`` does, once): the second carries
  the first's settles. A failed call may even run after a later one (a command left in a
  stalled server's buffer runs when it resumes, in any order with the others): so the id of
  a slice asked for by a failed call keeps riding along with the key's calls until that slice
  would have ended (``RIDING``; at most ``RIDERS`` a key), and a late grant is given back by
  the next call after it.
- **Install** (``install``): a grant becomes the slice (a grant for the same expiry as a slice
  another thread installed meanwhile joins it; otherwise the one that ends first is queued to
  be given back). A rejection holds the key for its retry time, at least ``horizon_ms / 10``
  and at most ``horizon_ms`` (never past a fixed window's end): rejections meanwhile cost no
  store call, and a give-back by another process is seen at most ``horizon_ms`` later; when
  other processes held slices that could have covered the request, the hold is the shortest.
  Replies can arrive out of order (threads, tasks): one from a call older than the reply
  last applied (``seen``: the time of that call) answers its own request only, and never
  overwrites what the key knows (``remaining``, ``reset_ms``, a hold).
- **A changed rate** (``entry``, the same slot under another limit): the slice, taken under the
  old rate, is detached as at a take and given back by the next one, which decides under the
  new rate: the window keeps what was spent, the room grows by a raise and shrinks by a cut.
- **Reset** (``drop``): the key is forgotten here, and its slices become the settles of the
  reset's call (``slices``: ``Ask.reset``).
- **False rejections** (an upper bound): a rejection is counted as possibly false when the
  store said other processes held, in live slices, at least what the request lacked (their
  unspent part is not known at that instant); the local rejections of the hold that follows
  are counted the same way.

Thread-safe: one lock around each operation (``spend`` is a few attribute reads and writes).
"""

from __future__ import annotations

import itertools
import secrets
import threading
from dataclasses import dataclass

from ..algorithms.base import INF, Limit, Outcome, new_outcome
from ..algorithms.slices import Ask, Taken
from ..plan import Policy

Settles = tuple[tuple[str, int], ...]
"""(grant id, units spent of it)."""
FAILED = -1
"""``Held.pending``'s units of a slice asked for by a failed call (not known to have run)."""
RIDING = -2
"""... once a call carrying its settle has answered: it rides along until it ends."""
RIDERS = 16


class Held:
    """One sliced key of this process (see the module)."""

    __slots__ = (
        "blocked", "debt", "debt_until", "demand", "granted", "ids", "key", "limit", "name",
        "pending", "policy", "rate", "remaining", "reset_ms", "retry_at", "retry_at_inf",
        "seen", "since", "slot", "suspect", "takes", "unspent", "until", "used",
    )  # fmt: skip

    def __init__(self, slot: str, key: str, policy: Policy, now: int) -> None:
        self.slot = slot
        self.key = key
        self.policy = policy
        self.name = policy.algorithm.NAME
        self.limit: Limit = policy.limits[0]
        self.until = self.unspent = self.granted = 0
        self.ids: list[tuple[str, int]] = []
        """The grants the live slice is made of: (id, units)."""
        self.pending: dict[str, tuple[int, int, int]] = {}
        """Settles not confirmed by the store: grant id -> (units spent, until, units granted,
        or ``FAILED``/``RIDING`` for a failed call's)."""
        self.remaining = self.limit.capacity
        self.reset_ms = now
        self.seen = 0
        """When the call whose reply set ``remaining``, ``reset_ms`` and the hold was made."""
        self.blocked = self.retry_at = 0
        self.retry_at_inf = False
        self.suspect = False
        self.demand = 0
        self.since = now
        self.rate = 0.0
        self.takes = 0
        self.used = now
        self.debt = self.debt_until = 0


@dataclass(slots=True)
class Settle:
    """Slices of one key to give back: their settles, and the units they should bring back."""

    held: Held
    settles: Settles
    unspent: int


@dataclass(slots=True)
class Counts:
    """What the book did (``LocalBudget.stats``)."""

    spent: int = 0
    local_rejections: int = 0
    false_rejections: int = 0
    slices_taken: int = 0
    units_taken: int = 0
    slices_returned: int = 0
    units_returned: int = 0
    units_expired: int = 0
    debt_charged: int = 0


class SliceBook:
    """The slices this process holds, by (slot, caller key)."""

    def __init__(self, horizon_ms: int, max_slice: int, epoch_ms: int) -> None:
        self.horizon_ms = horizon_ms
        self.max_slice = max_slice
        self.epoch_ms = epoch_ms
        self.held: dict[tuple[str, str], Held] = {}
        self.lock = threading.Lock()
        self.counts = Counts()
        self.settles: list[Settle] = []
        """Slices waiting to be given back (``local_budget`` sends them)."""
        self.owers: set[Held] = set()
        """Keys with a fail-local debt."""
        self._prefix = secrets.token_hex(3)
        self._ids = itertools.count(1)

    def new_id(self) -> str:
        """A grant id: unique among a key's live slices (a random prefix per book)."""
        return f"{self._prefix}{next(self._ids):x}"

    def entry(self, slot: str, key: str, policy: Policy, now: int) -> Held:
        """The key's ``Held``, made on first use; restated under a changed rate (see the
        module)."""
        h = self.held.get((slot, key))
        if h is None or h.policy is not policy:
            with self.lock:
                h = self.held.get((slot, key))
                if h is None:
                    h = self.held[(slot, key)] = Held(slot, key, policy, now)
                elif h.policy is not policy:
                    self._restate(h, policy, now)
        return h

    def _restate(self, h: Held, policy: Policy, now: int) -> None:
        """``h`` under ``policy``: a changed limit detaches the slice taken under the old one
        (the next take gives it back) and lifts a hold; the lock is held."""
        old, new = h.limit, policy.limits[0]
        h.policy = policy
        if new == old:
            return
        self._detach(h, now)
        h.limit = new
        room = h.remaining + new.capacity - old.capacity  # the store's, as the rate changes it
        h.remaining = 0 if room < 0 else room if room < new.capacity else new.capacity
        h.blocked = 0
        h.suspect = False

    def spend(self, h: Held, now: int, cost: int) -> Outcome | None:
        """The hit answered here (see the module), or None: the store must be asked."""
        lock = self.lock
        lock.acquire()
        try:
            if h.until > now and h.unspent >= cost:
                h.unspent -= cost
                h.demand += cost
                h.used = now
                self.counts.spent += 1
                reset = h.reset_ms if h.reset_ms > now else now  # never in the past
                return new_outcome((True, h.remaining + h.unspent, reset, 0.0))
            if h.blocked > now and cost > h.remaining:  # a smaller cost may fit: ask
                h.demand += cost
                counts = self.counts
                counts.local_rejections += 1
                if h.suspect:
                    counts.false_rejections += 1
                retry = INF if h.retry_at_inf else h.retry_at - now if h.retry_at > now else 0
                reset = h.reset_ms if h.reset_ms > now else now
                return new_outcome((False, h.remaining, reset, retry))
            return None
        finally:
            lock.release()

    def ask(self, h: Held, now: int, cost: int, share: int, again: bool = False) -> Ask:
        """The next take for ``h``'s key: its slice detached and settled by it (see the
        module); ``again``: the same request's second try (its demand is counted once)."""
        with self.lock:
            if not again:
                h.demand += cost
                elapsed = now - h.since
                if h.takes:  # the demand since the last take, per ms, averaged with the last
                    rate = h.demand / (elapsed if elapsed > 0 else 1)
                    h.rate = rate if h.takes == 1 else (h.rate + rate) / 2
                h.takes += 1
                h.demand = 0
                h.since = now
            want = int(h.rate * self.horizon_ms + 0.5)  # the first take: the cost alone
            want = min(self.max_slice, want) if want > cost else cost
            settles = self._detach(h, now)
            debt = self._claim(h, now)
            return Ask(cost, want, share, debt, settles, self.new_id(), self.epoch_ms)

    def _claim(self, h: Held, now: int) -> int:
        """The key's debt, taken into one call (a concurrent call does not charge it again;
        ``failed`` puts it back)."""
        debt = h.debt if h.debt_until > now else 0
        h.debt -= debt
        return debt

    def claim(self, h: Held, now: int) -> Ask:
        """A call that only charges the key's debt (after an outage)."""
        with self.lock:
            return Ask(0, 0, 1, self._claim(h, now), epoch_ms=self.epoch_ms)

    def _detach(self, h: Held, now: int) -> Settles:
        """The slice taken off ``h``, as settles, with those still pending (ended ones
        dropped: the store has forgotten those slices)."""
        until, unspent = h.until, h.unspent
        if until and until <= now:
            self.counts.units_expired += unspent
        elif until:
            spent = h.granted - unspent
            for grant, units in h.ids:
                used = spent if spent < units else units
                spent -= used
                h.pending[grant] = (used, until, units)
        h.until = h.unspent = h.granted = 0
        h.ids = []
        for grant in [g for g, (_, end, _) in h.pending.items() if end <= now]:
            del h.pending[grant]
        return tuple((grant, used) for grant, (used, _, _) in h.pending.items())

    def _owed(self, h: Held) -> bool:
        """Whether ``h``'s pending settles need a call of their own: anything to give back,
        or a reservation that caps a bucket (a fully spent fixed_window slice gives nothing
        back, and what it holds ends with its window: its settle rides in the next take)."""
        if h.name != "fixed_window":
            return any(units != RIDING for _, _, units in h.pending.values())
        return any(used < units or units == FAILED for used, _, units in h.pending.values())

    def failed(self, h: Held, ask: Ask, now: int) -> None:
        """A call carrying ``ask`` failed: its settles stay pending, the slice it asked for
        is settled as unspent at the next call (see the module), its debt is owed again (if
        the call ran after all, charging it twice only admits less)."""
        with self.lock:
            if ask.debt:
                h.debt += ask.debt
                self.owers.add(h)
            if ask.need <= 0 or ask.share <= 0:
                return
            if h.name == "fixed_window":  # the known window, or a new one opened by now
                until = h.reset_ms if h.reset_ms > now else now + h.limit.period_ms
            else:
                until = (now // self.epoch_ms + 2) * self.epoch_ms
            h.pending[ask.slice_id] = (0, until, FAILED)

    def _confirm(self, h: Held, ask: Ask) -> None:
        self._answered(h, ask.settles)

    def _answered(self, h: Held, settles: Settles) -> None:
        """A call carrying ``settles`` answered: they are forgotten, but a failed call's
        rides along (see the module); the lock is held."""
        pending = h.pending
        for grant, _ in settles:
            entry = pending.get(grant)
            if entry is not None and entry[2] < 0:
                pending[grant] = (0, entry[1], RIDING)
            elif entry is not None:
                del pending[grant]
        riders = [g for g, (_, _, units) in pending.items() if units == RIDING]
        for grant in riders[: len(riders) - RIDERS]:  # the oldest first
            del pending[grant]

    def install(self, h: Held, now: int, cost: int, taken: Taken, ask: Ask) -> Outcome:
        """The take's answer applied (see the module); the request's outcome."""
        granted = taken.granted
        counts = self.counts
        with self.lock:
            self._confirm(h, ask)
            if ask.settles:
                counts.slices_returned += 1
                counts.units_returned += taken.returned
            counts.debt_charged += taken.charged  # what found the key empty is dropped
            fresh = now >= h.seen  # else a reply overtaken by a newer one: its request's only
            if fresh:
                h.seen = now
                h.remaining, h.reset_ms = taken.remaining, taken.reset_ms
            if not granted:
                return self._hold(h, now, cost, taken, fresh)
            counts.slices_taken += 1
            counts.units_taken += granted
            if h.until > taken.expires_ms and h.until > now:  # a live slice that ends later
                h.pending[ask.slice_id] = (cost, taken.expires_ms, granted)  # back at the next
                return new_outcome((True, taken.remaining, taken.reset_ms, 0.0))
            if fresh:
                h.blocked = 0
                h.suspect = False
            if now > h.used:
                h.used = now
            if h.until > now and h.until != taken.expires_ms:  # another thread's, ending first
                unspent = h.unspent
                self.settles.append(Settle(h, self._detach(h, now), unspent))
            if h.until == taken.expires_ms:
                h.granted += granted
                h.unspent += granted - cost
            else:
                h.until, h.granted, h.unspent = taken.expires_ms, granted, granted - cost
            h.ids.append((ask.slice_id, granted))
            return new_outcome((True, taken.remaining + h.unspent, taken.reset_ms, 0.0))

    def _hold(self, h: Held, now: int, cost: int, taken: Taken, fresh: bool) -> Outcome:
        """A rejection: the key is answered here until ``blocked`` (see the module); a stale
        one (not ``fresh``) answers its own request only."""
        suspect = taken.held >= cost - taken.remaining
        self.counts.false_rejections += suspect
        if not fresh:
            return new_outcome((False, taken.remaining, taken.reset_ms, taken.retry_ms))
        h.suspect = suspect
        retry = taken.retry_ms
        shortest = self.horizon_ms // 10 or 1
        hold = self.horizon_ms if retry == INF else int(retry)
        hold = max(shortest, min(self.horizon_ms, hold))
        if h.suspect:  # others hold slices: ask again soon, they may give some back
            hold = shortest
        if h.name == "fixed_window" and retry != INF and hold > retry:
            hold = int(retry)  # never into the next window
        h.blocked = now + hold
        h.retry_at_inf = retry == INF
        h.retry_at = 0 if retry == INF else now + int(retry)
        return new_outcome((False, taken.remaining, taken.reset_ms, retry))

    def idle(self, now: int, idle_ms: int, most: int) -> list[Settle]:
        """Up to ``most`` keys' slices to give back: queued ones, then those unused for
        ``idle_ms`` (detached here) and those with settles pending that need a call."""
        with self.lock:
            out, self.settles = self.settles[:most], self.settles[most:]
            for h in self.held.values():
                if len(out) >= most:
                    break
                quiet = h.until and (h.until <= now or h.used <= now - idle_ms)
                if not quiet and not h.pending:
                    continue
                unspent = h.unspent if quiet and h.until > now else 0
                settles = self._detach(h, now) if quiet else ()
                if self._owed(h):
                    settles = tuple((g, used) for g, (used, _, _) in h.pending.items())
                    out.append(Settle(h, settles, unspent))
                elif settles:  # spent fixed_window slices only: forgotten here, no call
                    for grant in [g for g, (_, _, u) in h.pending.items() if u != RIDING]:
                        del h.pending[grant]
            return out

    def give_all(self, now: int) -> list[Settle]:
        """Every live slice and pending settle, detached (at shutdown)."""
        return self.idle(now, -1, len(self.held) + len(self.settles))

    def settled(self, s: Settle, taken: Taken) -> None:
        """A give-back answered."""
        with self.lock:
            self._answered(s.held, s.settles)
            self.counts.slices_returned += 1
            self.counts.units_returned += taken.returned
            self.counts.units_expired += max(0, s.unspent - taken.returned)

    def refund(self, slot: str, key: str, now: int, cost: int) -> bool:
        """A refund put back into the key's live slice, if it spent at least ``cost``."""
        h = self.held.get((slot, key))
        with self.lock:
            if h is None or h.until <= now or h.granted - h.unspent < cost:
                return False
            h.unspent += cost
            return True

    def pending_settles(self, h: Held | None, now: int) -> Settles:
        """The key's settles not confirmed yet (a peek carries them)."""
        if h is None:
            return ()
        with self.lock:
            return tuple((g, used) for g, (used, end, _) in h.pending.items() if end > now)

    def peeked(self, slot: str, key: str, now: int, cost: int, taken: Taken, ask: Ask) -> Outcome:
        """A peek's answer: what the store has (a take with ``share=0``, carrying the key's
        pending settles) plus the key's unspent slice."""
        h = self.held.get((slot, key))
        if h is not None and ask.settles:
            with self.lock:
                self._confirm(h, ask)
        unspent = h.unspent if h is not None and h.until > now else 0
        remaining = taken.remaining + unspent
        if taken.retry_ms == 0 or unspent >= cost:
            return new_outcome((True, remaining, taken.reset_ms, 0.0))
        return new_outcome((False, remaining, taken.reset_ms, taken.retry_ms))

    def owe(self, h: Held, now: int, units: int, until: int) -> None:
        """Units the key admitted without the store (fail-local), to charge when it answers."""
        with self.lock:
            h.debt = units if h.debt_until <= now else h.debt + units
            h.debt_until = max(h.debt_until, until)
            self.owers.add(h)

    def owing(self, now: int) -> list[Held]:
        """The keys with a debt that still matters (those whose debt ended are dropped)."""
        with self.lock:
            for h in [h for h in self.owers if not h.debt or h.debt_until <= now]:
                self.owers.discard(h)
                h.debt = h.debt_until = 0
            return list(self.owers)

    def charged(self, h: Held, taken: Taken, ask: Ask) -> None:
        """A debt's charge answered (what found the key empty is dropped)."""
        with self.lock:
            self._confirm(h, ask)
            self.counts.debt_charged += taken.charged

    def drop(self, slot: str, key: str, now: int) -> Settles:
        """Forget the key (a reset); its slices, live and pending, as the reset's settles."""
        with self.lock:
            h = self.held.pop((slot, key), None)
            if h is None:
                return ()
            self.owers.discard(h)
            live = [(grant, units) for grant, units in h.ids] if h.until > now else []
            return (*live, *((g, used) for g, (used, _, _) in h.pending.items()))

    def trim(self, now: int, most: int) -> None:
        """Keep at most ``most`` keys: drop those holding nothing (no live slice, hold, debt
        or pending settle), oldest first."""
        with self.lock:
            if len(self.held) <= most:
                return
            for k, h in list(self.held.items()):
                ended = all(end <= now for _, end, _ in h.pending.values())
                if h.until <= now and h.blocked <= now and not h.debt and ended:
                    self.counts.units_expired += h.unspent if h.until else 0
                    del self.held[k]
                    if len(self.held) <= most * 3 // 4:
                        break

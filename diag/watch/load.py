"""The load around a pin: phases of a watched process that is busy with memory outside any pin
(pure: samples in, phases out).

A pin is one step of a load. `Tensor.pin_memory()` is a pinned allocation followed by a copy
that reads the source; a loader pins, then reads, copies and pins again. Between and after its
pins a process may still be stuck on memory in its own page faults, and these phases say so:

    copy-from-swap  its VmSwap falls (or a thread waits in do_swap_page): swap-in in the
                    process's own faults, not a pin; catalog 19 (the load goes on after the pin),
                    by the mechanism of 1 (swap-in stall). Progress: the pages of its VmSwap at
                    the start brought back; ETA: the pages still in swap of the VMAs it drains
                    (diag.watch.regions; the whole VmSwap without smaps readings) at its swap-in rate.
    file-read       its read_bytes rise beyond what swap-in explains (or a thread waits in
                    filemap_fault): a file read in its own faults or reads; catalog 19. Progress:
                    bytes read; its total is the pin before it (the copy into a pinned buffer
                    reads as much as the buffer holds), else unknown.
    alloc           its resident memory grows without a pin (and without swap-in or file reads):
                    pages allocated and zeroed in its own faults; catalog 2. No total.

A phase starts at the sample before the first one that shows its work (for a swap-in or file read
that already showed in the sample where a pinned allocation returned, the sample before that one:
the allocation returned and the copy began in the same interval, which both phases then count)
and ends at the last sample that showed it, once two quiet samples in a row follow; when a pin
phase starts in the process (where the pin began; a pin is followed by the pin's own tracker),
when another kind of work goes on for two samples, or when the process ends. A phase of three
samples or fewer that a pin follows was that pin's start and is dropped, unless it read swap or a
file and the pin is a pinned allocation, which does neither.
Samples are read by diag.watch.sampler; the rules, bounds and ETAs are the pin's
(diag.watch.tracker, diag.watch.bounds).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .frames import in_pin_path, stack_bound
from .phases import PIN_CALLS, alive
from .result import PhaseResult
from .tracker import Tracker, judged

__all__ = ["LoadBook", "LoadPhase", "SWAPIN_PAGES_S", "READ_BYTES_S", "GROWTH_BYTES_S", "WORDS", "CATALOG"]

SWAPIN_PAGES_S = 100        # VmSwap falling this fast (pages/s) is a copy from swap ...
READ_BYTES_S = 1 << 20      # ... read_bytes beyond swap-in this fast is a file read ...
GROWTH_BYTES_S = 16 << 20   # ... resident memory growing this fast without either is an allocation
QUIET_SAMPLES = 2           # two quiet samples in a row end a phase (a throttle dispatches in bursts)
PIN_SIZE_FOR_S = 5.0        # a file read this soon after a pin reads into it: the pin's size is its total

WORDS = {"copy-from-swap": "swap-in in the process's own faults, not a pin",
         "file-read": "file reads in the process's own faults or read calls, not a pin",
         "alloc": "resident memory growing in the process's own faults, not a pin"}
CATALOG = {"copy-from-swap": 19, "file-read": 19, "alloc": 2}
_BASIS = {"copy-from-swap": "swap", "file-read": "read", "alloc": "resident"}
_STACK_KIND = {"swap-in": "copy-from-swap", "file-read": "file-read"}
_NOT_ALLOCS = ("copy-from-swap", "file-read")  # work a pinned allocation never does itself


@dataclass
class LoadPhase:
    pid: int
    kind: str
    started_t: float
    seen_start: bool
    comm: str | None = None
    ended_t: float | None = None
    end_reason: str | None = None   # 'quiet', 'pin', 'another kind', 'process gone'
    size_from: str | None = None
    _quiet: int = 0
    _quiet_since: float | None = None
    _other: int = 0
    _other_since: float | None = None
    _other_base: dict | None = None  # the sample before the other kind of work was first seen


def _in_pin(p: dict) -> bool:
    """A thread of the process is seen inside a pin (its stack or its system call says so)."""
    return any((th.get("frames") and in_pin_path(th["frames"])) or th.get("syscall") in PIN_CALLS
               for th in (p.get("threads") or {}).values() if th.get("state") not in ("Z", "X", "x"))


def _kind(p: dict, before: dict | None, dt: float, page: int) -> str | None:
    """The work a process did between two samples, or None when it was quiet."""
    for th in (p.get("threads") or {}).values():
        if th.get("state") == "D" and th.get("frames"):
            kind = _STACK_KIND.get(stack_bound(th["frames"])[0])
            if kind:
                return kind
    if not before or dt <= 0:
        return None

    def rate(key: str) -> float:
        a, b = before.get(key), p.get(key)
        return 0.0 if a is None or b is None else (b - a) / dt

    swapin_bytes_s = max(0.0, -rate("vm_swap"))
    if swapin_bytes_s / page >= SWAPIN_PAGES_S:
        return "copy-from-swap"
    if rate("read_bytes") - swapin_bytes_s >= READ_BYTES_S:  # read_bytes counts swap-in reads too
        return "file-read"
    if rate("vm_rss") - swapin_bytes_s >= GROWTH_BYTES_S:
        return "alloc"
    return None


class LoadBook:
    """Every load phase of the watched processes, each with a Tracker of its own."""

    def __init__(self, page: int = 4096, window_s: float = 2.0, interval_s: float = 0.5):
        self.page, self.window_s, self.interval_s = page, window_s, interval_s
        self.open: dict[int, tuple[LoadPhase, Tracker]] = {}
        self.closed: list[tuple[LoadPhase, Tracker]] = []
        self.prev: dict | None = None
        self.prev2: dict | None = None  # the sample before prev
        self.last_pin: dict[int, tuple[float, int | None]] = {}  # pid: (when its last pin ended, its bytes)
        self.last_pin_kind: dict[int, str | None] = {}
        self.dropped: list[LoadPhase] = []  # begun just before a pin was named: the pin's own start

    def pin_ended(self, pid: int, t: float, size_bytes: int | None, kind: str | None = None) -> None:
        self.last_pin[pid] = (t, size_bytes)
        self.last_pin_kind[pid] = kind

    def update(self, sample: dict, pinning: set[int] = frozenset()) -> tuple[list[LoadPhase], list[LoadPhase]]:
        """(phases that started, phases that ended) with this sample; `pinning`: the processes
        with a pin phase open now (their work is the pin's), as a set of pids or as
        PhaseBook.pinning() (pid: its open pin phase, whose kind and start end a load phase)."""
        started: list[LoadPhase] = []
        ended: list[LoadPhase] = []
        procs = {int(pid): p for pid, p in (sample.get("procs") or {}).items() if alive(p)}
        prev = self.prev or {}
        before_procs = {int(pid): p for pid, p in (prev.get("procs") or {}).items()}
        dt = sample["t"] - prev.get("t", sample["t"])
        for pid in list(self.open):
            if pid not in procs:
                ended.append(self._close(pid, sample["t"], "process gone"))
        for pid, p in procs.items():
            entry = self.open.get(pid)
            if pid in pinning or _in_pin(p):
                if entry is not None:
                    ph, tr = entry
                    pin = pinning.get(pid) if isinstance(pinning, dict) else None
                    # a pinned allocation reads no swap and no file: reads before it are no part of it
                    not_its = ph.kind in _NOT_ALLOCS and getattr(pin, "kind", None) == "hostalloc"
                    if len(tr.samples) <= QUIET_SAMPLES + 1 and ph.seen_start and not not_its:
                        # a thread running in the kernel shows no stack and no call: the first
                        # samples of a pin can look like the process's own swap-in until one
                        # names the pin; those were the pin's start, not a phase of their own
                        self.open.pop(pid)
                        self.dropped.append(ph)
                    else:  # it ends where the pin began (an allocation seen from counters: the sample before)
                        t_pin = min(sample["t"], getattr(pin, "started_t", sample["t"]))
                        ended.append(self._close(pid, max(ph.started_t, t_pin), "pin", sample))
                continue
            kind = _kind(p, before_procs.get(pid), dt, self.page)
            if entry is not None:
                ph, tr = entry
                if kind is None:
                    ph._other, ph._other_since, ph._other_base = 0, None, None
                    ph._quiet += 1
                    # the work ended by the last sample that showed it (the one before this): the first
                    # quiet sample is one interval late, 8% of a 6 s copy at 0.5 s
                    ph._quiet_since = ph._quiet_since if ph._quiet_since is not None else prev.get("t", sample["t"])
                    if ph._quiet >= QUIET_SAMPLES:
                        ended.append(self._close(pid, ph._quiet_since, "quiet", sample))
                        continue
                elif kind != ph.kind:
                    ph._quiet, ph._quiet_since = 0, None
                    ph._other += 1
                    if ph._other_since is None:
                        ph._other_since, ph._other_base = prev.get("t", sample["t"]), self.prev
                    if ph._other >= QUIET_SAMPLES:
                        since, base = ph._other_since, ph._other_base
                        ended.append(self._close(pid, since, "another kind", sample))
                        started.append(self._start(pid, p, kind, base, sample, seen=base is not None))
                        continue
                else:
                    ph._quiet = ph._other = 0
                    ph._quiet_since = ph._other_since = ph._other_base = None
                tr.update(sample, in_call=True)
            elif kind is not None:
                seen = pid in before_procs
                base = prev if seen else None
                t_pin = self.last_pin.get(pid, (None, None))[0]
                if (seen and kind in _NOT_ALLOCS and self.last_pin_kind.get(pid) == "hostalloc" and t_pin is not None
                        and abs(t_pin - prev.get("t", -1.0)) <= 1e-9 and self.prev2 is not None):
                    # a pinned allocation returned at the last sample (the first that saw its thread
                    # outside), and that sample already showed a swap-in or a file read, which an
                    # allocation does not do: this work began in the interval before it (a pin that
                    # reads swap or a file itself, an mlock, did some of that interval's reading)
                    earlier = _proc(self.prev2, pid)
                    if earlier and _kind(before_procs[pid], earlier, prev["t"] - self.prev2["t"], self.page) == kind:
                        base = self.prev2
                started.append(self._start(pid, p, kind, base, sample, seen=seen))
        self.prev2, self.prev = self.prev, sample
        return started, ended

    def _start(self, pid: int, p: dict, kind: str, base: dict | None, sample: dict, seen: bool) -> LoadPhase:
        size, size_from = None, None
        if kind == "copy-from-swap":
            swap = max(_proc(base, pid).get("vm_swap") or 0, p.get("vm_swap") or 0)
            size, size_from = (swap or None), "VmSwap at the start"
        elif kind == "file-read":
            t_pin, pin_bytes = self.last_pin.get(pid, (None, None))
            if t_pin is not None and pin_bytes and sample["t"] - t_pin <= PIN_SIZE_FOR_S + self.window_s:
                size, size_from = pin_bytes, "the pin before it"
        ph = LoadPhase(pid=pid, kind=kind, started_t=base["t"] if base is not None else sample["t"],
                       seen_start=seen and base is not None, comm=p.get("name"), size_from=size_from if size else None)
        tr = Tracker(size_bytes=size, page=self.page, basis=_BASIS[kind], pids={pid}, window_s=self.window_s,
                     whole_intervals=True)
        if base is not None:
            tr.begin(base, seen_start=True)
            tr.update(sample, in_call=True)
        else:
            tr.begin(sample, seen_start=False)
        self.open[pid] = (ph, tr)
        return ph

    def _close(self, pid: int, t: float, reason: str, sample: dict | None = None) -> LoadPhase:
        ph, tr = self.open.pop(pid)
        if sample is not None and tr.samples[-1] is not sample and sample["t"] <= t + 1e-9:
            tr.update(sample, in_call=True)
        tr.end({"t": t})
        ph.ended_t, ph.end_reason = t, reason
        self.closed.append((ph, tr))
        return ph

    def results(self) -> list[PhaseResult]:
        return [_result(ph, tr) for ph, tr in self.closed + list(self.open.values())]


def _proc(sample: dict | None, pid: int) -> dict[str, Any]:
    procs = (sample or {}).get("procs") or {}
    return procs.get(pid) or procs.get(str(pid)) or {}


# the bound's words are written for a pin; a load phase is none ("not a pin ... as the pin goes")
_PIN_WORDS = (("as the pin goes", "in the process's own faults"), ("the pin reads", "the process reads"),
              ("while the pin moves", "while it progresses"), ("while the pin does not move", "while it does not move"))


def _not_a_pin(reason: str | None) -> str | None:
    for said, meant in _PIN_WORDS:
        reason = reason.replace(said, meant) if reason else reason
    return reason


def _result(ph: LoadPhase, tr: Tracker) -> PhaseResult:
    s = tr.summary()
    p = tr.progress
    outcome = "open" if ph.ended_t is None else ("exited" if ph.end_reason == "process gone" else "completed")
    bound = s["bound"] or {"copy-from-swap": "swap-in", "file-read": "file-read"}.get(ph.kind)
    r = PhaseResult(pid=ph.pid, tid=ph.pid, comm=ph.comm, kind=ph.kind, started_s=round(ph.started_t, 3),
                    seen_start=ph.seen_start, outcome=outcome, seconds=s["seconds"],
                    size_bytes=tr.expected * tr.page if tr.expected else None, size_from=ph.size_from,
                    pinned_pages=s["pinned_pages"], expected_pages=s["expected_pages"], pct=p.get("pct"),
                    rate_pages_s=s["rate_pages_s"] if outcome != "open" else p.get("rate_pages_s"),
                    eta_s=p.get("eta_s") if outcome == "open" else None, eta_basis=p.get("eta_basis"),
                    progress_basis=s["progress_basis"], bound=bound, bound_reason=_not_a_pin(s["bound_reason"]),
                    bound_frame=s["bound_frame"], bound_counts=s["bound_counts"], first_bound=s["first_bound"],
                    first_bound_at_s=s["first_bound_at_s"], catalog=CATALOG[ph.kind], eta_at_20pct=s["eta_at_20pct"],
                    eta_first=s["eta_first"], shared_counters=s["shared_counters"], figures=s["figures"],
                    pin=False, words=WORDS[ph.kind])
    if outcome == "completed":
        r.eta_error = judged(r.eta_at_20pct, r.seconds, r.bound)
        r.eta_first_error = judged(r.eta_first, r.seconds, r.bound)
    if ph.kind == "copy-from-swap" and (p.get("swap_pages_left") or 0) > 0 and outcome == "completed":
        left = p["swap_pages_left"] * tr.page
        counted = "its ETA did not count it: the region's swap, from smaps" if "of the region" in str(
            (r.eta_first or {}).get("basis")) else "its ETA counted it: at most that late"
        r.notes.append(f"{left / (1 << 20):,.0f} MiB of the process's memory stayed in swap after this copy: memory "
                       f"it did not touch ({counted})")
    if not ph.seen_start:
        r.notes.append(f"the {ph.kind} was going on when hostpin attached: its time counts from the attach")
    return r

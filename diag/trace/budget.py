"""Where a thread's time went, from its scheduler and memory-management events (pure).

A watched thread is, at every instant, on a CPU (between its switch-in and its switch-out) or
off it (from a switch-out to the next switch-in). An off-CPU stretch after a sleep is
attributed by the kernel stack taken at the switch-out (the `stacktrace` trigger) and by the
windows open around it; one after a preemption (prev_state R) is `runqueue`: runnable, waiting
for a CPU (a busy node's share, measured like the rest).
Windows: direct and memcg reclaim (`mm_vmscan_*_reclaim_begin/end`), direct compaction
(`mm_compaction_begin/end`), migration (`mm_migrate_pages_start` to `mm_migrate_pages`) and
waiting for the mmap lock (`mmap_lock_start_locking` to `mmap_lock_acquire_returned`): all of
a thread's time inside one (on or off CPU) is that window's. Each term is measured this way;
none is a remainder: `other` holds only what was measured and named by none (a sleep whose
stack says nothing known), and time before the thread's first event is not
covered at all (`covered_s`).

Time is kept in bins of BIN_S per thread, so a watch of any length costs the same memory;
a phase's edges fall inside bins, whose share is taken pro rata (at most 2 * BIN_S of error).
Block requests the thread issued are matched to their completion by device and sector (the
completion fires in interrupt context, traced by a second instance filtered by device). Where
the thread issued none itself (blk-throttle dispatches held bios from a kworker: a throttled
file read), io's details are the read requests on the devices it reads from over the phase,
whoever issued them, and say so (`io.basis` "device" instead of "thread").
"""
from __future__ import annotations

import math
import threading
from collections import OrderedDict, defaultdict
from typing import Any, Iterable

from .parse import Event

__all__ = ["CAUSES", "BIN_S", "Ledger", "budget_from_events", "classify_stack", "attach_budgets", "pick_pinner"]

CAUSES = ("io", "reclaim", "compaction", "lock_wait", "migration", "cpu", "runqueue", "other")
BIN_S = 0.05
_WINDOW_PRIORITY = ("compaction", "reclaim", "migration", "lock_wait")
_OPEN = {"mm_vmscan_direct_reclaim_begin": "reclaim", "mm_vmscan_memcg_reclaim_begin": "reclaim",
         "mm_compaction_begin": "compaction", "mm_migrate_pages_start": "migration",
         "mmap_lock_start_locking": "lock_wait"}
_CLOSE = {"mm_vmscan_direct_reclaim_end": "reclaim", "mm_vmscan_memcg_reclaim_end": "reclaim",
          "mm_compaction_end": "compaction", "mm_migrate_pages": "migration",
          "mmap_lock_acquire_returned": "lock_wait"}
# frames that name what a sleeping thread waits on, checked in this order (reclaim waits on I/O
# too: a sleep under try_to_free_pages is reclaim's, not the pinner's own I/O)
STACK_CAUSES = (
    ("compaction", ("try_to_compact_pages", "compact_zone", "__alloc_pages_direct_compact", "compact_node")),
    ("reclaim", ("try_to_free_pages", "do_try_to_free_pages", "try_to_free_mem_cgroup_pages", "shrink_node",
                 "shrink_lruvec", "mem_cgroup_handle_over_high", "__alloc_pages_direct_reclaim", "reclaim_throttle",
                 "__perform_reclaim")),
    ("migration", ("migrate_pages", "migration_entry_wait", "__migration_entry_wait", "migrate_pages_batch",
                   "migration_entry_wait_on_locked")),
    ("io", ("io_schedule", "io_schedule_timeout", "submit_bio_wait", "blkcg_maybe_throttle_current",
            "swap_read_folio", "swapin_readahead", "swap_cluster_readahead", "filemap_fault", "filemap_read",
            "folio_wait_bit_common", "wait_on_page_bit_common", "blk_mq_get_tag", "bit_wait_io")),
    ("lock_wait", ("rwsem_down_read_slowpath", "rwsem_down_write_slowpath", "__mutex_lock", "mutex_lock",
                   "rt_mutex_slowlock", "percpu_rwsem_wait", "__down", "__down_common", "lock_mm_and_find_vma",
                   "__mmap_lock_do_trace_start_locking", "mmap_read_lock_killable", "down_read", "down_write")),
)
_MAX_PENDING = 1 << 16       # requests waiting for their completion (or completions for their issue)
_HIST_PER_OCTAVE = 4         # latency histogram: 4 buckets per doubling, from 1 us


def _frame(f: str) -> str:
    return f.split("+", 1)[0].split(".", 1)[0].strip()


def classify_stack(frames: Iterable[str]) -> str | None:
    """The cause a sleeping stack names, or None when it names none of them.

    >>> classify_stack(["__schedule", "schedule", "io_schedule", "folio_wait_bit_common", "do_swap_page"])
    'io'
    """
    names = {_frame(f) for f in frames}
    for cause, marks in STACK_CAUSES:
        if names.intersection(marks):
            return cause
    return None


def _bucket(seconds: float) -> int:
    us = max(1.0, seconds * 1e6)
    return int(math.log2(us) * _HIST_PER_OCTAVE)


def _bucket_upper_ms(b: int) -> float:
    return 2 ** ((b + 1) / _HIST_PER_OCTAVE) / 1000.0


class _Dist:
    __slots__ = ("n", "total", "max", "hist")

    def __init__(self):
        self.n, self.total, self.max, self.hist = 0, 0.0, 0.0, defaultdict(int)

    def add(self, seconds: float, weight: float = 1.0) -> None:
        self.n += weight
        self.total += seconds * weight
        self.max = max(self.max, seconds)
        self.hist[_bucket(seconds)] += weight

    def merge(self, other: "_Dist", weight: float) -> None:
        self.n += other.n * weight
        self.total += other.total * weight
        if other.n:
            self.max = max(self.max, other.max)
        for b, c in other.hist.items():
            self.hist[b] += c * weight

    def summary(self) -> dict | None:
        n = round(self.n)
        if n <= 0:
            return None
        out = {"count": n, "mean_ms": round(1000 * self.total / self.n, 3), "max_ms": round(1000 * self.max, 3)}
        seen, want = 0.0, {"p50_ms": 0.5, "p90_ms": 0.9, "p99_ms": 0.99}
        buckets = sorted(self.hist.items())
        for key, q in want.items():
            seen = 0.0
            for b, c in buckets:
                seen += c
                if seen >= q * self.n:
                    out[key] = round(min(_bucket_upper_ms(b), 1000 * self.max), 3)
                    break
        out["histogram_ms"] = [[round(_bucket_upper_ms(b), 4), round(c)] for b, c in buckets if round(c)]
        return out


class _Bin:
    __slots__ = ("causes", "events", "requests", "bios", "bytes", "devices", "rq_lat", "sleep", "io_sleeps",
                 "inferred", "unseen")

    def __init__(self):
        self.causes = [0.0] * len(CAUSES)
        self.inferred = 0.0           # seconds of sleeps without a stack of their own (see Ledger)
        self.unseen = 0.0             # seconds counted on-CPU whose switch-in was not recorded (see Ledger)
        self.events: dict[str, int] = defaultdict(int)
        self.requests = self.bios = self.bytes = 0
        self.devices: dict[str, int] = defaultdict(int)
        self.rq_lat = _Dist()
        self.sleep = _Dist()          # the thread's io sleeps, switch-out to wakeup
        self.io_sleeps = 0


class _Thread:
    __slots__ = ("last", "on_cpu", "sleep_cause", "off_at", "windows", "bins", "last_cause", "stacked", "dead",
                 "woken", "from_start")

    def __init__(self):
        self.last: float | None = None     # the time up to which this thread's time is accounted
        self.on_cpu: bool | None = None    # None: not known yet (before its first switch)
        self.sleep_cause: str | None = None
        self.off_at: float | None = None
        self.windows: dict[str, float] = {}
        self.bins: dict[int, _Bin] = {}
        self.last_cause: str | None = None   # the cause its last stack named
        self.stacked = False                 # the current sleep has a stack of its own
        self.dead = False                    # it exited (its last switch-out had state X or Z)
        self.woken = False                   # woken, and not yet seen on a CPU (runnable)
        self.from_start = False              # watched before the trace's first event


class Ledger:
    """Events in (each instance's in its own order, from any thread), budgets out."""

    def __init__(self, bin_s: float = BIN_S):
        self.bin_s = bin_s
        self.threads: dict[int, _Thread] = {}
        self.pending: OrderedDict = OrderedDict()     # (dev, sector) -> (tid, bin, issued ts)
        self.early: OrderedDict = OrderedDict()       # completions read before their issue
        self.devices: set[str] = set()
        self.dev_bins: dict[int, _Bin] = {}           # read requests on the traced devices, any process's
        self.xids: list[dict] = []
        self.lost = 0
        self.first_ts: float | None = None            # the trace's first event: where it began
        self.events = 0
        self._lock = threading.Lock()

    # -- in ---------------------------------------------------------------------------------
    def _bin(self, th: _Thread, t: float) -> _Bin:
        i = int(t / self.bin_s)
        b = th.bins.get(i)
        if b is None:
            b = th.bins[i] = _Bin()
        return b

    def _label(self, th: _Thread) -> tuple[str | None, bool]:
        """The thread's cause now, and whether it is inferred (a sleep whose stack was not taken:
        the trigger takes a limited number a second; it gets the cause of the thread's last stack)."""
        if th.dead:
            return None, False
        for w in _WINDOW_PRIORITY:
            if w in th.windows:
                return w, False
        if th.on_cpu is None:
            return None, False
        if th.on_cpu:
            return "cpu", False
        if th.sleep_cause is None and not th.stacked and th.last_cause:
            return th.last_cause, True
        return th.sleep_cause or "other", False

    def _advance(self, th: _Thread, t: float, unseen: bool = False) -> None:
        """Account the thread's time from th.last to t under its current label (unseen: on a CPU
        by inference, its switch-in not recorded)."""
        if th.last is None or t <= th.last:
            th.last = t if th.last is None else th.last
            return
        label, inferred = self._label(th)
        if label is not None:
            k = CAUSES.index(label)
            a = th.last
            while a < t:
                i = int(a / self.bin_s)
                edge = min(t, (i + 1) * self.bin_s)
                if edge <= a:  # a on a bin's edge, rounded down into the bin before
                    i += 1
                    edge = min(t, (i + 1) * self.bin_s)
                b = th.bins.get(i) or th.bins.setdefault(i, _Bin())
                b.causes[k] += edge - a
                if inferred:
                    b.inferred += edge - a
                if unseen:
                    b.unseen += edge - a
                a = edge
        th.last = t

    def watch(self, tids: Iterable[int]) -> None:
        """Threads whose time is accounted (the pid filter lets in the other side of a switch too)."""
        with self._lock:
            for tid in tids:
                if tid > 0 and tid not in self.threads:
                    th = self.threads[tid] = _Thread()
                    th.from_start = self.first_ts is None

    def feed(self, ev: Event) -> None:
        with self._lock:
            self._feed(ev)

    def feed_all(self, events: Iterable[Event], device: bool = False) -> None:
        """device: events of the instance filtered by device, not by pid (any process's requests)."""
        with self._lock:
            for ev in events:
                if device and ev.name == "block_rq_issue":
                    self._device_issue(ev)
                else:
                    self._feed(ev)

    def _device_issue(self, ev: Event) -> None:
        self.events += 1
        if not ev.args["rwbs"].startswith("R"):
            return
        i = int(ev.ts / self.bin_s)
        b = self.dev_bins.get(i)
        if b is None:
            b = self.dev_bins[i] = _Bin()
        b.requests += 1
        b.bytes += ev.args["bytes"]
        b.devices[ev.args["dev"]] += 1
        key = (ev.args["dev"], ev.args["sector"])
        if key not in self.pending:  # the watched thread's own issue (the other instance) takes precedence
            self.pending[key] = (b, ev.ts)
            if len(self.pending) > _MAX_PENDING:
                self.pending.popitem(last=False)

    def _feed(self, ev: Event) -> None:
        self.events += 1
        n = ev.name
        if n == "lost":
            self.lost += ev.args.get("n", 0)
            return
        if self.first_ts is None:
            self.first_ts = ev.ts
        own = self.threads.get(ev.pid) if n != "stack" else None
        if own is not None and own.on_cpu is None and own.last is None and own.from_start:
            # its first sign is an event of its own, with no wakeup before it: it has been on a CPU
            # since the trace began (a switch out of it would have been recorded, in its context)
            own.last, own.on_cpu = self.first_ts, True
        if own is not None and own.on_cpu is False and not own.dead:
            # an event in the thread's own context: it is on a CPU. The pid filter does not record
            # a switch from the idle task to it (6.18 on the H200 and CI), so the time up to this
            # event since it was woken, or preempted, is counted apart as `unseen_s`, under the
            # term /proc's CPU times bore out: after a wakeup the sleep's own cause (a throttled
            # mlock on CI had 0.92 s of such time where /proc gave the thread 0.30 s of CPU in
            # all; taken as runqueue it varied 0.9-4.8 s from run to run), after a preemption
            # `cpu` (the H200's prefaulted 47 GiB register was preempted by kworkers and ran on:
            # /proc counted it on a CPU for all of its 1.6 s).
            if own.woken:
                self._advance(own, ev.ts, unseen=True)
            elif own.sleep_cause == "runqueue":
                own.on_cpu = True
                self._advance(own, ev.ts, unseen=True)
            else:
                self._advance(own, ev.ts)
            own.on_cpu, own.woken = True, False
            own.sleep_cause, own.off_at = None, None
        if n == "sched_switch":
            prev, nxt = ev.args["prev"], ev.args["next"]
            if prev in self.threads:
                th = self.threads[prev]
                # _advance never moves th.last back: events of two CPUs can cross (trace_pipe merges
                # the rings by time within a read, not across reads); setting it to ev.ts here did,
                # and counted the time between twice (io 34.9 s of a 22.5 s phase on the H200)
                self._advance(th, ev.ts)
                th.on_cpu = False
                preempted = ev.args["state"].startswith("R")
                th.sleep_cause = "runqueue" if preempted else None
                th.off_at = None if preempted else ev.ts
                th.stacked = False
                if ev.args["state"][:1] in ("X", "Z"):  # its last switch: no time of it after this
                    th.dead, th.windows = True, {}
                self._bin(th, ev.ts).events["sched_switch"] += 1
            if nxt in self.threads:
                th = self.threads[nxt]
                self._advance(th, ev.ts)
                th.on_cpu, th.sleep_cause, th.off_at, th.woken = True, None, None, False
                if prev not in self.threads:
                    self._bin(th, ev.ts).events["sched_switch"] += 1
            return
        if n == "stack":
            th = self.threads.get(ev.pid)
            if th is not None and th.on_cpu is False and th.off_at is not None and th.sleep_cause is None:
                th.sleep_cause = classify_stack(ev.args.get("frames", ())) or "other"
                th.last_cause, th.stacked = th.sleep_cause, True
                b = self._bin(th, th.off_at)
                b.events["stack"] += 1
            return
        if n in ("sched_wakeup", "sched_waking"):
            th = self.threads.get(ev.args["tid"])
            if th is None:
                return
            b = self._bin(th, ev.ts)
            b.events["sched_wakeup"] += 1
            if th.on_cpu is False and th.off_at is not None:
                if (th.sleep_cause or (th.last_cause if not th.stacked else None)) == "io":
                    sb = self._bin(th, th.off_at)
                    sb.sleep.add(ev.ts - th.off_at)
                    sb.io_sleeps += 1
                th.off_at = None
            if th.on_cpu is False and not th.dead and not th.woken:
                self._advance(th, ev.ts)  # the sleep ends here: runnable from now
                th.woken = True
            return
        if n in _OPEN or n in _CLOSE:
            if ev.pid not in self.threads:
                return
            th = self.threads[ev.pid]
            self._advance(th, ev.ts)
            if n in _OPEN:
                th.windows.setdefault(_OPEN[n], ev.ts)
            else:
                th.windows.pop(_CLOSE[n], None)
            self._bin(th, ev.ts).events[_OPEN.get(n) or _CLOSE[n]] += 1
            return
        if n == "block_bio_queue":
            if ev.args["rwbs"].startswith("R") and ev.pid in self.threads:
                b = self._bin(self.threads[ev.pid], ev.ts)
                b.bios += 1
                b.events["block_bio_queue"] += 1
            return
        if n == "block_rq_issue":
            dev = ev.args["dev"]
            self.devices.add(dev)
            if not ev.args["rwbs"].startswith("R") or ev.pid not in self.threads:
                return
            th = self.threads[ev.pid]
            b = self._bin(th, ev.ts)
            b.requests += 1
            b.bytes += ev.args["bytes"]
            b.devices[dev] += 1
            b.events["block_rq_issue"] += 1
            key = (dev, ev.args["sector"])
            done = self.early.pop(key, None)
            if done is not None and done >= ev.ts:
                b.rq_lat.add(done - ev.ts)
                b.events["block_rq_complete"] += 1
                return
            self.pending[key] = (b, ev.ts)
            if len(self.pending) > _MAX_PENDING:
                self.pending.popitem(last=False)
            return
        if n == "block_rq_complete":
            key = (ev.args["dev"], ev.args["sector"])
            issued = self.pending.pop(key, None)
            if issued is not None:
                b, t0 = issued
                b.rq_lat.add(max(0.0, ev.ts - t0))
                b.events["block_rq_complete"] += 1
            else:
                self.early[key] = ev.ts
                if len(self.early) > _MAX_PENDING:
                    self.early.popitem(last=False)
            return
        if n == "nvidia_dev_xid":
            self.xids.append({"ts": ev.ts, **ev.args})
            return

    def close(self, t: float) -> None:
        """Account every thread's time up to t (the end of the trace)."""
        with self._lock:
            for th in self.threads.values():
                self._advance(th, t)

    # -- out --------------------------------------------------------------------------------
    def _overlap(self, bins: dict[int, _Bin], start: float, end: float) -> Iterable[tuple[_Bin, float]]:
        """The bins over [start, end] with the share of each that lies inside it (0 at an edge)."""
        if end <= start:
            return
        for i in range(int(start / self.bin_s), int(end / self.bin_s) + 1):
            b = bins.get(i)
            if b is not None:
                lo, hi = i * self.bin_s, (i + 1) * self.bin_s
                yield b, max(0.0, min(hi, end) - max(lo, start)) / self.bin_s

    def budget(self, tid: int, start: float, end: float, dropped: int = 0) -> dict[str, Any]:
        """The time budget of thread tid over [start, end] (the trace's clock)."""
        wall = max(0.0, end - start)
        causes = [0.0] * len(CAUSES)
        events: dict[str, float] = defaultdict(float)
        requests = bios = nbytes = io_sleeps = inferred = unseen = 0.0
        devices: dict[str, float] = defaultdict(float)
        rq, sl = _Dist(), _Dist()
        with self._lock:
            th = self.threads.get(tid)
            bins = dict(th.bins) if th else {}
            dev_bins = dict(self.dev_bins)
        for b, w in self._overlap(bins, start, end):
            if w <= 0:
                continue
            for k in range(len(CAUSES)):
                causes[k] += b.causes[k] * w
            for name, c in b.events.items():
                events[name] += c * w
            requests += b.requests * w
            bios += b.bios * w
            nbytes += b.bytes * w
            io_sleeps += b.io_sleeps * w
            inferred += b.inferred * w
            unseen += b.unseen * w
            for d, c in b.devices.items():
                devices[d] += c * w
            rq.merge(b.rq_lat, w)
            sl.merge(b.sleep, w)
        basis = "thread"
        if not requests and dev_bins:
            # none issued in the thread's own context (blk-throttle issues held bios from a kworker):
            # the read requests on the devices it reads from, over the phase, whoever issued them
            drq = _Dist()
            dreq = dbytes = 0.0
            ddev: dict[str, float] = defaultdict(float)
            for b, w in self._overlap(dev_bins, start, end):
                dreq += b.requests * w
                dbytes += b.bytes * w
                for d, c in b.devices.items():
                    ddev[d] += c * w
                drq.merge(b.rq_lat, w)
            if round(dreq):
                basis, requests, nbytes, devices, rq = "device", dreq, dbytes, ddev, drq
        covered = sum(causes)
        named = covered - causes[CAUSES.index("other")]
        out: dict[str, Any] = {
            "tid": tid, "wall_s": round(wall, 3), "covered_s": round(covered, 3),
            "causes": {c: round(v, 3) for c, v in zip(CAUSES, causes)},
            "explained": round(named / wall, 4) if wall else None,
            "events": {k: round(v) for k, v in sorted(events.items()) if round(v)},
            "inferred_s": round(inferred, 3),
            "unseen_s": round(unseen, 3),
            "dropped": dropped,
            "io": {"basis": basis, "requests": round(requests), "bios": round(bios), "bytes": round(nbytes),
                   "devices": {d: round(c) for d, c in sorted(devices.items(), key=lambda x: -x[1]) if round(c)},
                   "request_latency": rq.summary(), "sleep_latency": sl.summary(), "sleeps": round(io_sleeps)},
        }
        return out


def budget_from_events(events: Iterable[Event], tid: int, start: float, end: float, dropped: int = 0,
                       bin_s: float = BIN_S) -> dict[str, Any]:
    """The budget of one thread over [start, end] from a recorded trace's events (pure)."""
    ledger = Ledger(bin_s)
    ledger.watch([tid])
    evs = list(events)
    ledger.feed_all(evs)
    ledger.close(max([end] + [e.ts for e in evs]))
    return ledger.budget(tid, start, end, dropped)


def pick_pinner(budgets: dict[int, dict | None]) -> dict | None:
    """Of a process's threads' budgets over a pin, the pinner's: the one with the most time measured
    in named causes (its other threads sleep in futex or poll, 'other'). Time inferred from an
    earlier stack counts for nothing here, and an exited thread has none after its exit."""
    best = None
    for tid in sorted(budgets):
        b = budgets[tid]
        if b is None:
            continue
        named = (b.get("covered_s") or 0) - (b["causes"].get("other") or 0) - (b.get("inferred_s") or 0)
        if best is None or named > best[0]:
            best = (named, b)
    return best[1] if best else None


def attach_budgets(result_or_phases: Any, source: Any) -> int:
    """Fill phases[].time_budget from a budget source (diag.trace.Tracer.budget_source, or anything
    with `budget(tid, start_s, end_s) -> dict | None` over the watch's own clock). Takes a result
    dict ({"phases": [...]}), a result object with .phases, or a list of phases (dicts or objects
    with tid, started_s, seconds). Returns how many phases got one."""
    if source is None:
        return 0
    if isinstance(result_or_phases, dict):
        phases = result_or_phases.get("phases") or []
    elif isinstance(result_or_phases, list):
        phases = result_or_phases
    else:
        phases = getattr(result_or_phases, "phases", None) or []
    n = 0
    for ph in phases:
        get = ph.get if isinstance(ph, dict) else (lambda k, _p=ph: getattr(_p, k, None))
        tid, start, secs = get("tid"), get("started_s"), get("seconds")
        if tid is None or start is None or secs is None:
            continue
        b = source.budget(tid, float(start), float(start) + float(secs))
        if b is None:
            continue
        if isinstance(ph, dict):
            ph["time_budget"] = b
        else:
            setattr(ph, "time_budget", b)
        n += 1
    return n

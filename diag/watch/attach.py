"""`hostpin watch --pid PID`: follow a process hostpin did not start, read-only.

Samples the process every interval (diag.watch.sampler), notices its pin phases and the load
around them (diag.watch.load: a copy from swap, a file read, an allocation in its own faults),
and ends when the process has been quiet (no phase open, nothing moving) for --quiet-after
seconds, when it exits, or at the deadline; with --until pin, when the first pin returns. It
never signals, traces or stops the target; it writes only into its run directory:
timeline.jsonl, stacks at the start and the end (and at a stall), result.json.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Callable, Iterable

from ..evidence import RunDir
from ..exitcodes import EXIT_FAIL, EXIT_INTERRUPTED, EXIT_OK, EXIT_UNEVALUATED
from ..facts import node_facts
from ..process import read_status
from ..rootfs import Root
from .book import PhaseBook
from .load import LoadBook
from .bounds import remedy_for
from .render import watch_verdict
from .result import WatchResult
from .sampler import Sampler
from .timeline import TimelineWriter, write_stacks
from .traced import finish_trace, start_trace

__all__ = ["WatchOptions", "watch_pid", "watch_outcome", "Clock", "finish_result", "QUIET_AFTER_S", "nvidia_loaded",
           "region_wants"]

# --quiet-after's default: ten samples at the default interval, and 2.5 times the 2 s window
# that rates are measured over. A loader's step between tensors (open the next file, parse a
# header) is well under a second; a copy from a throttled swap device dispatches in bursts of
# ~0.1 s. Five quiet seconds with no phase open mean the load is over, and an operator waiting
# for the answer does not wait long.
QUIET_AFTER_S = 5.0


def nvidia_loaded(root: Root) -> bool:
    """An NVIDIA kernel module is loaded: only then can an allocation seen from counters be the
    driver's (cudaHostAlloc)."""
    return root.exists("proc/driver/nvidia") or root.exists("sys/module/nvidia")


@dataclass
class WatchOptions:
    size_bytes: int | None = None
    interval: float = 0.5
    deadline: float | None = None       # seconds of watching; None: until the pin returns or the process exits
    stall_after: float = 120.0          # no progress for this long inside a pin: stacks are kept, a note made
    heartbeat: float = 30.0             # the launcher form's stderr lines
    quiet_s: float = 5.0                # a phase shorter than this gets no heartbeat
    until: str = "quiet"                # --pid: 'quiet' (the whole load) or 'pin' (the first pin's return)
    quiet_after: float = QUIET_AFTER_S  # --pid: seconds with no phase open and nothing moving end the watch
    trace: bool = False                 # --trace: the kernel tracer (diag.trace) measures each phase's budget


class Clock:
    """Seconds since watching began, and the watcher's own CPU time."""

    def __init__(self):
        self.t0 = time.monotonic()
        self.cpu0 = os.times()

    def now(self) -> float:
        return time.monotonic() - self.t0

    def cost(self, samples: int) -> dict:
        t = os.times()
        cpu = (t.user - self.cpu0.user) + (t.system - self.cpu0.system)
        wall = max(1e-6, self.now())
        return {"cpu_s": round(cpu, 3), "wall_s": round(wall, 3), "cpu_pct_of_core": round(100 * cpu / wall, 2),
                "samples": samples}


class Stalls:
    """Keeps every thread's stack once when a phase stops moving for stall_after."""

    def __init__(self, run: RunDir, stall_after: float, proc: str):
        self.run, self.stall_after, self.proc = run, stall_after, proc
        self.seen: set[tuple[int, int]] = set()
        self.events: list[dict] = []

    def check(self, book: PhaseBook, t: float, on_stall: Callable[[dict], None] | None = None) -> None:
        for (pid, tid), (ph, tr) in book.open.items():
            quiet = tr.stalled_for(t)
            if quiet >= self.stall_after and (pid, tid) not in self.seen:
                self.seen.add((pid, tid))
                rel = write_stacks(self.run, f"stacks-stall-{pid}-{tid}.txt", [pid], f"no progress for {quiet:.0f} s",
                                   proc=self.proc)
                event = {"pid": pid, "tid": tid, "at_s": round(t, 3), "quiet_s": round(quiet, 1), "stacks": rel,
                         "bound": tr.progress.get("bound")}
                self.events.append(event)
                if on_stall:
                    on_stall(event)


def finish_result(result: WatchResult, book: PhaseBook, sampler: Sampler, clock: Clock, samples: int,
                  load: LoadBook | None = None) -> None:
    result.phases = sorted(book.results() + (load.results() if load is not None else []), key=lambda r: r.started_s)
    result.watched_s = round(clock.now(), 3)
    result.watcher = clock.cost(samples)
    costs = sorted(sampler.smaps.costs_ms)
    if costs:  # the per-VMA swap reads (diag.watch.smaps), in their own thread
        result.watcher.update(smaps_reads=len(costs), smaps_ms_median=costs[len(costs) // 2], smaps_ms_max=costs[-1])
    result.unreadable = dict(sampler.problems)
    main = result.main_phase
    if main is not None:
        result.bound, result.bound_reason, result.catalog = main.bound, main.bound_reason, main.catalog
        result.remedy = remedy_for(main.bound, main.catalog)
    result.verdict = watch_verdict(result)


def region_wants(book: PhaseBook, load: LoadBook | None, first: Iterable[int] = ()) -> dict[int, bool]:
    """The processes whose per-VMA swap the next sample reads (diag.watch.smaps): those with a
    phase open that swap-in bounds (the only ETA the region's swap makes), each with whether one of
    its phases still waits for its region; `first`: the processes read once at the start (the
    baseline a draining VMA is seen against). A pin that reads no swap costs no read."""
    out = {int(pid): False for pid in first}
    entries = list(book.open.values()) + (list(load.open.values()) if load is not None else [])
    for ph, tr in entries:
        swapin = tr.progress.get("bound") == "swap-in" or ph.kind == "copy-from-swap"
        if tr.region is None or (tr.progress and not swapin):
            continue  # (a phase not updated yet, begun on this sample, may be swap-in: it is read)
        out[int(ph.pid)] = out.get(int(ph.pid), False) or tr.waits_for_region
    return out


def watch_pid(pid: int, opts: WatchOptions, run: RunDir, on_progress: Callable[[dict], None] | None = None,
              root: Root | None = None) -> WatchResult:
    root = root or Root("/")
    result = WatchResult(mode="pid", pid=pid, size_bytes=opts.size_bytes, interval_s=opts.interval,
                         deadline_s=opts.deadline, run_dir=str(run.path))
    sampler = Sampler(root)
    clock = Clock()
    what, how = sampler.what_is(pid)
    first = sampler.process(pid) if what == "process" else None
    if first is None:
        result.outcome, result.exit_code = "gone", EXIT_UNEVALUATED
        st = read_status(pid, proc=sampler.proc)
        name = f"pid {pid}" + (f" ({st.name})" if st and st.name else "")
        if what == "kernel thread":
            result.verdict = f"{name} is a kernel thread: it has no user memory and cannot pin; nothing to watch"
        elif what == "exited" and how == "zombie":
            result.verdict = (f"{name} has exited (a zombie its parent has not reaped): there is nothing left to "
                              "watch")
        elif what == "exited":
            result.verdict = f"{name} is exiting: there is nothing left to watch"
        else:
            result.verdict = f"no process {pid} to watch (it does not exist, or /proc/{pid} cannot be read)"
        return result
    result.name = first.get("name")
    tracer = start_trace(run, [pid], clock.t0, result.notes) if opts.trace else None
    result.facts = node_facts(Root(root.path, run=run))
    result.stacks.append(write_stacks(run, "stacks-start.txt", [pid], "at the attach", proc=sampler.proc))
    book = PhaseBook(opts.size_bytes, sampler.page, nvidia=nvidia_loaded(root), interval_s=opts.interval)
    load = LoadBook(sampler.page, interval_s=opts.interval)
    writer = TimelineWriter(run)
    stalls = Stalls(run, opts.stall_after, sampler.proc)
    samples, outcome = 0, None
    quiet_since: float | None = 0.0
    next_tick = time.monotonic()
    try:
        while outcome is None:
            t = clock.now()
            s = sampler.sample(t, [pid], book.active_tids(), region_wants(book, load, [pid] if not samples else ()))
            samples += 1
            started, ended = book.update(s)
            for ph in ended:
                tr = next((tr for p, tr in book.closed if p is ph), None)
                load.pin_ended(ph.pid, ph.ended_t, tr.expected * tr.page if tr is not None and tr.expected else None,
                               ph.kind)
            lstarted, _ = load.update(s, pinning=book.pinning()) if opts.until == "quiet" else ([], [])
            prog = book.progress() or load_progress(load)
            s["progress"] = prog or {"phase": "watch"}
            writer.write(s, keep={tid for tids in book.active_tids().values() for tid in tids})
            stalls.check(book, t)
            if on_progress and prog:
                on_progress(prog)
            if book.open or load.open or started or lstarted:
                quiet_since = None
            elif quiet_since is None:
                quiet_since = t
            if pid not in s["procs"]:
                outcome = "exited"
            elif opts.until == "pin" and any(ph.end_reason == "returned" for ph in ended):
                outcome = "completed"
            elif opts.until == "pin" and ended:
                outcome = "exited"
            elif opts.until == "quiet" and quiet_since is not None and t - quiet_since >= opts.quiet_after:
                outcome = "quiet"
            elif opts.deadline is not None and t >= opts.deadline:
                outcome = "deadline"
            else:
                next_tick += opts.interval
                time.sleep(max(0.0, next_tick - time.monotonic()))
    except KeyboardInterrupt:
        outcome = "interrupted"
    finally:
        writer.close()
        if tracer is not None:
            tracer.stop()
    if outcome in ("deadline", "interrupted") and book.open:
        result.stacks.append(write_stacks(run, f"stacks-{outcome}.txt", [pid], f"at the {outcome}", proc=sampler.proc))
    result.stalls = stalls.events
    result.until, result.quiet_after_s = opts.until, opts.quiet_after if opts.until == "quiet" else None
    result.ended_by = {"completed": "pin"}.get(outcome, outcome)
    result.outcome = outcome
    finish_result(result, book, sampler, clock, samples, load)
    result.outcome, exit_code = watch_outcome(outcome, result.phases)
    result.verdict = watch_verdict(result)
    finish_trace(tracer, result)  # after the verdict: it quotes the main phase's budget
    result.exit_code = exit_code
    return result


def watch_outcome(ended_by: str, phases: list) -> tuple[str, int]:
    """(outcome, exit code) of a --pid watch from what ended it and its phases (pure)."""
    outcome = ended_by
    if not phases:
        outcome = "no-pin" if outcome != "interrupted" else outcome
    elif outcome in ("exited", "quiet"):
        # the process went quiet or exited: the load ended; how its pins ended says how it went
        pins = [p.outcome for p in phases if p.pin]
        outcome = ("unknown" if "unknown" in pins else "exited" if any(o in ("exited", "open") for o in pins)
                   else "completed")
    return outcome, {"completed": EXIT_OK, "interrupted": EXIT_INTERRUPTED,
                     "unknown": EXIT_UNEVALUATED}.get(outcome, EXIT_FAIL)


def load_progress(load: LoadBook) -> dict | None:
    """The progress of the oldest open load phase, for the progress line and the timeline."""
    if not load.open:
        return None
    ph, tr = min(load.open.values(), key=lambda e: e[0].started_t)
    return dict(tr.progress, phase=ph.kind, pid=ph.pid, tid=ph.pid)

"""The supervisor: drives repro's children through their steps while diag.watch samples them.

It never calls CUDA and never blocks on a child. Every interval it takes one sample of the
children (diag.watch.sampler: the same read-only reads `hostpin watch` makes), feeds the pin's
tracker (diag.watch.tracker: progress, rate, bound, ETA), and appends the sample to
timeline.jsonl (diag.watch.timeline). It reads the children's events between samples, and
when a run must end early it keeps every thread's stack and the dmesg tail before it kills.
"""
from __future__ import annotations

import json
import os
import select
import time
from typing import Any, Callable

from diag.evidence import RunDir
from diag.watch.sampler import Sampler
from diag.watch.timeline import TimelineWriter, write_stacks
from diag.watch.tracker import Tracker, moved, progress_signature, targets_sum

from .children import Child, kill_and_wait

__all__ = ["Supervisor", "PROGRESS_BASIS", "PROGRESS"]

# where each method's progress is read (diag.watch.tracker):
#  register:  pins outstanding, delta(nr_foll_pin_acquired - nr_foll_pin_released): one per page
#             pin_user_pages pins; system-wide, so another long-term pinner is noted
#  hostalloc: the children's RssShmem: cudaHostAlloc'd pages are the process's shared memory
#             ("auto": the node's Shmem, system-wide, if the driver maps them only at the end)
#  mlock:     the children's VmRSS above their RSS before the region was touched (mlock
#             populates through the same fault path; nr_mlock is updated in batches)
PROGRESS_BASIS = {"register": "pins", "hostalloc": "auto", "mlock": "resident"}
PROGRESS = "hostpin_progress_pages"  # the pages done, also kept in each sample's "vm" (hostpin report's picture)


class Supervisor:
    def __init__(self, run: RunDir, prefix: str, children: list[Child], method: str, size_bytes: int,
                 interval: float = 0.5, stall_after: float = 120.0, deadline: float | None = None,
                 on_tick: Callable[[dict], None] | None = None):
        self.run, self.prefix, self.children, self.method = run, prefix, children, method
        self.size_bytes = size_bytes  # all ranks together
        self.interval, self.stall_after, self.deadline = interval, stall_after, deadline
        self.on_tick = on_tick
        self.sampler = Sampler()
        self.page = self.sampler.page
        self.writer = TimelineWriter(run, f"{prefix}timeline.jsonl")
        self.events_log = run.open_stream(f"{prefix}events.jsonl")
        self.t0 = time.monotonic()
        self.cpu0 = os.times()
        self.phase = "setup"
        self.tracker: Tracker | None = None
        self.pin_t: float | None = None
        self.pin_end_t: float | None = None
        self.pin_running = False
        self.clean_pages_s: float | None = None
        self.rss_base: int | None = None
        self.last: dict[str, Any] | None = None
        self.progress: dict[str, Any] = {"phase": "setup"}
        self.samples = 0
        self._sig = None
        self._progress_t = 0.0
        self._last_tick = 0.0

    @property
    def pids(self) -> list[int]:
        return [c.pid for c in self.children]

    def now(self) -> float:
        return time.monotonic() - self.t0

    # -- sampling ------------------------------------------------------------------------------
    def tick(self) -> dict:
        self._last_tick = time.monotonic()
        alive = [c.pid for c in self.children if c.alive]
        s = self.sampler.sample(self.now(), alive, {pid: {pid} for pid in alive})
        s["phase"] = self.phase
        self.samples += 1
        prog: dict[str, Any] = {"phase": self.phase}
        if self.tracker is not None and self.phase == "pin":
            prog.update(self.tracker.update(s, in_call=self.pin_running))
            s["vm"][PROGRESS] = prog.get("pinned_pages") or 0
        elif self.phase == "prefault":
            prog["rss_bytes"] = targets_sum(s, "vm_rss")
        prog["phase"] = self.phase
        s["progress"] = self.progress = prog
        sig = progress_signature(s, pins=self.method == "register")
        if moved(sig, self._sig):
            self._sig, self._progress_t = sig, s["t"]
        self.writer.write(s)
        self.last = s
        if self.on_tick:
            self.on_tick(prog)
        return s

    def pump_events(self) -> list[dict]:
        new = []
        for child in self.children:
            for ev in child.read_events():
                self.events_log.write(json.dumps(ev) + "\n")
                new.append(ev)
        return new

    def wait(self, until: Callable[[], bool], stall: bool = False, deadline: float | None = None) -> str | None:
        """Sample every interval until `until()` holds. Returns None, or why it stopped early:
        'deadline' (the run's, or this wait's own, in run-relative seconds), 'stall' (no progress
        for stall_after), 'child_exit' (a child died)."""
        deadline = self.deadline if deadline is None else deadline
        next_tick = max(time.monotonic(), self._last_tick + self.interval)
        self._progress_t = self.now()
        while True:
            self.pump_events()
            if until():
                return None
            if any(c.poll() is not None for c in self.children):
                self.pump_events()
                return None if until() else "child_exit"
            now = time.monotonic()
            if now >= next_tick:
                self.tick()
                next_tick = now + self.interval
                if deadline is not None and self.now() > deadline:
                    return "deadline"
                if stall and self.now() - self._progress_t > self.stall_after:
                    return "stall"
            fds = [c.events_fd for c in self.children if c.alive]
            timeout = max(0.0, next_tick - time.monotonic())
            if fds:
                select.select(fds, [], [], timeout)
            else:
                time.sleep(timeout)

    def command_all(self, phase: str, command: str, done: str, failed: str) -> str | None:
        """Start `phase`: every child is sent `command`, and sampled until each has reported `done`
        (or an error). None, or why the phase ended early: wait()'s reasons, or `failed` when a child
        reported an error."""
        self.phase = phase
        for c in self.children:
            c.send(command)
        stop = self.wait(lambda: all(c.has(done, "error") for c in self.children), stall=True)
        return stop or (failed if any(c.has("error") for c in self.children) else None)

    # -- the pin -------------------------------------------------------------------------------
    def mark_region_base(self) -> None:
        """Call before the region is touched: the RSS the children have without it."""
        self.rss_base = targets_sum(self.tick(), "vm_rss")

    def start_pin(self) -> None:
        s = self.tick()
        self.phase = "pin"
        self.pin_t = s["t"]
        basis = PROGRESS_BASIS[self.method]
        self.tracker = Tracker(size_bytes=self.size_bytes, page=self.page, basis=basis,
                               pids={c.pid for c in self.children}, clean_pages_s=self.clean_pages_s,
                               base_resident=self.rss_base if basis == "resident" else None)
        self.tracker.begin(s, seen_start=True)
        self.pin_running = True
        for child in self.children:
            child.send("pin")

    def end_pin(self) -> dict:
        """The pin returned (or was given up): one more sample, taken with the pin's end."""
        self.pin_running = False
        self.pin_end_t = self.now()
        if self.tracker is not None:
            self.tracker.end({"t": self.pin_end_t})
        return self.tick()

    # -- ending --------------------------------------------------------------------------------
    def capture_stacks(self, reason: str) -> str:
        return write_stacks(self.run, f"{self.prefix}stacks-{reason}.txt", self.pids, f"{reason} at {self.now():.1f} s",
                            proc=self.sampler.proc, labels={c.pid: f"rank {c.rank} pid" for c in self.children})

    def kill_children(self, reason: str, wait_s: float = 10.0) -> dict:
        """Stacks and the dmesg tail first, then SIGKILL, then a bounded wait; never blocks longer."""
        evidence = {"stacks": self.capture_stacks(reason)}
        entry = self.run.run_command(f"{self.prefix}dmesg-tail-{reason}", ["sh", "-c", "dmesg | tail -n 300"],
                                     timeout=5)
        evidence["dmesg"] = entry["path"]
        stuck = kill_and_wait(self.children, wait_s)
        if stuck:
            evidence["unkillable_stacks"] = self.capture_stacks(f"{reason}-unkillable")
        return evidence

    def stop_children(self, reason: str) -> dict:
        """End the run early: for the deadline or a stall the children are killed (their stacks first);
        otherwise each is asked to quit, given 30 s, and killed if still alive. What was done, for the result."""
        done: dict[str, Any] = {"stopped": {"reason": reason, "phase": self.phase, "at_s": round(self.now(), 3),
                                            "progress": self.progress}}
        if reason in ("deadline", "stall"):
            done["kill"] = self.kill_children(reason)
            return done
        for c in self.children:
            if c.alive:
                c.send("quit")
        t_end = time.monotonic() + 30
        while time.monotonic() < t_end and any(c.alive and not c.has("exit") for c in self.children):
            self.pump_events()
            time.sleep(0.05)
        if any(c.alive for c in self.children):
            done["kill"] = self.kill_children("after-" + reason)
        return done

    def quit_children(self, timeout_s: float) -> dict | None:
        """The run's end: each child unpins, unmaps and exits. One still running after timeout_s is
        killed: the kill's evidence, else None."""
        self.phase = "undo"
        for c in self.children:
            c.send("quit")
        stop = self.wait(lambda: all(c.has("exit") or not c.alive for c in self.children),
                         deadline=self.now() + timeout_s)
        kill = self.kill_children("undo-timeout") if stop == "deadline" else None
        for c in self.children:
            try:
                c.proc.wait(timeout=10)
            except Exception:
                pass
        return kill

    def finish(self) -> dict:
        self.pump_events()
        t = os.times()
        wall = max(1e-6, self.now())
        cpu = (t.user - self.cpu0.user) + (t.system - self.cpu0.system)
        self.writer.close()
        self.events_log.close(kind="events")
        for child in self.children:
            try:
                os.close(child.events_fd)
            except OSError:
                pass
            self.run.adopt(child.log_rel, kind="child-log")
        return {"watchdog_cpu_s": round(cpu, 3), "wall_s": round(wall, 3),
                "watchdog_cpu_pct_of_core": round(100.0 * cpu / wall, 2), "samples": self.samples,
                "unreadable": dict(self.sampler.problems)}

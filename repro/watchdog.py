"""The watchdog: the parent process that watches pinning children without ever blocking on them.

It never calls CUDA. Every interval it reads, for each child and each of its threads, the
state, wchan and kernel stack (root), VmRSS and VmSwap from status (never smaps, maps or
cmdline: they take the mmap lock the pin holds), plus /proc/vmstat, meminfo and PSI, and
appends one line to timeline.jsonl (flushed and fsynced). From the samples it computes the
pin's progress, rate, ETA and bound (repro.bounds).
"""
from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from typing import Any, Callable

from diag import process
from diag.cuda import child_env
from diag.evidence import RunDir
from diag.units import PAGE_SIZE  # this node's base page: progress counts pages of that size
from diag.meminfo import parse_meminfo
from diag.psi import parse_psi
from diag.rootfs import read_bounded
from diag.vmstat import WATCHED_PREFIXES, parse_vmstat

from .bounds import classify, estimate_eta, progress_signals

__all__ = ["Child", "Watchdog", "spawn_child", "kill_and_wait", "PROGRESS_COUNTER"]

# where each method's progress is read, one unit per base page (PAGE_SIZE: 4 KiB on x86-64):
#  register:  nr_foll_pin_acquired rises by one per page pin_user_pages pins (system-wide)
#  hostalloc: MemTotal - MemAvailable rises as the driver allocates (system-wide, approximate;
#             not nr_free_pages, which grows on VMs that plug memory in as it is used)
#  mlock:     the children's VmRSS above their size before the region was touched: mlock
#             populates through the same fault path, and nr_mlock is updated in batches
PROGRESS_COUNTER = {"register": "nr_foll_pin_acquired", "mlock": "VmRSS", "hostalloc": "MemTotal-MemAvailable"}
PROGRESS = "hostpin_progress_pages"
STACKS_PER_TICK = 4  # the per-method figure, stored in each sample's "vm"
_MEM_KEYS = ("MemTotal", "MemAvailable", "MemFree", "SwapFree", "SwapTotal", "Cached", "AnonHugePages", "Mlocked", "Shmem")


def _in_use(sample: dict) -> int:
    mem = sample.get("mem", {})
    return (mem.get("MemTotal") or 0) - (mem.get("MemAvailable") or 0)


class Child:
    """One pinning child: its process, event pipe and command pipe."""

    def __init__(self, rank: int, proc: subprocess.Popen, events_fd: int, log_rel: str):
        self.rank = rank
        self.proc = proc
        self.pid = proc.pid
        self.events_fd = events_fd
        self.log_rel = log_rel
        self._buf = b""
        self.events: list[dict] = []
        self.last: dict[str, dict] = {}  # event name -> latest event
        self.exit_status: int | None = None
        self.killed = False
        self.unkillable = False

    def read_events(self) -> list[dict]:
        new = []
        while True:
            try:
                chunk = os.read(self.events_fd, 65536)
            except BlockingIOError:
                break
            except OSError:
                break
            if not chunk:
                break
            self._buf += chunk
        while b"\n" in self._buf:
            line, self._buf = self._buf.split(b"\n", 1)
            try:
                ev = json.loads(line)
            except json.JSONDecodeError:
                ev = {"event": "garbled", "raw": line.decode(errors="replace")}
            ev["rank"] = self.rank
            self.events.append(ev)
            self.last[ev["event"]] = ev
            new.append(ev)
        return new

    def has(self, *names: str) -> bool:
        return any(n in self.last for n in names)

    def send(self, command: str) -> bool:
        try:
            self.proc.stdin.write((command + "\n").encode())
            self.proc.stdin.flush()
            return True
        except (BrokenPipeError, OSError, ValueError):
            return False

    def poll(self) -> int | None:
        if self.exit_status is None:
            rc = self.proc.poll()
            if rc is not None:
                self.exit_status = rc
        return self.exit_status

    @property
    def alive(self) -> bool:
        return self.poll() is None


def spawn_child(spec: dict, rank: int, run: RunDir, prefix: str, join_files: list[str]) -> Child:
    r_fd, w_fd = os.pipe()
    os.set_blocking(r_fd, False)
    spec = dict(spec, events_fd=w_fd, rank=rank)
    log_rel = f"{prefix}child-{rank}.log"
    log_path = run.path / log_rel
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log = open(log_path, "wb")

    def preexec() -> None:
        os.setpgrp()  # Ctrl-C reaches the watchdog only; the watchdog decides what the child does
        for path in join_files:  # join the run's cgroups before allocating anything
            with open(path, "w") as fh:
                fh.write("0")

    proc = subprocess.Popen([sys.executable, "-m", "repro.pinner", json.dumps(spec)], stdin=subprocess.PIPE,
                            stdout=log, stderr=subprocess.STDOUT, pass_fds=(w_fd,), preexec_fn=preexec,
                            env=child_env())
    os.close(w_fd)
    log.close()
    return Child(rank, proc, r_fd, log_rel)


def kill_and_wait(children: list[Child], wait_s: float = 10.0) -> list[Child]:
    """SIGKILL each live child's process group, wait at most wait_s; the ones still alive are
    marked unkillable and returned (a task stuck in the kernel, e.g. frozen, outlives SIGKILL)."""
    for child in children:
        if child.alive:
            child.killed = True
            try:
                os.killpg(child.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and any(c.alive for c in children):
        time.sleep(0.05)
    stuck = [c for c in children if c.alive]
    for c in stuck:
        c.unkillable = True
    return stuck


class Watchdog:
    def __init__(self, run: RunDir, prefix: str, children: list[Child], method: str, expected_pages: int,
                 interval: float = 0.5, stall_after: float = 120.0, deadline: float | None = None,
                 on_tick: Callable[[dict], None] | None = None, proc_root: str = "/proc"):
        self.run, self.prefix, self.children = run, prefix, children
        self.method = method
        self.counter = PROGRESS
        self.source_counter = PROGRESS_COUNTER[method]
        self.rss_base: int | None = None  # children's RSS before the region is touched (mlock)
        self.expected_pages = expected_pages
        self.interval, self.stall_after, self.deadline = interval, stall_after, deadline
        self.on_tick = on_tick
        self.proc_root = proc_root
        self.can_read_stacks = os.geteuid() == 0
        self.timeline = run.open_stream(f"{prefix}timeline.jsonl")
        self.events_log = run.open_stream(f"{prefix}events.jsonl")
        self.t0 = time.monotonic()
        self.vm0 = parse_vmstat(read_bounded("/proc/vmstat", 1 << 20).decode())
        self.samples: list[dict] = []
        self.last_frames: dict[int, list[str]] = {}
        self._last_stack_text: dict[int, str] = {}
        self.phase = "setup"
        self.pin_t: float | None = None        # run-relative time the pin command was sent
        self.pin_vm: dict[str, int] = {}
        self.pin_end_t: float | None = None
        self.pin_running = False
        self.clean_pages_s: float | None = None  # from the child's calibration, for the ETA
        self.pinned_at_end: int | None = None    # progress right after the pin (it falls at undo)
        self._stack_turn = 0
        self.bound_counts: dict[str, int] = {}
        self.first_bound_at: float | None = None
        self.eta_at_20: dict | None = None
        self.progress: dict[str, Any] = {}
        self._last_progress_sig = None
        self._last_progress_t = 0.0
        self.cpu0 = os.times()
        self._last_tick_mono = 0.0

    # -- sampling ------------------------------------------------------------------------------
    def now(self) -> float:
        return time.monotonic() - self.t0

    def _proc_sample(self, child: Child) -> dict | None:
        st = process.read_status(child.pid, proc=self.proc_root)
        if st is None:
            return None
        out = {"state": st.state, "vm_rss": st.vm_rss_bytes, "vm_swap": st.vm_swap_bytes, "vm_lck": st.vm_lck_bytes,
               "threads": {}}
        tasks = process.list_tasks(child.pid, proc=self.proc_root)
        states = {tid: process.read_task_state(child.pid, tid, proc=self.proc_root) for tid in tasks}
        # wchan and the kernel stack for the main thread and at most STACKS_PER_TICK busy (D or R)
        # threads, taking turns: a 16-thread prefault must not make the watchdog expensive, and a
        # thread asleep in S (futex waits, the CUDA runtime's helpers) says nothing about the pin
        busy = [tid for tid in tasks if states[tid] in ("D", "R") and tid != child.pid]
        if len(busy) > STACKS_PER_TICK:
            start = self._stack_turn % len(busy)
            busy = (busy[start:] + busy[:start])[:STACKS_PER_TICK]
        watched = set(busy) | {child.pid}
        for tid in tasks:
            th = {"tid": tid, "state": states[tid]}
            if tid in watched:
                th["wchan"] = process.read_wchan(child.pid, tid, proc=self.proc_root)
                if self.can_read_stacks:
                    text, _ = process.read_stack(child.pid, tid, proc=self.proc_root)
                    if text is not None and text != self._last_stack_text.get(tid):
                        self._last_stack_text[tid] = text
                        frames = process.parse_stack(text)
                        th["frames"] = frames  # written only when the stack changed
                        if frames:
                            self.last_frames[tid] = frames
            out["threads"][tid] = th
        return out

    def sample(self) -> dict:
        t = self.now()
        vm_now = parse_vmstat(read_bounded("/proc/vmstat", 1 << 20).decode())
        vm = {k: v - self.vm0.get(k, 0) for k, v in vm_now.items() if k.startswith(WATCHED_PREFIXES)}
        mem = parse_meminfo(read_bounded("/proc/meminfo", 1 << 20).decode()).raw
        psi_text = None
        try:
            psi_text = read_bounded("/proc/pressure/memory", 4096).decode()
        except OSError:
            pass
        s = {"t": round(t, 3), "phase": self.phase, "vm": vm,
             "mem": {k: mem.get(k) for k in _MEM_KEYS},
             "psi": parse_psi(psi_text) if psi_text else None,
             "procs": {}}
        for child in self.children:
            if child.alive:
                p = self._proc_sample(child)
                if p is not None:
                    s["procs"][child.pid] = p
        vm[PROGRESS] = self._progress_pages(s)
        return s

    def _progress_pages(self, s: dict) -> int:
        if self.method == "mlock":
            if self.rss_base is None:
                return 0
            rss = sum((p.get("vm_rss") or 0) for p in s["procs"].values())
            return max(0, (rss - self.rss_base) // PAGE_SIZE)
        if self.pin_t is None:
            return 0
        if self.method == "hostalloc":
            return max(0, (_in_use(s) - self.pin_in_use) // PAGE_SIZE)
        return max(0, s["vm"].get(self.source_counter, 0) - self.pin_vm.get(self.source_counter, 0))

    def mark_region_base(self) -> None:
        """Call before the region is touched: the RSS the children have without it."""
        self.rss_base = sum((p.get("vm_rss") or 0) for p in self.sample()["procs"].values())

    def tick(self) -> dict:
        self._last_tick_mono = time.monotonic()
        self._stack_turn += 1
        s = self.sample()
        self.samples.append(s)
        if len(self.samples) > 4000:  # keep memory bounded on long runs; the timeline file has all
            del self.samples[:1000]
        window = [x for x in self.samples if x["t"] >= s["t"] - 2.0 - 1e-9]
        prog: dict[str, Any] = {"phase": self.phase}
        if self.phase == "pin" and self.pin_t is not None:
            pin_window = [x for x in window if x["t"] >= self.pin_t - 1e-9] or window[-1:]
            done = min(s["vm"].get(PROGRESS, 0), self.expected_pages)
            eta = estimate_eta(pin_window, PROGRESS, done, self.expected_pages, self.clean_pages_s)
            bound = classify(pin_window, PROGRESS, self.last_frames)
            if self.method == "register" and done >= self.expected_pages and self.pin_running:
                # every page is pinned but the call has not returned: the driver is building its
                # page tables and DMA mappings for them (seen on an H200: 2.7 s of 3.3 s at 47 GiB)
                bound = {"bound": "driver", "reason": "all pages pinned (nr_foll_pin_acquired), the call has "
                                                      "not returned: the driver is mapping them"}
            elapsed = s["t"] - self.pin_t
            prog.update(pinned_pages=done, expected_pages=self.expected_pages,
                        pct=min(100.0, 100.0 * done / self.expected_pages) if self.expected_pages else None,
                        rate_pages_s=eta.get("rate_pages_s"), eta_s=eta.get("eta_s"),
                        swapin_pages_s=eta.get("swapin_pages_s"), swap_pages_left=eta.get("swap_pages_left"),
                        bound=bound["bound"], reason=bound.get("reason"), elapsed_s=round(elapsed, 3))
            if self.pin_running and bound["bound"] != "unknown" and len(pin_window) >= 2:
                self.bound_counts[bound["bound"]] = self.bound_counts.get(bound["bound"], 0) + 1
                if self.first_bound_at is None:
                    self.first_bound_at = elapsed
                    self.first_bound = bound
            if (self.pin_running and self.eta_at_20 is None and self.expected_pages and done >= 0.2 * self.expected_pages
                    and eta.get("eta_s") is not None and done < self.expected_pages):
                self.eta_at_20 = {"at_s": elapsed, "eta_s": eta["eta_s"], "predicted_total_s": elapsed + eta["eta_s"],
                                  "pct": 100.0 * done / self.expected_pages}
        elif self.phase == "prefault":
            rss = sum((p.get("vm_rss") or 0) for p in s["procs"].values())
            prog.update(rss_bytes=rss)
        s["progress"] = prog
        self.progress = prog
        sig = progress_signals(s, self.counter)
        if sig != self._last_progress_sig:
            self._last_progress_sig = sig
            self._last_progress_t = s["t"]
        self.timeline.write(json.dumps(s, separators=(",", ":")) + "\n")
        if self.on_tick:
            self.on_tick(prog)
        return s

    # -- events and waiting --------------------------------------------------------------------
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
        next_tick = max(time.monotonic(), self._last_tick_mono + self.interval)
        self._last_progress_t = self.now()
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
                if stall and self.now() - self._last_progress_t > self.stall_after:
                    return "stall"
            fds = [c.events_fd for c in self.children if c.alive]
            timeout = max(0.0, next_tick - time.monotonic())
            if fds:
                select.select(fds, [], [], timeout)
            else:
                time.sleep(timeout)

    def start_pin(self) -> None:
        s = self.tick()
        self.phase = "pin"
        self.pin_t = self.now()
        self.pin_vm = dict(s["vm"])
        self.pin_in_use = _in_use(s)
        self.pin_running = True
        for child in self.children:
            child.send("pin")

    # -- ending --------------------------------------------------------------------------------
    def capture_stacks(self, reason: str) -> str:
        lines = [f"# {reason} at {self.now():.1f} s: every thread of every child"]
        for child in self.children:
            lines.append(f"\n## rank {child.rank} pid {child.pid}")
            for tid in process.list_tasks(child.pid, proc=self.proc_root) or [child.pid]:
                st = process.read_status(child.pid, tid, proc=self.proc_root)
                text, why = process.read_stack(child.pid, tid, proc=self.proc_root)
                lines.append(f"### tid {tid} state {st.state if st else '?'} wchan "
                             f"{process.read_wchan(child.pid, tid, proc=self.proc_root)}")
                lines.append(text.rstrip() if text else f"(stack unreadable: {why})")
        text = "\n".join(lines) + "\n"
        rel = f"{self.prefix}stacks-{reason}.txt"
        self.run.add_file(rel, text.encode(), kind="stacks")
        return rel

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

    def finish(self) -> dict:
        self.pump_events()
        t = os.times()
        wall = max(1e-6, self.now())
        cpu = (t.user - self.cpu0.user) + (t.system - self.cpu0.system)
        self.timeline.close(kind="timeline")
        self.events_log.close(kind="events")
        for child in self.children:
            try:
                os.close(child.events_fd)
            except OSError:
                pass
            self.run.adopt(child.log_rel, kind="child-log")
        return {"watchdog_cpu_s": round(cpu, 3), "wall_s": round(wall, 3),
                "watchdog_cpu_pct_of_core": round(100.0 * cpu / wall, 2), "samples": len(self.samples)}

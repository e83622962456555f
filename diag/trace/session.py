"""One trace of a watch: two tracefs instances, their readers, the raw trace kept, the ledger.

Instance 0 (`hostpin-<pid>-0`) is filtered by set_event_pid to the watched threads (and, by
event-fork, their children): scheduler switches and wakeups, a kernel stack at each of their
sleeps (the `stacktrace` trigger on sched_switch, filtered to their sleeping switch-outs),
block bios and requests, reclaim, compaction, migration and mmap_lock events. Instance 1
(`hostpin-<pid>-1`) has no pid filter, since request completions fire in interrupt context:
block_rq_complete filtered to the devices the watched threads read from (learnt as they
issue), and the driver's Xid events where the kernel has them. Both run on CLOCK_MONOTONIC
(trace_clock mono), the watch's own clock.
"""
from __future__ import annotations

import atexit
import os
import re
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from .budget import Ledger
from .parse import LineParser
from .tracefs import Instance, Mount, TraceFsError, TRACEFS

__all__ = ["Tracer", "TraceUnavailable", "PID_EVENTS", "REQUIRED", "DEVICE_EVENTS", "buffer_kb", "CAP_BYTES"]

REQUIRED = ("sched/sched_switch", "sched/sched_wakeup")
PID_EVENTS = REQUIRED + (
    "block/block_rq_issue",   # block_bio_queue is left out: one event a 4 KiB page, a third of the trace
    "vmscan/mm_vmscan_direct_reclaim_begin", "vmscan/mm_vmscan_direct_reclaim_end",
    "vmscan/mm_vmscan_memcg_reclaim_begin", "vmscan/mm_vmscan_memcg_reclaim_end",
    "compaction/mm_compaction_begin", "compaction/mm_compaction_end",
    "mmap_lock/mmap_lock_start_locking", "mmap_lock/mmap_lock_acquire_returned",
    "migrate/mm_migrate_pages_start", "migrate/mm_migrate_pages",
)
# every read request on those devices too: a throttled bio (blk-throttle) is issued later by a
# kworker, out of the pid filter's sight (a file read's readahead under --read-rate)
DEVICE_EVENTS = ("block/block_rq_complete", "block/block_rq_issue")
OPTIONAL_EVENTS = ("nvidia/nvidia_dev_xid",)   # only where the NVIDIA driver is loaded
CAP_BYTES = 64 << 20          # raw trace kept in the run from its start, per instance
TAIL_BYTES = 8 << 20          # past CAP_BYTES, its last bytes (a ring in memory), kept as trace/NAME.tail.txt
MAX_STACK_TIDS = 200          # the stack trigger's filter names at most this many threads
# kernel stacks at sleeps, at most this many a second (the trigger re-armed every second): a
# stack is 13 lines of text, most of the trace's cost; a sleep past the quota gets the cause of
# its thread's last stack, and the budget counts that time apart (inferred_s)
STACKS_PER_S = 50
FOLLOW_EVERY_S = 1.0
_FLUSH_EVERY_S = 0.5
READ_EVERY_S = 0.25


class TraceUnavailable(RuntimeError):
    """--trace cannot run here; the message names what is missing (the watch samples instead)."""


def buffer_kb(ncpu: int | None = None) -> tuple[int, int]:
    """Per-CPU ring sizes (KiB) of the two instances: 64 MiB over all CPUs for the watched
    threads' events, 1 to 8 MiB a CPU, and a quarter of that for completions.

    >>> buffer_kb(2), buffer_kb(16)
    ((8192, 2048), (4096, 1024))
    """
    ncpu = ncpu or os.cpu_count() or 1
    pid_kb = max(1024, min(8192, (64 << 10) // ncpu))
    return pid_kb, max(256, pid_kb // 4)


def _threads(pid: int) -> list[int]:
    try:
        return sorted(int(t) for t in os.listdir(f"/proc/{pid}/task") if t.isdigit())
    except OSError:
        return []


def _swap_disks() -> set[str]:
    """major:minor of the disks behind active swap (block events name the whole disk)."""
    out: set[str] = set()
    try:
        lines = Path("/proc/swaps").read_text().splitlines()[1:]
    except OSError:
        return out
    for line in lines:
        parts = line.split()
        if not parts:
            continue
        try:
            st = os.stat(parts[0].replace("\\040", " "))
        except OSError:
            continue
        dev = st.st_rdev if parts[1] == "partition" else st.st_dev
        out.add(_disk_of(os.major(dev), os.minor(dev)))
    return out


def _disk_of(major: int, minor: int) -> str:
    sysdev = Path(f"/sys/dev/block/{major}:{minor}")
    try:
        if (sysdev / "partition").exists():
            return (sysdev.resolve().parent / "dev").read_text().strip()
    except OSError:
        pass
    return f"{major}:{minor}"


@dataclass
class _Reader:
    inst: Instance
    rel: str                       # the raw trace's name in the run
    stream: Any
    cap: int
    raw_bytes: int = 0
    kept_bytes: int = 0
    parser: LineParser = field(default_factory=LineParser)
    pending: bytearray = field(default_factory=bytearray)
    tail: bytes = b""
    ring: deque = field(default_factory=deque)   # past the cap: the last chunks, TAIL_BYTES and one chunk at most
    ring_bytes: int = 0
    tail_kept: int = 0


class Tracer:
    """Start with Tracer.start(run, pids, t0); stop() in a finally; budget(tid, start_s, end_s)."""

    def __init__(self, run: Any, t0: float, mount: Mount, cap_bytes: int = CAP_BYTES):
        self.run, self.t0, self.mount, self.cap = run, t0, mount, cap_bytes
        self.ledger = Ledger()
        self.instances: list[Instance] = []
        self.readers: list[_Reader] = []
        self.pids: list[int] = []
        self.tids: set[int] = set()
        self.threads_of: dict[int, set[int]] = {}
        self.devices: set[str] = set()
        self._stack_filter = ""
        self._stack_armed = False
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self.notes: list[str] = []
        self.summary: dict[str, Any] = {}
        self.stopped = False
        self.kb = buffer_kb()

    # -- set up ------------------------------------------------------------------------------
    @classmethod
    def start(cls, run: Any, pids: Iterable[int], t0: float, devices: Iterable[str] = (),
              cap_bytes: int = CAP_BYTES) -> "Tracer":
        if os.geteuid() != 0:
            raise TraceUnavailable("--trace needs root (tracefs)")
        try:
            mount = Mount.acquire(TRACEFS)
        except TraceFsError as exc:
            raise TraceUnavailable(str(exc)) from None
        self = cls(run, t0, mount, cap_bytes)
        atexit.register(self.stop)
        try:
            self._setup(list(pids), set(devices))
        except TraceUnavailable:
            self.stop()
            raise
        except (OSError, TraceFsError) as exc:
            self.stop()
            raise TraceUnavailable(f"cannot set up tracefs: {exc}") from None
        return self

    def _setup(self, pids: list[int], devices: set[str]) -> None:
        main = Instance.create(self.mount, 0)
        self.instances.append(main)
        missing = [e for e in REQUIRED if not main.has(e)]
        if missing:
            raise TraceUnavailable(f"this kernel has no {', '.join(missing)} tracepoint")
        if not (main.path / "set_event_pid").exists():
            raise TraceUnavailable("this kernel's tracefs has no set_event_pid")
        dev = Instance.create(self.mount, 1)
        self.instances.append(dev)
        pid_kb, dev_kb = self.kb
        main.write("buffer_size_kb", str(pid_kb))
        dev.write("buffer_size_kb", str(dev_kb))
        for inst in (main, dev):
            inst.write("tracing_on", "0")
            inst.write("trace_clock", "mono")
        main.write("options/event-fork", "1")
        self.pids = pids
        self._follow()
        for e in PID_EVENTS:
            main.enable(e)
        self.devices = devices | _swap_disks()
        self._set_device_filter()
        for e in DEVICE_EVENTS:
            dev.enable(e, self._device_filter())
        for e in OPTIONAL_EVENTS:
            if dev.has(e):
                dev.enable(e)
        for i, inst in enumerate(self.instances):
            rel = f"trace/{'threads' if i == 0 else 'devices'}.txt"
            fd = os.open(inst.path / "trace_pipe", os.O_RDONLY | os.O_NONBLOCK)
            reader = _Reader(inst, rel, self.run.open_stream(rel), self.cap)
            reader.fd = fd  # type: ignore[attr-defined]
            self.readers.append(reader)
        for inst in self.instances:
            inst.write("tracing_on", "1")
        for r in self.readers:
            t = threading.Thread(target=self._read_loop, args=(r,), name=f"hostpin-trace-{r.rel}", daemon=True)
            t.start()
            self._threads.append(t)
        missing = sorted(set(main.missing + dev.missing))
        if missing:
            self.notes.append(f"trace: this kernel has no {', '.join(missing)} tracepoint: left out of the budget")

    def _device_filter(self) -> str:
        devs = sorted(self.devices)
        if not devs:
            return "dev == 0"
        terms = []
        for d in devs:
            major, minor = (int(x) for x in d.split(":"))
            terms.append(f"dev == {(major << 20) | minor}")
        # reads only: a swap-out's writes (262,144 completions for 1 GiB, on the CPU that takes the
        # interrupts) overran that CPU's ring on the H200 and took the reads' completions with them
        return f"({' || '.join(terms)}) && rwbs ~ \"R*\""

    def _set_device_filter(self) -> None:
        for e in DEVICE_EVENTS:
            if len(self.instances) > 1 and self.instances[1].has(e):
                try:
                    self.instances[1].write(f"events/{e}/filter", self._device_filter())
                except OSError as exc:
                    self.notes.append(f"trace: cannot filter {e} by device: {exc.strerror}")

    def _follow(self) -> None:
        """The watched processes' threads into set_event_pid, the stack filter and the ledger."""
        new: set[int] = set()
        for p in self.pids:
            tids = set(_threads(p))
            self.threads_of.setdefault(p, set()).update(tids)
            new |= tids - self.tids
        if not new:
            self._arm_stacks()
            return
        main = self.instances[0]
        main.write("set_event_pid", " ".join(str(t) for t in sorted(new)), append=bool(self.tids))
        self.tids |= new
        self.ledger.watch(new)
        tids = sorted(self.tids)[:MAX_STACK_TIDS]
        self._stack_filter = "(" + " || ".join(f"prev_pid == {t}" for t in tids) + ") && prev_state & 3"
        self._arm_stacks()

    def _arm_stacks(self) -> None:
        """(Re)arm the stacktrace trigger for STACKS_PER_S more sleeps of the watched threads."""
        if not self._stack_filter or self._stack_filter == "none" or not self.instances:
            return
        main, trig = self.instances[0], "events/sched/sched_switch/trigger"
        try:
            if self._stack_armed:
                main.write(trig, "!stacktrace")
            main.write(trig, f"stacktrace:{STACKS_PER_S} if {self._stack_filter}")
            self._stack_armed = True
        except OSError as exc:
            if not self._stack_armed:
                self.notes.append(f"trace: no kernel stack at sleeps (stacktrace trigger: {exc.strerror}); "
                                  "sleeps are named by the events around them only")
                self._stack_filter = "none"

    def follow(self, pids: Iterable[int]) -> None:
        """Watch these processes too (the launcher form's tree, as it grows)."""
        with self._lock:
            self.pids = sorted(set(self.pids) | set(pids))

    # -- reading -----------------------------------------------------------------------------
    def _read_loop(self, r: _Reader) -> None:
        # read in batches every READ_EVERY_S, not on poll: trace_pipe wakes a poller at every
        # event, which cost several times the parsing; the rings hold far more than a batch
        last_flush = last_follow = time.monotonic()
        while True:
            stopping = self._stop.is_set()
            if not stopping:
                self._stop.wait(READ_EVERY_S)
            got = self._drain(r)
            now = time.monotonic()
            if now - last_flush >= _FLUSH_EVERY_S:
                self._flush(r)
                last_flush = now
            if r is self.readers[0] and now - last_follow >= FOLLOW_EVERY_S and not stopping:
                last_follow = now
                with self._lock:
                    try:
                        self._follow()
                    except OSError:
                        pass
                    if not self.ledger.devices <= self.devices:
                        self.devices |= self.ledger.devices
                        self._set_device_filter()
            if stopping and not got:
                break
        self._flush(r)

    def _drain(self, r: _Reader) -> int:
        total = 0
        while True:
            try:
                chunk = os.read(r.fd, 1 << 16)  # type: ignore[attr-defined]
            except BlockingIOError:
                break
            except OSError:
                break
            if not chunk:
                break
            total += len(chunk)
            r.raw_bytes += len(chunk)
            rest = chunk
            if r.kept_bytes < r.cap:
                keep = chunk[: r.cap - r.kept_bytes]
                r.pending += keep
                r.kept_bytes += len(keep)
                rest = chunk[len(keep):]
            if rest:
                r.ring.append(rest)
                r.ring_bytes += len(rest)
                while r.ring and r.ring_bytes - len(r.ring[0]) >= TAIL_BYTES:
                    r.ring_bytes -= len(r.ring.popleft())
            data = r.tail + chunk
            cut = data.rfind(b"\n") + 1
            r.tail = data[cut:]
            events = [e for line in data[:cut].decode("utf-8", "replace").splitlines() for e in r.parser.feed(line)]
            self.ledger.feed_all(events, device=r is not self.readers[0])
            if len(chunk) < (1 << 16):
                break
        return total

    def _flush(self, r: _Reader) -> None:
        if r.pending:
            r.stream.write(bytes(r.pending))
            r.pending.clear()

    def _write_tail(self, r: _Reader) -> None:
        """Past the cap, the trace's last TAIL_BYTES (from a line's start) as trace/NAME.tail.txt,
        after one line that says how much between the two files was read and not kept."""
        if not r.ring:
            return
        data = b"".join(r.ring)[-TAIL_BYTES:]
        if r.raw_bytes - r.kept_bytes > len(data):  # bytes left out before it: start at a line
            nl = data.find(b"\n")
            data = data[nl + 1:] if nl >= 0 else b""
        gap = r.raw_bytes - r.kept_bytes - len(data)
        rel = r.rel[:-len(".txt")] + ".tail.txt" if r.rel.endswith(".txt") else r.rel + ".tail"
        try:
            stream = self.run.open_stream(rel)
            stream.write(f"# hostpin: the trace's last {len(data)} bytes; the {gap} bytes between "
                         f"{r.rel} and here were read and counted, not kept\n".encode())
            stream.write(data)
            stream.close(kind="trace", source=str(r.inst.path / "trace_pipe"), tail_bytes=len(data),
                         gap_bytes=gap, raw_bytes=r.raw_bytes)
            r.tail_kept = len(data)
        except (OSError, ValueError):
            pass

    # -- end ---------------------------------------------------------------------------------
    def stop(self) -> dict[str, Any]:
        """Stop tracing, read what is left, remove the instances (and the mount if made). Idempotent."""
        if self.stopped:
            return self.summary
        self.stopped = True
        atexit.unregister(self.stop)
        for inst in self.instances:
            try:
                inst.write("tracing_on", "0")
            except OSError:
                pass
        overruns = []
        for inst in self.instances:
            try:
                overruns.append(inst.per_cpu_overrun())
            except OSError:
                overruns.append(0)
        overrun = sum(overruns)
        self._stop.set()
        for t in self._threads:
            t.join(timeout=10)
        self.ledger.feed_all([e for r in self.readers for e in r.parser.flush()])
        self.ledger.close(time.monotonic())
        problems = []
        for r in self.readers:
            try:
                os.close(r.fd)  # type: ignore[attr-defined]
            except OSError:
                pass
            try:
                r.stream.close(kind="trace", source=str(r.inst.path / "trace_pipe"), cap_bytes=r.cap,
                               raw_bytes=r.raw_bytes, truncated=r.raw_bytes > r.kept_bytes)
            except (OSError, ValueError):
                pass
            self._write_tail(r)
        for inst in self.instances:
            err = inst.remove()
            if err:
                problems.append(err)
        err = self.mount.release()
        if err:
            problems.append(err)
        ncpu = os.cpu_count() or 1
        self.summary = {
            "instances": [str(i.path.name) for i in self.instances],
            "clock": "mono", "t0_monotonic": self.t0,   # a phase's started_s + t0 is its time in the raw trace
            "events_enabled": sorted(set(e for i in self.instances for e in i.enabled)),
            "events_missing": sorted(set(e for i in self.instances for e in i.missing)),
            "buffer_kb_per_cpu": list(self.kb), "buffer_bytes": (self.kb[0] + self.kb[1]) * 1024 * ncpu,
            # the rings' overrun and trace_pipe's "LOST n EVENTS" lines count the same events (a
            # consuming reader is told of the overrun since its last read): the larger, not the sum
            "events": self.ledger.events, "dropped": max(overrun, self.ledger.lost),
            "dropped_by_instance": overruns, "lost_lines_events": self.ledger.lost,
            "raw_bytes": sum(r.raw_bytes for r in self.readers),
            "kept_bytes": sum(r.kept_bytes for r in self.readers),
            "tail_bytes": sum(r.tail_kept for r in self.readers),
            "files": [r.rel for r in self.readers] + [r.rel[:-len(".txt")] + ".tail.txt" for r in self.readers
                                                       if r.tail_kept], "threads": len(self.tids),
            "devices": sorted(self.devices), "xids": self.ledger.xids,
            "mounted_tracefs": self.mount.made, "left_mounted": self.mount.mounted_by_us, "cleanup_problems": problems,
            "unparsed_lines": sum(r.parser.unparsed for r in self.readers), "notes": self.notes,
        }
        return self.summary

    @property
    def dropped(self) -> int:
        return int(self.summary.get("dropped") or 0)

    def budget(self, tid: int, start_s: float, end_s: float) -> dict | None:
        """The budget of tid over [start_s, end_s] of the watch's clock (seconds since t0)."""
        if tid not in self.ledger.threads:
            return None
        b = self.ledger.budget(tid, self.t0 + start_s, self.t0 + end_s, self.dropped)
        return b

"""Reading the per-VMA swap of a watched process, now and then, without waiting on it.

/proc/PID/smaps is the one place that says which of a process's memory is in swap, VMA by
VMA (diag.watch.regions makes the region's swap of it). Reading it takes the process's mmap
lock for reading: a pin holds that lock for the whole call (the NVIDIA driver's
pin_user_pages, mlock's populate), and a reader queues behind any thread of the target that
waits to write it (an mmap or munmap in another thread), until the pin returns. So it is read
in a thread of its own, at most one read per process at a time, and the sampler waits for it
at most WAIT_MS: a read that takes longer lands in a later sample, and one that never returns
leaves the phase's ETA on the whole VmSwap. While a read holds the lock, a writer of the
target waits for it (milliseconds: the read's cost is kept in the reading). The unit is the
VMA: memory that shares a VMA with the region (adjacent anonymous mappings with the same flags
merge into one) counts as the region's. A process is read
when a watch starts, at once and REREAD_S after when one of its phases has no region yet, and
every EVERY_S while a phase is open. Nothing is written and nothing else of the process is read.
"""
from __future__ import annotations

import threading
import time
from typing import Any

from .. import process
from ..rootfs import read_bounded
from .regions import parse_smaps_swap

__all__ = ["SmapsSwap", "EVERY_S", "REREAD_S", "WAIT_MS", "LIMIT", "KEEP_VMAS"]

EVERY_S = 5.0        # a process in a phase is read again this often ...
REREAD_S = 0.9       # ... and this soon after the last read while a phase waits for its region (two samples)
WAIT_MS = 50         # the sampler waits this long for a read it started
LIMIT = 64 << 20     # smaps of a process with 50,000 VMAs is ~60 MiB
KEEP_VMAS = 256      # a reading keeps the VMAs with the most swap (the rest summed): timelines stay small


class _Read:
    def __init__(self, proc: str, pid: int, t: float):
        self.proc, self.pid, self.t = proc, pid, t
        self.path = f"{proc}/{pid}/smaps"
        self.done = threading.Event()
        self.result: dict[str, Any] | None = None
        self.why: str | None = None
        threading.Thread(target=self._run, name="hostpin-smaps", daemon=True).start()

    def _swap(self) -> int | None:
        st = process.read_status(self.pid, proc=self.proc)
        return st.vm_swap_bytes if st is not None else None

    def _run(self) -> None:
        try:
            before = self._swap()
            t0 = time.monotonic()
            text = read_bounded(self.path, LIMIT)
            ms = (time.monotonic() - t0) * 1000
            after = self._swap()
            parsed = parse_smaps_swap(text)
            if parsed is None or before is None or after is None:
                self.why = "smaps unreadable" if parsed is None else "process gone"
            else:
                vmas, count = parsed
                self.result = {"t": round(self.t, 3), "ms": round(ms, 2), "vm_swap": (before + after) // 2,
                               "vma_count": count, "vmas": vmas}
                if len(vmas) > KEEP_VMAS:  # the timeline keeps the largest: a VMA with less is no region's bulk
                    kept = sorted(sorted(vmas, key=lambda v: -v[2])[:KEEP_VMAS])
                    self.result.update(vmas=kept, vmas_left_out=len(vmas) - len(kept),
                                       swap_left_out_bytes=sum(v[2] for v in vmas) - sum(v[2] for v in kept))
        except OSError as exc:
            self.why = exc.strerror or str(exc)
        except Exception as exc:  # noqa: BLE001 - a reader thread must never take the watch down
            self.why = f"{type(exc).__name__}: {exc}"
        finally:
            self.done.set()


class SmapsSwap:
    """Per-process smaps readings for the sampler: `poll(pid, t, urgent)` starts a read when one
    is due and returns what goes into the sample (a reading, a wait, or None)."""

    def __init__(self, proc: str = "/proc"):
        self.proc = proc
        self.reads: dict[int, _Read] = {}
        self.last: dict[int, float] = {}
        self.problems: dict[int, str] = {}
        self.costs_ms: list[float] = []

    def poll(self, pid: int, t: float, urgent: bool = False) -> dict[str, Any] | None:
        job = self.reads.get(pid)
        if job is not None and job.done.is_set():  # one that came back since (it lands in this sample)
            self.reads.pop(pid, None)
            return self._landed(pid, job)
        if job is None:
            last = self.last.get(pid)
            if last is None or t - last >= (REREAD_S if urgent else EVERY_S):
                job = self.reads[pid] = _Read(self.proc, pid, t)
                self.last[pid] = t
                if job.done.wait(WAIT_MS / 1000):
                    self.reads.pop(pid, None)
                    return self._landed(pid, job)
        if job is None:
            return None
        # not back within the wait: later samples say how long it has waited
        return {"waiting_s": round(t - job.t, 3)} if t > job.t else None

    def _landed(self, pid: int, job: _Read) -> dict[str, Any]:
        if job.result is None:
            self.problems.setdefault(pid, job.why or "unreadable")
            return {"error": job.why}
        self.costs_ms.append(job.result["ms"])
        return job.result

    def forget(self, pids) -> None:
        """Processes no longer watched (a read still running is left to end by itself)."""
        for pid in list(self.last):
            if pid not in pids:
                self.last.pop(pid, None)

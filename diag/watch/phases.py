"""Pin phases in any thread of the watched processes, noticed from samples (pure).

A thread is in a pin phase while its kernel stack is inside a pin (get_user_pages under
mlock, pin_user_pages, MADV_POPULATE, the driver's page allocation; see frames.in_pin_path)
or its system call is mlock/mlock2/mlockall (readable without a stack, for a process one may
ptrace), or it runs in the kernel while its process's RssShmem (or, if the driver maps its
pages into the process only at the end, the node's Shmem) grows fast: the driver allocating
pinned pages, whose running thread's stack cannot be read; or it runs in the kernel faulting
tens of thousands of pages a second: get_user_pages faulting a region in. It has left the phase when it is seen outside twice in a row: asleep (S) with a
stack outside the pin, in another system call, or gone. A thread that goes from one kind of
pin to another without being seen outside (a prefault, then mlock) starts a new phase. A
process that exits, is dying (every thread past do_exit's start, or SIGKILL pending) or is a
zombie ends its phases as gone: exited inside the pin, unless a sample showed the thread
outside it first (a zombie counts as no thread at all, never as outside) or the process, one
thread when last seen, ended by an exit code (its exit() came from user space, after the pin
returned); one killed by a signal was interrupted; one that vanished between two samples
(reaped before a sample saw how it ended) has an unknown outcome. A kind guessed from
counters (an allocation: RssShmem growing) is refined when a stack or system call names it
(mlock of shared memory), never split into two phases; with no NVIDIA driver loaded nothing
is guessed to be the driver's. A running thread's stack is often
cut short (the kernel does not stop it to unwind it), so a running thread with a stack that
says nothing keeps its phase.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from .frames import in_pin_path, normalize, pin_kind
from .tracker import _pins

__all__ = ["Phase", "PhaseDetector", "PIN_CALLS", "alive"]

PIN_CALLS = ("mlock", "mlock2", "mlockall")
DEAD = ("Z", "X", "x")


def alive(p: dict) -> bool:
    """A process of a sample that still lives: not a zombie (its status has no memory lines:
    VmSwap reads 0, which looks like every page in) and with a thread that is not dead."""
    threads = p.get("threads") or {}
    return p.get("state") not in DEAD and (not threads or any(t.get("state") not in DEAD for t in threads.values()))


@dataclass
class Phase:
    pid: int
    tid: int
    comm: str | None
    started_t: float
    seen_start: bool
    kind: str | None = None
    syscall: Any = None
    size_hint: int | None = None       # bytes, from mlock's length argument
    ended_t: float | None = None
    end_reason: str | None = None      # 'returned', 'thread gone', 'process gone', 'process vanished'
    guessed: bool = False              # the kind was guessed from counters: a stack or call may refine it
    _outside: int = field(default=0, repr=False)
    _out_since: float | None = field(default=None, repr=False)
    _pins0: int = field(default=0, repr=False)       # pins outstanding (system-wide) when it began ...
    _pins_peak: int = field(default=0, repr=False)   # ... and the most seen since
    _undo_since: float | None = field(default=None, repr=False)  # first seen letting go of what it pinned
    at_return: dict | None = field(default=None, repr=False)     # its progress when first seen outside


# a running thread's stack is not readable, so the driver's page allocation (cudaHostAlloc: the
# thread runs in the kernel, R with an empty stack, for 18 s at 47 GiB on the H200) is seen
# from the thread's system time and its process's RssShmem instead
KERNEL_SHARE = 0.8                 # of the interval spent in the kernel ...
USER_SHARE = 0.1                   # ... and almost none in user space
SHMEM_BYTES_S = 256 << 20          # while the process's RssShmem grows this fast (cudaHostAlloc: 2.5 GiB/s)
# ... or while the thread itself faults this fast: get_user_pages faulting pages in for a pin
# (the H200's stuck 16 GiB file registration: R, 98% in the kernel, 840k faults/s, its stack
# and system call unreadable because it never stopped running)
FAULTS_S = 20_000
# the undo of a pin, in the kernel like the pin itself, while nothing in its stack says "pin": the
# process's RssShmem falling this fast (cudaFreeHost: 47 GiB in ~1.5 s on the H200), or pins
# outstanding back below half of what the phase added, when it added this many pages or more
# (cudaHostUnregister): a neighbour would have to let go of as many pages at that moment
UNDO_PAGES = SHMEM_BYTES_S // 4096
CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _shares(th: dict, before: dict | None, dt: float) -> tuple[float, float] | None:
    """(kernel, user) shares of the interval the thread ran, from its stat's stime and utime."""
    if before is None or dt <= 0 or th.get("stime") is None or before.get("stime") is None:
        return None
    return ((th["stime"] - before["stime"]) / CLK_TCK / dt, (th.get("utime", 0) - before.get("utime", 0)) / CLK_TCK / dt)


def _faults_per_s(th: dict, before: dict | None, dt: float) -> float:
    if before is None or dt <= 0 or th.get("minflt") is None or before.get("minflt") is None:
        return 0.0
    return ((th["minflt"] + (th.get("majflt") or 0)) - (before["minflt"] + (before.get("majflt") or 0))) / dt


# frames of a fault taken in user space: get_user_pages faults pages in through handle_mm_fault
# without them, so a stack that has them (and nothing of a pin) is the process's own fault
_USER_FAULT = {"asm_exc_page_fault", "exc_page_fault", "do_user_addr_fault", "irqentry_exit_to_user_mode"}


def _verdict(th: dict, shares: tuple[float, float] | None = None, allocating: bool = False,
             undoing: bool = False) -> bool | None:
    """True: in a pin; False: certainly not; None: cannot tell from this sample."""
    frames = th.get("frames")
    call = th.get("syscall")
    if frames and in_pin_path(frames):
        return True
    if undoing:
        return False  # freeing or unpinning what it pinned: the pin has returned
    if call in PIN_CALLS:
        return True
    if frames and any(normalize(f.split(" [", 1)[0]) in _USER_FAULT for f in frames):
        # a page fault taken in user space (a copy reading swapped memory or its file), not
        # get_user_pages: the stack is now, the counters are the interval before it, in which an
        # allocation may have ended (H200, Tensor.pin_memory() of a cold file: RssShmem grew to
        # its 4 GiB and the copy's first 288 MiB were read between the same two samples)
        return False
    if allocating:
        return True
    if shares is not None and th.get("state") == "R" and shares[1] >= 0.5:
        return False  # running in user space: whatever it pinned has returned
    if frames is not None and th.get("state") in ("S", "I", "T", "t"):
        return False  # (a zombie or dying thread is not "outside": it is gone, see PhaseDetector.update)
    if call not in (None, "running", "ioctl"):
        return False
    return None


def _listed(sample: dict, pid: int) -> bool:
    """Whether a sample lists the process at all (a recorded zombie is listed, dead)."""
    procs = sample.get("procs") or {}
    return pid in procs or str(pid) in procs or str(pid) in (sample.get("listed") or ())


class PhaseDetector:
    def __init__(self, end_after: int = 2, nvidia: bool = True):
        self.end_after = end_after
        self.nvidia = nvidia  # an NVIDIA driver is loaded: an allocation seen from counters may be its
        self.active: dict[tuple[int, int], Phase] = {}
        self.done: list[Phase] = []
        self.samples_seen = 0
        self.prev: dict | None = None
        self.outside: dict[tuple[int, int], bool | None] = {}  # each thread's last verdict
        self.threads: dict[int, int] = {}  # each process's live threads when last seen alive

    def update(self, sample: dict) -> tuple[list[Phase], list[Phase]]:
        """(phases that started, phases that ended) with this sample."""
        self.samples_seen += 1
        started, ended = [], []
        procs = {pid: p for pid, p in (sample.get("procs") or {}).items() if alive(p)}
        prev = self.prev or {}
        dt = sample["t"] - prev.get("t", sample["t"])
        pins_now = _pins(sample)
        for pid, p in procs.items():
            self.threads[int(pid)] = sum(1 for th in (p.get("threads") or {}).values() if th.get("state") not in DEAD)
            before = (prev.get("procs") or {}).get(pid) or {}
            shmem_s = ((p.get("rss_shmem") or 0) - (before.get("rss_shmem") or 0)) / dt if before and dt > 0 else 0.0
            own_shmem_s = shmem_s
            if shmem_s <= 0 and dt > 0:  # the driver's pages may be mapped into the process only at the end
                shmem_s = ((sample.get("mem") or {}).get("Shmem") or 0) - ((prev.get("mem") or {}).get("Shmem") or 0)
                shmem_s /= dt
            for tid, th in (p.get("threads") or {}).items():
                if th.get("state") in DEAD:
                    continue  # gone: it will not return from a pin (a thread absent from the sample)
                key = (int(pid), int(tid))
                th_before = (before.get("threads") or {}).get(tid)
                shares = _shares(th, th_before, dt)
                faults_s = _faults_per_s(th, th_before, dt)
                in_kernel = bool(shares and th.get("state") in ("R", "D") and shares[0] >= KERNEL_SHARE
                                 and shares[1] <= USER_SHARE)
                allocating = in_kernel and (shmem_s >= SHMEM_BYTES_S or faults_s >= FAULTS_S)
                phase = self.active.get(key)
                if phase is not None:
                    phase._pins_peak = max(phase._pins_peak, pins_now)
                gain = phase._pins_peak - phase._pins0 if phase is not None else 0
                undoing = bool(phase is not None and th.get("state") in ("R", "D") and (
                    own_shmem_s <= -SHMEM_BYTES_S or (gain >= UNDO_PAGES and pins_now <= phase._pins0 + gain // 2)))
                state = _verdict(th, shares, allocating and not undoing, undoing)
                if phase is not None:
                    phase._undo_since = (phase._undo_since or sample["t"]) if undoing else \
                        (None if state else phase._undo_since)
                # the start was seen when the last sample showed the thread out of a pin; for a stack
                # or a call that says "pin", a last sample that could not tell counts as outside too
                # (an allocation seen from times needs two samples: it may have begun before either)
                last = self.outside.get(key, True)
                was_outside = last is False or (last is None and not allocating)
                self.outside[key] = state
                named = pin_kind(th.get("frames") or []) or ("mlock" if th.get("syscall") in PIN_CALLS else None)
                if phase is None:
                    if state:
                        phase = Phase(pid=int(pid), tid=int(tid), comm=th.get("comm") or p.get("name"),
                                      _pins0=_pins(prev) if prev else pins_now, _pins_peak=pins_now,
                                      started_t=prev.get("t", sample["t"]) if allocating else sample["t"],
                                      seen_start=was_outside,
                                      kind=named or ("hostalloc" if self.nvidia and allocating
                                                     and shmem_s >= SHMEM_BYTES_S else None),
                                      guessed=named is None,
                                      syscall=th.get("syscall"), size_hint=th.get("syscall_len"))
                        self.active[key] = phase
                        started.append(phase)
                    continue
                kind = named
                if kind and phase.guessed:  # what the counters suggested, now named by a stack or a call
                    phase.kind, phase.guessed = kind, False
                if kind and phase.kind and kind != phase.kind:
                    # another call in the same thread without a visible return (a prefault, then mlock)
                    ended.append(self._close(key, sample["t"], "returned"))
                    phase = Phase(pid=int(pid), tid=int(tid), comm=phase.comm, started_t=sample["t"], seen_start=True,
                                  _pins0=pins_now, _pins_peak=pins_now,
                                  kind=kind, syscall=th.get("syscall"), size_hint=th.get("syscall_len"))
                    self.active[key] = phase
                    started.append(phase)
                    continue
                if phase.kind is None and kind:
                    phase.kind, phase.guessed = kind, False
                if phase.size_hint is None and th.get("syscall_len"):
                    phase.size_hint = th["syscall_len"]
                if state is False:
                    if phase._out_since is None:  # the first time outside since it was last seen inside
                        phase._out_since = sample["t"]
                    phase._outside += 1
                    if phase._outside >= self.end_after:  # it returned when it was first seen outside
                        ended.append(self._close(key, phase._out_since, "returned"))
                elif state:  # inside again: an earlier look outside was not the return
                    phase._outside = 0
                    phase._out_since = None
                # (a sample that cannot tell, a running thread with no stack, neither ends nor resumes it:
                # a copy after the pin, R in user space between its faults, looked so most of the time)
        self.prev = sample
        for key, phase in list(self.active.items()):
            pid, tid = key
            p = procs.get(pid) or procs.get(str(pid))
            if p is None:  # exited, or dying or a zombie (the sampler leaves those out)
                how = (sample.get("ended") or {}).get(pid) or (sample.get("ended") or {}).get(str(pid)) or {}
                if "exit" in how and self.threads.get(pid, 0) == 1:
                    # its only thread called exit() from user space: the pin had returned
                    ended.append(self._close(key, sample["t"], "returned"))
                elif not how and not _listed(sample, pid):  # reaped unseen: the pin may have returned
                    ended.append(self._close(key, sample["t"], "process vanished"))
                else:  # killed (the pin interrupted), or it cannot be told: exited inside the pin
                    ended.append(self._close(key, sample["t"], "process gone"))
            else:
                th = (p.get("threads") or {}).get(tid) or (p.get("threads") or {}).get(str(tid))
                if th is None or th.get("state") in DEAD:
                    ended.append(self._close(key, sample["t"], "thread gone"))
        return started, ended

    def _close(self, key: tuple[int, int], t: float, reason: str) -> Phase:
        phase = self.active.pop(key)
        if reason != "returned" and phase._outside:  # seen out of the pin, then gone: it returned first
            reason, t = "returned", phase._out_since
        elif reason != "returned" and phase._undo_since is not None:  # seen letting go of its pages, then gone
            reason, t = "returned", min(phase._undo_since, phase._out_since or phase._undo_since)
        phase.ended_t, phase.end_reason = t, reason
        self.done.append(phase)
        return phase

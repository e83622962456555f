"""Reading a pinning process without touching it: one sample of the node and the watched
processes per call.

Per process it reads /proc/PID/status (VmRSS, VmSwap, RssAnon/RssFile/RssShmem, VmLck),
/proc/PID/io (read_bytes) and every thread's /proc/PID/task/TID/stat (state, minor and major
faults); for the threads that matter (those in a pin phase, the main thread, and a few busy
ones in turn) also wchan, the kernel stack (root) and the system call with its arguments.
None of these takes the mmap lock that pin_user_pages holds for the whole call; maps, cmdline
and environ do, and are never read. smaps does too, and is read only by diag.watch.smaps, for a
process in a phase, now and then, in a thread of its own that a sample waits on for at most
50 ms (its per-VMA swap: the region a phase reads). Nothing is written and no signal is sent.
System-wide: /proc/vmstat as deltas since the first sample, a few /proc/meminfo figures and
memory PSI. Everything is read under a Root, like diag's readers.
"""
from __future__ import annotations

import os
from typing import Any, Iterable

from .. import process
from ..meminfo import parse_meminfo
from ..pagesize import live_page_size
from ..psi import parse_psi
from ..rootfs import Root
from ..vmstat import WATCHED_PREFIXES, parse_vmstat
from .frames import frame_module
from .smaps import SmapsSwap

__all__ = ["Sampler", "descendants", "VM_PREFIXES", "MEM_KEYS"]

VM_PREFIXES = WATCHED_PREFIXES + ("zswp", "pgpgin", "pgpgout", "allocstall", "pgscan_direct", "pgsteal_direct",
                                  "workingset_refault")
MEM_KEYS = ("MemTotal", "MemAvailable", "MemFree", "SwapFree", "SwapTotal", "SwapCached", "Cached", "AnonHugePages",
            "Mlocked", "Shmem")


def _frames(text: str) -> list[str]:
    """Stack frames, innermost first, with the module of module frames ('x [nvidia]')."""
    lines = [line for line in text.splitlines() if line.strip()]
    names = process.parse_stack(text)
    out = []
    for name, line in zip(names, lines):
        module = frame_module(line)
        out.append(f"{name} [{module}]" if module else name)
    return out


def descendants(root: Root, pid: int) -> list[int]:
    """pid and every process below it, from each process's parent in /proc/*/stat (one pass
    over /proc: CONFIG_PROC_CHILDREN is often off)."""
    parents: dict[int, list[int]] = {}
    for entry in root.listdir("proc"):
        if not entry.isdigit():
            continue
        st = process.read_task_stat(int(entry), proc=str(root.path / "proc"))
        if st is not None:
            parents.setdefault(st.ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        if p in out:
            continue
        out.append(p)
        todo.extend(parents.get(p, []))
    return sorted(out)


SIGKILL_BIT = 1 << (9 - 1)


def _killed(st: process.ProcStatus) -> bool:
    """SIGKILL pending: the process is being killed (a fatal signal puts SIGKILL in every
    thread's pending set: the pin is interrupted and will not return)."""
    for key in ("SigPnd", "ShdPnd"):
        try:
            if int(st.raw.get(key) or "0", 16) & SIGKILL_BIT:
                return True
        except ValueError:
            pass
    return False


def _why(why: str | None) -> str | None:
    """A permission error as root is no missing root: ptrace's access checks (another user
    namespace, a dumpable flag, Yama) or kernel lockdown refuse it."""
    if why == "needs root" and os.geteuid() == 0:
        return "permission denied even as root (ptrace access check or kernel lockdown)"
    return why


class Sampler:
    def __init__(self, root: Root | None = None, stacks_per_tick: int = 4):
        self.root = root or Root("/")
        self.proc = str(self.root.path / "proc")
        self.page = live_page_size()
        self.stacks_per_tick = stacks_per_tick
        self.machine = os.uname().machine
        self.vm0: dict[str, int] | None = None
        self.problems: dict[str, str] = {}  # what could not be read, once per kind
        self.ended: dict[int, str] = {}     # processes seen dying or dead before they were reaped
        self._turn = 0
        self.smaps = SmapsSwap(self.proc)

    def _note(self, what: str, why: str | None) -> None:
        if why and what not in self.problems:
            self.problems[what] = why

    def system(self) -> dict[str, Any]:
        text = self.root.read_fresh("proc/vmstat") or ""
        now = parse_vmstat(text)
        if self.vm0 is None:
            self.vm0 = now
        # deltas since the first sample; a counter that has not moved is left out (readers take 0)
        vm = {k: v - self.vm0.get(k, 0) for k, v in now.items() if k.startswith(VM_PREFIXES) and v != self.vm0.get(k, 0)}
        mem = parse_meminfo(self.root.read_fresh("proc/meminfo") or "").raw
        psi = self.root.read_fresh("proc/pressure/memory")
        return {"vm": vm, "mem": {k: mem.get(k) for k in MEM_KEYS}, "psi": parse_psi(psi) if psi else None}

    def what_is(self, pid: int) -> tuple[str, str | None]:
        """('process', None) for a process that can pin; else ('gone' | 'exited' | 'kernel thread',
        the state seen: 'zombie', 'exiting')."""
        st = process.read_status(pid, proc=self.proc)
        lead = process.read_task_stat(pid, proc=self.proc)
        if st is None or lead is None:
            return "gone", None
        if lead.kernel_thread:
            return "kernel thread", None
        if self.process(pid) is None:
            return "exited", (self.ended.get(pid) or {}).get("state") or "gone"
        return "process", None

    def process(self, pid: int, must: Iterable[int] = ()) -> dict[str, Any] | None:
        """One process: None when it is gone, and when it is dying or dead but not yet reaped
        (every thread exiting or a zombie: `self.ended[pid]` says which, and how it ended: a signal or
        an exit code, when the kernel shows it). A zombie's status has no
        memory lines (its VmSwap would read 0: a pin "done") and a dying process gives its memory
        back: neither is progress. `must`: threads whose stack is read this time."""
        st = process.read_status(pid, proc=self.proc)
        if st is None:
            return None
        stats = {tid: process.read_task_stat(pid, tid, proc=self.proc) for tid in process.list_tasks(pid, self.proc)}
        stats = {tid: s for tid, s in stats.items() if s is not None}
        live = {tid: s for tid, s in stats.items() if not s.exiting}
        dead = st.state in ("Z", "X", "x")
        if (not live and (stats or dead)) or _killed(st):
            lead = stats.get(pid)
            how = {"state": "zombie" if dead else "exiting", "threads": len(stats)}
            if lead is not None and _killed(st):
                how["signal"] = 9
            elif lead is not None and (dead or lead.exit_code):  # a dying task's code is set after PF_EXITING
                how.update(lead.ended_by or {})
            self.ended[pid] = how
            return None
        if pid not in live and live:  # the main thread has exited, the others run: their mm's figures
            st = process.read_status(pid, min(live), proc=self.proc) or st
        stats = live  # an exiting thread is gone: it will not return from a pin
        io, why = process.read_io(pid, proc=self.proc)
        self._note("io", _why(why))
        out: dict[str, Any] = {
            "name": st.name, "state": st.state, "vm_rss": st.vm_rss_bytes, "vm_swap": st.vm_swap_bytes,
            "vm_lck": st.vm_lck_bytes, "rss_anon": st.rss_anon_bytes, "rss_file": st.rss_file_bytes,
            "rss_shmem": st.rss_shmem_bytes, "read_bytes": io.get("read_bytes") if io else None,
            "minflt": None, "majflt": None, "threads": {}}
        if stats:
            out["minflt"] = sum(s.minflt for s in stats.values())
            out["majflt"] = sum(s.majflt for s in stats.values())
        must = set(must)
        busy = sorted(tid for tid, s in stats.items() if s.state in ("D", "R") and tid not in must and tid != pid)
        if len(busy) > self.stacks_per_tick:  # in turns: a 100-thread server must not make watching expensive
            start = self._turn % len(busy)
            busy = (busy[start:] + busy[:start])[:self.stacks_per_tick]
        looked = must | set(busy) | {pid}
        for tid, s in stats.items():
            th: dict[str, Any] = {"tid": tid, "state": s.state, "minflt": s.minflt, "majflt": s.majflt,
                                  "utime": s.utime_ticks, "stime": s.stime_ticks, "comm": s.comm}
            if tid in looked:
                th["wchan"] = process.read_wchan(pid, tid, proc=self.proc)
                text, why = process.read_stack(pid, tid, proc=self.proc)
                self._note("stack", _why(why) if why != "process gone" else None)
                if text is not None:
                    th["frames"] = _frames(text)
                call = process.read_syscall(pid, tid, proc=self.proc)
                if call is not None:
                    th["syscall"] = (process.syscall_name(call.nr, self.machine) or call.nr) if not call.running \
                        else "running"
                    if call.nr is not None and process.syscall_name(call.nr, self.machine) in ("mlock", "mlock2"):
                        th["syscall_len"] = call.args[1] if len(call.args) > 1 else None
                        th["syscall_addr"] = call.args[0] if call.args else None
            out["threads"][tid] = th
        return out

    def sample(self, t: float, pids: Iterable[int], must: dict[int, set[int]] | None = None,
               regions: dict[int, bool] | None = None) -> dict[str, Any]:
        """`regions`: the processes whose per-VMA swap is wanted (diag.watch.smaps), each with
        whether a phase of it waits for its region (read again sooner)."""
        self._turn += 1
        s = {"t": round(t, 3), **self.system(), "procs": {}}
        for pid in pids:
            p = self.process(pid, (must or {}).get(pid, ()))
            if p is not None:
                s["procs"][pid] = p
            elif pid in self.ended:
                s.setdefault("ended", {})[pid] = self.ended[pid]
        if regions is not None:
            s["regions"] = "smaps"
            for pid, urgent in regions.items():
                if pid in s["procs"]:
                    reading = self.smaps.poll(pid, t, urgent)
                    if reading is not None:
                        s["procs"][pid]["smaps_swap"] = reading
                    if reading and reading.get("error"):
                        self._note("smaps", reading["error"])
        return s

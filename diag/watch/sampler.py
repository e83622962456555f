"""Reading a pinning process without touching it: one sample of the node and the watched
processes per call.

Per process it reads /proc/PID/status (VmRSS, VmSwap, RssAnon/RssFile/RssShmem, VmLck),
/proc/PID/io (read_bytes) and every thread's /proc/PID/task/TID/stat (state, minor and major
faults); for the threads that matter (those in a pin phase, the main thread, and a few busy
ones in turn) also wchan, the kernel stack (root) and the system call with its arguments.
None of these takes the mmap lock that pin_user_pages holds for the whole call; smaps, maps,
cmdline and environ do, and are never read. Nothing is written and no signal is sent.
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


class Sampler:
    def __init__(self, root: Root | None = None, stacks_per_tick: int = 4):
        self.root = root or Root("/")
        self.proc = str(self.root.path / "proc")
        self.page = live_page_size()
        self.stacks_per_tick = stacks_per_tick
        self.machine = os.uname().machine
        self.vm0: dict[str, int] | None = None
        self.problems: dict[str, str] = {}  # what could not be read, once per kind
        self._turn = 0

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

    def process(self, pid: int, must: Iterable[int] = ()) -> dict[str, Any] | None:
        """One process: None when it is gone. `must`: threads whose stack is read this time."""
        st = process.read_status(pid, proc=self.proc)
        if st is None:
            return None
        io, why = process.read_io(pid, proc=self.proc)
        self._note("io", why)
        out: dict[str, Any] = {
            "name": st.name, "state": st.state, "vm_rss": st.vm_rss_bytes, "vm_swap": st.vm_swap_bytes,
            "vm_lck": st.vm_lck_bytes, "rss_anon": st.rss_anon_bytes, "rss_file": st.rss_file_bytes,
            "rss_shmem": st.rss_shmem_bytes, "read_bytes": io.get("read_bytes") if io else None,
            "minflt": None, "majflt": None, "threads": {}}
        stats = {tid: process.read_task_stat(pid, tid, proc=self.proc) for tid in process.list_tasks(pid, self.proc)}
        stats = {tid: s for tid, s in stats.items() if s is not None}
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
                self._note("stack", why if why != "process gone" else None)
                if text is not None:
                    th["frames"] = _frames(text)
                call = process.read_syscall(pid, tid, proc=self.proc)
                if call is not None:
                    th["syscall"] = (process.syscall_name(call.nr, self.machine) or call.nr) if not call.running \
                        else "running"
                    if call.nr is not None and process.syscall_name(call.nr, self.machine) in ("mlock", "mlock2"):
                        th["syscall_len"] = call.args[1] if len(call.args) > 1 else None
            out["threads"][tid] = th
        return out

    def sample(self, t: float, pids: Iterable[int], must: dict[int, set[int]] | None = None) -> dict[str, Any]:
        self._turn += 1
        s = {"t": round(t, 3), **self.system(), "procs": {}}
        for pid in pids:
            p = self.process(pid, (must or {}).get(pid, ()))
            if p is not None:
                s["procs"][pid] = p
        return s

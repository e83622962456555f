"""Per-process facts the watchdog samples: /proc/PID/status, stack, wchan, task list.

Never read a pinning process's smaps, maps or cmdline: they take the mmap lock that
pin_user_pages holds for the whole call, so the reader would block behind the pin.

>>> s = parse_status("State:\\tD (disk sleep)\\nVmRSS:\\t  100 kB\\nVmSwap:\\t 0 kB\\nThreads:\\t3\\n")
>>> s.state, s.vm_rss_bytes, s.threads
('D', 102400, 3)
"""
from __future__ import annotations

import errno
import os
from dataclasses import dataclass, field
from pathlib import Path

from .parsing import to_int
from .rootfs import read_bounded
from .safetext import one_line

__all__ = ["ProcStatus", "parse_status", "read_status", "read_task_state", "read_stack", "read_wchan", "list_tasks",
           "parse_stack", "TaskStat", "parse_task_stat", "read_task_stat", "parse_io", "read_io", "Syscall",
           "parse_syscall", "read_syscall", "syscall_name", "PF_EXITING", "PF_KTHREAD"]

_BYTES = {"VmRSS": "vm_rss_bytes", "VmSwap": "vm_swap_bytes", "VmLck": "vm_lck_bytes",
          "VmPin": "vm_pin_bytes", "VmSize": "vm_size_bytes", "RssAnon": "rss_anon_bytes",
          "RssFile": "rss_file_bytes", "RssShmem": "rss_shmem_bytes"}


@dataclass
class ProcStatus:
    name: str | None = None
    state: str | None = None          # one letter: R S D T Z ...
    threads: int | None = None
    vm_rss_bytes: int | None = None
    vm_swap_bytes: int | None = None
    vm_lck_bytes: int | None = None
    vm_pin_bytes: int | None = None   # since 3.2; driver pins do not show here either
    vm_size_bytes: int | None = None
    rss_anon_bytes: int | None = None
    rss_file_bytes: int | None = None
    rss_shmem_bytes: int | None = None
    raw: dict[str, str] = field(default_factory=dict)
    bad: list[str] = field(default_factory=list)  # fields whose value could not be read


def parse_status(text: str) -> ProcStatus:
    st = ProcStatus()
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        value = value.strip()
        st.raw[key] = value
        if key == "Name":
            st.name = one_line(value)
        elif key == "State":
            st.state = value[:1] or None
        elif key == "Threads":
            st.threads = to_int(value)
            if st.threads is None:
                st.bad.append(f"Threads: {value[:20]!r}")
        elif key in _BYTES:
            parts = value.split()
            number = to_int(parts[0]) if len(parts) == 2 and parts[1] == "kB" else None
            if number is None or number < 0:
                st.bad.append(f"{key}: {value[:20]!r}")
            else:
                setattr(st, _BYTES[key], number * 1024)
    return st


def _read(path: Path) -> tuple[str | None, str | None]:
    try:
        return read_bounded(path, 1 << 20).decode("utf-8", "replace"), None
    except OSError as exc:
        if exc.errno == errno.ENOENT or exc.errno == errno.ESRCH:
            return None, "process gone"
        if exc.errno in (errno.EACCES, errno.EPERM):
            return None, "needs root"
        return None, exc.strerror


def _base(pid: int, tid: int | None, proc: str) -> Path:
    return Path(proc) / str(pid) / ("task/" + str(tid) if tid is not None else "")


def read_status(pid: int, tid: int | None = None, proc: str = "/proc") -> ProcStatus | None:
    text, _ = _read(_base(pid, tid, proc) / "status")
    return parse_status(text) if text is not None else None


def parse_stack(text: str) -> list[str]:
    """Function names, innermost first: '[<0>] do_swap_page+0x1c/0x90' -> 'do_swap_page'."""
    frames = []
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        sym = line.split("]", 1)[-1].strip()
        frames.append(sym.split("+", 1)[0].strip())
    return frames


def read_task_state(pid: int, tid: int | None = None, proc: str = "/proc") -> str | None:
    """The one-letter state from /proc/PID/task/TID/stat (cheaper than status)."""
    text, _ = _read(_base(pid, tid, proc) / "stat")
    if not text or ")" not in text:
        return None
    rest = text.rsplit(")", 1)[1].split()
    return rest[0] if rest else None


def read_stack(pid: int, tid: int | None = None, proc: str = "/proc") -> tuple[str | None, str | None]:
    """(raw stack text, None) or (None, reason); the stack needs root (CAP_SYS_ADMIN)."""
    return _read(_base(pid, tid, proc) / "stack")


def read_wchan(pid: int, tid: int | None = None, proc: str = "/proc") -> str | None:
    text, _ = _read(_base(pid, tid, proc) / "wchan")
    return text.strip() if text else None


def list_tasks(pid: int, proc: str = "/proc") -> list[int]:
    try:
        return sorted(int(t) for t in os.listdir(Path(proc) / str(pid) / "task"))
    except OSError:
        return []


# -- what `hostpin watch` reads per thread; none of these files takes the mmap lock --------------

@dataclass
class TaskStat:
    """The fields of /proc/PID/task/TID/stat that say what a thread is doing. Faults that
    get_user_pages takes on the thread's behalf count here too (mm_account_fault)."""
    comm: str
    state: str
    ppid: int
    minflt: int
    majflt: int
    utime_ticks: int
    stime_ticks: int
    flags: int = 0        # the task's PF_* flags (PF_EXITING, PF_KTHREAD)
    exit_code: int | None = None  # since 3.5, a dying or zombie task's wait status (0 when not permitted)

    @property
    def exiting(self) -> bool:
        """The thread is dying (do_exit has begun: it will never return to user space), or dead."""
        return bool(self.flags & PF_EXITING) or self.state in ("Z", "X", "x")

    @property
    def ended_by(self) -> dict | None:
        """How a zombie ended, from its wait status: {'signal': N} or {'exit': code}; None when
        it cannot be told (no exit code in this kernel's stat)."""
        if self.exit_code is None:
            return None
        if self.exit_code & 0x7f:
            return {"signal": self.exit_code & 0x7f}
        return {"exit": (self.exit_code >> 8) & 0xff}

    @property
    def kernel_thread(self) -> bool:
        return bool(self.flags & PF_KTHREAD)


PF_EXITING = 0x00000004   # include/linux/sched.h: set by exit_signals() at the start of do_exit
PF_KTHREAD = 0x00200000   # a kernel thread: no user memory of its own


def parse_task_stat(text: str) -> TaskStat | None:
    """None for a damaged or cut line; comm may hold spaces and parentheses.

    >>> t = parse_task_stat("42 (a (b) c) D 1 42 42 0 -1 4194560 131072 0 3 0 10 20 0 0 20 0 1 0 5 0 0")
    >>> t.comm, t.state, t.minflt, t.majflt, t.stime_ticks, t.exiting, t.kernel_thread
    ('a (b) c', 'D', 131072, 3, 20, False, False)
    >>> parse_task_stat("2 (kthreadd) S 0 0 0 0 -1 2129984 0 0 0 0 0 1 0 0 20 0 1 0 5 0 0").kernel_thread
    True
    """
    head, sep, rest = text.rpartition(")")
    fields = rest.split()
    if not sep or "(" not in head or len(fields) < 13:
        return None
    try:
        return TaskStat(comm=one_line(head.partition("(")[2]), state=fields[0], ppid=int(fields[1]), minflt=int(fields[7]),
                        majflt=int(fields[9]), utime_ticks=int(fields[11]), stime_ticks=int(fields[12]),
                        flags=int(fields[6]), exit_code=int(fields[49]) if len(fields) > 49 else None)
    except ValueError:
        return None


def read_task_stat(pid: int, tid: int | None = None, proc: str = "/proc") -> TaskStat | None:
    text, _ = _read(_base(pid, tid, proc) / "stat")
    return parse_task_stat(text) if text is not None else None


def parse_io(text: str) -> dict[str, int]:
    """/proc/PID/io: read_bytes is what the process made the block layer read (submit_bio),
    file readahead and swap-in included; rchar counts every read() however served.

    >>> parse_io("rchar: 10\\nread_bytes: 134217728\\nbogus\\n")["read_bytes"]
    134217728
    """
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and value.strip().isdigit():
            out[key.strip()] = int(value)
    return out


def read_io(pid: int, proc: str = "/proc") -> tuple[dict[str, int] | None, str | None]:
    """(counters, None) or (None, reason): needs root or the right to ptrace the process
    (CONFIG_TASK_IO_ACCOUNTING)."""
    text, why = _read(Path(proc) / str(pid) / "io")
    return (parse_io(text), None) if text is not None else (None, why)


@dataclass
class Syscall:
    """What /proc/PID/task/TID/syscall says: the call a blocked thread is in and its
    arguments; `running` when the thread was on a CPU (the kernel does not stop it to look)."""
    nr: int | None
    args: tuple[int, ...] = ()
    running: bool = False


def parse_syscall(text: str) -> Syscall | None:
    """Parsed; None for damaged text.

    >>> parse_syscall("149 0x7f5a49200000 0x8000000 0x0 0x0 0x0 0x0 0x7ffd 0x7f5a").args[1]
    134217728
    >>> parse_syscall("running").running, parse_syscall("-1 0x7ffd 0x7f5a").nr
    (True, -1)
    """
    parts = text.split()
    if not parts:
        return None
    if parts[0] == "running":
        return Syscall(nr=None, running=True)
    try:
        nr = int(parts[0])
        args = tuple(int(p, 16) for p in parts[1:7]) if nr >= 0 else ()
    except ValueError:
        return None
    return Syscall(nr=nr, args=args)


def read_syscall(pid: int, tid: int | None = None, proc: str = "/proc") -> Syscall | None:
    """Needs root or the right to ptrace the thread; reading it does not stop the thread."""
    text, _ = _read(_base(pid, tid, proc) / "syscall")
    return parse_syscall(text) if text is not None else None


# the calls whose numbers matter to a pin, per architecture (asm/unistd_64.h, asm-generic/unistd.h)
_SYSCALLS = {
    "x86_64": {9: "mmap", 16: "ioctl", 28: "madvise", 149: "mlock", 150: "munlock", 151: "mlockall", 325: "mlock2"},
    "aarch64": {29: "ioctl", 222: "mmap", 228: "mlock", 229: "munlock", 230: "mlockall", 233: "madvise", 284: "mlock2"},
}


def syscall_name(nr: int | None, machine: str | None = None) -> str | None:
    """The name of a call that matters to a pin, else None.

    >>> syscall_name(149, "x86_64"), syscall_name(228, "aarch64"), syscall_name(0, "x86_64")
    ('mlock', 'mlock', None)
    """
    if nr is None:
        return None
    return _SYSCALLS.get(machine or os.uname().machine, {}).get(nr)

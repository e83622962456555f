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

__all__ = ["ProcStatus", "parse_status", "read_status", "read_task_state", "read_stack", "read_wchan", "list_tasks",
           "parse_stack"]

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
            st.name = value
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

"""What killed hostpin runs leave behind, found without changing anything.

A reproduction sets up swap files, memory and blkio/io cgroups (with a read throttle on the
swap disk), /dev/shm region files; reading a bundle unpacks it into a temporary directory.
All are removed on every exit path a process can see, but not when the process is SIGKILLed.
So each carries its owner's pid in its name, and this module lists them with that pid and
whether the owner still runs (a pid that exists again but started after the thing was made
is another process: the owner is dead). `hostpin repro cleanup` removes those of dead owners,
`hostpin preflight` warns about them, `hostpin repro register` refuses to start beside them.

A name alone proves nothing (any user can create /var/tmp/hostpin-swap-1-ab): a swap file is
hostpin's only when root owns it, its mode is 0600, it has one link, and its first page is
hostpin's swap header (or still all zeros: killed before the header was written). Every swap
file is recorded, before it is made, in SWAP_RECORDS (a directory only root can write), so one
left in a custom --swap-dir is found too.

The names are made here (repro imports them: diag never imports repro):

>>> swap_file_name(1234, "ab12cd34")
'hostpin-swap-1234-ab12cd34'
>>> cgroup_name(1234, 0, 1)
'hostpin-1234-0-r1'
>>> owner_pid("hostpin-1234-0-r1", "cgroup"), owner_pid("hostpin-test-1", "cgroup")
(1234, None)
"""
from __future__ import annotations

import os
import re
import stat
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["SWAP_PREFIX", "SWAP_RECORDS", "dir_problem", "is_hostpin_swap_file", "swap_records", "CGROUP_PREFIX", "SHM_PREFIX", "BUNDLE_TMP_PREFIX", "swap_file_name", "cgroup_name",
           "shm_name", "owner_pid", "owner_alive", "cgroup_mounts", "Leftover", "find_leftovers", "CLEANUP_COMMAND"]

SWAP_PREFIX = "hostpin-swap-"
CGROUP_PREFIX = "hostpin-"
SHM_PREFIX = "hostpin-"
BUNDLE_TMP_PREFIX = "hostpin-bundle-"
DEFAULT_SWAP_DIR = "/var/tmp"
SWAP_RECORDS = "/var/lib/hostpin/swap-files"  # one file per swap file made: its path
SWAP_LABEL = b"hostpin"                        # the header's volume label (repro.swapfile writes it)
CLEANUP_COMMAND = "hostpin repro cleanup"

_PATTERNS = {
    "swap": re.compile(r"^hostpin-swap-(\d+)-[0-9a-f]+$"),
    "cgroup": re.compile(r"^hostpin-(\d+)-\d+-r\d+$"),
    "shm": re.compile(r"^hostpin-(\d+)-\d+$"),
    "bundle-tmp": re.compile(r"^hostpin-bundle-(\d+)-"),
    "trace": re.compile(r"^hostpin-(\d+)-\d+$"),   # a tracefs instance of --trace (diag.trace)
    "trace-mount": re.compile(r"^hostpin-(\d+)$"),  # tracefs mounted by --trace: the mount's source
}


def swap_file_name(pid: int, tag: str) -> str:
    return f"{SWAP_PREFIX}{pid}-{tag}"


def cgroup_name(pid: int, tag: int, rank: int) -> str:
    return f"{CGROUP_PREFIX}{pid}-{tag}-r{rank}"


def shm_name(pid: int, tag: int) -> str:
    return f"{SHM_PREFIX}{pid}-{tag}"


def owner_pid(name: str, kind: str) -> int | None:
    m = _PATTERNS[kind].match(name)
    return int(m.group(1)) if m else None


def _boot_time(proc: str) -> float | None:
    try:
        for line in Path(proc, "stat").read_text().splitlines():
            if line.startswith("btime "):
                return float(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def owner_alive(pid: int, made_at: float | None = None, proc: str = "/proc") -> bool:
    """The pid runs, is not a zombie, and (when made_at is known) started before the thing was
    made: a pid reused by a later process does not keep a dead owner's leftovers alive."""
    try:
        text = Path(proc, str(pid), "stat").read_text()
    except (OSError, ValueError):
        return False
    fields = text.rpartition(")")[2].split()
    if not fields or fields[0] in ("Z", "X"):
        return False
    if made_at is not None and len(fields) > 19:
        boot = _boot_time(proc)
        try:
            started = boot + int(fields[19]) / os.sysconf("SC_CLK_TCK") if boot is not None else None
        except (ValueError, OSError):
            started = None
        if started is not None and started > made_at + 2.0:
            return False
    return True


def cgroup_mounts(proc: str = "/proc") -> dict[str, Any] | None:
    """Where the memory and io/blkio controllers are: {'version': 1|2, 'memory', 'io'}, or None."""
    from .cgroup import parse_mountinfo
    try:
        mounts = parse_mountinfo(Path(proc, "self", "mountinfo").read_text())
    except OSError:
        return None
    v1_mem = next((m for m in mounts if m["fstype"] == "cgroup" and "memory" in m["super_options"].split(",")), None)
    if v1_mem is not None:
        v1_io = next((m for m in mounts if m["fstype"] == "cgroup" and "blkio" in m["super_options"].split(",")), None)
        return {"version": 1, "memory": v1_mem["mount_point"], "io": v1_io["mount_point"] if v1_io else None}
    v2 = next((m for m in mounts if m["fstype"] == "cgroup2"), None)
    if v2 is None:
        return None
    return {"version": 2, "memory": v2["mount_point"], "io": v2["mount_point"]}


@dataclass
class Leftover:
    kind: str              # swap (active), swap-file (not active), cgroup, shm, bundle-tmp
    path: str
    pid: int               # the owner
    alive: bool
    detail: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        what = {"swap": "active swap file", "swap-file": "swap file (not active)", "cgroup": "cgroup",
                "shm": "/dev/shm region file", "bundle-tmp": "unpacked bundle",
                "trace": "tracefs instance", "trace-mount": "tracefs mount"}[self.kind]
        extra = ""
        if self.kind == "swap" and self.detail.get("used_bytes") is not None:
            extra = f", {self.detail['used_bytes'] >> 20} MiB in use"
        if self.detail.get("throttles"):
            extra += ", read throttle " + "; ".join(self.detail["throttles"])
        if self.detail.get("procs"):
            extra += ", holding pid " + ", ".join(map(str, self.detail["procs"]))
        owner = f"owner pid {self.pid} {'running' if self.alive else 'dead'}"
        return f"{what} {self.path} ({owner}{extra})"


def dir_problem(directory: str) -> str | None:
    """Why another user could swap a file in `directory` for one of their own (its real path, or
    a directory above it, is not root's, or others may write to it without the sticky bit), or
    None when only root can rename what root makes there.

    >>> dir_problem("/")
    """
    real = os.path.realpath(directory)
    parts = [p for p in real.split("/") if p]
    for i in range(len(parts) + 1):
        path = "/" + "/".join(parts[:i])
        try:
            st = os.lstat(path)
        except OSError as exc:
            return f"cannot check {path}: {exc.strerror}"
        if not stat.S_ISDIR(st.st_mode):
            return f"{path} is not a directory"
        if st.st_uid != 0:
            return f"{path} belongs to uid {st.st_uid}, who can rename what root makes there"
        if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            return (f"{path} is writable by {'every user' if st.st_mode & 0o002 else 'its group'} without the "
                    "sticky bit, so they can rename what root makes there")
    return None


def is_hostpin_swap_file(path: str, page: int | None = None) -> bool:
    """Root's regular 0600 file with one link whose first page is hostpin's swap header, or all
    zeros (made, then killed before the header was written). Opened without following a link."""
    from .pagesize import live_page_size
    page = page or live_page_size()
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != 0 or stat.S_IMODE(st.st_mode) != 0o600 \
                or st.st_nlink != 1:
            return False
        head = os.pread(fd, page, 0)
    except OSError:
        return False
    finally:
        os.close(fd)
    if not head.strip(b"\0"):
        return True
    return len(head) == page and head[page - 10:] == b"SWAPSPACE2" and head[1052:1052 + len(SWAP_LABEL)] == SWAP_LABEL


def swap_records(records: str = SWAP_RECORDS) -> dict[str, str]:
    """{record file: swap file path} for every swap file hostpin made and has not removed; only
    when the records directory and each record are root's (a record names what root may delete)."""
    if dir_problem(records) is not None or os.path.islink(records):
        return {}
    out = {}
    try:
        names = sorted(os.listdir(records))
    except OSError:
        return {}
    for name in names:
        if owner_pid(name, "swap") is None:
            continue
        rec = os.path.join(records, name)
        try:
            fd = os.open(rec, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            st = os.fstat(fd)
            text = os.read(fd, 4096).decode("utf-8", "replace").strip() if stat.S_ISREG(st.st_mode) \
                and st.st_uid == 0 else ""
        except OSError:
            text = ""
        finally:
            os.close(fd)
        if text.startswith("/") and os.path.basename(text) == name:
            out[rec] = text
    return out


def _made_at(path: str) -> float | None:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return min(st.st_mtime, st.st_ctime)


def _lines(path: Path) -> list[str]:
    try:
        return [line.strip() for line in path.read_text().splitlines() if line.strip()]
    except OSError:
        return []


def _swaps(proc: str) -> list[tuple[str, int | None]]:
    out = []
    for line in _lines(Path(proc, "swaps"))[1:]:
        parts = line.split()
        used = int(parts[3]) * 1024 if len(parts) >= 5 and parts[3].isdigit() else None
        out.append((parts[0].replace("\\040", " "), used))
    return out


def find_leftovers(proc: str = "/proc", shm_dir: str = "/dev/shm", tmp_dir: str | None = None,
                   swap_dirs: tuple[str, ...] = (DEFAULT_SWAP_DIR,), records: str = SWAP_RECORDS) -> list[Leftover]:
    """Every hostpin swap file (in swap_dirs and wherever a record says one was made), cgroup (with
    its throttles), /dev/shm file and unpacked bundle on this node, with its owner's pid and
    whether it runs. Reads only."""
    found: list[Leftover] = []
    active = set()
    for name, used in _swaps(proc):
        pid = owner_pid(os.path.basename(name), "swap")
        if pid is None:
            continue
        active.add(name)
        found.append(Leftover("swap", name, pid, owner_alive(pid, _made_at(name), proc), {"used_bytes": used}))
    recorded = {path: rec for rec, path in swap_records(records).items()}
    dirs = set(swap_dirs) | {os.path.dirname(name) for name in active} | {os.path.dirname(p) for p in recorded}
    for directory in sorted(dirs):
        try:
            names = os.listdir(directory)
        except OSError:
            continue
        for name in sorted(names):
            path = os.path.join(directory, name)
            pid = owner_pid(name, "swap")
            if pid is None or path in active:
                continue
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if is_hostpin_swap_file(path):
                detail: dict[str, Any] = {"size_bytes": st.st_size}
                if path in recorded:
                    detail["record"] = recorded[path]
                found.append(Leftover("swap-file", path, pid, owner_alive(pid, _made_at(path), proc), detail))
    mounts = cgroup_mounts(proc)
    if mounts:
        for base in sorted({mounts["memory"], mounts.get("io")} - {None}):
            try:
                names = sorted(os.listdir(base))
            except OSError:
                continue
            for name in names:
                pid = owner_pid(name, "cgroup")
                path = Path(base, name)
                if pid is None or not path.is_dir():
                    continue
                procs = [int(x) for x in _lines(path / "cgroup.procs") if x.isdigit()]
                throttles = _lines(path / "blkio.throttle.read_bps_device") if mounts["version"] == 1 else \
                    _lines(path / "io.max")
                found.append(Leftover("cgroup", str(path), pid, owner_alive(pid, _made_at(str(path)), proc),
                                      {"procs": procs, "throttles": throttles, "version": mounts["version"]}))
    for kind, directory in (("shm", shm_dir), ("bundle-tmp", tmp_dir or tempfile.gettempdir())):
        try:
            names = sorted(os.listdir(directory))
        except OSError:
            continue
        for name in names:
            pid = owner_pid(name, kind)
            path = os.path.join(directory, name)
            if pid is None:
                continue
            try:
                st = os.lstat(path)
            except OSError:
                continue
            wanted = stat.S_ISREG(st.st_mode) if kind == "shm" else stat.S_ISDIR(st.st_mode)
            if not wanted or st.st_uid != os.geteuid():
                continue
            found.append(Leftover(kind, path, pid, owner_alive(pid, min(st.st_mtime, st.st_ctime), proc),
                                  {"size_bytes": st.st_size} if kind == "shm" else {}))
    found.extend(_trace_instances(proc))
    return found


def _trace_instances(proc: str) -> list[Leftover]:
    """hostpin's tracefs instances, wherever tracefs is mounted (a SIGKILLed --trace leaves one)."""
    out = []
    for line in _lines(Path(proc, "self", "mounts")):
        parts = line.split()
        if len(parts) < 3 or parts[2] != "tracefs":
            continue
        base = Path(parts[1].replace("\\040", " "), "instances")
        try:
            names = sorted(os.listdir(base))
        except OSError:
            continue
        owner = owner_pid(parts[0], "trace-mount")
        if owner is not None:
            out.append(Leftover("trace-mount", parts[1], owner, owner_alive(owner, None, proc),
                                {"instances": [n for n in names]}))
        for name in names:
            pid = owner_pid(name, "trace")
            if pid is not None:
                path = str(base / name)
                out.append(Leftover("trace", path, pid, owner_alive(pid, _made_at(path), proc)))
    return out

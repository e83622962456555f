"""Temporary cgroups for a reproduction: a memory limit (to push a region into swap for real)
and a read throttle on the swap device (to reproduce a slow swap device), v1 and v2.

Each RunCgroup is created empty, the child joins it before it allocates anything (from a
preexec hook), and `remove()` moves any process left back to the parent cgroup and removes
the directories. Everything it writes is undone by remove(). Cgroups are named with the
owner's pid (diag.leftovers.cgroup_name), and a throttle lives in its cgroup, so what a killed
run leaves is found and removed by `hostpin repro cleanup`.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from diag.leftovers import CGROUP_PREFIX as PREFIX, cgroup_mounts, owner_pid

__all__ = ["CgroupError", "RunCgroup", "cgroup_layout", "block_device_for", "leftover_cgroups", "PREFIX",
           "file_device"]


class CgroupError(RuntimeError):
    pass


def cgroup_layout() -> dict:
    """Where the memory and io/blkio controllers are: {'version': 1|2, 'memory': path, 'io': path}."""
    layout = cgroup_mounts()
    if layout is None:
        raise CgroupError("no memory cgroup controller is mounted (neither v1 'memory' nor cgroup2)")
    return layout


def block_device_for(path: str) -> str:
    """MAJ:MIN of the whole disk that holds path (a swap file) or is path (a swap partition):
    throttles apply to whole disks, not partitions."""
    st = os.stat(path)
    import stat as _stat
    dev = st.st_rdev if _stat.S_ISBLK(st.st_mode) else st.st_dev
    majmin = f"{os.major(dev)}:{os.minor(dev)}"
    sysdir = Path(f"/sys/dev/block/{majmin}")
    if (sysdir / "partition").exists():
        parent = sysdir.resolve().parent
        majmin = (parent / "dev").read_text().strip()
    return majmin


def _write(path: Path, value: str) -> None:
    try:
        with open(path, "w") as fh:
            fh.write(value)
    except OSError as exc:
        raise CgroupError(f"cannot write {value!r} to {path}: {exc.strerror}") from None


@dataclass
class RunCgroup:
    name: str
    layout: dict = field(default_factory=cgroup_layout)
    dirs: list[Path] = field(default_factory=list)
    enabled_controllers: list[tuple[Path, str]] = field(default_factory=list)
    throttled: list[str] = field(default_factory=list)

    def create(self, want_io: bool = False) -> "RunCgroup":
        v = self.layout["version"]
        if v == 1:
            self.dirs.append(Path(self.layout["memory"]) / self.name)
            if want_io:
                if not self.layout["io"]:
                    raise CgroupError("no blkio cgroup controller is mounted: cannot throttle swap-in")
                self.dirs.append(Path(self.layout["io"]) / self.name)
        else:
            top = Path(self.layout["memory"])
            controllers = (top / "cgroup.controllers").read_text().split()
            needed = ["memory"] + (["io"] if want_io else [])
            for ctl in needed:
                if ctl not in controllers:
                    raise CgroupError(f"the cgroup2 hierarchy has no {ctl} controller")
                enabled = (top / "cgroup.subtree_control").read_text().split()
                if ctl not in enabled:
                    _write(top / "cgroup.subtree_control", f"+{ctl}")
                    self.enabled_controllers.append((top, ctl))
            self.dirs.append(top / self.name)
        for d in self.dirs:
            d.mkdir(exist_ok=False)
        return self

    @property
    def memory_dir(self) -> Path:
        return self.dirs[0]

    @property
    def io_dir(self) -> Path:
        return self.dirs[-1]

    def join_files(self) -> list[str]:
        """cgroup.procs files a process writes '0' to, to join (used from the child's preexec)."""
        return [str(d / "cgroup.procs") for d in self.dirs]

    def usage_bytes(self) -> int:
        name = "memory.usage_in_bytes" if self.layout["version"] == 1 else "memory.current"
        return int((self.memory_dir / name).read_text())

    def set_memory_limit(self, limit: int | None) -> None:
        if self.layout["version"] == 1:
            _write(self.memory_dir / "memory.limit_in_bytes", "-1" if limit is None else str(limit))
        else:
            _write(self.memory_dir / "memory.max", "max" if limit is None else str(limit))

    def swap_bytes(self) -> int | None:
        if self.layout["version"] == 2:
            path = self.memory_dir / "memory.swap.current"
            return int(path.read_text()) if path.exists() else None
        return self._stat().get("swap")

    def _stat(self) -> dict[str, int]:
        out = {}
        for line in (self.memory_dir / "memory.stat").read_text().splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[1].isdigit():
                out[parts[0]] = int(parts[1])
        return out

    def _reclaim(self, amount: int) -> str:
        if self.layout["version"] == 2:
            path = self.memory_dir / "memory.reclaim"
            last = None
            for request in (f"{amount} swappiness=200", str(amount)):  # swappiness= since 6.8
                try:
                    _write(path, request)
                    return request
                except CgroupError as exc:
                    last = exc
            return f"{amount}: {last}"
        target = max(1 << 20, self.usage_bytes() - amount)
        try:
            _write(self.memory_dir / "memory.limit_in_bytes", str(target))
            return f"limit {target}"
        except CgroupError as exc:  # EBUSY: it could not reclaim that far this time
            return f"limit {target}: {exc}"
        finally:
            _write(self.memory_dir / "memory.limit_in_bytes", "-1")

    def drop_swap_cache(self, rounds: int = 8) -> dict:
        """Reclaim the pages of this cgroup that are written to swap but still cached, so that
        each must be read back from the device. After writeback they sit at the tail of the
        inactive list, so a reclaim of that size takes them first. v2: memory.reclaim (5.19+);
        v1: a lowered memory.limit_in_bytes, whose write reclaims, lifted at once. Neither
        OOM-kills."""
        log = []
        for _ in range(rounds):
            cached = self._stat().get("swapcached", 0)
            if cached < (1 << 20):
                break
            log.append(self._reclaim(cached))
        return {"swapcached_bytes": self._stat().get("swapcached"), "steps": log}

    def throttle_reads(self, majmin: str, bytes_per_s: int) -> None:
        if self.layout["version"] == 1:
            _write(self.io_dir / "blkio.throttle.read_bps_device", f"{majmin} {bytes_per_s}")
        else:
            _write(self.io_dir / "io.max", f"{majmin} rbps={bytes_per_s}")
        self.throttled.append(majmin)

    def procs(self) -> list[int]:
        out = []
        for d in self.dirs:
            try:
                out += [int(x) for x in (d / "cgroup.procs").read_text().split()]
            except OSError:
                pass
        return sorted(set(out))

    def remove(self, wait_s: float = 5.0) -> list[str]:
        """Undo everything; returns what could not be undone (empty when clean)."""
        problems = []
        for majmin in self.throttled:
            try:
                if self.layout["version"] == 1:
                    _write(self.io_dir / "blkio.throttle.read_bps_device", f"{majmin} 0")
                else:
                    _write(self.io_dir / "io.max", f"{majmin} rbps=max")
            except (CgroupError, OSError) as exc:
                if self.io_dir.exists():
                    problems.append(str(exc))
        self.throttled.clear()
        for d in reversed(self.dirs):
            if not d.exists():
                continue
            parent_procs = d.parent / "cgroup.procs"
            deadline = time.monotonic() + wait_s
            while True:
                left = []
                try:
                    left = [int(x) for x in (d / "cgroup.procs").read_text().split()]
                except OSError:
                    pass
                for pid in left:  # a process still inside: move it out so the directory can go
                    try:
                        _write(parent_procs, str(pid))
                    except CgroupError:
                        pass
                why = _try_rmdir(d, deadline)
                if why is not False:
                    problems += [why] if why else []
                    break
        for top, ctl in self.enabled_controllers:
            try:
                _write(top / "cgroup.subtree_control", f"-{ctl}")
            except CgroupError:
                pass  # another cgroup started using it meanwhile: leave it on
        self.enabled_controllers.clear()
        return problems


def _try_rmdir(d: Path, deadline: float) -> str | None | bool:
    """None: removed (or gone); False: busy, try again; a message: still busy at the deadline."""
    try:
        d.rmdir()
        return None
    except FileNotFoundError:
        return None
    except OSError as exc:
        if time.monotonic() > deadline:
            return f"cannot remove {d}: {exc.strerror}"
        time.sleep(0.05)
        return False


def remove_dir(d: Path, wait_s: float = 5.0) -> list[str]:
    """rmdir a cgroup, retrying while the kernel still counts a task that left it."""
    deadline = time.monotonic() + wait_s
    while True:
        why = _try_rmdir(d, deadline)
        if why is not False:
            return [why] if why else []


def leftover_cgroups(owner: int | None = None) -> list[str]:
    """hostpin cgroups that exist now, or only those of the run with pid owner."""
    try:
        layout = cgroup_layout()
    except CgroupError:
        return []
    found = []
    for base in {layout["memory"], layout.get("io")} - {None}:
        for entry in Path(base).iterdir():
            pid = owner_pid(entry.name, "cgroup")
            if pid is not None and entry.is_dir() and owner in (None, pid):
                found.append(str(entry))
    return sorted(found)


def file_device(path: str) -> str:
    """MAJ:MIN of the disk a regular file's reads go to, for a read throttle; CgroupError when
    its file system has no block device (tmpfs, overlayfs, NFS: no throttle reaches those reads)."""
    majmin = block_device_for(path)
    if not Path(f"/sys/dev/block/{majmin}").exists():
        raise CgroupError(f"{path} is on a file system with no block device ({majmin}: tmpfs, overlayfs or a "
                          "network file system); a read throttle cannot slow its reads; put the file on a disk "
                          "file system (ext4, xfs)")
    return majmin

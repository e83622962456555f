"""tracefs: the mount, hostpin's own instances (`instances/hostpin-<pid>-<n>`), their events.

Reads and writes only under /sys/kernel/tracing (the mount point that hostpin may create and
then removes), and only inside instances whose name starts with `hostpin-`: the global buffer
and anyone else's instances are never touched.
"""
from __future__ import annotations

import errno
import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["TRACEFS", "PREFIX", "TraceFsError", "Mount", "Instance", "stale_instances", "remove_instance",
           "instance_owner", "encode_dev"]

TRACEFS = Path("/sys/kernel/tracing")
PREFIX = "hostpin-"
_NAME = re.compile(r"^hostpin-(\d+)-(\d+)$")


class TraceFsError(RuntimeError):
    """tracefs cannot be used: the message says why, and what the watch does instead."""


def _is_tracefs(path: Path) -> bool:
    try:
        with open("/proc/self/mounts", encoding="utf-8") as fh:
            return any(line.split()[1] == str(path) and line.split()[2] == "tracefs" for line in fh
                       if len(line.split()) > 2)
    except OSError:
        return False


@dataclass
class Mount:
    """tracefs at /sys/kernel/tracing: found mounted, or mounted now (and then unmounted by release)."""
    path: Path = TRACEFS
    mounted_by_us: bool = False        # still mounted by us (False again once release unmounted it)
    made: bool = False                 # we mounted it

    @classmethod
    def acquire(cls, path: Path = TRACEFS) -> "Mount":
        if _is_tracefs(path):
            return cls(path, False)
        if not path.is_dir():
            raise TraceFsError(f"{path} does not exist (a kernel without CONFIG_TRACING)")
        # the mount's source names its owner, so that `repro cleanup` knows a mount a killed run left
        r = subprocess.run(["mount", "-t", "tracefs", f"{PREFIX}{os.getpid()}", str(path)], capture_output=True,
                           text=True)
        if r.returncode != 0 or not _is_tracefs(path):
            raise TraceFsError(f"cannot mount tracefs at {path}: {(r.stderr or '').strip() or 'mount failed'}")
        return cls(path, True, True)

    def release(self) -> str | None:
        """Unmount what we mounted, unless someone else now has an instance there or a file open."""
        if not self.mounted_by_us:
            return None
        others = [p.name for p in (self.path / "instances").iterdir()] if (self.path / "instances").is_dir() else []
        if others:
            return f"tracefs left mounted at {self.path}: instances {', '.join(sorted(others))} are there"
        r = subprocess.run(["umount", str(self.path)], capture_output=True, text=True)
        if r.returncode != 0:
            return f"tracefs left mounted at {self.path}: {(r.stderr or '').strip()}"
        self.mounted_by_us = False
        return None


def encode_dev(major: int, minor: int) -> int:
    """dev_t as block events carry it (MKDEV: major << 20 | minor).

    >>> encode_dev(8, 1)
    8388609
    """
    return (major << 20) | minor


@dataclass
class Instance:
    """One tracefs instance of hostpin's."""
    path: Path
    enabled: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)

    @classmethod
    def create(cls, mount: Mount, n: int) -> "Instance":
        path = mount.path / "instances" / f"{PREFIX}{os.getpid()}-{n}"
        try:
            os.mkdir(path)
        except OSError as exc:
            raise TraceFsError(f"cannot create tracefs instance {path}: {exc.strerror}") from None
        return cls(path)

    def write(self, rel: str, text: str, append: bool = False) -> None:
        fd = os.open(self.path / rel, os.O_WRONLY | (os.O_APPEND if append else os.O_TRUNC) | os.O_NOFOLLOW)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)

    def read(self, rel: str) -> str:
        with open(self.path / rel, encoding="utf-8", errors="replace") as fh:
            return fh.read()

    def has(self, event: str) -> bool:
        return (self.path / "events" / event / "enable").exists()

    def enable(self, event: str, filt: str | None = None) -> bool:
        """Enable one event (`system/name`); False (and listed as missing) when this kernel lacks it."""
        if not self.has(event):
            self.missing.append(event)
            return False
        if filt:
            self.write(f"events/{event}/filter", filt)
        self.write(f"events/{event}/enable", "1")
        self.enabled.append(event)
        return True

    def per_cpu_overrun(self) -> int:
        """Events the ring lost (overwritten before they were read), over every CPU."""
        total = 0
        base = self.path / "per_cpu"
        for cpu in base.iterdir() if base.is_dir() else ():
            try:
                text = (cpu / "stats").read_text()
            except OSError:
                continue
            m = re.search(r"^overrun: (\d+)", text, re.M)
            total += int(m.group(1)) if m else 0
        return total

    def remove(self) -> str | None:
        return remove_instance(self.path)


def _quiet(path: Path) -> None:
    """Stop an instance's tracing, its triggers and its events, so that rmdir may succeed."""
    for rel, text in (("tracing_on", "0"), ("set_event", ""), ("set_event_pid", "")):
        try:
            fd = os.open(path / rel, os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW)
            try:
                os.write(fd, text.encode() or b"\n")
            finally:
                os.close(fd)
        except OSError:
            pass
    events = path / "events"
    for trig in events.glob("*/*/trigger") if events.is_dir() else ():
        try:
            for line in trig.read_text().splitlines():
                if line and not line.startswith("#"):
                    with open(trig, "w") as fh:
                        fh.write("!" + line.split(":", 1)[0].split(" ", 1)[0])
        except OSError:
            pass


def remove_instance(path: Path) -> str | None:
    """Remove one instance (a readers' open trace_pipe makes it busy: close it first); None when gone."""
    if not path.exists():
        return None
    _quiet(path)
    try:
        os.rmdir(path)
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return None
        return f"cannot remove tracefs instance {path}: {exc.strerror}"
    return None


def instance_owner(name: str) -> int | None:
    """The pid in an instance's name, `hostpin-<pid>-<n>`.

    >>> instance_owner("hostpin-4711-0")
    4711
    """
    m = _NAME.match(name)
    return int(m.group(1)) if m else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stale_instances(mount_path: Path = TRACEFS) -> list[Path]:
    """hostpin-* instances whose owner (the pid in the name) is dead; [] when tracefs is not mounted."""
    base = mount_path / "instances"
    if not _is_tracefs(mount_path) or not base.is_dir():
        return []
    out = []
    for p in sorted(base.iterdir()):
        owner = instance_owner(p.name)
        if owner is not None and not _alive(owner):
            out.append(p)
    return out

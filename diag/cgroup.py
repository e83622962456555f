"""Memory cgroup of the current process (v1 and v2): limit, usage and where the limit binds.

Reads /proc/self/cgroup and /proc/self/mountinfo to find the process's memory cgroup, then
its files under /sys/fs/cgroup. For v2 every ancestor's memory.max is read, because the
tightest ancestor binds; for v1 the kernel's hierarchical_memory_limit already says it.

>>> parse_proc_cgroup("4:memory:/a/b\\n0::/\\n")
[(4, ['memory'], '/a/b'), (0, [], '/')]
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import PurePosixPath

from .rootfs import Root

__all__ = ["CgroupMemory", "parse_proc_cgroup", "parse_mountinfo", "read_cgroup_memory", "V1_UNLIMITED"]

V1_UNLIMITED = 1 << 62  # v1 prints PAGE_COUNTER_MAX * PAGE_SIZE (9223372036854771712) for no limit


@dataclass
class CgroupMemory:
    version: int
    path: str                      # the cgroup path as /proc/self/cgroup names it
    dir: str                       # its directory, relative to the root
    limit_bytes: int | None        # the binding limit (None: no limit anywhere up the tree)
    limit_dir: str | None          # where that limit is set
    usage_bytes: int | None        # usage where the limit binds
    swap_limit_bytes: int | None = None
    events: dict[str, int] = field(default_factory=dict)
    levels: list[dict] = field(default_factory=list)  # every level read, for the evidence

    @property
    def headroom_bytes(self) -> int | None:
        if self.limit_bytes is None or self.usage_bytes is None:
            return None
        return max(0, self.limit_bytes - self.usage_bytes)


def parse_proc_cgroup(text: str) -> list[tuple[int, list[str], str]]:
    out = []
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        out.append((int(parts[0]), [c for c in parts[1].split(",") if c], parts[2]))
    return out


def parse_mountinfo(text: str) -> list[dict[str, str]]:
    mounts = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        lf, rf = left.split(), right.split()
        if len(lf) < 5 or len(rf) < 3:
            continue
        mounts.append({"root": lf[3], "mount_point": lf[4], "fstype": rf[0], "super_options": rf[2]})
    return mounts


def _int_or_none(text: str | None) -> int | None:
    if text is None:
        return None
    text = text.strip()
    if text == "max":
        return None
    try:
        value = int(text)
    except ValueError:
        return None
    return None if value >= V1_UNLIMITED else value


def _dir_for(mount: dict[str, str], cg_path: str) -> str:
    rel = PurePosixPath(cg_path)
    mroot = PurePosixPath(mount["root"])
    if mroot != PurePosixPath("/") and (rel == mroot or mroot in rel.parents):
        rel = PurePosixPath("/") / rel.relative_to(mroot)
    return str(PurePosixPath(mount["mount_point"].lstrip("/")) / str(rel).lstrip("/")).rstrip("/")


def _parse_kv(text: str | None) -> dict[str, int]:
    out = {}
    for line in (text or "").splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            out[parts[0]] = int(parts[1])
    return out


def read_cgroup_memory(root: Root, pid: str = "self") -> CgroupMemory | None:
    """None when the process is in no memory cgroup we can read (reason in root.missing)."""
    cg_text = root.read_text(f"proc/{pid}/cgroup")
    mi_text = root.read_text(f"proc/{pid}/mountinfo")
    if cg_text is None or mi_text is None:
        return None
    groups = parse_proc_cgroup(cg_text)
    mounts = parse_mountinfo(mi_text)
    v1 = next((g for g in groups if "memory" in g[1]), None)
    if v1 is not None:
        mount = next((m for m in mounts if m["fstype"] == "cgroup" and "memory" in m["super_options"].split(",")), None)
        if mount is None:
            return None
        d = _dir_for(mount, v1[2])
        limit = _int_or_none(root.read_text(f"{d}/memory.limit_in_bytes"))
        usage = _int_or_none(root.read_text(f"{d}/memory.usage_in_bytes"))
        stat = _parse_kv(root.read_text(f"{d}/memory.stat"))
        hier = stat.get("hierarchical_memory_limit")
        if hier is not None and hier < V1_UNLIMITED and (limit is None or hier < limit):
            limit = hier
        memsw = _int_or_none(root.read_text(f"{d}/memory.memsw.limit_in_bytes"))
        return CgroupMemory(version=1, path=v1[2], dir=d, limit_bytes=limit, limit_dir=d if limit else None,
                            usage_bytes=usage, swap_limit_bytes=memsw,
                            levels=[{"dir": d, "limit_bytes": limit, "usage_bytes": usage}])
    v2 = next((g for g in groups if g[0] == 0), None)
    mount = next((m for m in mounts if m["fstype"] == "cgroup2"), None)
    if v2 is None or mount is None:
        return None
    leaf = _dir_for(mount, v2[2])
    top = mount["mount_point"].lstrip("/").rstrip("/")
    levels = []
    d = leaf
    while True:
        limit_text = root.read_text(f"{d}/memory.max")
        if limit_text is not None:  # the root cgroup has no memory.max
            levels.append({"dir": d, "limit_bytes": _int_or_none(limit_text),
                           "usage_bytes": _int_or_none(root.read_text(f"{d}/memory.current"))})
        if d == top or "/" not in d or len(d) <= len(top):
            break
        d = d.rsplit("/", 1)[0]
    if not levels:
        return CgroupMemory(version=2, path=v2[2], dir=leaf, limit_bytes=None, limit_dir=None,
                            usage_bytes=_int_or_none(root.read_text(f"{leaf}/memory.current")))
    bound = [lv for lv in levels if lv["limit_bytes"] is not None and lv["usage_bytes"] is not None]
    binding = min(bound, key=lambda lv: lv["limit_bytes"] - lv["usage_bytes"]) if bound else None
    return CgroupMemory(
        version=2, path=v2[2], dir=leaf,
        limit_bytes=binding["limit_bytes"] if binding else None,
        limit_dir=binding["dir"] if binding else None,
        usage_bytes=binding["usage_bytes"] if binding else levels[0]["usage_bytes"],
        swap_limit_bytes=_int_or_none(root.read_text(f"{leaf}/memory.swap.max")),
        events=_parse_kv(root.read_text(f"{leaf}/memory.events")),
        levels=levels,
    )

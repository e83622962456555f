"""Memory cgroup of the process that will pin (v1 and v2): every level's limit, usage and
reclaimable file cache, where the limit binds, and where throttling starts (memory.high).

Reads /proc/PID/cgroup (this process by default, `--pid`) or takes a cgroup given by path
(`--cgroup`), finds its directory through this process's /proc/self/mountinfo, then walks
from it up to the hierarchy's root reading each level with its own usage, because the
tightest ancestor binds. Headroom at a level is what the kernel can still give before it
must swap or OOM-kill: limit - (usage - page cache on the file LRU lists, active and inactive
alike), on v1 and v2; the dirty part of that cache is written back first. v2's `file` counts
shmem (where cudaHostAlloc pages are charged) and is not used.
On v1 the leaf's memory.stat also prints hierarchical_memory_limit, the lowest limit above
it: when the walk cannot see that ancestor (a container that mounts only its own subtree),
that limit still binds and is reported with the leaf's usage.

>>> parse_proc_cgroup("4:memory:/a/b\\n0::/\\n")
[(4, ['memory'], '/a/b'), (0, [], '/')]
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from .parsing import ParsedDict, ParsedList, to_int
from .rootfs import Root

__all__ = ["CgroupMemory", "CgroupLevel", "CgroupError", "CgroupDamaged", "CgroupUnseen", "parse_proc_cgroup", "parse_mountinfo", "parse_kv",
           "read_cgroup_memory", "V1_UNLIMITED"]

V1_UNLIMITED = 1 << 62  # v1 prints PAGE_COUNTER_MAX * PAGE_SIZE (9223372036854771712 on 4 KiB pages) for no limit


class CgroupError(ValueError):
    """A cgroup that was asked for (--cgroup, --pid) and cannot be found or read; the message says why."""


class CgroupDamaged(ValueError):
    """The files that say which cgroup the process is in cannot be parsed, or contradict each other."""


class CgroupUnseen(ValueError):
    """The process's cgroup is outside the root of the mount that shows its hierarchy: it exists,
    but no file of it can be read here (its limits are not known, not absent)."""


@dataclass
class CgroupLevel:
    dir: str                               # relative to the root, e.g. sys/fs/cgroup/kubepods/pod1
    limit_bytes: int | None = None         # memory.max / memory.limit_in_bytes; None: no limit
    high_bytes: int | None = None          # v2 memory.high: reclaim and throttling start here
    usage_bytes: int | None = None         # memory.current / memory.usage_in_bytes
    inactive_file_bytes: int | None = None  # memory.stat inactive_file (v1: total_inactive_file)
    swap_limit_bytes: int | None = None    # v2 memory.swap.max; v1 memory.memsw.limit_in_bytes (memory + swap)
    swap_usage_bytes: int | None = None    # v2 memory.swap.current; v1 memsw.usage - usage
    inferred: str | None = None            # how a level not read directly was derived
    bad: list[str] = field(default_factory=list)
    # memory.stat, the leaf and everything below it (v1: the total_* lines, as usage is hierarchical)
    active_file_bytes: int | None = None   # active_file: file pages on the LRU (not shmem: v2 'file' counts it)
    dirty_bytes: int | None = None         # file_dirty (v1 total_dirty)
    writeback_bytes: int | None = None     # file_writeback (v1 total_writeback)
    anon_bytes: int | None = None          # anon (v1 total_rss)
    shmem_bytes: int | None = None         # shmem (v1 total_shmem): cudaHostAlloc pages are charged here
    unevictable_bytes: int | None = None   # unevictable (v1 total_unevictable): mlocked, never reclaimed
    swappiness: int | None = None          # v1 memory.swappiness (0: the cgroup's own reclaim never swaps)

    @property
    def file_lru_bytes(self) -> int:
        """Page cache on the file LRU lists, active and inactive alike: reclaim drops either."""
        return (self.active_file_bytes or 0) + (self.inactive_file_bytes or 0)

    @property
    def dirty_cache_bytes(self) -> int:
        """Page cache that must be written before it can be dropped (dirty and under writeback)."""
        return min(self.file_lru_bytes, (self.dirty_bytes or 0) + (self.writeback_bytes or 0))

    @property
    def clean_cache_bytes(self) -> int:
        """Page cache reclaim can drop at once."""
        return self.file_lru_bytes - self.dirty_cache_bytes

    @property
    def swappable_bytes(self) -> int:
        """Anonymous and shmem pages reclaim could push to swap (mlocked ones never)."""
        return max(0, (self.anon_bytes or 0) + (self.shmem_bytes or 0) - (self.unevictable_bytes or 0))

    @property
    def working_set_bytes(self) -> int | None:
        """Usage that reclaim cannot drop without swap: usage less the page cache on the file LRU
        lists, clean (dropped at once) and dirty (written back first). Measured: a cgroup full of
        page cache read twice (all on the active list) takes a pin of its size less that cache
        on v1 and v2 (tests/test_cgroup_reclaim_live.py, bench/gpu_cgroup_pagecache_headroom.sh)."""
        if self.usage_bytes is None:
            return None
        return max(0, self.usage_bytes - self.file_lru_bytes)

    @property
    def free_bytes(self) -> int | None:
        """What the limit gives before reclaim starts."""
        if self.limit_bytes is None or self.usage_bytes is None:
            return None
        return max(0, self.limit_bytes - self.usage_bytes)

    @property
    def headroom_bytes(self) -> int | None:
        if self.limit_bytes is None or self.working_set_bytes is None:
            return None
        return max(0, self.limit_bytes - self.working_set_bytes)

    @property
    def high_headroom_bytes(self) -> int | None:
        if self.high_bytes is None or self.working_set_bytes is None:
            return None
        return max(0, self.high_bytes - self.working_set_bytes)


@dataclass
class CgroupMemory:
    version: int
    path: str                      # the cgroup path as /proc/PID/cgroup names it (or --cgroup)
    dir: str                       # its directory, relative to the root
    levels: list[CgroupLevel] = field(default_factory=list)  # leaf first, up to the hierarchy's root
    source: str = "self"           # whose cgroup: 'self', 'pid 1234', or 'path'
    events: dict[str, int] = field(default_factory=dict)     # v2 memory.events of the leaf
    hierarchical_limit_bytes: int | None = None              # v1 leaf memory.stat hierarchical_memory_limit
    missing: list[str] = field(default_factory=list)         # files of a level that could not be read
    bad: list[str] = field(default_factory=list)             # files whose value is damaged
    not_captured: list[str] = field(default_factory=list)    # a limit or usage a captured tree lacks

    @property
    def binding(self) -> CgroupLevel | None:
        """The level with the least headroom, where a limit is set."""
        limited = [lv for lv in self.levels if lv.headroom_bytes is not None]
        return min(limited, key=lambda lv: lv.headroom_bytes) if limited else None

    @property
    def throttling(self) -> CgroupLevel | None:
        """The level whose memory.high is reached first (v2)."""
        highs = [lv for lv in self.levels if lv.high_headroom_bytes is not None]
        return min(highs, key=lambda lv: lv.high_headroom_bytes) if highs else None

    # the figures the headroom check and the reports quote
    @property
    def limit_bytes(self) -> int | None:
        return self.binding.limit_bytes if self.binding else None

    @property
    def limit_dir(self) -> str | None:
        return self.binding.dir if self.binding else None

    @property
    def usage_bytes(self) -> int | None:
        level = self.binding or (self.levels[0] if self.levels else None)
        return level.usage_bytes if level else None

    @property
    def headroom_bytes(self) -> int | None:
        return self.binding.headroom_bytes if self.binding else None

    @property
    def can_swap(self) -> bool | None:
        """Whether the leaf's pages may go to swap at all (v2 memory.swap.max 0, v1 memsw equal to
        the memory limit, or v1 memory.swappiness 0, forbid it). None when unknown."""
        leaf = self.levels[0] if self.levels else None
        if leaf is None:
            return None
        if self.version == 2:
            return leaf.swap_limit_bytes != 0
        if leaf.swappiness == 0:  # mm/vmscan.c get_scan_count: cgroup reclaim with swappiness 0 scans file only
            return False
        if leaf.swap_limit_bytes is None:
            return True
        return leaf.limit_bytes is None or leaf.swap_limit_bytes > leaf.limit_bytes


def parse_proc_cgroup(text: str) -> ParsedList:
    """(hierarchy id, controllers, path) per line; a damaged line is named in `.bad`."""
    out = ParsedList()
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split(":", 2)
        hid = to_int(parts[0]) if len(parts) == 3 else None
        if hid is None or not parts[2].startswith("/"):
            out.bad.append(line.strip()[:80])
            continue
        out.append((hid, [c for c in parts[1].split(",") if c], parts[2]))
    return out


def parse_mountinfo(text: str) -> ParsedList:
    """Mounts as proc(5) prints them: six fields (mount id, parent id, major:minor, root, mount
    point, mount options), optional fields, ' - ', then fstype, source and the super options,
    which run to the end of the line (a 9p mount prints them with spaces unescaped; automemlimit's
    cgroups_test.go cases, tests/fixtures/automemlimit-mountinfo). A line with fewer than six
    fields before the separator is damage.

    >>> parse_mountinfo("25 1 0:22 / /dev rw - devtmpfs udev rw\\n36 35 98:0 /a /b - ext3 /dev/root rw\\n")
    [{'root': '/', 'mount_point': '/dev', 'fstype': 'devtmpfs', 'super_options': 'rw'}]
    """
    out = ParsedList()
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        lf, rf = left.split(), right.split(None, 2)
        if not sep or len(lf) < 6 or len(rf) < 3:
            if line.strip():
                out.bad.append(line.strip()[:80])
            continue
        out.append({"root": lf[3], "mount_point": lf[4], "fstype": rf[0], "super_options": rf[2].rstrip()})
    return out


def parse_kv(text: str | None) -> ParsedDict:
    """memory.stat / memory.events: 'name value' lines; a damaged line is named in `.bad`."""
    out = ParsedDict()
    for line in (text or "").splitlines():
        parts = line.split()
        if not parts:
            continue
        value = to_int(parts[1]) if len(parts) == 2 else None
        if value is None:
            out.bad.append(line.strip()[:60])
            continue
        out[parts[0]] = value
    return out


def _dir_for(mount: dict[str, str], cg_path: str) -> str:
    """The directory of cgroup cg_path under the mount; CgroupUnseen when the mount's root does not
    hold it (automemlimit's resolveCgroupPath case 'invalid cgroup path outside root',
    tests/fixtures/automemlimit-cgroup-outside-root): joining it under the mount point would read
    some other cgroup's files, or none, and judge against MemAvailable while the real limit binds.

    >>> _dir_for({"root": "/container0", "mount_point": "/fake/mount"}, "/container0/group1")
    'fake/mount/group1'
    """
    rel = PurePosixPath(cg_path)
    mroot = PurePosixPath(mount["root"])
    if mroot != PurePosixPath("/"):
        if not (rel == mroot or mroot in rel.parents):
            raise CgroupUnseen(f"{cg_path} is not under the root {mroot} of the cgroup mount at {mount['mount_point']}: "
                               "its limits cannot be read from here")
        rel = PurePosixPath("/") / rel.relative_to(mroot)
    return str(PurePosixPath(mount["mount_point"].lstrip("/")) / str(rel).lstrip("/")).rstrip("/")


class _LevelReader:
    def __init__(self, root: Root, version: int, result: CgroupMemory):
        self.root, self.version, self.result = root, version, result

    def value(self, d: str, name: str, unlimited_words=("max",), decisive: bool = False) -> int | None:
        text = self.root.read_text(f"{d}/{name}")
        if text is None:
            self.result.missing.append(f"{d}/{name}")
            # a limit or usage that a captured tree lacks is not "no limit", unless the capture saw it absent
            if decisive and not self.root.live and not self.root.known_absent(f"{d}/{name}"):
                self.result.not_captured.append(f"{d}/{name}")
            return None
        text = text.strip()
        if text in unlimited_words:
            return None
        value = to_int(text)
        if value is None or value < 0:
            self.result.bad.append(f"{d}/{name}: {text[:30]!r}")
            return None
        return None if value >= V1_UNLIMITED else value

    def stat(self, d: str) -> ParsedDict | None:
        text = self.root.read_text(f"{d}/memory.stat")
        if text is None:
            self.result.missing.append(f"{d}/memory.stat")
            return None
        stat = parse_kv(text)
        self.result.bad += [f"{d}/memory.stat: {b!r}" for b in stat.bad]
        return stat

    def level(self, d: str) -> CgroupLevel:
        lv = self._level(d)
        usage = lv.usage_bytes
        # the file LRU lists are part of the usage they are charged to; v1 usage is approximate (per-CPU
        # charge batches), so a little above it can be real, far above it is no reading to judge by
        if usage is not None and lv.file_lru_bytes > usage + max(256 << 20, usage // 10):
            raise CgroupDamaged(f"{d}: memory.stat puts {lv.file_lru_bytes:,} bytes on the file LRU lists, far above "
                                f"the cgroup's usage of {usage:,} bytes that includes them")
        return lv

    def _level(self, d: str) -> CgroupLevel:
        stat = self.stat(d) or {}
        if self.version == 1:
            usage = self.value(d, "memory.usage_in_bytes", decisive=True)
            memsw_usage = self.value(d, "memory.memsw.usage_in_bytes") if self.root.exists(
                f"{d}/memory.memsw.usage_in_bytes") else None
            def total(name: str) -> int | None:  # usage is hierarchical: so are the total_* lines
                return stat.get(f"total_{name}", stat.get(name))

            return CgroupLevel(
                dir=d, limit_bytes=self.value(d, "memory.limit_in_bytes", decisive=True), usage_bytes=usage,
                inactive_file_bytes=total("inactive_file"), active_file_bytes=total("active_file"),
                dirty_bytes=total("dirty"), writeback_bytes=total("writeback"), anon_bytes=total("rss"),
                shmem_bytes=total("shmem"), unevictable_bytes=total("unevictable"),
                swappiness=self.value(d, "memory.swappiness") if self.root.exists(f"{d}/memory.swappiness") else None,
                swap_limit_bytes=self.value(d, "memory.memsw.limit_in_bytes") if self.root.exists(
                    f"{d}/memory.memsw.limit_in_bytes") else None,
                swap_usage_bytes=(memsw_usage - usage) if memsw_usage is not None and usage is not None else None)
        return CgroupLevel(
            dir=d, limit_bytes=self.value(d, "memory.max", decisive=True), high_bytes=self.value(d, "memory.high"),
            usage_bytes=self.value(d, "memory.current", decisive=True), inactive_file_bytes=stat.get("inactive_file"),
            active_file_bytes=stat.get("active_file"), dirty_bytes=stat.get("file_dirty"),
            writeback_bytes=stat.get("file_writeback"), anon_bytes=stat.get("anon"), shmem_bytes=stat.get("shmem"),
            unevictable_bytes=stat.get("unevictable"),
            swap_limit_bytes=self.value(d, "memory.swap.max") if self.root.exists(f"{d}/memory.swap.max") else None,
            swap_usage_bytes=self.value(d, "memory.swap.current") if self.root.exists(
                f"{d}/memory.swap.current") else None)


def _mounts(root: Root) -> ParsedList | None:
    text = root.read_text("proc/self/mountinfo")
    return parse_mountinfo(text) if text is not None else None


def _from_path(root: Root, mounts: list[dict], path: str) -> tuple[int, dict, str, str]:
    """(version, mount, dir, cgroup path) for a cgroup named by directory or by cgroup path."""
    v1 = next((m for m in mounts if m["fstype"] == "cgroup" and "memory" in m["super_options"].split(",")), None)
    v2 = next((m for m in mounts if m["fstype"] == "cgroup2"), None)
    mount, version = (v1, 1) if v1 is not None else (v2, 2)
    if mount is None:
        raise CgroupError("no memory cgroup hierarchy is mounted (neither v1 'memory' nor cgroup2)")
    if root.live and not path.startswith("/") and os.path.isdir(path):  # ./sub, from inside a cgroup's directory
        path = os.path.abspath(path)
    if ".." in PurePosixPath(path).parts:
        raise CgroupError(f"{path!r}: a cgroup path may not contain '..'")
    clean = "/" + "/".join(p for p in path.strip().split("/") if p and p != ".")
    mp = mount["mount_point"].rstrip("/") or "/"
    if clean == mp or clean.startswith(mp + "/"):  # a directory under the mount point
        cg_path = clean[len(mp):] or "/"
    else:
        cg_path = clean
    d = str(PurePosixPath(mp.lstrip("/")) / cg_path.lstrip("/")).rstrip("/")
    return version, mount, d, cg_path


def read_cgroup_memory(root: Root, pid: str | int = "self", cgroup_path: str | None = None) -> CgroupMemory | None:
    """The memory cgroup of pid (or the one at cgroup_path). None when the process is in no
    memory cgroup this root can show (the reason is in root.missing). CgroupError when a
    --pid or --cgroup that was asked for cannot be found."""
    mounts = _mounts(root)
    if mounts is None:
        if cgroup_path is not None or pid != "self":
            raise CgroupError(f"cannot find cgroup mounts: {root.display('proc/self/mountinfo')} "
                              f"({root.missing.get('proc/self/mountinfo')})")
        return None
    if cgroup_path is not None:
        version, mount, d, cg_path = _from_path(root, mounts, cgroup_path)
        if not root.exists(d):
            raise CgroupError(f"no cgroup at {root.display(d)} (from --cgroup {cgroup_path})")
        source = "path"
    else:
        cg_text = root.read_text(f"proc/{pid}/cgroup")
        if cg_text is None:
            if pid != "self":
                raise CgroupError(f"cannot read /proc/{pid}/cgroup ({root.missing.get(f'proc/{pid}/cgroup')}): "
                                  "is the process still running?")
            return None
        groups = parse_proc_cgroup(cg_text)
        if groups.bad or not groups:
            raise CgroupDamaged(f"unreadable line {groups.bad[0]!r}" if groups.bad else "no cgroup line")
        v1 = next((g for g in groups if "memory" in g[1]), None)
        if v1 is not None:
            version = 1
            mount = next((m for m in mounts if m["fstype"] == "cgroup" and "memory" in m["super_options"].split(",")), None)
            cg_path = v1[2]
        else:
            version = 2
            v2 = next((g for g in groups if g[0] == 0), None)
            mount = next((m for m in mounts if m["fstype"] == "cgroup2"), None)
            if v2 is None:
                return None
            cg_path = v2[2]
        if mount is None:
            if mounts.bad:  # the mount may be the line that could not be read
                raise CgroupDamaged(f"{root.display('proc/self/mountinfo')}: unreadable line {mounts.bad[0]!r}")
            if not root.live:  # a capture names the process's cgroup but not where it is mounted
                raise CgroupDamaged(f"{root.display('proc/self/mountinfo')}: no {'cgroup memory' if version == 1 else 'cgroup2'} "
                                    f"mount for {cg_path} (from {root.display(f'proc/{pid}/cgroup')})")
            return None
        if cg_path.startswith("/..") and pid != "self":
            raise CgroupError(f"the cgroup of pid {pid} ({cg_path}) is outside this process's cgroup namespace; "
                              "run preflight in the host's cgroup namespace, or give --cgroup PATH")
        try:
            d = _dir_for(mount, cg_path)
        except CgroupUnseen as exc:
            if pid != "self":
                raise CgroupError(f"the cgroup of pid {pid}: {exc}; give --cgroup PATH") from None
            raise
        source = "self" if pid == "self" else f"pid {pid}"
    result = CgroupMemory(version=version, path=cg_path, dir=d, source=source)
    reader = _LevelReader(root, version, result)
    top = mount["mount_point"].lstrip("/").rstrip("/")
    level = d
    limit_file = "memory.limit_in_bytes" if version == 1 else "memory.max"
    unseen = []  # ancestors a captured tree holds no limit file for, and does not say the node lacked
    while True:
        # every level is tried, so that a snapshot records a limit file the node does not have as
        # absent (a level without the memory controller)
        if level != top or version == 1:  # the v2 root cgroup has no memory.max: nothing to read there
            if level == d or root.read_text(f"{level}/{limit_file}") is not None:
                result.levels.append(reader.level(level))
            elif not (root.live or root.known_absent(f"{level}/{limit_file}")):
                unseen.append(f"{level}/{limit_file}")
        if level == top or "/" not in level or len(level) <= len(top):
            break
        level = level.rsplit("/", 1)[0]
    stat = parse_kv(root.read_text(f"{d}/memory.stat")) if version == 1 and result.levels else {}
    # v1's leaf prints the lowest limit above it (hierarchical_memory_limit): that covers unseen ancestors
    if unseen and "hierarchical_memory_limit" not in stat:
        result.not_captured += unseen
    if version == 1 and result.levels:
        hier = stat.get("hierarchical_memory_limit")
        if hier is not None and hier < V1_UNLIMITED:
            result.hierarchical_limit_bytes = hier
            walked = [lv.limit_bytes for lv in result.levels if lv.limit_bytes is not None]
            if not walked or hier < min(walked):
                leaf = result.levels[0]
                result.levels.append(CgroupLevel(
                    dir=f"an ancestor of {d}", limit_bytes=hier, usage_bytes=leaf.usage_bytes,
                    inactive_file_bytes=leaf.inactive_file_bytes, active_file_bytes=leaf.active_file_bytes,
                    dirty_bytes=leaf.dirty_bytes, writeback_bytes=leaf.writeback_bytes, anon_bytes=leaf.anon_bytes,
                    shmem_bytes=leaf.shmem_bytes, unevictable_bytes=leaf.unevictable_bytes,
                    swappiness=leaf.swappiness,
                    inferred="hierarchical_memory_limit in the leaf's memory.stat; that ancestor's own usage "
                             "is not visible here, so the leaf's is used (the ancestor's is at least as large)"))
    if version == 2:
        events = parse_kv(root.read_text(f"{d}/memory.events"))
        result.events = dict(events)
    return result

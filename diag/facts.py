"""The node's readings, read once through a Root, and the facts about a node that matter for
pinning, in one flat dict, made from those same readings.

`Readings` is what the preflight checks read (through their Context) and what `node_facts`
summarises, so a run's facts and its verdict never come from two different readings of a
file. Each reading knows its state: read, absent on the node (a kernel feature that is not
there), not captured (a captured tree that lacks it), unreadable, or damaged (its text
could not be parsed), and the files behind it.
"""
from __future__ import annotations

import json
import platform
from functools import cached_property
from pathlib import Path
from typing import Any

from . import (buddyinfo, cgroup, hotplug, iommu, kernel, limits, meminfo, numa, nvidia, psi, sysctl, swap, thp,
               vmstat, zoneinfo)
from .pagesize import PageSize, page_size_for, thp_order
from .parsing import describe_bad
from .rootfs import Root

__all__ = ["Readings", "node_facts", "FACT_LABELS", "FACT_SOURCES", "OK", "ABSENT", "NOT_CAPTURED", "UNREADABLE",
           "DAMAGED", "load_node_probe", "live_node_probe"]

OK, ABSENT, NOT_CAPTURED, UNREADABLE, DAMAGED = "ok", "absent", "not captured", "unreadable", "damaged"

# fact name -> the file(s) behind it, as a person would look for them
FACT_SOURCES = {
    "meminfo": ("proc/meminfo",), "vmstat": ("proc/vmstat",), "buddyinfo": ("proc/buddyinfo",),
    "zoneinfo": ("proc/zoneinfo",), "swaps": ("proc/swaps",), "psi": ("proc/pressure/memory",),
    "release": ("proc/sys/kernel/osrelease", "proc/version"), "cmdline": ("proc/cmdline",),
    "thp": ("sys/kernel/mm/transparent_hugepage/enabled",), "memlock": ("proc/self/limits",),
    "proc_status": ("proc/self/status",), "cgroup": ("proc/self/cgroup", "proc/self/mountinfo"),
    "nvidia": ("proc/driver/nvidia/version",), "hung_task": ("proc/sys/kernel/hung_task_timeout_secs",),
    "vm": ("proc/sys/vm/swappiness",), "iommu": ("sys/kernel/iommu_groups",),
    "numa_nodes": ("sys/devices/system/node",), "hotplug": ("sys/devices/system/memory/auto_online_blocks",),
    "page_size": ("sys/kernel/mm/transparent_hugepage/hpage_pmd_size", "probes/node.json"),
}

# fields every kernel we judge prints: their absence is damage, not "none". MemAvailable (3.14+) is
# not among them: without it (older kernels, runtimes that rewrite meminfo: procfs's and
# node_exporter's fixtures) it is estimated as the kernel computes it, from zoneinfo's watermarks
MEMINFO_REQUIRED = ("MemTotal", "MemFree", "SwapTotal", "SwapFree")
# sysctls a captured tree must hold where it holds its group at all (they decide the swap and hung-task checks)
SYSCTLS_REQUIRED = {"vm": ("proc/sys/vm", ()),
                    "hung_task": ("proc/sys/kernel", ("hung_task_timeout_secs", "hung_task_panic"))}

# facts that need every one of their sources (the others read the first one there)
NEEDS_ALL_SOURCES = {"cgroup"}

FACT_LABELS = {
    "host": "host", "kernel": "kernel", "driver": "NVIDIA driver", "gpus": "GPUs", "thp_enabled": "THP enabled",
    "thp_defrag": "THP defrag", "mem_total_bytes": "MemTotal", "mem_available_bytes": "MemAvailable",
    "swap_total_bytes": "swap total", "swap_used_bytes": "swap used", "swappiness": "swappiness",
    "free_order9_bytes": "free in huge-page blocks (order >= THP order)",
    "unusable_index_order9": "unusable index at the THP order (Normal)",
    "psi_some_avg10": "PSI memory some avg10", "hotplug": "memhp_default_state", "page_size": "page size",
}


def live_node_probe(root: Root) -> dict[str, Any]:
    """What only a live process knows, kept next to a captured tree (probes/node.json)."""
    from .pagesize import live_page_size
    devices = swap.read_swaps(root) or []
    return {"schema": "hostpin.node-probe", "schema_version": 1, "page_size": live_page_size(),
            "machine": platform.machine(), "swap_devices": [swap.classify_swap_device(d) for d in devices],
            "zswap_enabled": swap.read_zswap_enabled(root)}


def load_node_probe(root: Root) -> tuple[dict | None, str | None]:
    """(probe, problem): the node probe kept next to a captured tree (in the run that holds it as
    root/, or in the tree itself), if any; read confined to them, at most 1 MiB."""
    for where, data in (("probes/node.json beside the tree", root.beside("probes/node.json")),
                        (root.display("probes/node.json"), _in_tree(root, "probes/node.json"))):
        if data is None:
            continue
        try:
            parsed = json.loads(data)
        except ValueError as exc:
            return None, f"{where}: damaged ({type(exc).__name__})"
        if not isinstance(parsed, dict):
            return None, f"{where}: damaged (not an object)"
        return parsed, None
    return None, None


def _in_tree(root: Root, rel: str, limit: int = 1 << 20) -> bytes | None:
    from .confined import Limits, PathRefused, open_dir
    try:
        with open_dir(root.path, Limits(total_bytes=limit, files=1, file_bytes=limit)) as d:
            return d.read_bytes(rel, limit=limit) if d.is_file(rel) else None
    except (OSError, PathRefused):
        return None


class Readings:
    """Every reading of a node a check or a fact may need, read once, with its state."""

    def __init__(self, root: Root, pid: str | int = "self", cgroup_path: str | None = None,
                 node_probe: dict | None = None):
        self.root = root
        self.pid = pid
        self.cgroup_path = cgroup_path
        self._node_probe = node_probe
        self.damage: dict[str, list[str]] = {}   # fact -> what could not be read in it
        self.gaps: dict[str, list[str]] = {}     # fact -> files a captured tree lacks behind it

    # -- state ---------------------------------------------------------------------------
    def file_state(self, rel: str) -> str:
        rel = rel.strip("/")
        if self.root.exists(rel) and not self.root.path.joinpath(rel).is_file():
            return OK  # a directory (or one the capture recorded as empty)
        if self.root.read_text(rel) is not None:
            return OK
        reason = self.root.missing.get(rel, "absent")
        if reason != "absent":
            return UNREADABLE
        if self.root.live or self.root.known_absent(rel):
            return ABSENT
        return NOT_CAPTURED

    def state(self, fact: str) -> str:
        """The state of a fact: damaged wins, then the state of its first readable source."""
        if hasattr(type(self), fact):
            getattr(self, fact)  # read it, so that damage is known
        if self.damage.get(fact):
            return DAMAGED
        if self.gaps.get(fact):
            return NOT_CAPTURED
        if fact == "cgroup" and self.cgroup_path is not None:
            return OK  # given by --cgroup (read, or 'none')
        if fact == "page_size":  # from sysconf, the snapshot's probe, or hpage_pmd_size: else assumed
            return NOT_CAPTURED if self.page.assumed else OK
        sources = FACT_SOURCES.get(fact, ())
        states = [self.file_state(rel) for rel in sources]
        if not states or (all if fact in NEEDS_ALL_SOURCES else any)(st == OK for st in states):
            return OK
        for s in (UNREADABLE, NOT_CAPTURED, ABSENT):
            if s in states:
                return s
        return OK

    def describe(self, fact: str) -> str:
        """'DIR/proc/zoneinfo (not captured)' or the damage, for a message."""
        state = self.state(fact)
        rel = FACT_SOURCES.get(fact, (fact,))[0]
        if state == DAMAGED:
            if all(b.startswith(("sys/", "proc/")) for b in self.damage[fact]):  # each names its own file
                bad = self.damage[fact]
                return "; ".join(self.root.display(b) for b in bad[:3]) + (f" (and {len(bad) - 3} more)"
                                                                          if len(bad) > 3 else "")
            return describe_bad(self.root.display(rel), self.damage[fact])
        if self.gaps.get(fact):
            return ", ".join(self.root.display(g) for g in self.gaps[fact][:3]) + " (not captured)"
        if fact in NEEDS_ALL_SOURCES:  # name the source that is not there
            rel = next((r for r in FACT_SOURCES[fact] if self.file_state(r) != OK), rel)
        return f"{self.root.display(rel)} ({state if state != UNREADABLE else self.root.missing.get(rel)})"

    def _damaged(self, fact: str, bad: list[str]) -> None:
        if bad:
            self.damage.setdefault(fact, []).extend(bad)

    def _checked(self, fact: str, reading):
        """A parser's result, with what it could not read recorded as the fact's damage; a file
        whose last line has no end was cut short (the kernel ends every line of these files)."""
        if reading is not None:
            self._damaged(fact, list(getattr(reading, "bad", [])))
            self._cut_short(fact)
        return reading

    def _cut_short(self, fact: str) -> None:
        rel = FACT_SOURCES.get(fact, ("",))[0]
        text = self.root.read_text(rel) if rel.startswith("proc/") else None
        if text and not text.endswith("\n"):
            self._damaged(fact, [f"cut short (its last line {text.splitlines()[-1][-40:]!r} has no end)"])

    # -- readings ------------------------------------------------------------------------
    @cached_property
    def node_probe(self) -> dict | None:
        if self._node_probe is not None:
            return self._node_probe
        if self.root.live:
            return None
        probe, problem = load_node_probe(self.root)
        if problem:
            self._damaged("node_probe", [problem])
        return probe

    @cached_property
    def page(self) -> PageSize:
        recorded = (self.node_probe or {}).get("page_size")
        return page_size_for(self.root.live, recorded, self.thp.pmd_size_bytes)

    @property
    def page_size(self) -> int:
        return self.page.bytes

    @cached_property
    def thp_order(self) -> int:
        order = thp_order(self.thp.pmd_size_bytes, self.page_size)
        # no hpage_pmd_size: a PMD maps one page of 8-byte entries (x86-64, arm64): page / 8 pages
        return order if order is not None else self.page_size.bit_length() - 1 - 3

    @cached_property
    def machine(self) -> str | None:
        if self.root.live:
            return platform.machine()
        probe = (self.node_probe or {}).get("machine")
        if isinstance(probe, str):
            return probe
        return self.nvidia.version.arch if self.nvidia.loaded and self.nvidia.version else None

    @cached_property
    def meminfo(self):
        m = meminfo.read_meminfo(self.root)
        if m is not None:
            self._damaged("meminfo", [b for b in m.bad if b.split(":")[0] in meminfo._FIELDS.values()]
                          + [f"no {k} line" for k in MEMINFO_REQUIRED if k in m.missing and k not in m.raw
                             and not any(b.startswith(k + ":") for b in m.bad)])
            for small, big in (("available_bytes", "total_bytes"), ("free_bytes", "total_bytes"),
                               ("swap_free_bytes", "swap_total_bytes")):
                a, b = getattr(m, small), getattr(m, big)
                if a is not None and b is not None and a > b:  # no kernel prints that
                    self._damaged("meminfo", [f"{small.replace('_bytes', '')} {a:,} B is more than "
                                              f"{big.replace('_bytes', '')} {b:,} B"])
            self._cut_short("meminfo")
            if m.available_bytes is None and "MemAvailable" not in m.raw and not any(
                    b.startswith("MemAvailable:") for b in m.bad):
                estimate = meminfo.estimate_available(m, self.zoneinfo if self.state("zoneinfo") == OK else None)
                if estimate is not None:
                    m.available_bytes, m.available_estimate = estimate["available_bytes"], estimate
        return m

    @cached_property
    def vmstat(self):
        return self._checked("vmstat", vmstat.read_vmstat(self.root))

    @cached_property
    def buddyinfo(self):
        return self._zones("buddyinfo", buddyinfo.read_buddyinfo(self.root, self.page_size))

    @cached_property
    def zoneinfo(self):
        return self._zones("zoneinfo", zoneinfo.read_zoneinfo(self.root, self.page_size))

    def _zones(self, fact: str, zones):
        """Every node has a zone: a file that lists none is damaged (empty), not 'nothing there'."""
        self._checked(fact, zones)
        if zones is not None and not zones and not zones.bad:
            self._damaged(fact, ["no zone in it"])
        return zones

    @cached_property
    def swaps(self):
        return self._checked("swaps", swap.read_swaps(self.root))

    @cached_property
    def psi(self):
        return self._checked("psi", psi.read_psi_memory(self.root))

    @cached_property
    def release(self) -> str | None:
        rel = kernel.read_release(self.root)
        if rel is not None and kernel.parse_release(rel) is None:
            self._damaged("release", [f"{rel[:40]!r} is no kernel release"])
        elif rel is None and self.root.read_text("proc/version") is not None:
            self._damaged("release", ["proc/version has no 'Linux version' line and osrelease is missing"])
        return rel

    @cached_property
    def cmdline(self):
        return kernel.read_cmdline(self.root)

    @cached_property
    def thp(self):
        return self._checked("thp", thp.read_thp(self.root))

    @cached_property
    def vm(self):
        return self._sysctls("vm", sysctl.read_vm_sysctls(self.root))

    @cached_property
    def hung_task(self):
        return self._sysctls("hung_task", sysctl.read_hung_task(self.root))

    def _sysctls(self, fact: str, values):
        """A group of sysctls; in a captured tree that holds the group, a decisive one it lacks is a gap."""
        self._checked(fact, values)
        base, required = SYSCTLS_REQUIRED[fact]
        if not self.root.live and any(values.get(n) is not None for n in values):
            lacking = [f"{base}/{n}" for n in required if values.get(n) is None and not self.root.known_absent(
                f"{base}/{n}") and not any(b.startswith(n + ":") for b in values.bad)]
            if lacking:
                self.gaps.setdefault(fact, []).extend(lacking)
        return values

    @cached_property
    def memlock(self):
        text = self.root.read_text(f"proc/{self.pid}/limits") if self.pid != "self" else self.root.read_text(
            "proc/self/limits")
        if text is None:
            return None
        parsed = limits.parse_limits(text)
        if "Max locked memory" not in parsed:
            self._damaged("memlock", parsed.bad or ["no 'Max locked memory' line"])
            return None
        return parsed["Max locked memory"]

    @cached_property
    def proc_status(self):
        from .process import parse_status
        text = self.root.read_text("proc/self/status")
        if text is None:
            return None
        st = parse_status(text)
        self._damaged("proc_status", st.bad)
        return st

    @cached_property
    def cgroup(self):
        if self.cgroup_path == "none":
            return None  # --cgroup none: the user says the pinning process is in no memory-limited cgroup
        try:
            cg = cgroup.read_cgroup_memory(self.root, pid=self.pid, cgroup_path=self.cgroup_path)
        except cgroup.CgroupDamaged as exc:
            self._damaged("cgroup", [str(exc)])
            return None
        except cgroup.CgroupUnseen as exc:  # its limit exists but cannot be read: not "no limit"
            self.gaps.setdefault("cgroup", []).append(f"proc/{self.pid}/cgroup: {exc};")
            return None
        if cg is not None:
            self._damaged("cgroup", cg.bad)
            if cg.not_captured:
                self.gaps.setdefault("cgroup", []).extend(cg.not_captured)
        return cg

    @cached_property
    def hotplug(self):
        return hotplug.read_hotplug_policy(self.root)

    @cached_property
    def nvidia(self):
        nv = nvidia.read_nvidia(self.root)
        if nv.loaded and (nv.version is None or nv.version.version is None):
            self._damaged("nvidia", [f"version line {nv.version.text[:60] if nv.version else ''!r}"])
        return nv

    @cached_property
    def numa_nodes(self):
        nodes = numa.read_numa_nodes(self.root)
        unread = [f"sys/devices/system/node/node{n.node}/meminfo" for n in nodes if not n.meminfo_read]
        if unread:  # a node whose free memory is not known cannot be judged as having none
            self.gaps.setdefault("numa_nodes", []).extend(unread)
        return nodes

    def iommu_for(self, devices: list[str]):
        return iommu.read_iommu(self.root, devices)

    @cached_property
    def zswap_enabled(self) -> bool | None:
        if self.root.live:
            return swap.read_zswap_enabled(self.root)
        probe = (self.node_probe or {}).get("zswap_enabled")
        return probe if isinstance(probe, bool) else swap.read_zswap_enabled(self.root)

    @cached_property
    def swap_media(self) -> list[dict]:
        """What backs each swap area: live from stat() and sysfs, captured from probes/node.json."""
        devices = self.swaps or []
        if self.root.live:
            return [swap.classify_swap_device(d) for d in devices]
        recorded = {d.get("name"): d for d in (self.node_probe or {}).get("swap_devices") or []
                    if isinstance(d, dict) and isinstance(d.get("name"), str)}  # a list there is no name (no crash)
        out = []
        for d in devices:
            rec = recorded.get(d.name.replace("\\040", " "))
            if rec and isinstance(rec.get("media"), str):
                out.append({"name": d.name, "media": rec["media"], "rotational": rec.get("rotational"),
                            "disk": rec.get("disk"), "from": "probes/node.json"})
            else:
                out.append({"name": d.name, "media": swap.media_from_name(d.name) or "unknown", "rotational": None,
                            "disk": None, "from": "its name" if swap.media_from_name(d.name) else "not captured"})
        return out


def node_facts(source: Root | Readings) -> dict[str, Any]:
    """Whatever can be read; a fact that cannot is None (its file is listed in root.missing)."""
    r = source if isinstance(source, Readings) else Readings(source)
    root = r.root
    out: dict[str, Any] = {k: None for k in FACT_LABELS}
    host = root.read_text("proc/sys/kernel/hostname")
    out["host"] = host.strip() if host else None
    out["kernel"] = r.release
    out["hotplug"] = (r.cmdline or {}).get("memhp_default_state")
    nv = r.nvidia
    if nv.loaded and nv.version:
        flavour = {True: "open", False: "proprietary"}.get(nv.version.open_module, "")
        out["driver"] = f"{nvidia.version_str(nv.version.version)} {flavour}".strip()
        out["gpus"] = ", ".join(f"{info.get('Model', '?')} ({bdf})" for bdf, info in sorted(nv.gpus.items())) or None
    elif root.known_absent("proc/driver/nvidia/version"):
        out["driver"] = "not loaded"
    out["thp_enabled"], out["thp_defrag"] = r.thp.enabled, r.thp.defrag
    m = r.meminfo
    if m:
        out.update(mem_total_bytes=m.total_bytes, mem_available_bytes=m.available_bytes,
                   swap_total_bytes=m.swap_total_bytes, swap_used_bytes=m.swap_used_bytes)
    out["swappiness"] = r.vm.get("swappiness")
    zones = r.buddyinfo
    if zones:
        order = r.thp_order
        out["free_order9_bytes"] = sum(buddyinfo.free_bytes_at_or_above(z.counts, order, r.page_size) for z in zones)
        normal = next((z for z in zones if z.zone == "Normal"), None)
        if normal:
            out["unusable_index_order9"] = buddyinfo.unusable_free_index(normal.counts, order)
    p = r.psi
    if p:
        out["psi_some_avg10"] = (p.get("some") or {}).get("avg10")
    devices = r.swaps
    out["swap_devices"] = [d.name for d in devices] if devices is not None else None
    out["page_size"] = r.page_size
    out["page_size_source"] = r.page.source
    out["thp_order"] = r.thp_order
    return out

"""Preflight checks: small units, each with an id, a title, the facts it needs, the failure
catalog entries it covers (MISSION.md), and `run(ctx) -> Verdict`.

A check never reads a file itself: it asks the Context for facts, which are read once,
copied into the run's evidence, and shared. A fact that cannot be read turns the checks
that need it into a skip with the reason.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Callable

from .. import (buddyinfo, cgroup, hotplug, iommu, kernel, limits, meminfo, numa, nvidia, psi, swap,
                sysctl, thp, vmstat, zoneinfo)
from ..rootfs import Root

__all__ = ["PASS", "WARN", "FAIL", "SKIP", "STATUS_ORDER", "Verdict", "Check", "Plan", "Context",
           "register", "all_checks", "FACT_SOURCES"]

PASS, WARN, FAIL, SKIP = "pass", "warn", "fail", "skip"
STATUS_ORDER = {FAIL: 0, WARN: 1, PASS: 2, SKIP: 3}
METHODS = ("register", "hostalloc", "mlock")


@dataclass
class Verdict:
    status: str
    summary: str
    remedy: str | None = None
    evidence: dict[str, Any] = field(default_factory=dict)


@dataclass
class Check:
    id: str
    title: str
    needs: tuple[str, ...]
    catalog: tuple[int, ...]
    func: Callable[["Context"], Verdict]

    def run(self, ctx: "Context") -> Verdict:
        for fact in self.needs:
            if getattr(ctx, fact) is None:
                return Verdict(SKIP, f"cannot read {ctx.why_missing(fact)}",
                               evidence={"missing_fact": fact})
        return self.func(ctx)


_REGISTRY: list[Check] = []


def register(id: str, title: str, needs: tuple[str, ...] = (), catalog: tuple[int, ...] = ()):
    def wrap(func: Callable[["Context"], Verdict]) -> Callable[["Context"], Verdict]:
        _REGISTRY.append(Check(id, title, needs, catalog, func))
        return func
    return wrap


def all_checks() -> list[Check]:
    from . import fragmentation, leftovers, memory, platform  # noqa: F401  (registration on import)
    return list(_REGISTRY)


@dataclass
class Plan:
    """What the launcher is about to do: size per rank, ranks on this node, how it pins."""
    size_bytes: int | None = None
    ranks: int = 1
    method: str = "register"
    thp: bool | None = None          # None: whatever the THP policy gives a madvised region
    source: str = "anon"             # anon | shm | file
    map: str = "private"             # private | shared
    readonly: bool = False
    chunk_bytes: int | None = None   # per-call size when the launcher registers in pieces
    margin: str = "5%"               # of MemTotal, or a size
    reserve_bytes: int = 0           # per rank, beyond the table (e.g. measured staging memory)

    @property
    def total_bytes(self) -> int | None:
        return self.size_bytes * self.ranks if self.size_bytes else None

    @property
    def per_call_bytes(self) -> int | None:
        if self.chunk_bytes and self.size_bytes:
            return min(self.chunk_bytes, self.size_bytes)
        return self.size_bytes

    @property
    def uses_gpu(self) -> bool:
        return self.method in ("register", "hostalloc")

    def describe(self) -> str:
        from ..units import format_bytes
        if not self.size_bytes:
            return f"no size given (--size): node state only, method {self.method}"
        chunk = f", chunks of {format_bytes(self.chunk_bytes)}" if self.chunk_bytes else ""
        return f"{self.ranks} x {format_bytes(self.size_bytes)} by {self.method}{chunk}"


# fact name -> the file a person would look for when it is missing
FACT_SOURCES = {
    "meminfo": "proc/meminfo", "vmstat": "proc/vmstat", "buddyinfo": "proc/buddyinfo",
    "zoneinfo": "proc/zoneinfo", "swaps": "proc/swaps", "psi": "proc/pressure/memory",
    "release": "proc/sys/kernel/osrelease", "cmdline": "proc/cmdline", "memlock": "proc/self/limits",
    "proc_status": "proc/self/status", "cgroup": "proc/self/cgroup",
}


class Context:
    """Facts about the node, read lazily through a Root and shared by all checks."""

    def __init__(self, root: Root, plan: Plan, cuda: dict | None = None, cuda_skip_reason: str | None = None,
                 sample_s: float = 1.0):
        self.root = root
        self.plan = plan
        self.cuda = cuda
        self.cuda_skip_reason = cuda_skip_reason
        self.sample_s = sample_s
        self._t0 = time.monotonic()
        self._vmstat_t0 = self.vmstat  # first reading starts the swap-in sample window

    def why_missing(self, fact: str) -> str:
        rel = FACT_SOURCES.get(fact, fact)
        reason = self.root.missing.get(rel, "absent")
        return f"{self.root.display(rel)} ({reason})"

    @cached_property
    def meminfo(self):
        return meminfo.read_meminfo(self.root)

    @cached_property
    def vmstat(self):
        return vmstat.read_vmstat(self.root)

    @cached_property
    def buddyinfo(self):
        return buddyinfo.read_buddyinfo(self.root)

    @cached_property
    def zoneinfo(self):
        return zoneinfo.read_zoneinfo(self.root)

    @cached_property
    def swaps(self):
        return swap.read_swaps(self.root)

    @cached_property
    def psi(self):
        return psi.read_psi_memory(self.root)

    @cached_property
    def release(self):
        return kernel.read_release(self.root)

    @cached_property
    def cmdline(self):
        return kernel.read_cmdline(self.root)

    @cached_property
    def thp(self):
        return thp.read_thp(self.root)

    @cached_property
    def vm(self):
        return sysctl.read_vm_sysctls(self.root)

    @cached_property
    def hung_task(self):
        return sysctl.read_hung_task(self.root)

    @cached_property
    def memlock(self):
        return limits.read_memlock(self.root)

    @cached_property
    def proc_status(self):
        from ..process import parse_status
        text = self.root.read_text("proc/self/status")
        return parse_status(text) if text is not None else None

    @cached_property
    def cgroup(self):
        return cgroup.read_cgroup_memory(self.root)

    @cached_property
    def hotplug(self):
        return hotplug.read_hotplug_policy(self.root)

    @cached_property
    def nvidia(self):
        return nvidia.read_nvidia(self.root)

    @cached_property
    def gpu_addresses(self) -> list[str]:
        """PCI addresses of NVIDIA GPUs, from the driver's proc files or the CUDA probe."""
        found = set(self.nvidia.gpus)
        for dev in (self.cuda or {}).get("devices", []):
            if dev.get("pci_bus_id"):
                found.add(dev["pci_bus_id"].lower())
        return sorted(found)

    @cached_property
    def iommu(self):
        return iommu.read_iommu(self.root, self.gpu_addresses)

    @cached_property
    def numa_nodes(self):
        return numa.read_numa_nodes(self.root)

    @cached_property
    def swapin(self) -> dict[str, Any]:
        """Swap-in rate over a sample window, live only, and only when swap is in use (with
        nothing in swap there is nothing to swap in, and the launcher saves the second)."""
        used = self.meminfo.swap_used_bytes if self.meminfo else None
        before = self._vmstat_t0
        if not self.root.live:
            return {"sampled": False, "reason": "captured tree: no live sample", "pages_per_s": None}
        if not used:
            return {"sampled": False, "reason": "no swap in use", "pages_per_s": 0.0}
        if not before or "pswpin" not in before or self.sample_s <= 0:
            return {"sampled": False, "reason": "no pswpin counter or sampling off", "pages_per_s": None}
        wait = self._t0 + self.sample_s - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        text = self.root.read_fresh("proc/vmstat")
        after = vmstat.parse_vmstat(text or "")
        elapsed = time.monotonic() - self._t0
        pages = after.get("pswpin", before["pswpin"]) - before["pswpin"]
        if self.root.run is not None and text:
            self.root.run.add_file("samples/vmstat-after-swapin-sample.txt", text.encode(), kind="sample",
                                   source="/proc/vmstat", duration_s=elapsed)
        return {"sampled": True, "window_s": round(elapsed, 3), "pswpin_pages": pages,
                "pages_per_s": pages / elapsed if elapsed > 0 else None}

    @property
    def euid_is_root(self) -> bool | None:
        if self.root.live:
            return os.geteuid() == 0
        st = self.proc_status
        if st and "Uid" in st.raw:
            return st.raw["Uid"].split()[1] == "0"
        return None

    @property
    def has_cap_ipc_lock(self) -> bool | None:
        st = self.proc_status
        if st and "CapEff" in st.raw:
            try:
                return bool(int(st.raw["CapEff"], 16) & (1 << 14))  # CAP_IPC_LOCK
            except ValueError:
                return None
        return self.euid_is_root

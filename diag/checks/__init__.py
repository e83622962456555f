"""Preflight checks: small units, each with an id, a title, the facts it needs, the failure
catalog entries it covers (diag/catalog.py), when it can fail, and `run(ctx) -> Verdict`.

A check never reads a file itself: it asks the Context, whose readings are read once, copied
into the run's evidence, and shared with the run's node facts. The gate fails closed:
- a check that crashes is status `error` (the run exits 3);
- a needed reading that is damaged is `error`;
- a needed reading missing from a captured tree is "not captured": `error` where the check's
  answer decides the verdict (it can fail this plan, or warn under --strict), else `skip`;
- a reading the live node does not have (a kernel feature that is off) is the check's to judge.

This package is the registry the check modules import; it imports none of them.
diag.checks.suite imports every check module and lists them (`all_checks`).
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ..facts import ABSENT, DAMAGED, NOT_CAPTURED, OK, UNREADABLE, Readings
from ..rootfs import Root
from .. import vmstat

__all__ = ["PASS", "WARN", "FAIL", "SKIP", "ERROR", "STATUS_ORDER", "Verdict", "Check", "Plan", "Context",
           "register", "METHODS", "never"]

PASS, WARN, FAIL, SKIP, ERROR = "pass", "warn", "fail", "skip", "error"
STATUS_ORDER = {ERROR: 0, FAIL: 1, WARN: 2, PASS: 3, SKIP: 4}
METHODS = ("register", "hostalloc", "mlock")


@dataclass
class Verdict:
    status: str
    summary: str
    remedy: str | None = None
    evidence: dict[str, Any] = field(default_factory=dict)
    predicted: list[int] = field(default_factory=list)   # catalog entries whose condition holds here
    missing: list[str] = field(default_factory=list)     # inputs not captured / unreadable / damaged


def _always(plan: "Plan") -> bool:
    return True


@dataclass
class Check:
    id: str
    title: str
    needs: tuple[str, ...]
    catalog: tuple[int, ...]
    func: Callable[["Context"], Verdict]
    can_fail: Callable[["Plan"], bool] = _always   # whether this check can FAIL this plan
    can_warn: Callable[["Plan"], bool] = _always
    absent: dict[str, str] = field(default_factory=dict)  # fact -> what its absence on the node means
    uses: tuple[str, ...] = ()   # facts read when there (their damage is an error, their absence is not)

    def decides(self, ctx: "Context") -> bool:
        return self.can_fail(ctx.plan) or (ctx.strict and self.can_warn(ctx.plan))

    def run(self, ctx: "Context") -> Verdict:
        for fact in self.needs:
            state = ctx.state(fact)
            if state == OK:
                continue
            what = ctx.describe(fact)
            if state == DAMAGED:
                return Verdict(ERROR, f"damaged reading: {what}; refusing to judge on it",
                               "capture the node again (hostpin snapshot); a damaged live file is a kernel or "
                               "hostpin bug worth a report", evidence={"damaged_fact": fact}, missing=[what])
            if state in (NOT_CAPTURED, UNREADABLE) and self.decides(ctx):
                return Verdict(ERROR, f"{state}: {what}; this check decides the verdict for this plan",
                               _GAP_REMEDY.get(fact, f"capture it (hostpin snapshot, as root), or accept the gap "
                                                     f"with --skip {self.id}"),
                               evidence={"missing_fact": fact, "state": state}, missing=[what])
            if state in (NOT_CAPTURED, UNREADABLE):
                return Verdict(SKIP, f"{state}: {what}", evidence={"missing_fact": fact, "state": state},
                               missing=[what])
            if state == ABSENT:
                meaning = self.absent.get(fact, "absent on this node")
                return Verdict(SKIP, f"{meaning}: {what}", evidence={"missing_fact": fact, "state": state})
        verdict = self.func(ctx)
        damaged = [f for f in self.needs + self.uses if ctx.state(f) == DAMAGED]  # read during the check
        if damaged and verdict.status != ERROR:
            what = "; ".join(ctx.describe(f) for f in damaged)
            return Verdict(ERROR, f"damaged reading: {what}; refusing to judge on it", evidence=verdict.evidence,
                           missing=[what])
        return verdict


_REGISTRY: list[Check] = []

# a gap that an option fills while the check still runs: --skip would drop the whole check
_GAP_REMEDY = {
    "cgroup": "capture it (hostpin snapshot, as root), name the pinner's memory cgroup with --cgroup PATH, or say "
              "it runs in none with --cgroup none (the check still judges MemAvailable)",
}


def never(plan: "Plan") -> bool:
    return False


def register(id: str, title: str, needs: tuple[str, ...] = (), catalog: tuple[int, ...] = (),
             can_fail: Callable[["Plan"], bool] = _always, can_warn: Callable[["Plan"], bool] = _always,
             absent: dict[str, str] | None = None, uses: tuple[str, ...] = ()):
    def wrap(func: Callable[["Context"], Verdict]) -> Callable[["Context"], Verdict]:
        _REGISTRY.append(Check(id, title, needs, catalog, func, can_fail, can_warn, dict(absent or {}), uses))
        return func
    return wrap


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
    file: str | None = None          # the table's file, for --source file (its file system decides catalog 9)
    allocator: str = "cuda"          # cuda: the launcher calls CUDA itself; torch: through PyTorch (catalog 18)
    torch: dict | None = None        # diag.torchalloc.TorchRequest.to_dict() when allocator is torch

    @property
    def pinned_bytes(self) -> int | None:
        """Per rank, what the driver is asked to pin: the size, or what PyTorch rounds it to."""
        if self.torch and self.size_bytes:
            return self.torch["request_bytes"]
        return self.size_bytes

    @property
    def total_bytes(self) -> int | None:
        return self.pinned_bytes * self.ranks if self.size_bytes else None

    @property
    def per_call_bytes(self) -> int | None:
        if self.torch and self.size_bytes:
            return self.torch["per_call_bytes"]
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
        if self.torch:
            return (f"{self.ranks} x {format_bytes(self.size_bytes)} through PyTorch, {format_bytes(self.pinned_bytes)} "
                    f"pinned each by {self.method}{chunk}")
        return f"{self.ranks} x {format_bytes(self.size_bytes)} by {self.method}{chunk}"


class Context(Readings):
    """The node's readings plus what this run adds: the plan, the CUDA facts, the swap-in sample."""

    def __init__(self, root: Root, plan: Plan, cuda: dict | None = None, cuda_skip_reason: str | None = None,
                 sample_s: float = 1.0, strict: bool = False, pid: str | int = "self", cgroup_path: str | None = None,
                 swap_rate_override: float | None = None, cuda_state: str = OK):
        super().__init__(root, pid=pid, cgroup_path=cgroup_path)
        self.plan = plan
        self.cuda = cuda
        self.cuda_skip_reason = cuda_skip_reason
        self.cuda_state = cuda_state if cuda is None else OK
        self.sample_s = sample_s
        self.strict = strict
        self.swap_rate_override = swap_rate_override  # bytes/s, --swap-in-rate
        self._t0 = time.monotonic()
        self._vmstat_t0 = self.vmstat  # first reading starts the swap-in sample window

    def why_missing(self, fact: str) -> str:
        return self.describe(fact)

    @property
    def gpu_addresses(self) -> list[str]:
        """PCI addresses of NVIDIA GPUs, from the driver's proc files or the CUDA probe."""
        found = set(self.nvidia.gpus)
        for dev in (self.cuda or {}).get("devices", []) or []:
            if isinstance(dev, dict) and isinstance(dev.get("pci_bus_id"), str):
                found.add(dev["pci_bus_id"].lower())
        return sorted(found)

    @property
    def iommu(self):
        return self.iommu_for(self.gpu_addresses)

    @property
    def swapin(self) -> dict[str, Any]:
        """Swap-in demand over a sample window, live only, and only when swap is in use. This is
        what other processes are reading back now, not what the device can deliver."""
        if "_swapin" in self.__dict__:
            return self.__dict__["_swapin"]
        used = self.meminfo.swap_used_bytes if self.meminfo else None
        before = self._vmstat_t0
        if not self.root.live:
            out = {"sampled": False, "reason": "captured tree: no live sample", "pages_per_s": None}
        elif not used:
            out = {"sampled": False, "reason": "no swap in use", "pages_per_s": 0.0}
        elif not before or "pswpin" not in before or self.sample_s <= 0:
            out = {"sampled": False, "reason": "no pswpin counter or sampling off", "pages_per_s": None}
        else:
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
            out = {"sampled": True, "window_s": round(elapsed, 3), "pswpin_pages": pages,
                   "pages_per_s": pages / elapsed if elapsed > 0 else None}
        self.__dict__["_swapin"] = out
        return out

    @property
    def euid_is_root(self) -> bool | None:
        if self.root.live:
            return os.geteuid() == 0
        st = self.proc_status
        if st and "Uid" in st.raw:
            parts = st.raw["Uid"].split()
            return parts[1] == "0" if len(parts) > 1 else None
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

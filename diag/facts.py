"""The facts about a node that matter for pinning, in one flat dict, from any root.

Every command reads them through a Root attached to its run, so the files land in the run's
`root/` tree; `hostpin report` and `hostpin compare` read the same facts back from there.
"""
from __future__ import annotations

from typing import Any

from . import buddyinfo, kernel, meminfo, nvidia, psi, swap, sysctl, thp
from .rootfs import Root

__all__ = ["node_facts", "FACT_LABELS"]

FACT_LABELS = {
    "host": "host", "kernel": "kernel", "driver": "NVIDIA driver", "gpus": "GPUs", "thp_enabled": "THP enabled",
    "thp_defrag": "THP defrag", "mem_total_bytes": "MemTotal", "mem_available_bytes": "MemAvailable",
    "swap_total_bytes": "swap total", "swap_used_bytes": "swap used", "swappiness": "swappiness",
    "free_order9_bytes": "free in order >= 9 blocks", "unusable_index_order9": "unusable index, order 9 (Normal)",
    "psi_some_avg10": "PSI memory some avg10", "hotplug": "memhp_default_state",
}


def node_facts(root: Root) -> dict[str, Any]:
    """Whatever can be read; a fact that cannot is None (its file is listed in root.missing)."""
    out: dict[str, Any] = {k: None for k in FACT_LABELS}
    host = root.read_text("proc/sys/kernel/hostname")
    out["host"] = host.strip() if host else None
    out["kernel"] = kernel.read_release(root)
    cmd = kernel.read_cmdline(root) or {}
    out["hotplug"] = cmd.get("memhp_default_state")
    nv = nvidia.read_nvidia(root)
    if nv.loaded and nv.version:
        flavour = {True: "open", False: "proprietary"}.get(nv.version.open_module, "")
        out["driver"] = f"{nvidia.version_str(nv.version.version)} {flavour}".strip()
        out["gpus"] = ", ".join(f"{info.get('Model', '?')} ({bdf})" for bdf, info in sorted(nv.gpus.items())) or None
    elif root.known_absent("proc/driver/nvidia/version"):
        out["driver"] = "not loaded"
    t = thp.read_thp(root)
    out["thp_enabled"], out["thp_defrag"] = t.enabled, t.defrag
    m = meminfo.read_meminfo(root)
    if m:
        out.update(mem_total_bytes=m.total_bytes, mem_available_bytes=m.available_bytes,
                   swap_total_bytes=m.swap_total_bytes, swap_used_bytes=m.swap_used_bytes)
    out["swappiness"] = sysctl.read_vm_sysctls(root).get("swappiness")
    zones = buddyinfo.read_buddyinfo(root)
    if zones:
        out["free_order9_bytes"] = sum(buddyinfo.free_bytes_at_or_above(z.counts, 9) for z in zones)
        normal = next((z for z in zones if z.zone == "Normal"), None)
        if normal:
            out["unusable_index_order9"] = buddyinfo.unusable_free_index(normal.counts, 9)
    p = psi.read_psi_memory(root)
    if p:
        out["psi_some_avg10"] = p.get("some", {}).get("avg10")
    devices = swap.read_swaps(root)
    out["swap_devices"] = [d.name for d in devices] if devices is not None else None
    return out

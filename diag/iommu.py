"""IOMMU mode: kernel command line, /sys/class/iommu, and the default domain type of groups.

A translated domain ('DMA', 'DMA-FQ') maps every pinned page through the IOMMU at
registration and unmaps it at unregistration (catalog 13); 'identity' is passthrough.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .kernel import read_cmdline
from .rootfs import Root

__all__ = ["IommuInfo", "read_iommu", "CMDLINE_KEYS"]

CMDLINE_KEYS = ("iommu", "intel_iommu", "amd_iommu", "iommu.passthrough", "iommu.strict")


@dataclass
class IommuInfo:
    units: list[str]                       # /sys/class/iommu entries (dmar0, ivhd0, ...)
    group_types: dict[str, str]            # group number -> type
    device_groups: dict[str, str] = field(default_factory=dict)  # PCI address -> group number
    cmdline: dict[str, str | None] = field(default_factory=dict)

    @property
    def enabled(self) -> bool:
        return bool(self.units or self.group_types)

    def type_for(self, bdf: str) -> str | None:
        group = self.device_groups.get(bdf.lower())
        return self.group_types.get(group) if group is not None else None


def read_iommu(root: Root, devices: list[str] = ()) -> IommuInfo:
    cmdline = read_cmdline(root) or {}
    groups: dict[str, str] = {}
    device_groups: dict[str, str] = {}
    for group in root.listdir("sys/kernel/iommu_groups"):
        text = root.read_text(f"sys/kernel/iommu_groups/{group}/type")
        if text is not None:
            groups[group] = text.strip()
        for dev in root.listdir(f"sys/kernel/iommu_groups/{group}/devices"):
            device_groups[dev.lower()] = group
    wanted = {d.lower() for d in devices}
    return IommuInfo(units=root.listdir("sys/class/iommu"),
                     group_types=groups,
                     device_groups={d: g for d, g in device_groups.items() if not wanted or d in wanted},
                     cmdline={k: cmdline[k] for k in CMDLINE_KEYS if k in cmdline})

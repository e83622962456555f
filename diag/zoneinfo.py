"""/proc/zoneinfo: per-zone page counts (managed, present, free, CMA) and watermarks, in pages.

>>> z = parse_zoneinfo("Node 0, zone  Movable\\n  pages free     10\\n        managed  2048\\n        cma      0\\n")[0]
>>> z.zone, z.managed_pages, z.managed_bytes
('Movable', 2048, 8388608)
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .rootfs import Root
from .units import PAGE_SIZE

__all__ = ["Zone", "parse_zoneinfo", "read_zoneinfo"]


@dataclass
class Zone:
    node: int
    zone: str
    fields: dict[str, int] = field(default_factory=dict)

    def _get(self, key: str) -> int | None:
        return self.fields.get(key)

    @property
    def managed_pages(self) -> int | None:
        return self._get("managed")

    @property
    def present_pages(self) -> int | None:
        return self._get("present")

    @property
    def free_pages(self) -> int | None:
        return self._get("free")

    @property
    def cma_pages(self) -> int | None:
        return self._get("cma")  # since 5.7; CONFIG_CMA=n still prints it

    @property
    def managed_bytes(self) -> int:
        return (self.managed_pages or 0) * PAGE_SIZE


def parse_zoneinfo(text: str) -> list[Zone]:
    zones: list[Zone] = []
    current: Zone | None = None
    in_pagesets = False
    for line in text.splitlines():
        if line.startswith("Node"):
            left, _, right = line.partition("zone")
            node = int(left.replace("Node", "").strip().rstrip(","))
            current = Zone(node=node, zone=right.strip())
            zones.append(current)
            in_pagesets = False
            continue
        if current is None:
            continue
        stripped = line.strip()
        if stripped.startswith("pagesets"):
            in_pagesets = True  # per-cpu counts follow; their 'count'/'high' would shadow the zone's
        if in_pagesets:
            continue
        parts = stripped.split()
        if stripped.startswith("pages free") and len(parts) >= 3:
            current.fields["free"] = int(parts[2])
        elif len(parts) == 2 and parts[1].lstrip("-").isdigit():
            current.fields.setdefault(parts[0], int(parts[1]))
    return zones


def read_zoneinfo(root: Root) -> list[Zone] | None:
    text = root.read_text("proc/zoneinfo")
    return parse_zoneinfo(text) if text is not None else None

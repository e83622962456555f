"""/proc/zoneinfo: per-zone page counts (managed, present, free, CMA) and watermarks, in pages.

>>> z = parse_zoneinfo("Node 0, zone  Movable\\n  pages free     10\\n        managed  2048\\n        cma      0\\n")[0]
>>> z.zone, z.managed_pages, z.managed_bytes
('Movable', 2048, 8388608)
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .parsing import ParsedList, to_int
from .rootfs import Root
from .units import PAGE_SIZE

__all__ = ["Zone", "parse_zoneinfo", "read_zoneinfo", "ZONE_NAMES"]

# mm/page_alloc.c zone_names[]: a header naming anything else is damage
ZONE_NAMES = ("DMA", "DMA32", "Normal", "HighMem", "Movable", "Device")


@dataclass
class Zone:
    node: int
    zone: str
    fields: dict[str, int] = field(default_factory=dict)
    bad: list[str] = field(default_factory=list)  # fields whose value could not be read
    page_size: int = PAGE_SIZE                     # the node's base page size (64 KiB on some arm64)
    protection: list[int] | None = None           # 'protection: (0, 3019, ...)': lowmem_reserve[], pages

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
        return (self.managed_pages or 0) * self.page_size


def parse_zoneinfo(text: str, page_size: int = PAGE_SIZE) -> ParsedList:
    """Zones in file order; a damaged value is left out of `fields` and named in the zone's
    `bad` (and in the list's `.bad`), a damaged 'Node N, zone X' header drops its zone.

    >>> zs = parse_zoneinfo("Node 0, zone Normal\\n  pages free     n/a\\n        managed  8\\n")
    >>> zs[0].free_pages, zs[0].managed_pages, zs.bad
    (None, 8, ["Node 0 zone Normal: free='n/a'"])
    """
    zones = ParsedList()
    current: Zone | None = None
    in_pagesets = False
    for line in text.splitlines():
        if line.startswith("Node"):
            left, _, right = line.partition("zone")
            node = to_int(left.replace("Node", "").strip().rstrip(","))
            name = right.strip()
            if node is None or name not in ZONE_NAMES or any(
                    z.node == node and z.zone == name for z in zones):
                zones.bad.append(f"header {line.strip()[:60]!r}")
                current = None
                continue
            current = Zone(node=node, zone=name, page_size=page_size)
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
        if stripped.startswith("protection:"):  # lowmem_reserve[] against allocations for higher zones
            values = [to_int(v) for v in stripped[len("protection:"):].strip(" ()").split(",")]
            if values and all(v is not None and v >= 0 for v in values):
                current.protection = values
            else:
                current.bad.append("protection")
                zones.bad.append(f"Node {current.node} zone {current.zone}: protection={stripped[12:40]!r}")
            continue
        if not parts or stripped.startswith("per-node stats"):
            continue  # a heading
        if stripped.startswith("pages free"):
            key, text_value = "free", " ".join(parts[2:])
        elif parts[0].rstrip(":").replace("_", "").isalnum():
            key, text_value = parts[0].rstrip(":"), " ".join(parts[1:])  # 'name value'; anything else is damage
        else:
            key, text_value = stripped[:20], ""
        value = to_int(text_value)
        if value is None:
            what = f"Node {current.node} zone {current.zone}: {key}={text_value[:20]!r}"
            current.bad.append(key)
            zones.bad.append(what)
            continue
        current.fields.setdefault(key, value)
    return zones


def read_zoneinfo(root: Root, page_size: int = PAGE_SIZE) -> ParsedList | None:
    text = root.read_text("proc/zoneinfo")
    return parse_zoneinfo(text, page_size) if text is not None else None

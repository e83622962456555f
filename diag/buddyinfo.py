"""/proc/buddyinfo and /proc/pagetypeinfo: free blocks per order, and the kernel's
fragmentation indices computed from them exactly as mm/vmstat.c does.

>>> z = parse_buddyinfo("Node 0, zone   Normal      1      0      2      2      1      3      5     18     17      8     37")[0]
>>> z.zone, free_bytes_at_or_above(z.counts, 9)
('Normal', 171966464)
>>> unusable_free_index(z.counts, 9)
0.144
"""
from __future__ import annotations

from dataclasses import dataclass

from .rootfs import Root
from .units import PAGE_SIZE

__all__ = ["ZoneFree", "parse_buddyinfo", "read_buddyinfo", "parse_pagetypeinfo", "read_pagetypeinfo",
           "free_bytes_at_or_above", "unusable_free_index", "fragmentation_index", "THP_ORDER"]

THP_ORDER = 9  # a 2 MiB huge page on x86-64 with 4 KiB base pages


@dataclass
class ZoneFree:
    node: int
    zone: str
    counts: list[int]  # free blocks at order 0, 1, 2, ...

    @property
    def free_bytes(self) -> int:
        return sum(c << o for o, c in enumerate(self.counts)) * PAGE_SIZE


def parse_buddyinfo(text: str) -> list[ZoneFree]:
    zones = []
    for line in text.splitlines():
        head, _, tail = line.partition("zone")
        if not tail or not head.startswith("Node"):
            continue
        node = int(head.replace("Node", "").strip().rstrip(","))
        parts = tail.split()
        zones.append(ZoneFree(node=node, zone=parts[0], counts=[int(x) for x in parts[1:]]))
    return zones


def read_buddyinfo(root: Root) -> list[ZoneFree] | None:
    text = root.read_text("proc/buddyinfo")
    return parse_buddyinfo(text) if text is not None else None


def parse_pagetypeinfo(text: str) -> dict:
    """{'pageblock_order': 9, 'free': {(node, zone, type): [counts]}, 'blocks': {(node, zone): {type: n}}}."""
    out: dict = {"pageblock_order": None, "free": {}, "blocks": {}}
    block_types: list[str] = []
    for line in text.splitlines():
        if line.startswith("Page block order:"):
            out["pageblock_order"] = int(line.split(":")[1])
        elif line.startswith("Number of blocks type"):
            block_types = line.split()[4:]
        elif line.startswith("Node") and ", type" in line:
            left, _, right = line.partition(", type")
            node = int(left.split(",")[0].split()[1])
            zone = left.split("zone")[1].strip()
            parts = right.split()
            out["free"][(node, zone, parts[0])] = [int(x) for x in parts[1:]]
        elif line.startswith("Node") and block_types:
            left, _, right = line.partition("zone")
            node = int(left.replace("Node", "").strip().rstrip(","))
            parts = right.split()
            out["blocks"][(node, parts[0])] = dict(zip(block_types, (int(x) for x in parts[1:])))
    return out


def read_pagetypeinfo(root: Root) -> dict | None:
    text = root.read_text("proc/pagetypeinfo")  # mode 0400 since 5.9: needs root
    return parse_pagetypeinfo(text) if text is not None else None


def free_bytes_at_or_above(counts: list[int], order: int) -> int:
    return sum(c << o for o, c in enumerate(counts) if o >= order) * PAGE_SIZE


def _contig(counts: list[int], order: int) -> tuple[int, int, int]:
    """(free_blocks_total, free_pages, free_blocks_suitable) as fill_contig_page_info() counts them."""
    total = sum(counts)
    pages = sum(c << o for o, c in enumerate(counts))
    suitable = sum(c << (o - order) for o, c in enumerate(counts) if o >= order)
    return total, pages, suitable


def unusable_free_index(counts: list[int], order: int = THP_ORDER) -> float:
    """0 = all free memory usable for this order, 1 = none of it (mm/vmstat.c unusable_free_index)."""
    _, pages, suitable = _contig(counts, order)
    if pages == 0:
        return 1.0  # the kernel: no free memory is interpreted as all free memory is unusable
    return ((pages - (suitable << order)) * 1000 // pages) / 1000


def fragmentation_index(counts: list[int], order: int = THP_ORDER) -> float | None:
    """extfrag index: None when an allocation would succeed (kernel: -1000), towards 0 = lack of
    memory, towards 1 = fragmentation (mm/vmstat.c __fragmentation_index)."""
    total, pages, suitable = _contig(counts, order)
    if not total:
        return 0.0
    if suitable:
        return None
    requested = 1 << order
    return (1000 - (1000 + pages * 1000 // requested) // total) / 1000

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

from .parsing import ParsedList, to_int
from .rootfs import Root
from .units import PAGE_SIZE

__all__ = ["ZoneFree", "parse_buddyinfo", "read_buddyinfo", "parse_pagetypeinfo", "read_pagetypeinfo",
           "free_bytes_at_or_above", "unusable_free_index", "fragmentation_index", "THP_ORDER"]

THP_ORDER = 9  # a 2 MiB huge page on x86-64 with 4 KiB base pages; the node's own is thp_order()


@dataclass
class ZoneFree:
    node: int
    zone: str
    counts: list[int]  # free blocks at order 0, 1, 2, ...
    page_size: int = PAGE_SIZE

    @property
    def free_bytes(self) -> int:
        return sum(c << o for o, c in enumerate(self.counts)) * self.page_size


def parse_buddyinfo(text: str, page_size: int = PAGE_SIZE) -> ParsedList:
    """Zones with their free-block counts; a line with a damaged count is left out and named in `.bad`.

    >>> parse_buddyinfo("Node 0, zone Normal 1 x 2\\n").bad
    ['Node 0, zone Normal 1 x 2']
    """
    zones = ParsedList()
    for line in text.splitlines():
        if not line.strip():
            continue
        head, _, tail = line.partition("zone")
        node = to_int(head.replace("Node", "").strip().rstrip(",")) if head.startswith("Node") else None
        parts = tail.split()
        counts = [to_int(x) for x in parts[1:]]
        if node is None or not parts or not counts or any(c is None or c < 0 for c in counts):
            zones.bad.append(line.strip()[:80])
            continue
        zones.append(ZoneFree(node=node, zone=parts[0], counts=counts, page_size=page_size))
    # every zone line has one count per order (NR_PAGE_ORDERS): a shorter one was cut short
    widest = max((len(z.counts) for z in zones), default=0)
    for z in [z for z in zones if len(z.counts) < widest]:
        zones.bad.append(f"Node {z.node}, zone {z.zone}: {len(z.counts)} of {widest} orders")
        zones.remove(z)
    return zones


def read_buddyinfo(root: Root, page_size: int = PAGE_SIZE) -> ParsedList | None:
    text = root.read_text("proc/buddyinfo")
    return parse_buddyinfo(text, page_size) if text is not None else None


def parse_pagetypeinfo(text: str) -> dict:
    """{'pageblock_order': 9, 'free': {(node, zone, type): [counts]}, 'blocks': {(node, zone): {type: n}},
    'bad': [lines]}; a damaged line is named in 'bad' and left out."""
    out: dict = {"pageblock_order": None, "free": {}, "blocks": {}, "bad": []}
    block_types: list[str] = []
    for line in text.splitlines():
        if line.startswith("Page block order:"):
            out["pageblock_order"] = to_int(line.split(":", 1)[1])
        elif line.startswith("Number of blocks type"):
            block_types = line.split()[4:]
        elif line.startswith("Node") and ", type" in line:
            left, _, right = line.partition(", type")
            head = left.split(",")[0].split()
            node = to_int(head[1]) if len(head) > 1 else None
            zone = left.split("zone")[1].strip() if "zone" in left else ""
            parts = right.split()
            counts = [to_int(x) for x in parts[1:]]
            if node is None or not zone or not parts or any(c is None for c in counts):
                out["bad"].append(line.strip()[:80])
                continue
            out["free"][(node, zone, parts[0])] = counts
        elif line.startswith("Node") and block_types:
            left, _, right = line.partition("zone")
            node = to_int(left.replace("Node", "").strip().rstrip(","))
            parts = right.split()
            counts = [to_int(x) for x in parts[1:]]
            if node is None or not parts or any(c is None for c in counts):
                out["bad"].append(line.strip()[:80])
                continue
            out["blocks"][(node, parts[0])] = dict(zip(block_types, counts))
    return out


def read_pagetypeinfo(root: Root) -> dict | None:
    text = root.read_text("proc/pagetypeinfo")  # mode 0400 since 5.9: needs root
    return parse_pagetypeinfo(text) if text is not None else None


def free_bytes_at_or_above(counts: list[int], order: int, page_size: int = PAGE_SIZE) -> int:
    return sum(c << o for o, c in enumerate(counts) if o >= order) * page_size


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

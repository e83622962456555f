"""The node's base page size and its THP (PMD) order: 4 KiB and 9 on x86-64, 64 KiB and 13 on
arm64 kernels built with 64 KiB pages (Grace), never assumed where the node can say.

Live: sysconf(_SC_PAGESIZE). A captured tree: the page size the snapshot recorded in
probes/node.json; else derived from hpage_pmd_size, since on x86-64 and arm64 a PMD maps one
page-table page of 8-byte entries (pmd = page * page / 8, so page = sqrt(8 * pmd)); else
4 KiB, said to be assumed.

>>> derive_from_pmd(2 << 20), derive_from_pmd(512 << 20), thp_order(512 << 20, 65536)
(4096, 65536, 13)
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .units import PAGE_SIZE as _LIVE_PAGE_SIZE

__all__ = ["PageSize", "live_page_size", "derive_from_pmd", "thp_order", "page_size_for"]

DEFAULT = 4096


@dataclass(frozen=True)
class PageSize:
    bytes: int
    source: str  # 'sysconf', 'probes/node.json', 'derived from hpage_pmd_size', 'assumed (not captured)'

    @property
    def assumed(self) -> bool:
        return self.source.startswith("assumed")


def live_page_size() -> int:
    return _LIVE_PAGE_SIZE  # sysconf(_SC_PAGESIZE), read once in diag.units


def derive_from_pmd(pmd_bytes: int | None) -> int | None:
    if not pmd_bytes or pmd_bytes <= 0:
        return None
    page = math.isqrt(8 * pmd_bytes)
    if page * page != 8 * pmd_bytes or page & (page - 1) or not 4096 <= page <= 65536:
        return None
    return page


def thp_order(pmd_bytes: int | None, page_bytes: int) -> int | None:
    """The buddy order of one PMD-sized huge page (9 for 2 MiB over 4 KiB)."""
    if not pmd_bytes or pmd_bytes < page_bytes or pmd_bytes % page_bytes:
        return None
    ratio = pmd_bytes // page_bytes
    if ratio & (ratio - 1):
        return None
    return ratio.bit_length() - 1


def page_size_for(live: bool, recorded: int | None, pmd_bytes: int | None) -> PageSize:
    if live:
        return PageSize(live_page_size(), "sysconf")
    # a bundle's probe is foreign: a power of two no kernel has (2^2000) is not taken (at most 256 KiB, hexagon's)
    if isinstance(recorded, int) and 4096 <= recorded <= 1 << 18 and not recorded & (recorded - 1):
        return PageSize(recorded, "probes/node.json")
    derived = derive_from_pmd(pmd_bytes)
    if derived:
        return PageSize(derived, "derived from hpage_pmd_size")
    return PageSize(DEFAULT, "assumed (not captured)")

"""Transparent huge page policy: /sys/kernel/mm/transparent_hugepage.

>>> parse_selected("always defer defer+madvise [madvise] never")
'madvise'
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from .rootfs import Root

__all__ = ["Thp", "parse_selected", "read_thp"]

_BASE = "sys/kernel/mm/transparent_hugepage"


@dataclass
class Thp:
    enabled: str | None
    defrag: str | None
    khugepaged_defrag: str | None
    shmem_enabled: str | None
    pmd_size_bytes: int | None

    @property
    def available(self) -> bool:
        return self.enabled is not None  # CONFIG_TRANSPARENT_HUGEPAGE=n: the directory is absent


def parse_selected(text: str) -> str | None:
    """The bracketed choice of a sysfs multiple-choice file, or the plain value ('1')."""
    m = re.search(r"\[([^\]]+)\]", text)
    if m:
        return m.group(1)
    text = text.strip()
    return text or None


def read_thp(root: Root) -> Thp:
    def sel(name: str) -> str | None:
        text = root.read_text(f"{_BASE}/{name}")
        return parse_selected(text) if text is not None else None

    pmd = root.read_text(f"{_BASE}/hpage_pmd_size")
    return Thp(enabled=sel("enabled"), defrag=sel("defrag"), khugepaged_defrag=sel("khugepaged/defrag"),
               shmem_enabled=sel("shmem_enabled"), pmd_size_bytes=int(pmd) if pmd and pmd.strip().isdigit() else None)

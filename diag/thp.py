"""Transparent huge page policy: /sys/kernel/mm/transparent_hugepage.

>>> parse_selected("always defer defer+madvise [madvise] never")
'madvise'
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from .parsing import to_int
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
    bad: list[str] = field(default_factory=list)  # files whose text could not be read

    @property
    def available(self) -> bool:
        return self.enabled is not None  # CONFIG_TRANSPARENT_HUGEPAGE=n: the directory is absent


def parse_selected(text: str) -> str | None:
    """The bracketed choice of a sysfs multiple-choice file, or the plain value ('1').

    >>> parse_selected("[always] [never]") is None, parse_selected("")
    (True, None)
    """
    if text.count("[") > 1 or text.count("]") > 1:
        return None  # two selections, or stray brackets: the file is damaged
    chosen = re.findall(r"\[([^\[\]\s]+)\]", text)
    if chosen:
        return chosen[0]
    text = text.strip()
    if "[" in text or "]" in text or " " in text:
        return None  # a choice list without a selection, or a half bracket
    return text or None


# what the kernel's mm/huge_memory.c and mm/shmem.c print in each file (a value outside is damage)
CHOICES = {"enabled": {"always", "madvise", "never", "inherit"},
           "defrag": {"always", "defer", "defer+madvise", "madvise", "never"},
           "khugepaged/defrag": {"0", "1"},
           "shmem_enabled": {"always", "within_size", "advise", "never", "deny", "force", "inherit"}}


def read_thp(root: Root) -> Thp:
    bad: list[str] = []

    def sel(name: str) -> str | None:
        text = root.read_text(f"{_BASE}/{name}")
        if text is None:
            return None
        value = parse_selected(text)
        if value is None or value not in CHOICES[name]:
            bad.append(f"{name}: {text.strip()[:40]!r}")
            return None
        return value

    pmd_text = root.read_text(f"{_BASE}/hpage_pmd_size")
    pmd = to_int(pmd_text) if pmd_text is not None else None
    if pmd_text is not None and (pmd is None or pmd <= 0 or pmd & (pmd - 1)):
        bad.append(f"hpage_pmd_size: {pmd_text.strip()[:40]!r}")
        pmd = None
    return Thp(enabled=sel("enabled"), defrag=sel("defrag"), khugepaged_defrag=sel("khugepaged/defrag"),
               shmem_enabled=sel("shmem_enabled"), pmd_size_bytes=pmd, bad=bad)

"""/proc/meminfo: system memory, in bytes.

>>> m = parse_meminfo("MemTotal: 100 kB\\nMemAvailable: 40 kB\\nHugePages_Total: 0\\n")
>>> m.total_bytes, m.available_bytes, m.raw["HugePages_Total"]
(102400, 40960, 0)
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .parsing import to_int
from .rootfs import Root

__all__ = ["Meminfo", "parse_meminfo", "read_meminfo"]

_FIELDS = {
    "total_bytes": "MemTotal", "free_bytes": "MemFree", "available_bytes": "MemAvailable",
    "cached_bytes": "Cached", "swap_cached_bytes": "SwapCached", "swap_total_bytes": "SwapTotal",
    "swap_free_bytes": "SwapFree", "mlocked_bytes": "Mlocked", "unevictable_bytes": "Unevictable",
    "anon_bytes": "AnonPages", "anon_huge_bytes": "AnonHugePages", "shmem_bytes": "Shmem",
    "cma_total_bytes": "CmaTotal", "cma_free_bytes": "CmaFree", "mapped_bytes": "Mapped",
    "sec_page_tables_bytes": "SecPageTables", "committed_as_bytes": "Committed_AS",
    "commit_limit_bytes": "CommitLimit", "hugetlb_bytes": "Hugetlb",
}


@dataclass
class Meminfo:
    raw: dict[str, int]
    missing: list[str] = field(default_factory=list)  # fields this kernel does not print, or damaged
    bad: list[str] = field(default_factory=list)      # lines that could not be read
    total_bytes: int | None = None
    free_bytes: int | None = None
    available_bytes: int | None = None  # since 3.14
    cached_bytes: int | None = None
    swap_cached_bytes: int | None = None
    swap_total_bytes: int | None = None
    swap_free_bytes: int | None = None
    mlocked_bytes: int | None = None
    unevictable_bytes: int | None = None
    anon_bytes: int | None = None
    anon_huge_bytes: int | None = None  # CONFIG_TRANSPARENT_HUGEPAGE=n: absent
    shmem_bytes: int | None = None
    cma_total_bytes: int | None = None  # CONFIG_CMA=n: absent
    cma_free_bytes: int | None = None
    mapped_bytes: int | None = None
    sec_page_tables_bytes: int | None = None  # since 6.0
    committed_as_bytes: int | None = None
    commit_limit_bytes: int | None = None
    hugetlb_bytes: int | None = None

    @property
    def swap_used_bytes(self) -> int | None:
        if self.swap_total_bytes is None or self.swap_free_bytes is None:
            return None
        return self.swap_total_bytes - self.swap_free_bytes

    @property
    def in_use_bytes(self) -> int | None:
        """MemTotal - MemAvailable: what the staging and headroom figures are made of."""
        if self.total_bytes is None or self.available_bytes is None:
            return None
        return self.total_bytes - self.available_bytes


def parse_meminfo(text: str) -> Meminfo:
    """Total: a damaged line is named in `bad`; a damaged known field is None and in `missing`.

    >>> m = parse_meminfo("MemTotal: 100 kB\\nMemFree: n/a kB\\n")
    >>> m.free_bytes, "MemFree" in m.missing, m.bad
    (None, True, ["MemFree: 'n/a kB'"])
    """
    raw: dict[str, int] = {}
    bad: list[str] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        name, sep, rest = line.partition(":")
        name = name.strip()
        parts = rest.split()
        value = to_int(parts[0]) if sep and parts else None
        unit_ok = len(parts) == 1 or (len(parts) == 2 and parts[1] == "kB")
        if not name or value is None or not unit_ok:
            bad.append(f"{name or line.strip()[:40]}: {rest.strip()[:40]!r}")
            continue
        raw[name] = value * 1024 if len(parts) == 2 else value
    info = Meminfo(raw=raw, bad=bad)
    for attr, key in _FIELDS.items():
        if key in raw:
            setattr(info, attr, raw[key])
        else:
            info.missing.append(key)
    return info


def read_meminfo(root: Root) -> Meminfo | None:
    text = root.read_text("proc/meminfo")
    return parse_meminfo(text) if text is not None else None

"""/proc/meminfo: system memory, in bytes.

>>> m = parse_meminfo("MemTotal: 100 kB\\nMemAvailable: 40 kB\\nHugePages_Total: 0\\n")
>>> m.total_bytes, m.available_bytes, m.raw["HugePages_Total"]
(102400, 40960, 0)
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .parsing import to_int
from .rootfs import Root

__all__ = ["Meminfo", "parse_meminfo", "read_meminfo", "estimate_available"]

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
    available_estimate: dict | None = None  # MemAvailable not printed: how it was estimated (estimate_available)

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

    >>> m = parse_meminfo("MemTotal: 100 kB\\nMemFree: n/a kB\\nMemAvailable: -1 kB\\n")
    >>> m.free_bytes, "MemFree" in m.missing, m.available_bytes, m.bad
    (None, True, None, ["MemFree: 'n/a kB'", "MemAvailable: '-1 kB'"])
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
        # every meminfo figure is a count of pages or bytes: the kernel never prints a negative one
        # (psutil's tests/test_linux.py feeds 'MemAvailable: -1 kB'; tests/fixtures/psutil-meminfo-negative)
        if not name or value is None or value < 0 or not unit_ok:
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


def estimate_available(m: Meminfo, zones) -> dict | None:
    """MemAvailable as the kernel computes it, for a meminfo that does not print it (kernels
    before 3.14, runtimes that rewrite meminfo): mm/show_mem.c si_mem_available (6.x; it was in
    mm/page_alloc.c before 6.2), from meminfo and /proc/zoneinfo's watermarks:

        available = MemFree - totalreserve
                  + pagecache - min(pagecache / 2, wmark_low)        pagecache = Active(file) + Inactive(file)
                  + reclaimable - min(reclaimable / 2, wmark_low)    reclaimable = KReclaimable (SReclaimable before 4.20)

    wmark_low is the sum of the zones' low watermarks (low_wmark_pages, boost included, as
    zoneinfo prints it); totalreserve is mm/page_alloc.c calculate_totalreserve_pages: per zone
    the largest lowmem reserve ('protection:') plus the high watermark without the boost, at
    most the zone's managed pages. None when a figure it needs is not there.

    >>> z = [type("Z", (), {"fields": {"low": 100, "high": 120, "boost": 0, "managed": 10_000}, "protection": [0, 30],
    ...                      "page_size": 4096})()]
    >>> m = parse_meminfo("MemFree: 4000 kB\\nActive(file): 2000 kB\\nInactive(file): 2000 kB\\nKReclaimable: 400 kB\\n")
    >>> e = estimate_available(m, z)
    >>> e["available_bytes"] // 1024, e["totalreserve_pages"], e["wmark_low_pages"]
    (7200, 150, 100)
    """
    raw = m.raw
    need = ("MemFree", "Active(file)", "Inactive(file)")
    if any(k not in raw for k in need) or not zones:
        return None
    page = zones[0].page_size
    wmark_low = reserve = 0
    for z in zones:
        f = z.fields
        if f.get("low") is None or f.get("high") is None or f.get("managed") is None or z.protection is None:
            return None
        wmark_low += f["low"]
        reserve += min(max(z.protection) + f["high"] - (f.get("boost") or 0), f["managed"])
    pagecache = (raw["Active(file)"] + raw["Inactive(file)"]) // page
    reclaimable = raw.get("KReclaimable", raw.get("SReclaimable", 0)) // page
    pages = raw["MemFree"] // page - reserve
    pages += pagecache - min(pagecache // 2, wmark_low)
    pages += reclaimable - min(reclaimable // 2, wmark_low)
    return {"available_bytes": max(0, pages) * page, "totalreserve_pages": reserve, "wmark_low_pages": wmark_low,
            "pagecache_pages": pagecache, "reclaimable_pages": reclaimable,
            "source": "estimated as mm/show_mem.c si_mem_available does (MemFree - reserve + page cache and "
                      "reclaimable kernel memory less the low watermarks)"}

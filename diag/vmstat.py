"""/proc/vmstat: event and state counters (pages or events, as the kernel names them).

>>> parse_vmstat("pswpin 10\\nnr_foll_pin_acquired 4196352\\n")["nr_foll_pin_acquired"]
4196352
"""
from __future__ import annotations

from .parsing import ParsedDict, to_int
from .rootfs import Root

__all__ = ["parse_vmstat", "read_vmstat", "vmstat_delta", "WATCHED_PREFIXES"]

# what the watchdog and the fragmentation check look at
WATCHED_PREFIXES = ("nr_foll_pin_", "pswp", "pgmajfault", "pgfault", "compact_", "pgmigrate_", "thp_",
                    "nr_free_pages", "numa_miss", "nr_mlock", "nr_unevictable", "nr_anon_transparent")


def parse_vmstat(text: str) -> ParsedDict:
    """Counters by name; a line that is not 'name integer' is named in `.bad`.

    >>> v = parse_vmstat("pswpin 10\\nnr_free_pages n/a\\n")
    >>> dict(v), v.bad
    ({'pswpin': 10}, ["nr_free_pages: 'n/a'"])
    """
    out = ParsedDict()
    for line in text.splitlines():
        parts = line.split()
        if not parts:
            continue
        value = to_int(parts[1]) if len(parts) == 2 else None
        if value is None:
            out.bad.append(f"{parts[0][:40]}: {' '.join(parts[1:])[:40]!r}")
            continue
        out[parts[0]] = value
    return out


def read_vmstat(root: Root) -> ParsedDict | None:
    text = root.read_text("proc/vmstat")
    if text is None:
        # a partial capture (the reference tree keeps only the interesting lines)
        text = root.read_text("proc/vmstat.partial")
    return parse_vmstat(text) if text is not None else None


def vmstat_delta(before: dict[str, int], after: dict[str, int], prefixes=WATCHED_PREFIXES) -> dict[str, int]:
    """Non-zero differences of the counters that start with one of prefixes."""
    out = {}
    for key, value in after.items():
        if key.startswith(prefixes) and key in before:
            d = value - before[key]
            if d:
                out[key] = d
    return out

"""/proc/PID/limits: resource limits, None = unlimited.

>>> parse_limits("Limit Soft Limit Hard Limit Units\\nMax locked memory         8388608              unlimited            bytes\\n")["Max locked memory"]
(8388608, None)
"""
from __future__ import annotations

import re

from .parsing import ParsedDict, to_int
from .rootfs import Root

__all__ = ["parse_limits", "read_memlock"]


def parse_limits(text: str) -> ParsedDict:
    """{limit name: (soft, hard)} with None = unlimited; a damaged value leaves its limit out
    (named in `.bad`) rather than reading as unlimited.

    >>> parse_limits("Limit Soft Limit Hard Limit Units\\nMax locked memory  lots  unlimited  bytes\\n").bad
    ["Max locked memory: 'lots' 'unlimited'"]
    """
    out = ParsedDict()
    for line in text.splitlines()[1:]:
        m = re.match(r"(Max [a-z ]+?)\s{2,}(\S+)\s+(\S+)", line)
        if not m:
            if line.strip():
                out.bad.append(f"{line.strip()[:60]!r}")
            continue
        values = [None if v == "unlimited" else to_int(v) for v in (m.group(2), m.group(3))]
        if any(v is None and raw != "unlimited" for v, raw in zip(values, (m.group(2), m.group(3)))):
            out.bad.append(f"{m.group(1)}: {m.group(2)[:20]!r} {m.group(3)[:20]!r}")
            continue
        out[m.group(1)] = (values[0], values[1])
    return out


def read_memlock(root: Root, pid: str = "self") -> tuple[int | None, int | None] | None:
    """(soft, hard) RLIMIT_MEMLOCK in bytes; None inside = unlimited; None = unreadable."""
    text = root.read_text(f"proc/{pid}/limits")
    if text is None:
        return None
    return parse_limits(text).get("Max locked memory")

"""/proc/PID/limits: resource limits, None = unlimited.

>>> parse_limits("Limit Soft Limit Hard Limit Units\\nMax locked memory         8388608              unlimited            bytes\\n")["Max locked memory"]
(8388608, None)
"""
from __future__ import annotations

import re

from .rootfs import Root

__all__ = ["parse_limits", "read_memlock"]


def parse_limits(text: str) -> dict[str, tuple[int | None, int | None]]:
    out = {}
    for line in text.splitlines()[1:]:
        m = re.match(r"(Max [a-z ]+?)\s{2,}(\S+)\s+(\S+)", line)
        if not m:
            continue
        values = [None if v == "unlimited" else int(v) if v.isdigit() else None for v in (m.group(2), m.group(3))]
        out[m.group(1)] = (values[0], values[1])
    return out


def read_memlock(root: Root, pid: str = "self") -> tuple[int | None, int | None] | None:
    """(soft, hard) RLIMIT_MEMLOCK in bytes; None inside = unlimited; None = unreadable."""
    text = root.read_text(f"proc/{pid}/limits")
    if text is None:
        return None
    return parse_limits(text).get("Max locked memory")

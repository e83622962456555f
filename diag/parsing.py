"""What every /proc and /sys parser shares: values that may be damaged, and a record of which were.

A parser here is total: any text gives a result, never an exception. A value that cannot be
read becomes None, and the line or field is named in the result's `bad` list, so a check can
tell "the kernel does not print this" (missing) from "the file is damaged" (bad) and refuse to
judge on a damaged reading.

>>> to_int("4096"), to_int("n/a"), to_int("-1")
(4096, None, -1)
>>> rows = ParsedList([1, 2]); rows.bad.append("line 3: 'x'"); rows, rows.bad
([1, 2], ["line 3: 'x'"])
"""
from __future__ import annotations

__all__ = ["ParsedList", "ParsedDict", "to_int", "to_float", "describe_bad"]


class ParsedList(list):
    """A list of parsed rows that also names the lines it could not read (`bad`)."""

    def __init__(self, items=(), bad: list[str] | None = None):
        super().__init__(items)
        self.bad: list[str] = list(bad or [])


class ParsedDict(dict):
    """A mapping of parsed values that also names the lines it could not read (`bad`).
    It serialises as a plain dict (json.dumps drops the attribute)."""

    def __init__(self, items=(), bad: list[str] | None = None):
        super().__init__(items)
        self.bad: list[str] = list(bad or [])


def to_int(text: str | None) -> int | None:
    """An integer as the kernel prints it (decimal, optional sign), else None."""
    if text is None:
        return None
    text = text.strip()
    if not text:
        return None
    body = text[1:] if text[0] in "+-" else text
    if not body.isascii() or not body.isdigit() or len(body) > 20:
        return None  # past 20 digits it is no 64-bit counter (and int() refuses 4,300 and more)
    return int(text)


def to_float(text: str | None) -> float | None:
    """A decimal number as PSI prints it ('1.85'), else None (nan and inf are damage too)."""
    if text is None:
        return None
    text = text.strip()
    try:
        value = float(text)
    except ValueError:
        return None
    if value != value or value in (float("inf"), float("-inf")) or not text.isascii():
        return None
    return value


def describe_bad(source: str, bad: list[str], limit: int = 3) -> str:
    """'proc/zoneinfo: Node 0 zone Normal: free='n/a' (and 2 more)' for a message."""
    shown = "; ".join(bad[:limit])
    more = f" (and {len(bad) - limit} more)" if len(bad) > limit else ""
    return f"{source}: {shown}{more}"

"""Sizes and rates as people type them on a command line, and as we print them.

>>> parse_size("47.2GiB")
50680614093
>>> format_bytes(50680614093)
'47.2 GiB'
"""
from __future__ import annotations

import os
import re
from fractions import Fraction

__all__ = [
    "PAGE_SIZE", "KiB", "MiB", "GiB", "TiB", "MAX_SIZE", "SizeError", "parse_size", "parse_rate",
    "format_bytes", "format_duration", "SIZE_EXAMPLE", "RATE_EXAMPLE",
]

def _live_page_size() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") or 4096
    except (ValueError, OSError):
        return 4096


PAGE_SIZE = _live_page_size()  # this machine's base page (64 KiB on some arm64); checks use the node's own
KiB, MiB, GiB, TiB = 1 << 10, 1 << 20, 1 << 30, 1 << 40

_UNITS = {
    "": 1, "b": 1,
    "kib": KiB, "mib": MiB, "gib": GiB, "tib": TiB,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
}
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$", re.ASCII)
_DIGITS = 30           # more digits than any size a machine has: refused before any arithmetic
MAX_SIZE = 1 << 60     # 1 EiB
SIZE_EXAMPLE = "47GiB, 47.2GiB, 512MiB, 50GB or 1073741824"
RATE_EXAMPLE = "11MB/s, 16MiB/s or 2800pages/s"


class SizeError(ValueError):
    """A size or rate that cannot be read; the message names the value and a good example."""


def _show(text: object) -> str:
    """The value as the user typed it, cut short when it is long."""
    s = str(text)
    return repr(s) if len(s) <= 40 else repr(s[:40]) + f"... ({len(s)} characters)"


def parse_size(text: str) -> int:
    """Bytes from '47GiB', '47.2GiB', '512MiB', '50GB' (SI) or plain bytes; must be > 0.

    >>> parse_size("50GB"), parse_size("4096")
    (50000000000, 4096)
    """
    m = _SIZE_RE.match(str(text))
    unit = m.group(2).lower() if m else None
    if not m or unit not in _UNITS:
        raise SizeError(f"{_show(text)} is not a size; use e.g. {SIZE_EXAMPLE}")
    digits = m.group(1)
    if unit in ("", "b") and "." in digits:
        raise SizeError(f"{_show(text)}: plain bytes must be a whole number; use e.g. {SIZE_EXAMPLE}")
    if len(digits.split(".")[0].lstrip("0")) > _DIGITS or len(digits) > 2 * _DIGITS:
        raise SizeError(f"{_show(text)} is too large: at most 1 EiB (1048576TiB); use e.g. {SIZE_EXAMPLE}")
    value = round(Fraction(digits) * _UNITS[unit])  # exact: no float rounding, no overflow
    if value <= 0:
        raise SizeError(f"{_show(text)} is not a positive size; use e.g. {SIZE_EXAMPLE}")
    if value > MAX_SIZE:
        raise SizeError(f"{_show(text)} is too large: at most 1 EiB (1048576TiB); use e.g. {SIZE_EXAMPLE}")
    return value


def parse_rate(text: str) -> int:
    """Bytes per second from '11MB/s', '16MiB/s' or '2800pages/s' (4 KiB pages).

    >>> parse_rate("16MB/s"), parse_rate("2800pages/s")
    (16000000, 11468800)
    """
    raw = str(text).strip()
    low = raw.lower()
    if low.endswith("pages/s"):
        count = low[: -len("pages/s")].strip()
        if not re.fullmatch(r"[0-9]{1,20}", count, re.ASCII) or int(count) <= 0:
            raise SizeError(f"{_show(text)} is not a rate; use e.g. {RATE_EXAMPLE}")
        if int(count) * PAGE_SIZE > MAX_SIZE:
            raise SizeError(f"{_show(text)} is too large: at most 1 EiB/s; use e.g. {RATE_EXAMPLE}")
        return int(count) * PAGE_SIZE
    if not low.endswith("/s"):
        raise SizeError(f"{_show(text)} is not a rate; use e.g. {RATE_EXAMPLE}")
    try:
        return parse_size(raw[:-2])
    except SizeError as exc:
        if "too large" in str(exc):
            raise SizeError(f"{_show(text)} is too large: at most 1 EiB/s; use e.g. {RATE_EXAMPLE}") from None
        raise SizeError(f"{_show(text)} is not a rate; use e.g. {RATE_EXAMPLE}") from None


def format_bytes(n: float | int | None, signed: bool = False) -> str:
    """Binary units with at most one decimal: '47.2 GiB', '188 MiB', '0 B'."""
    if n is None:
        return "n/a"
    sign = ""
    if n < 0:
        sign, n = "-", -n
    elif signed:
        sign = "+"
    for unit, scale in (("TiB", TiB), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= scale:
            value = n / scale
            text = f"{value:.1f}" if value < 100 else f"{value:.0f}"
            return f"{sign}{text.rstrip('0').rstrip('.') if '.' in text else text} {unit}"
    return f"{sign}{int(n)} B"


def format_duration(seconds: float | None) -> str:
    """'0.42 s', '25.3 s', '25 min', '3.1 h'."""
    if seconds is None:
        return "n/a"
    if seconds < 10:
        return f"{seconds:.2f} s"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 600:
        return f"{seconds / 60:.1f} min"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"

"""/proc/pressure/memory: pressure stall information (since 4.20, CONFIG_PSI, psi=1).

>>> p = parse_psi("some avg10=1.85 avg60=10.66 avg300=3.92 total=13474851\\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\\n")
>>> p["some"]["avg10"], p["full"]["total_us"]
(1.85, 0)
"""
from __future__ import annotations

from .parsing import ParsedDict, to_float, to_int
from .rootfs import Root

__all__ = ["parse_psi", "read_psi_memory"]

KEYS = ("avg10", "avg60", "avg300", "total_us")


def parse_psi(text: str) -> ParsedDict:
    """{'some': {...}, 'full': {...}}; a damaged value is None and named in `.bad`.

    >>> p = parse_psi("some avg10=x avg60=0.00 avg300=0.00 total=1\\n")
    >>> p["some"]["avg10"], p.bad
    (None, ["some avg10='x'", "no 'full' line"])
    """
    out = ParsedDict()
    for line in text.splitlines():
        parts = line.split()
        if not parts:
            continue
        if parts[0] not in ("some", "full"):
            out.bad.append(f"{line.strip()[:60]!r}")
            continue
        row: dict[str, float | int | None] = {}
        for item in parts[1:]:
            key, sep, value = item.partition("=")
            number = to_int(value) if key == "total" else to_float(value)
            if not sep or number is None or number < 0 or (key != "total" and number > 100):  # avgs are percents
                out.bad.append(f"{parts[0]} {key}={value[:20]!r}")
                number = None
            name = "total_us" if key == "total" else key
            if name not in KEYS:
                out.bad.append(f"{parts[0]} {key[:20]!r}: not a PSI field")
                continue
            row[name] = number
        for key in KEYS:
            if key not in row:
                out.bad.append(f"{parts[0]}: no {key}")
                row[key] = None
        out[parts[0]] = row
    for kind in ("some", "full"):  # memory has printed both lines since PSI came in (4.20)
        if kind not in out:
            out.bad.append(f"no '{kind}' line")
    return out


def read_psi_memory(root: Root) -> ParsedDict | None:
    text = root.read_text("proc/pressure/memory")
    return parse_psi(text) if text is not None else None

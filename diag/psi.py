"""/proc/pressure/memory: pressure stall information (since 4.20, CONFIG_PSI, psi=1).

>>> p = parse_psi("some avg10=1.85 avg60=10.66 avg300=3.92 total=13474851\\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\\n")
>>> p["some"]["avg10"], p["full"]["total_us"]
(1.85, 0)
"""
from __future__ import annotations

from .rootfs import Root

__all__ = ["parse_psi", "read_psi_memory"]


def parse_psi(text: str) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for line in text.splitlines():
        parts = line.split()
        if not parts or parts[0] not in ("some", "full"):
            continue
        row: dict[str, float] = {}
        for item in parts[1:]:
            key, _, value = item.partition("=")
            if key == "total":
                row["total_us"] = int(value)
            else:
                row[key] = float(value)
        out[parts[0]] = row
    return out


def read_psi_memory(root: Root) -> dict[str, dict[str, float]] | None:
    text = root.read_text("proc/pressure/memory")
    return parse_psi(text) if text is not None else None

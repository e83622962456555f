"""/proc/swaps: swap devices and files, sizes in bytes.

>>> parse_swaps("Filename Type Size Used Priority\\n/swapfile file 1024 512 -2\\n")[0].used_bytes
524288
"""
from __future__ import annotations

from dataclasses import dataclass

from .rootfs import Root

__all__ = ["SwapDevice", "parse_swaps", "read_swaps"]


@dataclass
class SwapDevice:
    name: str
    kind: str  # 'partition' or 'file'
    size_bytes: int
    used_bytes: int
    priority: int


def parse_swaps(text: str) -> list[SwapDevice]:
    out = []
    for line in text.splitlines()[1:]:
        parts = line.split()
        if len(parts) < 5:
            continue
        # a name with spaces is printed with \040; keep it as the kernel wrote it
        out.append(SwapDevice(parts[0], parts[1], int(parts[2]) * 1024, int(parts[3]) * 1024, int(parts[4])))
    return out


def read_swaps(root: Root) -> list[SwapDevice] | None:
    text = root.read_text("proc/swaps")
    return parse_swaps(text) if text is not None else None

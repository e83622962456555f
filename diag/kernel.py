"""Kernel release (/proc/version, /proc/sys/kernel/osrelease) and command line (/proc/cmdline).

>>> parse_release("6.18.44-fc-v657-gpu")
(6, 18, 44)
>>> parse_cmdline("quiet movablecore=4G iommu=pt -- --init")["movablecore"]
'4G'
"""
from __future__ import annotations

import re

from .rootfs import Root
from .safetext import one_line

__all__ = ["parse_release", "release_from_version", "parse_cmdline", "read_release", "read_cmdline"]


def parse_release(release: str) -> tuple[int, int, int] | None:
    m = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", release.strip())
    if not m:
        return None
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def release_from_version(text: str) -> str | None:
    """'Linux version 6.18.44-fc (builder@...) ...' -> '6.18.44-fc'."""
    m = re.match(r"Linux version (\S+)", text)
    return m.group(1) if m else None


def read_release(root: Root) -> str | None:
    text = root.read_text("proc/sys/kernel/osrelease", record=True)
    if text:
        return one_line(text.strip())  # a captured tree's: anyone's text
    text = root.read_text("proc/version")
    release = release_from_version(text) if text else None
    return one_line(release) if release else None


def parse_cmdline(text: str) -> dict[str, str | None]:
    """Kernel parameters up to '--' (what follows is init's); a bare flag maps to None."""
    out: dict[str, str | None] = {}
    for token in text.split():
        if token == "--":
            break
        key, sep, value = token.partition("=")
        out[key] = value if sep else None
    return out


def read_cmdline(root: Root) -> dict[str, str | None] | None:
    text = root.read_text("proc/cmdline")
    return parse_cmdline(text) if text is not None else None

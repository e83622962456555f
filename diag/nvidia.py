"""NVIDIA kernel module facts from /proc/driver/nvidia: version, flavour, parameters, GPUs.

>>> v = parse_version("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build")
>>> v.version, v.open_module, v.arch
((580, 159, 4), True, 'x86_64')
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from .rootfs import Root

__all__ = ["DriverVersion", "NvidiaDriver", "parse_version", "parse_colon_kv", "read_nvidia", "version_str"]


@dataclass
class DriverVersion:
    version: tuple[int, ...] | None
    open_module: bool | None
    text: str
    arch: str | None = None  # the module's architecture, as its banner says ('x86_64', 'aarch64')


@dataclass
class NvidiaDriver:
    loaded: bool
    version: DriverVersion | None = None
    params: dict[str, str] = field(default_factory=dict)
    gpus: dict[str, dict[str, str]] = field(default_factory=dict)  # PCI address -> information


def version_str(v: tuple[int, ...] | None) -> str:
    if not v:
        return "unknown"
    return ".".join(f"{x:02d}" if i == 2 else str(x) for i, x in enumerate(v))


def parse_version(text: str) -> DriverVersion:
    first = text.splitlines()[0] if text else ""
    m = re.search(r"\s(\d+\.\d+(?:\.\d+)?)\s", first + " ")
    version = tuple(int(x) for x in m.group(1).split(".")) if m else None
    if "Open Kernel Module" in first:
        open_module = True
    elif "Kernel Module" in first:
        open_module = False
    else:
        open_module = None
    arch = re.search(r"Kernel Module for (\S+)", first)
    return DriverVersion(version=version, open_module=open_module, text=first.strip(),
                         arch=arch.group(1) if arch else None)


def parse_colon_kv(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            out[key.strip()] = value.strip().strip('"')
    return out


def read_nvidia(root: Root) -> NvidiaDriver:
    vtext = root.read_text("proc/driver/nvidia/version")
    if vtext is None:
        return NvidiaDriver(loaded=False)
    params_text = root.read_text("proc/driver/nvidia/params")
    gpus = {}
    for bdf in root.listdir("proc/driver/nvidia/gpus"):
        info = root.read_text(f"proc/driver/nvidia/gpus/{bdf}/information")
        if info is not None:
            gpus[bdf.lower()] = parse_colon_kv(info)
    return NvidiaDriver(loaded=True, version=parse_version(vtext),
                        params=parse_colon_kv(params_text) if params_text else {}, gpus=gpus)

"""A temporary swap file for a reproduction (`--make-swap SIZE`), removed afterwards.

The header is written here (linux/swap.h, union swap_header, version 1) and swapon/swapoff
are libc calls, so no util-linux binary is needed on the node. The file is named with the
owner's pid (diag.leftovers.swap_file_name), so a run that is SIGKILLed leaves one that
`hostpin repro cleanup` can tell from a running run's; a file that fails to become swap is
removed at once.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import uuid
from pathlib import Path

from diag.leftovers import SWAP_PREFIX as PREFIX, swap_file_name
from diag.pagesize import live_page_size

__all__ = ["SwapFile", "SwapError", "write_swap_header", "active_swaps", "PREFIX", "MIN_PAGES"]

PAGE = live_page_size()  # the header fills one page and ends in SWAPSPACE2 (64 KiB on 64 KiB-page arm64)
MIN_PAGES = 10  # the kernel's minimum for a swap area
SWAP_FLAG_PREFER = 0x8000
SWAP_FLAG_PRIO_MASK = 0x7FFF

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.swapon.argtypes = [ctypes.c_char_p, ctypes.c_int]
_libc.swapoff.argtypes = [ctypes.c_char_p]


class SwapError(RuntimeError):
    pass


def write_swap_header(fd: int, size: int) -> None:
    pages = size // PAGE
    if pages < MIN_PAGES:
        raise SwapError(f"a swap file needs at least {MIN_PAGES} pages ({MIN_PAGES * PAGE // 1024} KiB)")
    header = bytearray(PAGE)
    # bootbits[1024], then: version, last_page, nr_badpages, uuid[16], volume[16]
    header[1024:1036] = (1).to_bytes(4, "little") + (pages - 1).to_bytes(4, "little") + (0).to_bytes(4, "little")
    header[1036:1052] = uuid.uuid4().bytes
    header[1052:1068] = b"hostpin".ljust(16, b"\0")
    header[PAGE - 10:PAGE] = b"SWAPSPACE2"
    os.pwrite(fd, bytes(header), 0)


def active_swaps() -> list[str]:
    lines = Path("/proc/swaps").read_text().splitlines()[1:]
    return [line.split()[0] for line in lines if line.split()]


class SwapFile:
    def __init__(self, directory: Path | str, size: int, priority: int = 32000):
        self.path = Path(directory) / swap_file_name(os.getpid(), uuid.uuid4().hex[:8])
        self.size = size // PAGE * PAGE
        self.priority = priority
        self.active = False

    def create(self) -> "SwapFile":
        if self.size // PAGE < MIN_PAGES:
            raise SwapError(f"a swap file needs at least {MIN_PAGES} pages ({MIN_PAGES * PAGE // 1024} KiB); "
                            "give a larger --make-swap")
        try:
            fs = os.statvfs(self.path.parent)
        except OSError as exc:
            raise SwapError(f"cannot use {self.path.parent} for a swap file: {exc.strerror}; choose another "
                            "--swap-dir") from None
        free = fs.f_bavail * fs.f_frsize
        if free < self.size + (1 << 30):
            raise SwapError(f"{self.path.parent} has {free >> 20} MiB free; a {self.size >> 20} MiB swap file "
                            "needs that plus 1 GiB; choose another --swap-dir")
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except OSError as exc:
            raise SwapError(f"cannot create {self.path}: {exc.strerror}; choose another --swap-dir") from None
        try:
            try:
                os.posix_fallocate(fd, 0, self.size)
            except OSError as exc:
                raise SwapError(f"cannot allocate {self.path}: {exc.strerror}") from None
            write_swap_header(fd, self.size)
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            self.path.unlink(missing_ok=True)  # never leave a file that did not become swap
            raise
        os.close(fd)
        flags = SWAP_FLAG_PREFER | (self.priority & SWAP_FLAG_PRIO_MASK)
        if _libc.swapon(str(self.path).encode(), flags) != 0:
            err = ctypes.get_errno()
            self.path.unlink(missing_ok=True)
            raise SwapError(f"swapon {self.path}: {os.strerror(err)} (needs root, and a file system that "
                            "supports swap files: ext4, xfs; not tmpfs or overlayfs)")
        self.active = True
        return self

    def remove(self) -> list[str]:
        problems = []
        if self.active:
            if _libc.swapoff(str(self.path).encode()) != 0:
                err = ctypes.get_errno()
                problems.append(f"swapoff {self.path}: {os.strerror(err)}")
            else:
                self.active = False
        if not self.active:
            try:
                self.path.unlink(missing_ok=True)
            except OSError as exc:
                problems.append(f"cannot remove {self.path}: {exc.strerror}")
        return problems

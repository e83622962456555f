"""The page cache of one file: how much of it is cached, and evicting it before a pin.

With `--read-rate` and a file source, the pin must read the file from its disk for the
throttle to mean anything: its clean pages are dropped from the page cache first
(fdatasync, then POSIX_FADV_DONTNEED: the file's contents do not change; pages mapped by a
process or dirty stay). Residency is read with mincore on a read-only mapping that is never
touched.
"""
from __future__ import annotations

import ctypes
import mmap
import os
import stat

from .region import libc

__all__ = ["FileCacheError", "cached_fraction", "evict"]

libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]


class FileCacheError(RuntimeError):
    pass


def _open(path: str) -> int:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise FileCacheError(f"cannot open {path}: {exc.strerror}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise FileCacheError(f"{path} is not a regular file")
    return fd


def cached_fraction(path: str) -> float | None:
    """Share of the file's pages in the page cache now (0..1); None for an empty file."""
    fd = _open(path)
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            return None
        page = mmap.PAGESIZE
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            raise FileCacheError(f"cannot map {path}: {os.strerror(ctypes.get_errno())}")
        try:
            pages = (size + page - 1) // page
            vec = (ctypes.c_ubyte * pages)()
            if libc.mincore(addr, size, vec) != 0:
                raise FileCacheError(f"mincore on {path}: {os.strerror(ctypes.get_errno())}")
            return sum(b & 1 for b in vec) / pages
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)


def evict(path: str) -> dict:
    """Drop the file's clean pages from the page cache; what was cached before and after."""
    before = cached_fraction(path)
    fd = _open(path)
    try:
        os.fdatasync(fd)  # written back first, else its dirty pages stay cached
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        size = os.fstat(fd).st_size
    finally:
        os.close(fd)
    return {"path": path, "bytes": size, "cached_before": before, "cached_after": cached_fraction(path)}

"""Memory regions for the pinning child: map, advise, prefault, lock, through libc (ctypes).

Everything here runs in the child process. Calls that take long (madvise populate, mlock,
memset) release the GIL, so prefault threads run in parallel.

A user's file is never written: `file:PATH` that exists is opened read-only and mapped
PROT_READ whatever was asked (so the prefault only reads it, MADV_POPULATE_READ, and the pin
must be read-only), and it is never grown: a file shorter than the region is refused. Only a
file this run creates (O_EXCL) is written, grown to the region, and removed afterwards.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import stat
import threading
import time
from dataclasses import dataclass

__all__ = ["Region", "map_region", "prefault", "mlock_range", "munlock_range", "LibcError",
           "MADV_HUGEPAGE", "MADV_NOHUGEPAGE", "make_uffd_region", "FileSourceError", "existing_file_flags"]

libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
libc.mlock.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
libc.munlock.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
libc.memset.restype = ctypes.c_void_p
libc.syscall.restype = ctypes.c_long

MAP_FAILED = ctypes.c_void_p(-1).value
PROT_READ, PROT_WRITE = 0x1, 0x2
MAP_SHARED, MAP_PRIVATE, MAP_ANONYMOUS, MAP_NORESERVE = 0x01, 0x02, 0x20, 0x4000
MADV_PAGEOUT = 21
MADV_HUGEPAGE, MADV_NOHUGEPAGE = 14, 15
MADV_POPULATE_READ, MADV_POPULATE_WRITE = 22, 23  # since 5.14
PAGE = 4096


class LibcError(OSError):
    pass


class FileSourceError(ValueError):
    """A --source file:PATH that cannot be used without writing the user's file."""


def existing_file_flags(path: str, size: int, method: str, register_flags: str, map_kind: str = "shared") -> str:
    """The registration flags for --source file:PATH. A path that does not exist yet is the
    run's own file (created, written, removed): flags as asked. An existing file is the user's
    and is never written: shared, it is mapped read-only and registered with
    cudaHostRegisterReadOnly (a mode that needs a writable pin is refused); private, it is opened
    read-only and its writes land in private copies (copy-on-write), never in the file, so the
    flags are as asked: a launcher's MAP_PRIVATE table with default flags is what runs in
    production. A file shorter than the region is refused either way."""
    import stat as _stat
    try:
        st = os.stat(path)
    except FileNotFoundError:
        if os.path.islink(path):  # the run would create the file at wherever the link points
            raise FileSourceError(f"--source file:{path} is a link to nothing ({os.readlink(path)}); give a data "
                                  "file, or a new path for the run to create") from None
        return register_flags
    except OSError as exc:
        raise FileSourceError(f"--source file:{path}: {exc.strerror}") from None
    if not _stat.S_ISREG(st.st_mode):
        raise FileSourceError(f"--source file:{path} is not a regular file; give a data file, or a new path for "
                              "the run to create")
    if st.st_size < size:
        raise FileSourceError(f"--source file:{path} is {st.st_size:,} bytes, smaller than --size ({size:,}); an "
                              "existing file is never grown or written: give a file at least that large, or a new "
                              "path (the run creates it and removes it afterwards)")
    if not os.access(path, os.R_OK):
        raise FileSourceError(f"--source file:{path} is not readable")
    if method == "register" and map_kind != "private":
        if register_flags in ("portable", "mapped"):
            raise FileSourceError(f"--register-flags {register_flags} pins --source file:{path} writable, and an "
                                  "existing file is only ever mapped read-only (hostpin never writes your file): use "
                                  "--register-flags readonly (or default), or a new path that the run creates")
        return "readonly"
    return register_flags


def _check(ret: int, what: str) -> int:
    if ret == -1 or ret is None:
        err = ctypes.get_errno()
        raise LibcError(err, f"{what}: {os.strerror(err)} ({errno.errorcode.get(err, err)})")
    return ret


@dataclass
class Region:
    addr: int
    size: int
    source: str
    writable: bool
    fd: int | None = None
    path: str | None = None
    unlink_on_close: bool = False
    uffd: int | None = None

    def close(self) -> None:
        libc.munmap(self.addr, self.size)
        if self.fd is not None:
            os.close(self.fd)
        if self.uffd is not None:
            os.close(self.uffd)
        if self.unlink_on_close and self.path:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass


def map_region(size: int, source: str = "anon", map_kind: str = "private", writable: bool = True,
               thp: bool | None = None) -> Region:
    """source: 'anon', 'shm' (a new file in /dev/shm, removed on close) or 'file:PATH' (an
    existing file, or a new one of `size` bytes). thp: True/False madvises, None leaves it."""
    prot = PROT_READ | (PROT_WRITE if writable else 0)
    flags = MAP_SHARED if map_kind == "shared" else MAP_PRIVATE
    fd, path, unlink = -1, None, False
    if source == "anon":
        flags |= MAP_ANONYMOUS
    elif source == "shm":
        from diag.leftovers import shm_name
        path = f"/dev/shm/{shm_name(os.getpid(), time.monotonic_ns())}"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        unlink = True
    elif source.startswith("file:"):
        path = source[5:]
        try:  # the run's own file: created now, grown to the region, removed with it
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            unlink = True
        except FileExistsError:  # the user's file: opened read-only, never grown, kept
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_size < size:
                os.close(fd)
                what = ("not a regular file" if not stat.S_ISREG(st.st_mode)
                        else f"smaller than the region ({size} bytes)")
                raise LibcError(errno.EINVAL, f"{path} is {what}; an existing file is never grown or written")
            if map_kind == "shared":  # a shared mapping's writes would reach the file: read-only
                writable = False
                prot = PROT_READ
            # private: PROT_WRITE on a read-only descriptor is allowed, and every write is a
            # private copy of the page (the file is never written)
    else:
        raise ValueError(f"unknown source {source!r}")
    try:
        if unlink:
            os.ftruncate(fd, size)
        addr = libc.mmap(None, size, prot, flags, fd, 0)
        if addr in (None, MAP_FAILED):
            err = ctypes.get_errno()
            raise LibcError(err, f"mmap of {size} bytes ({source}, {map_kind}): {os.strerror(err)}")
    except BaseException:
        if fd >= 0:
            os.close(fd)
        if unlink and path:
            os.unlink(path)
        raise
    region = Region(addr=addr, size=size, source=source, writable=writable, fd=fd if fd >= 0 else None,
                    path=path, unlink_on_close=unlink)
    if thp is not None:
        _check(libc.madvise(addr, size, MADV_HUGEPAGE if thp else MADV_NOHUGEPAGE), "madvise(HUGEPAGE)")
    return region


def prefault(region: Region, threads: int = 8, piece: int = 256 << 20, progress=None) -> dict:
    """Touch every page before pinning, in parallel slices: MADV_POPULATE_WRITE (or _READ for a
    read-only mapping; memset before 5.14), then one non-zero byte per 4 KiB page.

    The non-zero byte matters: since 6.12 the kernel keeps all-zero pages out of swap (a zero
    map instead of a write) and splits mostly-zero huge pages onto the shared zero page, so an
    untouched-looking region would neither go to swap nor stay resident like a real table.
    """
    n = max(1, min(threads, region.size // (64 << 20) or 1))
    slice_size = -(-region.size // n)
    slice_size = -(-slice_size // (2 << 20)) * (2 << 20)  # huge-page aligned slices
    advice = MADV_POPULATE_WRITE if region.writable else MADV_POPULATE_READ
    view = memoryview((ctypes.c_char * region.size).from_address(region.addr)).cast("B") if region.writable else None
    errors: list[str] = []
    done = [0]
    lock = threading.Lock()
    method = ["madvise_populate"]

    def work(start: int, length: int) -> None:
        off = 0
        while off < length:
            size = min(piece, length - off)
            addr = region.addr + start + off
            if libc.madvise(addr, size, advice) != 0:
                err = ctypes.get_errno()
                if err == errno.EINVAL and region.writable:  # no MADV_POPULATE_*: before 5.14
                    method[0] = "memset"
                    libc.memset(addr, 0x5A, size)
                else:
                    errors.append(f"madvise(POPULATE) at +{start + off}: {os.strerror(err)}")
                    return
            if view is not None:
                lo = start + off
                view[lo:lo + size:PAGE] = b"\x5a" * ((size + PAGE - 1) // PAGE)
            off += size
            with lock:
                done[0] += size
                if progress:
                    progress(done[0])

    t0 = time.monotonic()
    workers = []
    for i in range(n):
        start = i * slice_size
        if start >= region.size:
            break
        t = threading.Thread(target=work, args=(start, min(slice_size, region.size - start)), daemon=True)
        t.start()
        workers.append(t)
    for t in workers:
        t.join()
    seconds = time.monotonic() - t0
    if view is not None:
        view.release()
    if errors:
        raise LibcError(errno.EFAULT, "; ".join(errors[:3]))
    return {"seconds": seconds, "threads": len(workers), "method": method[0], "piece_bytes": piece,
            "rate_gib_s": region.size / (1 << 30) / seconds if seconds > 0 else None}


def mlock_range(addr: int, size: int) -> None:
    _check(libc.mlock(addr, size), f"mlock of {size} bytes")


def munlock_range(addr: int, size: int) -> None:
    _check(libc.munlock(addr, size), f"munlock of {size} bytes")


# -- userfaultfd: a region whose faults are never served --------------------------------------------
# Used to make the watchdog's stall path testable for real: touching or locking such a region
# blocks the thread in handle_userfault() until the process is killed.
_SYS_USERFAULTFD = 323          # x86_64
_UFFDIO_API = 0xC018AA3F        # _IOWR(0xAA, 0x3F, struct uffdio_api)
_UFFDIO_REGISTER = 0xC020AA00   # _IOWR(0xAA, 0x00, struct uffdio_register)
_UFFD_API = 0xAA
_UFFDIO_REGISTER_MODE_MISSING = 1


class _UffdioApi(ctypes.Structure):
    _fields_ = [("api", ctypes.c_uint64), ("features", ctypes.c_uint64), ("ioctls", ctypes.c_uint64)]


class _UffdioRegister(ctypes.Structure):
    _fields_ = [("start", ctypes.c_uint64), ("len", ctypes.c_uint64), ("mode", ctypes.c_uint64),
                ("ioctls", ctypes.c_uint64)]


def make_uffd_region(size: int) -> Region:
    region = map_region(size, "anon", "private", writable=True, thp=False)
    fd = libc.syscall(_SYS_USERFAULTFD, os.O_CLOEXEC | os.O_NONBLOCK)
    if fd < 0:
        err = ctypes.get_errno()
        region.close()
        raise LibcError(err, f"userfaultfd: {os.strerror(err)} (needs root or vm.unprivileged_userfaultfd=1)")
    import fcntl
    api = _UffdioApi(_UFFD_API, 0, 0)
    fcntl.ioctl(fd, _UFFDIO_API, api)
    reg = _UffdioRegister(region.addr, size, _UFFDIO_REGISTER_MODE_MISSING, 0)
    fcntl.ioctl(fd, _UFFDIO_REGISTER, reg)
    region.uffd = fd
    region.source = "uffd"
    return region

"""A temporary swap file for a reproduction (`--make-swap SIZE`), removed afterwards.

The header is written here (linux/swap.h, union swap_header, version 1) and swapon/swapoff
are libc calls, so no util-linux binary is needed on the node. The file is named with the
owner's pid (diag.leftovers.swap_file_name), so a run that is SIGKILLed leaves one that
`hostpin repro cleanup` can tell from a running run's; a file that fails to become swap is
removed at once.

Another user must never get root's swap: a directory that anyone but root can rename files in
is refused (diag.leftovers.dir_problem), the file stays open from creation to removal, and
swapon and swapoff are given that descriptor (/proc/self/fd/N), never the name, so what is
activated is the file made here; it is unlinked only while its name still leads to it. The
path is recorded first (diag.leftovers.SWAP_RECORDS), so a kill -9 in a custom --swap-dir
leaves a file that cleanup finds.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import uuid
from pathlib import Path

from diag.leftovers import DEFAULT_SWAP_DIR, SWAP_LABEL, SWAP_RECORDS, dir_problem
from diag.leftovers import SWAP_PREFIX as PREFIX, swap_file_name
from diag.pagesize import live_page_size

__all__ = ["SwapFile", "SwapError", "write_swap_header", "active_swaps", "swap_dir_problem", "PREFIX", "MIN_PAGES"]

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
    header[1052:1068] = SWAP_LABEL.ljust(16, b"\0")
    header[PAGE - 10:PAGE] = b"SWAPSPACE2"
    os.pwrite(fd, bytes(header), 0)


def active_swaps() -> list[str]:
    lines = Path("/proc/swaps").read_text().splitlines()[1:]
    return [line.split()[0] for line in lines if line.split()]


def swap_dir_problem(directory: str) -> str | None:
    """Why --swap-dir DIRECTORY is refused, with what to do instead, or None."""
    why = dir_problem(directory)
    return None if why is None else (f"{why}; give a --swap-dir that only root can write to (owned by root, "
                                     "not writable by others, or sticky like /var/tmp)")


class SwapFile:
    def __init__(self, directory: Path | str, size: int, priority: int = 32000, records: str = SWAP_RECORDS):
        self.path = Path(directory) / swap_file_name(os.getpid(), uuid.uuid4().hex[:8])
        self.size = size // PAGE * PAGE
        self.priority = priority
        self.active = False
        self.records = records
        self._fd: int | None = None
        self._record: str | None = None

    @property
    def _by_fd(self) -> bytes:
        return f"/proc/self/fd/{self._fd}".encode()

    def _still_named(self) -> bool:
        """The name still leads to the file made here (not renamed away, no link put in its place)."""
        try:
            a, b = os.lstat(self.path), os.fstat(self._fd)
        except (OSError, TypeError):
            return False
        return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)

    def _current_path(self) -> str | None:
        """Where the file made here is now, whatever its name became (the kernel's name for the open
        descriptor, checked against it by device and inode), or None when it has no name left."""
        try:
            where = os.readlink(f"/proc/self/fd/{self._fd}")
            a, b = os.lstat(where), os.fstat(self._fd)
        except (OSError, TypeError):
            return None
        return where if (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino) else None

    def _unlink_ours(self) -> str | None:
        """Unlink the file made here under whatever name it has now; the problem, if any."""
        where = str(self.path) if self._still_named() else self._current_path()
        if where is None:
            return None  # already unlinked
        try:
            os.unlink(where)
        except FileNotFoundError:
            return None
        except OSError as exc:
            return f"cannot remove {where}: {exc.strerror}"
        return None if where == str(self.path) else f"{self.path} had been renamed to {where}; removed there"

    def _write_record(self) -> None:
        try:
            os.makedirs(self.records, mode=0o700, exist_ok=True)
            if dir_problem(self.records) is not None:
                raise OSError(0, dir_problem(self.records))
            rec = os.path.join(self.records, self.path.name)
            fd = os.open(rec, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                os.write(fd, f"{self.path}\n".encode())
            finally:
                os.close(fd)
            self._record = rec
        except OSError as exc:
            if str(self.path.parent) != DEFAULT_SWAP_DIR:  # only /var/tmp is searched without a record
                raise SwapError(f"cannot record the swap file in {self.records}: {exc.strerror}; a killed run "
                                "would leave a file no cleanup finds (use the default --swap-dir /var/tmp)") from None

    def _forget(self) -> None:
        if self._record:
            try:
                os.unlink(self._record)
            except OSError:
                pass
            self._record = None

    def _discard(self) -> None:
        """Close and remove a file that did not become (or is no longer) swap."""
        if self._fd is not None:
            self._unlink_ours()
            os.close(self._fd)
            self._fd = None
        self._forget()

    def create(self) -> "SwapFile":
        if self.size // PAGE < MIN_PAGES:
            raise SwapError(f"a swap file needs at least {MIN_PAGES} pages ({MIN_PAGES * PAGE // 1024} KiB); "
                            "give a larger --make-swap")
        why = swap_dir_problem(str(self.path.parent))
        if why:
            raise SwapError(f"cannot put a swap file in {self.path.parent}: {why}")
        try:
            fs = os.statvfs(self.path.parent)
        except OSError as exc:
            raise SwapError(f"cannot use {self.path.parent} for a swap file: {exc.strerror}; choose another "
                            "--swap-dir") from None
        free = fs.f_bavail * fs.f_frsize
        if free < self.size + (1 << 30):
            raise SwapError(f"{self.path.parent} has {free >> 20} MiB free; a {self.size >> 20} MiB swap file "
                            "needs that plus 1 GiB; choose another --swap-dir")
        self._write_record()
        try:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            self._forget()
            raise SwapError(f"cannot create {self.path}: {exc.strerror}; choose another --swap-dir") from None
        try:
            try:
                os.posix_fallocate(self._fd, 0, self.size)
            except OSError as exc:
                raise SwapError(f"cannot allocate {self.path}: {exc.strerror}") from None
            write_swap_header(self._fd, self.size)
            os.fsync(self._fd)
            flags = SWAP_FLAG_PREFER | (self.priority & SWAP_FLAG_PRIO_MASK)
            if _libc.swapon(self._by_fd, flags) != 0:
                err = ctypes.get_errno()
                raise SwapError(f"swapon {self.path}: {os.strerror(err)} (needs root, and a file system that "
                                "supports swap files: ext4, xfs; not tmpfs or overlayfs)")
            self.active = True
            if not self._still_named():  # cannot happen in a directory only root writes to
                problems = self.remove()
                raise SwapError(f"{self.path} was replaced while it was made; the swap file was switched off "
                                "again" + (": " + "; ".join(problems) if problems else ""))
        except BaseException:
            if self.active:
                self.remove()
            self._discard()  # never leave a file that did not become swap
            raise
        return self

    def remove(self) -> list[str]:
        problems = []
        if self.active:
            if _libc.swapoff(self._by_fd) != 0:
                err = ctypes.get_errno()
                problems.append(f"swapoff {self.path}: {os.strerror(err)}")
            else:
                self.active = False
        if not self.active and self._fd is not None:
            moved = self._unlink_ours()
            if moved and moved.startswith("cannot"):
                problems.append(moved)
            os.close(self._fd)
            self._fd = None
            if not problems:
                self._forget()
        return problems

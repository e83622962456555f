"""Reading and writing inside one directory without ever following a link.

Run directories, captured trees and unpacked bundles come from other people. Everything here
works relative to a base directory opened once: each path is normalised and must stay inside,
each component is opened relative to its parent's descriptor with O_NOFOLLOW, so neither the
file nor any directory on the way can be a symbolic link; only regular files are read, every
read is bounded, and files are created with O_EXCL (or written to a new temporary name and
renamed, which replaces a link rather than following it).

>>> normalize("root/proc/./meminfo")
'root/proc/meminfo'
>>> normalize("result.jsonX/../../../../etc/shadow")
Traceback (most recent call last):
...
diag.confined.PathRefused: 'result.jsonX/../../../../etc/shadow' leads outside the directory
"""
from __future__ import annotations

import errno
import hashlib
import os
import posixpath
import stat
import uuid
from dataclasses import dataclass
from pathlib import Path

__all__ = ["output_fd", "write_output", "PathRefused", "TooLarge", "Limits", "DEFAULT_LIMITS", "normalize", "Dir", "open_dir",
           "write_file_at", "read_json_object", "parse_json", "replace_output"]

_NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC
_DEV_NULL = os.makedev(1, 3)
_TTY_MAJORS = {4, 5} | set(range(136, 144))  # virtual and serial consoles, /dev/tty, pseudo-terminals
_DIRFLAGS = os.O_RDONLY | os.O_DIRECTORY | _NOFOLLOW
MAX_DEPTH = 256  # directories below a run or tree: /proc and /sys captures are a few dozen deep


class PathRefused(ValueError):
    """A path that leaves the directory, goes through a link, or names something not a regular file."""


class TooLarge(PathRefused):
    """More bytes or files than the limits allow."""


@dataclass(frozen=True)
class Limits:
    """How much one run or bundle may make hostpin read: bytes per file, bytes in all, files."""
    total_bytes: int = 1 << 30
    files: int = 20_000
    file_bytes: int = 256 << 20

    @classmethod
    def for_total(cls, total_bytes: int | None = None, files: int | None = None) -> "Limits":
        """--max-size raises the per-file cap with it (a quarter of the total, at least 256 MiB)."""
        total = total_bytes or cls.total_bytes
        return cls(total_bytes=total, files=files or cls.files, file_bytes=min(total, max(256 << 20, total // 4)))


    @property
    def json_bytes(self) -> int:
        """The most a JSON file (a manifest, a result, a journal) may be before it is parsed: a
        real manifest is about 1 MiB for thousands of entries; 32 MiB at the default --max-files,
        more with it. Parsing is what costs memory (50 bytes and up per value), not reading."""
        return max(32 << 20, self.files * 1600)


DEFAULT_LIMITS = Limits()


def parse_json(data: bytes, what: str, limit: int) -> object:
    """json.loads within bounds: TooLarge past `limit` bytes or past one container ([ or {) per
    16 bytes (a crafted `[[],[],...]` costs ~64 bytes of memory per 3 bytes of input);
    ValueError for text that is not JSON, too deep included."""
    import json
    if len(data) > limit:
        raise TooLarge(f"{what} is {len(data):,} bytes, more than a run ever writes ({limit:,}; --max-files "
                       "raises the limit)")
    if len(data) > 1 << 20 and data.count(b"[") + data.count(b"{") > len(data) // 16:
        raise TooLarge(f"{what} holds more nested lists and objects than a run ever writes; not parsed")
    try:
        return json.loads(data)
    except RecursionError:
        raise ValueError(f"{what} is nested too deep") from None


def normalize(rel: object) -> str:
    """A relative path that stays inside its directory, in normal form; PathRefused otherwise."""
    if not isinstance(rel, str) or not rel or "\x00" in rel:
        raise PathRefused(f"{rel!r} is not a path")
    if rel.startswith("/"):
        raise PathRefused(f"{rel!r} is absolute; only paths inside the directory are read")
    norm = posixpath.normpath(rel)
    if norm == ".." or norm.startswith("../"):
        raise PathRefused(f"{rel!r} leads outside the directory")
    if norm == ".":
        raise PathRefused(f"{rel!r} names the directory itself, not a file in it")
    return norm


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a directory"),
                       (stat.S_ISFIFO, "a named pipe"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a regular file"


class Dir:
    """A directory opened once; every path below it is reached without following a link."""

    def __init__(self, path: Path | str, fd: int, limits: Limits = DEFAULT_LIMITS):
        self.path = Path(path)
        self.fd = fd
        self.limits = limits
        self.bytes_read = 0

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> "Dir":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- walking --------------------------------------------------------------------------------
    def _refuse_link(self, parent: int, name: str, shown: str) -> PathRefused:
        try:
            st = os.stat(name, dir_fd=parent, follow_symlinks=False)
        except OSError:
            return PathRefused(f"{shown}: cannot be opened without following a link")
        if stat.S_ISLNK(st.st_mode):
            try:
                target = os.readlink(name, dir_fd=parent)
            except OSError:
                target = "?"
            return PathRefused(f"{shown} is a symbolic link (to {target!r}): not followed")
        return PathRefused(f"{shown} is {_kind(st.st_mode)}")

    def _parent(self, rel: str, create: bool = False) -> tuple[int, str]:
        """(descriptor of rel's directory, rel's last name); the caller closes the descriptor."""
        parts = rel.split("/")
        fd = os.dup(self.fd)
        try:
            for i, part in enumerate(parts[:-1]):
                if create:
                    try:
                        os.mkdir(part, 0o700, dir_fd=fd)
                    except FileExistsError:
                        pass
                try:
                    nxt = os.open(part, _DIRFLAGS, dir_fd=fd)
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                        raise self._refuse_link(fd, part, "/".join(parts[:i + 1])) from None
                    raise
                os.close(fd)
                fd = nxt
            return fd, parts[-1]
        except BaseException:
            os.close(fd)
            raise

    def lstat(self, rel: str) -> os.stat_result | None:
        """The entry itself (a link is not followed), or None when it is absent or unreachable."""
        rel = normalize(rel)
        try:
            parent, name = self._parent(rel)
        except (OSError, PathRefused):
            return None
        try:
            return os.stat(name, dir_fd=parent, follow_symlinks=False)
        except OSError:
            return None
        finally:
            os.close(parent)

    def is_file(self, rel: str) -> bool:
        st = self.lstat(rel)
        return st is not None and stat.S_ISREG(st.st_mode)

    def is_dir(self, rel: str) -> bool:
        st = self.lstat(rel)
        return st is not None and stat.S_ISDIR(st.st_mode)

    def open_file(self, rel: str) -> int:
        """A read descriptor of a regular file at rel (PathRefused for a link or anything else)."""
        rel = normalize(rel)
        parent, name = self._parent(rel)
        try:
            # the type first, from the entry itself (fstatat, no link followed): a device node is
            # never opened, so no driver's open() runs for it
            before = os.stat(name, dir_fd=parent, follow_symlinks=False)
            if not stat.S_ISREG(before.st_mode):
                raise self._refuse_link(parent, name, rel) if stat.S_ISLNK(before.st_mode) else \
                    PathRefused(f"{rel} is {_kind(before.st_mode)}, not a regular file: not read")
            self._refuse_hardlink(before, rel, "read")
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | _NOFOLLOW, dir_fd=parent)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR):
                    raise self._refuse_link(parent, name, rel) from None
                raise
        finally:
            os.close(parent)
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != (before.st_dev, before.st_ino):
            os.close(fd)
            raise PathRefused(f"{rel} is {_kind(st.st_mode)}, not a regular file, or was replaced while "
                              "it was opened: not read")
        try:
            self._refuse_hardlink(st, rel, "read")
        except PathRefused:
            os.close(fd)
            raise
        return fd

    @staticmethod
    def _refuse_hardlink(st: os.stat_result, rel: str, doing: str) -> None:
        """A regular file with more than one name may be a file outside the directory linked in
        (root/proc/meminfo -> /etc/shadow as a hard link, which no O_NOFOLLOW sees): refused.
        hostpin never makes one, and the live /proc is not read through here."""
        if st.st_nlink > 1:
            raise PathRefused(f"{rel} has {st.st_nlink} hard links: it may be a file from outside the "
                              f"directory linked in, so it is not {doing}")

    def _account(self, n: int, rel: str) -> None:
        self.bytes_read += n
        if self.bytes_read > self.limits.total_bytes:
            raise TooLarge(f"reading {rel} passes the limit of {self.limits.total_bytes:,} bytes for one run "
                           "(--max-size raises it)")

    def read_bytes(self, rel: str, limit: int | None = None, tail: bool = False) -> bytes:
        """The file's bytes. limit=None: the whole file, which must be within the per-file cap;
        limit=N: at most N bytes from the start (or the end, with tail=True)."""
        fd = self.open_file(rel)
        try:
            size = os.fstat(fd).st_size
            if limit is None:
                if size > self.limits.file_bytes:
                    raise TooLarge(f"{rel} is {size:,} bytes, over the limit of {self.limits.file_bytes:,} for one "
                                   "file (--max-size raises it)")
                want = self.limits.file_bytes + 1
            else:
                want = min(limit, self.limits.file_bytes)
                if tail and size > want:
                    os.lseek(fd, size - want, os.SEEK_SET)
            chunks, total = [], 0
            while total < want:
                piece = os.read(fd, min(1 << 20, want - total))
                if not piece:
                    break
                chunks.append(piece)
                total += len(piece)
                self._account(len(piece), rel)
            data = b"".join(chunks)
            if limit is None and len(data) > self.limits.file_bytes:
                raise TooLarge(f"{rel} grew past the limit of {self.limits.file_bytes:,} bytes while it was read")
            return data
        finally:
            os.close(fd)

    def read_json(self, rel: str) -> object:
        """A JSON file, its size checked before it is read (TooLarge), ValueError when not JSON."""
        st = self.lstat(rel)
        limit = self.limits.json_bytes
        if st is not None and st.st_size > limit:
            raise TooLarge(f"{rel} is {st.st_size:,} bytes, more than a run ever writes ({limit:,}; --max-files "
                           "raises the limit)")
        return parse_json(self.read_bytes(rel, limit + 1), rel, limit)

    def read_text(self, rel: str, limit: int | None = None, tail: bool = False) -> str:
        return self.read_bytes(rel, limit, tail).decode("utf-8", errors="replace")

    def hash_file(self, rel: str) -> tuple[int, str]:
        """(size, sha256) read in pieces, bounded by the limits."""
        fd = self.open_file(rel)
        try:
            h, size = hashlib.sha256(), 0
            while True:
                piece = os.read(fd, 1 << 20)
                if not piece:
                    break
                size += len(piece)
                if size > self.limits.file_bytes:
                    raise TooLarge(f"{rel} is over the limit of {self.limits.file_bytes:,} bytes for one file "
                                   "(--max-size raises it)")
                self._account(len(piece), rel)
                h.update(piece)
            return size, h.hexdigest()
        finally:
            os.close(fd)

    def listdir(self, rel: str = "") -> list[str]:
        """Names in a directory reached without links ([] when it is not one)."""
        try:
            if rel in ("", "."):
                fd = os.dup(self.fd)
            else:
                rel = normalize(rel)
                parent, name = self._parent(rel)
                try:
                    fd = os.open(name, _DIRFLAGS, dir_fd=parent)
                finally:
                    os.close(parent)
        except (OSError, PathRefused):
            return []
        try:
            return sorted(os.listdir(fd))
        except OSError:
            return []
        finally:
            os.close(fd)

    def readlink(self, rel: str) -> str | None:
        """The target string of a link (never followed), or None."""
        try:
            rel = normalize(rel)
            parent, name = self._parent(rel)
        except (OSError, PathRefused):
            return None
        try:
            return os.readlink(name, dir_fd=parent)
        except OSError:
            return None
        finally:
            os.close(parent)

    def walk(self) -> list[tuple[str, os.stat_result]]:
        """Every entry below the directory (rel path, lstat), links not followed, sorted."""
        # iterative, one directory open at a time (reopened by its path from the top, each step
        # without links), and no deeper than MAX_DEPTH: /proc and /sys trees are a few dozen deep
        out: list[tuple[str, os.stat_result]] = []
        pending = [""]
        while pending:
            prefix = pending.pop()
            if prefix.count("/") > MAX_DEPTH:
                raise TooLarge(f"{prefix.rstrip('/')[:200]}...: directories nested more than {MAX_DEPTH} deep; "
                               "no run is")
            if prefix:
                parent, name = self._parent(prefix.rstrip("/"))
                try:
                    fd = os.open(name, _DIRFLAGS, dir_fd=parent)
                finally:
                    os.close(parent)
            else:
                fd = os.dup(self.fd)
            try:
                subdirs = []
                for name in sorted(os.listdir(fd)):
                    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                    rel = f"{prefix}{name}"
                    out.append((rel, st))
                    if stat.S_ISDIR(st.st_mode):
                        subdirs.append(rel + "/")
                    if len(out) > self.limits.files:
                        raise TooLarge(f"more than {self.limits.files:,} files (--max-files raises the limit)")
                pending.extend(reversed(subdirs))
            finally:
                os.close(fd)
        return sorted(out, key=lambda item: item[0].split("/"))

    # -- writing --------------------------------------------------------------------------------
    def write_new(self, rel: str, data: bytes, mode: int = 0o600, durable: bool = False) -> None:
        """Create rel (and its directories, 0700) with O_EXCL|O_NOFOLLOW: never over anything."""
        rel = normalize(rel)
        parent, name = self._parent(rel, create=True)
        try:
            write_file_at(parent, name, data, mode, durable)
        finally:
            os.close(parent)

    def replace(self, rel: str, data: bytes, mode: int = 0o600, durable: bool = False) -> None:
        """Write a new temporary file next to rel and rename it over rel (a link there is
        replaced, never followed)."""
        rel = normalize(rel)
        parent, name = self._parent(rel, create=True)
        tmp = f".{name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
        try:
            write_file_at(parent, tmp, data, mode, durable)
            try:
                os.rename(tmp, name, src_dir_fd=parent, dst_dir_fd=parent)
            except BaseException:
                os.unlink(tmp, dir_fd=parent)
                raise
            if durable:
                os.fsync(parent)
        finally:
            os.close(parent)

    def open_new(self, rel: str, append: bool = False, mode: int = 0o600) -> int:
        """A write descriptor of a file created now (O_EXCL); append=True opens an existing
        regular file for appending instead (never through a link)."""
        rel = normalize(rel)
        parent, name = self._parent(rel, create=True)
        try:
            # O_NONBLOCK: a named pipe planted there fails at once (ENXIO) instead of hanging
            flags = os.O_WRONLY | _NOFOLLOW | os.O_CREAT | os.O_NONBLOCK | os.O_NOCTTY
            flags |= os.O_APPEND if append else os.O_EXCL
            try:
                fd = os.open(name, flags, mode, dir_fd=parent)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENXIO):
                    raise self._refuse_link(parent, name, rel) from None
                raise
        finally:
            os.close(parent)
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise PathRefused(f"{rel} is not a regular file: not written")
        if append:  # appending to a file with another name writes into that other file
            try:
                self._refuse_hardlink(st, rel, "written")
            except PathRefused:
                os.close(fd)
                raise
        os.set_blocking(fd, True)
        return fd

    def makedirs(self, rel: str) -> None:
        rel = normalize(rel)
        parent, name = self._parent(rel + "/x", create=True)
        os.close(parent)


def open_dir(path: Path | str, limits: Limits = DEFAULT_LIMITS, follow_last: bool = True) -> Dir:
    """Open a directory the user named. follow_last=False refuses it when it is itself a link
    (a directory found inside a run, such as its root/)."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | (0 if follow_last else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR) and os.path.islink(path):
            raise PathRefused(f"{path} is a symbolic link (to {os.readlink(path)!r}): not followed") from None
        raise
    return Dir(path, fd, limits)


def write_file_at(dir_fd: int, name: str, data: bytes, mode: int = 0o600, durable: bool = False) -> None:
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, mode, dir_fd=dir_fd)
    try:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        if durable:
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        try:
            os.unlink(name, dir_fd=dir_fd)
        except OSError:
            pass
        raise
    os.close(fd)


def read_json_object(base: Path | str, rel: str, limits: Limits = DEFAULT_LIMITS) -> dict | None:
    """A JSON object from base/rel read without links, or None (absent, refused, not an object)."""
    try:
        with open_dir(base, limits) as d:
            value = d.read_json(rel)
    except (OSError, ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def output_fd(out: Path | str, check_only: bool = False) -> int | None:
    """Where -o goes when it is not a file to replace: a descriptor to write through for `-`
    (stdout), or for a named pipe, a terminal or /dev/null, also behind a link (/dev/stdout is
    one, to /proc/self/fd/1); None for a file to create or replace. Anything else that is there is
    never replaced nor followed (PathRefused): a link to a file or to nothing, a directory, any
    other device. Opening never creates, truncates or blocks."""
    if str(out) == "-":
        return os.dup(1)
    try:
        st = os.lstat(out)
    except FileNotFoundError:
        return None
    if stat.S_ISREG(st.st_mode):
        return None
    link = stat.S_ISLNK(st.st_mode)
    shown = f"{out} is a symbolic link (to {os.readlink(out)!r})" if link else f"{out} is {_kind(st.st_mode)}"
    if not (link or stat.S_ISFIFO(st.st_mode) or stat.S_ISCHR(st.st_mode)):
        raise PathRefused(f"{shown}, not a regular file; give a file name")
    try:  # what it leads to, judged before anything is opened (opening some devices acts: a tape rewinds)
        target = os.stat(out)
    except OSError as exc:
        raise PathRefused(f"{shown}: {exc.strerror}; not written, nothing replaced") from None
    for std in (1, 2):  # our own stdout or stderr (/dev/stdout, also redirected to a file): write where it writes
        try:
            sst = os.fstat(std)
        except OSError:
            continue
        if (sst.st_dev, sst.st_ino) == (target.st_dev, target.st_ino):
            return os.dup(std)
    if stat.S_ISFIFO(target.st_mode) and target.st_uid != os.geteuid():
        # another user's pipe (one planted in /tmp): its reader could stop reading and hold the write forever
        raise PathRefused(f"{shown}: a named pipe of uid {target.st_uid}, not this user's; never written (give a "
                          "file name)")
    chr_ok = stat.S_ISCHR(target.st_mode) and (target.st_rdev == _DEV_NULL or os.major(target.st_rdev) in _TTY_MAJORS)
    if not (stat.S_ISFIFO(target.st_mode) or chr_ok):
        kind = "a regular file" if stat.S_ISREG(target.st_mode) else _kind(target.st_mode)
        leads = f"it leads to {kind}" if link else "not a terminal, a pipe or /dev/null"
        raise PathRefused(f"{shown}: {leads}; never followed nor replaced (give a file name, or - for stdout)")
    if check_only:  # judged, not opened: a writer that opens and closes a pipe ends its reader (`cat FIFO`)
        return None
    try:
        fd = os.open(out, os.O_WRONLY | os.O_NOCTTY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        why = "a named pipe that nobody reads" if exc.errno == errno.ENXIO else exc.strerror
        raise PathRefused(f"{shown}: {why}; not written, nothing replaced") from None
    fst = os.fstat(fd)
    if (fst.st_dev, fst.st_ino, fst.st_mode) != (target.st_dev, target.st_ino, target.st_mode):
        os.close(fd)
        raise PathRefused(f"{shown}: it changed while it was opened; not written")
    os.set_blocking(fd, True)
    return fd


def write_output(out: Path | str, data: bytes, mode: int = 0o600) -> None:
    """Write what the user asked for with -o: through the descriptor output_fd() gives, or into a
    new temporary file in its directory, fsynced and renamed over it (an existing regular file
    gets `mode`, 0600, rather than keeping its own). PathRefused for what is never written over;
    OSError when it cannot be written."""
    fd = output_fd(out)
    if fd is not None:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        return
    replace_output(out, data, mode)


def replace_output(out: Path | str, data: bytes, mode: int = 0o600) -> None:
    """Write a file the user named (-o): a new temporary file in its directory, fsynced and
    renamed over it; an existing file gets `mode` (0600) rather than keeping its own, and a link,
    named pipe, device or directory there is refused (PathRefused), never replaced nor opened.
    OSError when the directory cannot be written."""
    import tempfile
    out = Path(out)
    try:
        st = os.lstat(out)
    except FileNotFoundError:
        st = None
    if st is not None and stat.S_ISLNK(st.st_mode):  # never replaced: the run did not make it
        raise PathRefused(f"{out} is a symbolic link (to {os.readlink(out)!r}): never followed nor replaced; "
                          "give the file itself, or remove the link")
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise PathRefused(f"{out} is {_kind(st.st_mode)}, not a regular file; give a file name")
    parent = out.parent if str(out.parent) else Path(".")
    # the name cut so that the temporary one stays within NAME_MAX (255) for a name of up to 255
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name[:200]}.", suffix=".tmp", dir=parent)
    try:
        os.fchmod(fd, mode)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
        os.close(fd)
        fd = -1
        os.replace(tmp, out)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise

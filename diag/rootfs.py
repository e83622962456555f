"""Reading /proc and /sys under a root directory, keeping a copy of every file read.

`Root("/")` is the live machine; `Root("tests/fixtures/h200")` or a run directory's `root/`
is a captured tree, read exactly the same way. When a RunDir is attached, every file read
is copied into the run under `root/<same path>` with a manifest entry, and every file
that could not be read gets a skip entry with the reason.

The live root is the kernel's own /proc and /sys, whose links (/sys/bus/pci/devices/*) are
followed as the kernel made them. Any other root is someone else's tree and never follows a
link: it is opened once (refused when it is itself a link) and every file is reached through
diag.confined, so a link in it, or a linked directory on the way, is recorded as a link with
its target string (kind 'link', skipped, 'not followed') instead of being read.
"""
from __future__ import annotations

import errno
import fnmatch
import glob as _glob
import os
import stat
import time
from pathlib import Path

from .confined import Limits, PathRefused, open_dir
from .evidence import MAX_FILE_BYTES, ManifestError, RunDir, load_manifest

__all__ = ["Root", "resolve_root", "read_bounded"]


def resolve_root(path: Path | str) -> Path:
    """A run directory (with root/ inside) reads as its captured tree; any other dir as itself."""
    path = Path(path)
    if os.path.lexists(path / "manifest.json") or os.path.lexists(path / "manifest.jsonl"):
        if os.path.lexists(path / "root"):  # a link there is refused when the Root opens it
            return path / "root"
    return path


class Root:
    def __init__(self, path: Path | str = "/", run: RunDir | None = None):
        self.path = Path(path)
        self.run = run
        self.live = os.path.normpath(os.path.abspath(self.path)) == "/"
        self.missing: dict[str, str] = {}  # rel path -> reason
        self._cache: dict[str, str | None] = {}
        self._dir = None
        self._dir_error: str | None = None
        if not self.live:
            try:
                self._dir = open_dir(self.path, Limits(total_bytes=1 << 62, file_bytes=MAX_FILE_BYTES + 1),
                                     follow_last=False)
            except PathRefused as exc:
                self._dir_error = str(exc)
            except OSError as exc:
                self._dir_error = _reason(exc)
        self._captured_dirs, self._captured_absent = _captured_listing(self.path)

    def __del__(self) -> None:
        if getattr(self, "_dir", None) is not None:
            self._dir.close()

    def __repr__(self) -> str:
        return f"Root({str(self.path)!r})"

    def _abs(self, rel: str) -> Path:
        return self.path / rel.lstrip("/")

    def beside(self, rel: str, limit: int = 1 << 20) -> bytes | None:
        """A file the run directory holding this tree kept next to it (commands/..., probes/...), at
        most `limit` bytes; None when the tree is no run's root/ (a bare tree's parent is not the
        tree's: nothing there is read), or the file is missing, a link, hard-linked or not regular."""
        if self.live or self.path.name != "root":
            return None
        run = self.path.parent
        try:
            if not any(stat.S_ISREG(os.lstat(run / m).st_mode) for m in ("manifest.json", "manifest.jsonl")
                       if os.path.lexists(run / m)):
                return None
            with open_dir(run, Limits(total_bytes=limit, files=1, file_bytes=limit)) as d:
                return d.read_bytes(rel, limit=limit)
        except (OSError, PathRefused):
            return None

    def display(self, rel: str) -> str:
        """How a path is named to a person: /proc/meminfo on the live machine, DIR/proc/... otherwise."""
        return "/" + rel.lstrip("/") if self.live else str(self._abs(rel))

    def read_text(self, rel: str, record: bool = True) -> str | None:
        """The file's text, or None (reason in self.missing). Cached per Root."""
        rel = rel.lstrip("/")
        if rel in self._cache:
            return self._cache[rel]
        started = time.time()
        t0 = time.monotonic()
        try:
            data = self._read(rel, MAX_FILE_BYTES + 1)
        except (OSError, PathRefused) as exc:
            reason = str(exc) if isinstance(exc, PathRefused) else _reason(exc)
            self.missing[rel] = reason
            self._cache[rel] = None
            if record and self.run is not None:
                target = self.readlink(rel) if not self.live else None
                if target is not None:  # recorded as the link it is, never followed
                    self.run.add_skip(f"root/{rel}", reason, kind="link", target=target, source=self.display(rel))
                else:
                    self.run.add_skip(f"root/{rel}", reason, source=self.display(rel))
            return None
        truncated = len(data) > MAX_FILE_BYTES
        data = data[:MAX_FILE_BYTES]
        text = data.decode("utf-8", errors="replace")
        self._cache[rel] = text
        if record and self.run is not None:
            from datetime import datetime, timezone
            self.run.add_file(f"root/{rel}", data, source=self.display(rel),
                              started=datetime.fromtimestamp(started, timezone.utc).isoformat(timespec="milliseconds"),
                              duration_s=time.monotonic() - t0, truncated=truncated)
        return text

    def _read(self, rel: str, limit: int) -> bytes:
        if self.live:
            return read_bounded(self._abs(rel), limit)
        if self._dir is None:
            raise PathRefused(self._dir_error or "unreadable")
        return self._dir.read_bytes(rel, limit)

    def read_fresh(self, rel: str) -> str | None:
        """Read again, bypassing the cache and the evidence copy (for sampling)."""
        try:
            return self._read(rel.lstrip("/"), MAX_FILE_BYTES).decode("utf-8", errors="replace")
        except (OSError, PathRefused):
            return None

    def _lstat(self, rel: str) -> os.stat_result | None:
        rel = rel.strip("/")
        if self.live:
            try:
                return os.lstat(self._abs(rel))
            except OSError:
                return None
        if self._dir is None or not rel:
            return None
        try:
            return self._dir.lstat(rel)
        except PathRefused:
            return None

    def exists(self, rel: str) -> bool:
        return self._lstat(rel) is not None or rel.strip("/") in self._captured_dirs

    def known_absent(self, rel: str) -> bool:
        """True when the file is known not to exist on the node: live and absent, or a capture
        whose manifest says it was absent."""
        rel = rel.strip("/")
        if self.live:
            return not os.path.lexists(self._abs(rel))
        return rel in self._captured_absent

    def listdir(self, rel: str) -> list[str]:
        if not self.live:
            return self._dir.listdir(rel.strip("/")) if self._dir is not None else []
        try:
            return sorted(os.listdir(self._abs(rel)))
        except OSError:
            return []

    def readlink(self, rel: str) -> str | None:
        """A link's target string (never followed)."""
        if not self.live:
            return self._dir.readlink(rel.strip("/")) if self._dir is not None else None
        try:
            return os.readlink(self._abs(rel))
        except OSError:
            return None

    def glob(self, pattern: str) -> list[str]:
        """Relative paths of files (and, in a captured tree, links) matching pattern. Live: the
        kernel's tree as glob sees it; captured: walked without entering a linked directory."""
        if self.live:
            out = []
            for path in sorted(_glob.glob(str(self.path / pattern))):
                if os.path.isfile(path) and not os.path.islink(path):
                    out.append(os.path.relpath(path, self.path))
            return out
        found = [""]
        parts = pattern.strip("/").split("/")
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            nxt = []
            for base in found:
                for name in self.listdir(base):
                    if not fnmatch.fnmatchcase(name, part):
                        continue
                    rel = f"{base}/{name}" if base else name
                    st = self._lstat(rel)
                    if st is None:
                        continue
                    if last and (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
                        nxt.append(rel)
                    elif not last and stat.S_ISDIR(st.st_mode):
                        nxt.append(rel)
            found = nxt
        return sorted(found)


def _captured_listing(path: Path) -> tuple[set[str], set[str]]:
    """From a run's manifest: directories the capture saw empty (git and tar may drop them), and
    files it found absent on the node (which a reader can then tell from 'not captured')."""
    if path.name != "root" or not os.path.lexists(path.parent / "manifest.json"):
        return set(), set()
    try:
        entries = load_manifest(path.parent)["entries"]
    except ManifestError:  # a damaged manifest says nothing; `hostpin report` names the damage
        return set(), set()
    dirs, absent = set(), set()
    for e in entries:
        rel = e.get("path", "")
        if not rel.startswith("root/"):
            continue
        if e.get("kind") == "dir":
            dirs.add(rel[len("root/"):].strip("/"))
        elif e.get("skipped") and e.get("reason") == "absent":
            absent.add(rel[len("root/"):].strip("/"))
    return dirs, absent


def read_bounded(path: Path | str, limit: int) -> bytes:
    """Read up to limit bytes in 64 KiB pieces: a sysctl file asked for megabytes at once
    fails with ENOMEM (proc_sys_call_handler kmallocs the whole count)."""
    chunks, total = [], 0
    with open(path, "rb", buffering=0) as fh:
        while total < limit:
            piece = fh.read(min(1 << 16, limit - total))
            if not piece:
                break
            chunks.append(piece)
            total += len(piece)
    return b"".join(chunks)


def _reason(exc: OSError) -> str:
    if exc.errno == errno.ENOENT:
        return "absent"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return "permission denied (needs root)"
    return f"unreadable: {exc.strerror}"

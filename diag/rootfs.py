"""Reading /proc and /sys under a root directory, keeping a copy of every file read.

`Root("/")` is the live machine; `Root("tests/fixtures/h200")` or a run directory's `root/`
is a captured tree, read exactly the same way. When a RunDir is attached, every file read
is copied into the run under `root/<same path>` with a manifest entry, and every file
that could not be read gets a skip entry with the reason.
"""
from __future__ import annotations

import errno
import os
import time
from pathlib import Path

from .evidence import MAX_FILE_BYTES, RunDir

__all__ = ["Root", "resolve_root", "read_bounded"]


def resolve_root(path: Path | str) -> Path:
    """A run directory (with root/ inside) reads as its captured tree; any other dir as itself."""
    path = Path(path)
    if (path / "manifest.json").exists() or (path / "manifest.jsonl").exists():
        if (path / "root").is_dir():
            return path / "root"
    return path


class Root:
    def __init__(self, path: Path | str = "/", run: RunDir | None = None):
        self.path = Path(path)
        self.run = run
        self.live = self.path.resolve() == Path("/")
        self.missing: dict[str, str] = {}  # rel path -> reason
        self._cache: dict[str, str | None] = {}
        self._captured_dirs, self._captured_absent = _captured_listing(self.path)

    def __repr__(self) -> str:
        return f"Root({str(self.path)!r})"

    def _abs(self, rel: str) -> Path:
        return self.path / rel.lstrip("/")

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
            data = read_bounded(self._abs(rel), MAX_FILE_BYTES + 1)
        except OSError as exc:
            reason = _reason(exc)
            self.missing[rel] = reason
            self._cache[rel] = None
            if record and self.run is not None:
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

    def read_fresh(self, rel: str) -> str | None:
        """Read again, bypassing the cache and the evidence copy (for sampling)."""
        try:
            return read_bounded(self._abs(rel.lstrip("/")), MAX_FILE_BYTES).decode("utf-8", errors="replace")
        except OSError:
            return None

    def exists(self, rel: str) -> bool:
        return os.path.lexists(self._abs(rel)) or rel.strip("/") in self._captured_dirs

    def known_absent(self, rel: str) -> bool:
        """True when the file is known not to exist on the node: live and absent, or a capture
        whose manifest says it was absent."""
        rel = rel.strip("/")
        if self.live:
            return not os.path.lexists(self._abs(rel))
        return rel in self._captured_absent

    def listdir(self, rel: str) -> list[str]:
        try:
            return sorted(os.listdir(self._abs(rel)))
        except OSError:
            return []

    def readlink(self, rel: str) -> str | None:
        try:
            return os.readlink(self._abs(rel))
        except OSError:
            return None


def _captured_listing(path: Path) -> tuple[set[str], set[str]]:
    """From a run's manifest: directories the capture saw empty (git and tar may drop them), and
    files it found absent on the node (which a reader can then tell from 'not captured')."""
    manifest = path.parent / "manifest.json"
    if path.name != "root" or not manifest.is_file():
        return set(), set()
    import json
    try:
        entries = json.loads(manifest.read_text()).get("entries", [])
    except (OSError, ValueError):
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

"""The evidence store: one run directory per command, with a manifest of everything in it.

Layout of a run directory::

    manifest.jsonl   journal, one JSON line per item, appended and flushed as it happens
    manifest.json    the whole manifest, written atomically when the run finishes
    root/...         raw files read, in the same layout as / (root/proc/meminfo, root/sys/...)
    commands/...     output of commands run (stdout, stderr) with return code and duration
    probes/...       output of probes (the CUDA probe's JSON)
    result.json      the command's result

Every item gets a manifest entry whatever happened to it: path, size, sha256, started,
duration, return code, timed out, truncated, or a skip with its reason. A run that is
killed keeps its journal and every file written up to that moment.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import socket
import subprocess
import time
from pathlib import Path
from typing import Any, Iterable

__all__ = ["RunDir", "new_run_dir", "MAX_FILE_BYTES", "load_manifest", "verify_manifest", "register_file"]

MAX_FILE_BYTES = 8 << 20  # a /proc or /sys file larger than this is cut and marked truncated


def _now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")


def _entry(path: str, kind: str, data: bytes | None = None, **fields: Any) -> dict[str, Any]:
    """A manifest entry with every field present; data (when given) sets size and sha256."""
    entry = {"path": path, "kind": kind, "source": None, "size": 0, "sha256": None, "started": _now_iso(),
             "duration_s": 0.0, "returncode": None, "timed_out": False, "truncated": False, "skipped": False,
             "reason": None}
    if data is not None:
        entry.update(size=len(data), sha256=hashlib.sha256(data).hexdigest())
    entry.update(fields)
    return entry


def _write_manifest(run_dir: Path, manifest: dict[str, Any]) -> Path:
    """manifest.json written next to itself, fsynced and renamed over the old one."""
    tmp = run_dir / "manifest.json.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(manifest, fh, indent=1, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, run_dir / "manifest.json")
    return run_dir / "manifest.json"


def new_run_dir(base: Path | str | None, command: str) -> Path:
    """A fresh directory under base (default ./hostpin-runs) named by time, command and host."""
    base = Path(base) if base else Path("hostpin-runs")
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    host = socket.gethostname().split(".")[0] or "host"
    name = f"{stamp}-{command}-{host}"
    path = base / name
    n = 1
    while path.exists():
        n += 1
        path = base / f"{name}.{n}"
    return path


class RunDir:
    """A run directory being written. Not thread-safe; one writer per run."""

    def __init__(self, path: Path | str, command: str, argv: Iterable[str] = (), durable: bool = False):
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=False)
        self.command = command
        self.argv = list(argv)
        self.durable = durable  # fsync every journal line (the watchdog wants this)
        self.started = _now_iso()
        self.entries: list[dict[str, Any]] = []
        self._journal = open(self.path / "manifest.jsonl", "a", encoding="utf-8")
        self._finished = False

    # -- journal ---------------------------------------------------------------
    def _record(self, entry: dict[str, Any]) -> dict[str, Any]:
        self.entries.append(entry)
        self._journal.write(json.dumps(entry, sort_keys=True) + "\n")
        self._journal.flush()
        if self.durable:
            os.fsync(self._journal.fileno())
        return entry

    def _write(self, rel: str, data: bytes) -> Path:
        target = self.path / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target, "wb") as fh:
            fh.write(data)
            fh.flush()
            if self.durable:
                os.fsync(fh.fileno())
        return target

    # -- items -----------------------------------------------------------------
    def add_file(self, rel: str, data: bytes, *, kind: str = "file", source: str | None = None,
                 started: str | None = None, duration_s: float = 0.0, truncated: bool = False,
                 **extra: Any) -> dict[str, Any]:
        self._write(rel, data)
        return self._record(_entry(rel, kind, data, source=source, started=started or _now_iso(),
                                   duration_s=round(duration_s, 6), truncated=truncated, **extra))

    def add_skip(self, rel: str, reason: str, *, kind: str = "file", source: str | None = None,
                 **extra: Any) -> dict[str, Any]:
        return self._record(_entry(rel, kind, source=source, skipped=True, reason=reason, **extra))

    def adopt(self, rel: str, kind: str = "file", **extra: Any) -> dict[str, Any]:
        """A file something else wrote into the run (a child's log): give it its manifest entry."""
        path = self.path / rel
        if not path.is_file():
            return self.add_skip(rel, "never written", kind=kind, **extra)
        return self._record(_entry(rel, kind, path.read_bytes(), **extra))

    def add_dir(self, rel: str, **extra: Any) -> dict[str, Any]:
        """An empty directory that exists on the node (its absence would mean something else)."""
        (self.path / rel).mkdir(parents=True, exist_ok=True)
        return self._record(_entry(rel, "dir", **extra))

    def add_json(self, rel: str, obj: Any, *, kind: str = "result", **extra: Any) -> dict[str, Any]:
        data = (json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n").encode()
        return self.add_file(rel, data, kind=kind, **extra)

    def run_command(self, name: str, argv: list[str], timeout: float = 10.0,
                    max_bytes: int = MAX_FILE_BYTES) -> dict[str, Any]:
        """Run a command under its own timeout; keep stdout and stderr whatever happens."""
        rel = f"commands/{name}.txt"
        started = _now_iso()
        t0 = time.monotonic()
        try:
            proc = subprocess.run(argv, capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)
            out, err, rc, timed_out = proc.stdout, proc.stderr, proc.returncode, False
        except FileNotFoundError:
            return self.add_skip(rel, f"{argv[0]} not found on this machine", kind="command",
                                 source=" ".join(argv))
        except PermissionError as exc:
            return self.add_skip(rel, f"cannot run {argv[0]}: {exc}", kind="command", source=" ".join(argv))
        except subprocess.TimeoutExpired as exc:
            out, err, rc, timed_out = exc.stdout or b"", exc.stderr or b"", None, True
        duration = time.monotonic() - t0
        entry = self.add_file(rel, out[:max_bytes], kind="command", source=" ".join(argv), started=started,
                              duration_s=duration, truncated=len(out) > max_bytes,
                              returncode=rc, timed_out=timed_out)
        if err:
            self.add_file(f"commands/{name}.stderr.txt", err[:max_bytes], kind="command-stderr",
                          source=" ".join(argv), started=started, duration_s=duration)
        return entry

    def open_stream(self, rel: str) -> "Stream":
        """An append-only file flushed (and fsynced when durable) on every write."""
        return Stream(self, rel)

    # -- end -------------------------------------------------------------------
    def finish(self, result: Any = None) -> Path:
        if self._finished:
            return self.path / "manifest.json"
        if result is not None:
            self.add_json("result.json", result)
        manifest = {
            "tool": "hostpin", "command": self.command, "argv": self.argv,
            "host": socket.gethostname(), "started": self.started, "finished": _now_iso(),
            "complete": True,
            "entries": self.entries,
        }
        _write_manifest(self.path, manifest)
        self._journal.close()
        self._finished = True
        return self.path / "manifest.json"


class Stream:
    """A growing evidence file (a timeline); its manifest entry is written when it closes."""

    def __init__(self, run: RunDir, rel: str):
        self.run, self.rel = run, rel
        target = run.path / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(target, "ab")
        self._hash = hashlib.sha256()
        self._size = 0
        self._started = _now_iso()
        self._t0 = time.monotonic()
        self.closed = False

    def write(self, data: bytes | str) -> None:
        if isinstance(data, str):
            data = data.encode()
        self._fh.write(data)
        self._fh.flush()
        if self.run.durable:
            os.fsync(self._fh.fileno())
        self._hash.update(data)
        self._size += len(data)

    def close(self, kind: str = "stream", **extra: Any) -> None:
        if self.closed:
            return
        self._fh.close()
        self.closed = True
        self.run._record(_entry(self.rel, kind, size=self._size, sha256=self._hash.hexdigest(), started=self._started,
                                duration_s=round(time.monotonic() - self._t0, 6), **extra))


def load_manifest(run_dir: Path | str) -> dict[str, Any]:
    """manifest.json, or the journal of a run that did not finish (complete: false)."""
    run_dir = Path(run_dir)
    full = run_dir / "manifest.json"
    if full.exists():
        return json.loads(full.read_text())
    entries = []
    journal = run_dir / "manifest.jsonl"
    if journal.exists():
        for line in journal.read_text().splitlines():
            try:
                entries.append(json.loads(line))
            except json.JSONDecodeError:  # the last line of a killed run may be cut
                break
    return {"complete": False, "entries": entries}


def verify_manifest(run_dir: Path | str) -> list[str]:
    """Problems found: files whose size or sha256 differ from the manifest, or that are missing."""
    run_dir = Path(run_dir)
    problems = []
    latest: dict[str, dict] = {}
    for entry in load_manifest(run_dir)["entries"]:
        latest[entry["path"]] = entry  # a path written twice: the last write is what is on disk
    for entry in latest.values():
        if entry.get("skipped") or entry.get("kind") == "dir":
            continue
        path = run_dir / entry["path"]
        if not path.is_file():
            problems.append(f"{entry['path']}: missing")
            continue
        data = path.read_bytes()
        if len(data) != entry["size"] or hashlib.sha256(data).hexdigest() != entry["sha256"]:
            problems.append(f"{entry['path']}: content differs from the manifest")
    return problems


def register_file(run_dir: Path | str, rel: str, kind: str) -> dict[str, Any]:
    """Add a file written into a finished run (a report, its picture) to the run's manifest,
    replacing an older entry for the same path, so that the manifest still covers everything."""
    run_dir = Path(run_dir)
    entry = _entry(rel, kind, (run_dir / rel).read_bytes(), added_after_run=True)
    manifest = load_manifest(run_dir)
    manifest["entries"] = [e for e in manifest["entries"] if e.get("path") != rel] + [entry]
    _write_manifest(run_dir, manifest)
    with open(run_dir / "manifest.jsonl", "a", encoding="utf-8") as fh:
        fh.write(json.dumps(entry, sort_keys=True) + "\n")
    return entry

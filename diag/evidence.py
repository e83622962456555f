"""The evidence store: one run directory per command, with a manifest of everything in it.

Layout of a run directory::

    manifest.jsonl   journal: a first line naming the run, then one JSON line per item,
                     appended and flushed as it happens
    manifest.json    the whole manifest, written atomically when the run finishes
    manifest.added.jsonl  files added to the finished run later (a report, its picture)
    root/...         raw files read, in the same layout as / (root/proc/meminfo, root/sys/...)
    commands/...     output of commands run (stdout, stderr) with return code and duration
    probes/...       output of probes (the CUDA probe's JSON)
    result.json      the command's result

Every item gets a manifest entry whatever happened to it: path, size, sha256, started,
duration, return code, timed out, truncated, or a skip with its reason. A run that is
killed keeps its journal and every file written up to that moment: it reads back as a
partial run.

Nothing here follows a link: the run directory is created 0700 and opened once, every file
in it is created 0600 with O_EXCL|O_NOFOLLOW (a rewrite goes to a new name, renamed over the
old one), and reading a run goes through diag.confined (paths normalised and kept inside,
regular files only, bounded). A finished run's files and manifest.json are never rewritten.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import re
import socket
import stat
import subprocess
import time
from pathlib import Path
from typing import Any, Iterable

from .confined import DEFAULT_LIMITS, Dir, Limits, PathRefused, TooLarge, normalize, open_dir, parse_json

__all__ = ["RunDir", "new_run_dir", "MAX_FILE_BYTES", "load_manifest", "verify_manifest", "add_after_run",
           "ManifestError", "MANIFEST_FILES", "ADDED", "unrecorded_files", "command_of"]

MAX_FILE_BYTES = 8 << 20  # a /proc or /sys file larger than this is cut and marked truncated
ADDED = "manifest.added.jsonl"
MANIFEST_FILES = ("manifest.json", "manifest.jsonl", ADDED)
_SHA = re.compile(r"^[0-9a-f]{64}$")
# run directory names say which command made them: 20261130-123610-repro-register-vm
_COMMANDS = {"repro-register": "repro register", "repro-staging": "repro staging", "preflight": "preflight",
             "snapshot": "snapshot"}


class ManifestError(ValueError):
    """A manifest that cannot be read or trusted; the message names the file, the entry and why."""


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


def _dumps(manifest: dict[str, Any]) -> bytes:
    return json.dumps(manifest, indent=1, sort_keys=True).encode()


def new_run_dir(base: Path | str | None, command: str) -> Path:
    """A fresh directory under base (default ./hostpin-runs) named by time, command and host."""
    base = Path(base) if base else Path("hostpin-runs")
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    host = socket.gethostname().split(".")[0] or "host"
    name = f"{stamp}-{command}-{host}"
    path = base / name
    n = 1
    while os.path.lexists(path):
        n += 1
        path = base / f"{name}.{n}"
    return path


def command_of(raw: str | None, dir_name: str = "") -> str | None:
    """The command as people type it ('repro register') from a manifest's 'repro-register', or
    from the run directory's name when the manifest does not say (an old journal)."""
    if raw:
        return _COMMANDS.get(raw, raw)
    for key, command in _COMMANDS.items():
        if re.search(rf"^\d{{8}}-\d{{6}}-{key}-", dir_name):
            return command
    return None


class RunDir:
    """A run directory being written. Not thread-safe; one writer per run."""

    def __init__(self, path: Path | str, command: str, argv: Iterable[str] = (), durable: bool = False):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        os.mkdir(self.path, 0o700)  # FileExistsError when it is there already (or a link is)
        self._dir = open_dir(self.path, follow_last=False)
        self.command = command
        self.argv = list(argv)
        self.durable = durable  # fsync every journal line (the watchdog wants this)
        self.started = _now_iso()
        self.pid = os.getpid()
        self.entries: list[dict[str, Any]] = []
        self._written: set[str] = set()
        self._finished = False
        self.lost: str | None = None  # why the evidence stopped being written (a full disk), once it did
        try:
            st = os.fstat(self._dir.fd)
            if st.st_uid != os.geteuid():
                raise PermissionError(f"{self.path} was replaced by a directory of uid {st.st_uid}")
            os.fchmod(self._dir.fd, 0o700)
            self._journal = os.fdopen(self._dir.open_new("manifest.jsonl"), "a", encoding="utf-8")
            self._line({"run": {"tool": "hostpin", "command": command, "argv": self.argv,
                                "host": socket.gethostname(), "pid": self.pid, "started": self.started}},
                       keep_going=False)
        except BaseException:
            # a run that could not even start (no space for its journal's first line) leaves nothing
            # behind: an empty manifest.jsonl would read as a damaged run for ever after
            self._remove_unstarted()
            raise

    @classmethod
    def unkept(cls, path: Path | str, command: str, why: str, argv: Iterable[str] = ()) -> "RunDir":
        """A run whose directory could not be made (a full or unwritable disk): it takes every
        item and writes none, so that the command still decides, and says the evidence was lost."""
        run = cls.__new__(cls)
        run.path, run.command, run.argv, run.durable = Path(path), command, list(argv), False
        run.started, run.pid, run.entries, run._written = _now_iso(), os.getpid(), [], set()
        run._finished, run.lost, run._journal, run._dir = False, why, None, None
        return run

    @property
    def made(self) -> bool:
        """Whether the run directory exists (it holds what was written before any loss)."""
        return self._journal is not None

    def _remove_unstarted(self) -> None:
        try:
            os.unlink("manifest.jsonl", dir_fd=self._dir.fd)
        except OSError:
            pass
        self._dir.close()
        try:
            os.rmdir(self.path)
        except OSError:
            pass

    # -- journal ---------------------------------------------------------------------------
    def _lose(self, what: str, exc: OSError) -> None:
        """A write failed (a full disk, an I/O error): the run stops writing from here on, and what
        it decides is still decided; the command says the evidence could not be kept (exit 3 for a
        pass, the failure's own code otherwise, CMD's exit code for the launcher form)."""
        if self.lost is None:
            self.lost = f"{what}: {exc.strerror or exc}"

    def _line(self, obj: dict[str, Any], keep_going: bool = True) -> None:
        if self.lost is not None:
            return
        try:
            self._journal.write(json.dumps(obj, sort_keys=True) + "\n")
            self._journal.flush()
            if self.durable:
                os.fsync(self._journal.fileno())
        except OSError as exc:
            if not keep_going:
                raise
            self._lose("manifest.jsonl", exc)

    def _record(self, entry: dict[str, Any]) -> dict[str, Any]:
        self.entries.append(entry)
        self._line(entry)
        return entry

    def _write(self, rel: str, data: bytes) -> Path:
        rel = normalize(rel)
        if rel in MANIFEST_FILES:
            raise PathRefused(f"{rel} is the run's own manifest")
        if self.lost is not None:
            return self.path / rel
        try:
            if rel in self._written:  # written before by this run: a new file renamed over it
                self._dir.replace(rel, data, durable=self.durable)
            else:
                self._dir.write_new(rel, data, durable=self.durable)
                self._written.add(rel)
        except OSError as exc:  # write_file_at removed what it had begun
            self._lose(rel, exc)
        return self.path / rel

    # -- items -----------------------------------------------------------------------------
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
        if self.lost is not None:
            return self.add_skip(rel, f"not kept: {self.lost}", kind=kind, **extra)
        try:
            size, sha = Dir(self.path, self._dir.fd, Limits(total_bytes=1 << 62, file_bytes=1 << 62)).hash_file(rel)
        except FileNotFoundError:
            return self.add_skip(rel, "never written", kind=kind, **extra)
        except (OSError, PathRefused) as exc:
            return self.add_skip(rel, f"not adopted: {exc}", kind=kind, **extra)
        self._written.add(normalize(rel))
        return self._record(_entry(rel, kind, size=size, sha256=sha, **extra))

    def add_dir(self, rel: str, **extra: Any) -> dict[str, Any]:
        """An empty directory that exists on the node (its absence would mean something else)."""
        if self.lost is None:
            try:
                self._dir.makedirs(rel)
            except OSError as exc:
                self._lose(rel, exc)
        return self._record(_entry(rel, "dir", **extra))

    def add_json(self, rel: str, obj: Any, *, kind: str = "result", **extra: Any) -> dict[str, Any]:
        data = (json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n").encode()
        return self.add_file(rel, data, kind=kind, **extra)

    def create_file(self, rel: str):
        """A binary file object for a file created now inside the run (O_EXCL, no links), for
        output written by someone else (a child's log); give it its entry with adopt(). Once the
        run has lost its evidence, or cannot create the file, the object writes to /dev/null."""
        if self.lost is None:
            try:
                return os.fdopen(self._dir.open_new(rel), "wb")
            except OSError as exc:
                self._lose(rel, exc)
        return open(os.devnull, "wb")

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

    # -- end -------------------------------------------------------------------------------
    def finish(self, result: Any = None) -> Path:
        if self._finished:
            return self.path / "manifest.json"
        if result is not None:
            self.add_json("result.json", result)
        if self.lost is not None:
            self._stop()
            return self.path / "manifest.json"
        manifest = {
            "tool": "hostpin", "command": self.command, "argv": self.argv, "pid": self.pid,
            "host": socket.gethostname(), "started": self.started, "finished": _now_iso(),
            "complete": True,
            "entries": self.entries,
        }
        try:
            self._dir.replace("manifest.json", _dumps(manifest), durable=True)
        except OSError as exc:
            self._lose("manifest.json", exc)
            self._stop()
            return self.path / "manifest.json"
        self._close()
        return self.path / "manifest.json"

    def _stop(self) -> None:
        """The end of a run that lost its evidence: one last journal line says why it stopped (it
        fits when the space came back, or in the journal's last block), so that the partial run
        does not read as killed; then everything is closed."""
        if self._journal is None:  # never made (RunDir.unkept)
            self._finished = True
            return
        try:
            # after a newline: a line the full disk cut short stays a line of its own
            self._journal.write("\n" + json.dumps({"stopped": {"at": _now_iso(), "why": self.lost}}, sort_keys=True)
                                + "\n")
            self._journal.flush()
        except OSError:
            pass
        self._close()

    def _close(self) -> None:
        try:
            self._journal.close()
        except OSError:  # what was buffered could not be written: the run has lost it already
            self._lose("manifest.jsonl", OSError("could not be flushed"))
        self._dir.close()
        self._finished = True


class Stream:
    """A growing evidence file (a timeline); its manifest entry is written when it closes. The
    journal says at once that it is open, so a run killed meanwhile still accounts for it."""

    def __init__(self, run: RunDir, rel: str):
        self.run, self.rel = run, normalize(rel)
        self._fh = None
        if run.lost is None:
            try:
                self._fh = os.fdopen(run._dir.open_new(self.rel), "ab")
            except OSError as exc:
                run._lose(self.rel, exc)
        run._written.add(self.rel)
        self._hash = hashlib.sha256()
        self._size = 0
        self._started = _now_iso()
        self._t0 = time.monotonic()
        self.closed = False
        run._line(_entry(self.rel, "stream", started=self._started, open=True))

    def write(self, data: bytes | str) -> None:
        if isinstance(data, str):
            data = data.encode()
        if self._fh is None or self.run.lost is not None:
            return
        try:
            self._fh.write(data)
            self._fh.flush()
            if self.run.durable:
                os.fsync(self._fh.fileno())
        except OSError as exc:
            self.run._lose(self.rel, exc)
            return
        self._hash.update(data)
        self._size += len(data)

    def close(self, kind: str = "stream", **extra: Any) -> None:
        if self.closed:
            return
        self.closed = True
        if self._fh is not None:
            try:
                self._fh.close()
            except OSError as exc:
                self.run._lose(self.rel, exc)
        self.run._record(_entry(self.rel, kind, size=self._size, sha256=self._hash.hexdigest(), started=self._started,
                                duration_s=round(time.monotonic() - self._t0, 6), **extra))


# -- reading a run back -------------------------------------------------------------------------
_OPTIONAL_STR = ("source", "reason", "started", "target")
_BOOLS = ("skipped", "truncated", "timed_out", "open", "added_after_run", "redacted", "recorded")


def _check_entry(e: Any, where: str) -> dict[str, Any]:
    """One manifest entry, typed as readers use it; ManifestError names what is wrong."""
    if not isinstance(e, dict):
        raise ManifestError(f"{where} is not an object")
    try:
        path = normalize(e.get("path"))
    except PathRefused as exc:
        raise ManifestError(f"{where}: path {exc}") from None
    kind = e.get("kind", "file")
    if not isinstance(kind, str):
        raise ManifestError(f"{where} ({path}): kind is not a string")
    for key in _OPTIONAL_STR:
        if e.get(key) is not None and not isinstance(e[key], str):
            raise ManifestError(f"{where} ({path}): {key} is not a string")
    for key in _BOOLS:
        if key in e and not isinstance(e[key], bool):
            raise ManifestError(f"{where} ({path}): {key} is not true or false")
    size = e.get("size", 0)
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise ManifestError(f"{where} ({path}): size is not a whole number of bytes")
    sha = e.get("sha256")
    if sha is not None and not (isinstance(sha, str) and _SHA.match(sha)):
        raise ManifestError(f"{where} ({path}): sha256 is not a sha256")
    needs_hash = not e.get("skipped") and not e.get("open") and kind != "dir"
    if needs_hash and sha is None:
        raise ManifestError(f"{where} ({path}): a file entry without a sha256")
    return dict(e, path=path, kind=kind, size=size)


def _read_lines(d: Dir, rel: str, what: str) -> tuple[list[Any], bool]:
    """JSON lines of a journal; a cut last line (a killed writer) is dropped and reported."""
    st = d.lstat(rel)
    if st is not None and st.st_size > d.limits.json_bytes:
        raise ManifestError(f"{what} is {st.st_size:,} bytes, more than a run ever writes "
                            f"({d.limits.json_bytes:,}; --max-files raises the limit)")
    text = d.read_text(rel, d.limits.json_bytes + 1)
    lines = text.split("\n")
    out, cut = [], False
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            out.append(parse_json(line.encode(), f"{what} line {i + 1}", d.limits.json_bytes))
        except TooLarge as exc:
            raise ManifestError(str(exc)) from None
        except (ValueError, RecursionError):
            rest = [x for x in lines[i + 1:] if x.strip()]
            if i > 0 and (not rest or (len(rest) == 1 and rest[0].startswith('{"stopped": '))):
                cut = True
                if rest:  # the line that says why it stopped, written after the cut one
                    try:
                        out.append(parse_json(rest[0].encode(), f"{what} (its stop line)", d.limits.json_bytes))
                    except (ValueError, RecursionError):
                        pass
                break
            more = " and more follows it" if i > 0 else " (its first line)"
            raise ManifestError(f"{what} line {i + 1} is damaged (not JSON){more}") from None
    return out, cut


_HEADER_STR = ("tool", "command", "host", "started", "finished", "killed_at")


def _check_header(m: dict[str, Any], what: str) -> None:
    for key in _HEADER_STR:
        if m.get(key) is not None and not isinstance(m[key], str):
            raise ManifestError(f"{what}: {key} is not a string")
    argv = m.get("argv", [])
    if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
        raise ManifestError(f"{what}: argv is not a list of strings")
    for key in ("complete", "partial", "redacted"):
        if key in m and not isinstance(m[key], bool):
            raise ManifestError(f"{what}: {key} is not true or false")
    pid = m.get("pid")
    if pid is not None and (isinstance(pid, bool) or not isinstance(pid, int)):
        raise ManifestError(f"{what}: pid is not a number")


def _load(d: Dir, name: str) -> dict[str, Any]:
    if d.lstat("manifest.json") is not None:
        try:
            manifest = d.read_json("manifest.json")
        except TooLarge as exc:
            raise ManifestError(str(exc)) from None
        except (ValueError, RecursionError) as exc:
            raise ManifestError(f"manifest.json is not valid JSON ({exc})") from None
        if not isinstance(manifest, dict):
            raise ManifestError("manifest.json is not a JSON object")
        entries = manifest.get("entries")
        if not isinstance(entries, list):
            raise ManifestError("manifest.json has no list of entries")
        _check_header(manifest, "manifest.json")
        manifest = dict(manifest, argv=manifest.get("argv", []),
                        entries=[_check_entry(e, f"manifest.json entry {i + 1}") for i, e in enumerate(entries)])
        manifest.setdefault("complete", True)
    elif d.lstat("manifest.jsonl") is not None:
        lines, cut = _read_lines(d, "manifest.jsonl", "manifest.jsonl")
        header: dict[str, Any] = {}
        entries = []
        stopped = None
        for i, line in enumerate(lines):
            if isinstance(line, dict) and "stopped" in line and "path" not in line:
                stopped = line["stopped"] if isinstance(line["stopped"], dict) else None
                if stopped is None or not all(isinstance(stopped.get(k), str) for k in ("at", "why")):
                    raise ManifestError(f"manifest.jsonl line {i + 1}: the stop line is damaged")
                continue
            if isinstance(line, dict) and "run" in line and "path" not in line:
                if not isinstance(line["run"], dict):
                    raise ManifestError(f"manifest.jsonl line {i + 1}: the run header is not an object")
                header = line["run"]
                _check_header(header, "manifest.jsonl header")
                continue
            entries.append(_check_entry(line, f"manifest.jsonl line {i + 1}"))
        if not header:  # a journal's first line is the header, written when the run was created
            raise ManifestError("manifest.jsonl has no run header line: it is damaged or not a hostpin journal")
        manifest = {"tool": "hostpin", "command": header.get("command"), "argv": header.get("argv", []),
                    "host": header.get("host"), "pid": header.get("pid"), "started": header.get("started"),
                    "finished": None, "complete": False, "partial": True, "journal_cut": cut, "entries": entries}
        if stopped is not None:  # it stopped itself: the evidence could not be written (a full disk)
            manifest["stopped"] = {"at": stopped["at"], "why": stopped["why"]}
        if not manifest["command"]:
            found = command_of(None, name)
            manifest["command"] = next((k for k, v in _COMMANDS.items() if v == found), None)
    else:
        raise ManifestError("no manifest.json or manifest.jsonl: not a hostpin run directory")
    if d.lstat(ADDED) is not None:
        added, _cut = _read_lines(d, ADDED, ADDED)
        manifest["entries"] = manifest["entries"] + [
            dict(_check_entry(e, f"{ADDED} line {i + 1}"), added_after_run=True) for i, e in enumerate(added)]
    if len(manifest["entries"]) > 2 * d.limits.files:  # each file has an entry, a few also a skip or a reopen
        raise ManifestError(f"{len(manifest['entries']):,} entries, more than a run of {d.limits.files:,} files "
                            "can have (--max-files raises the limit)")
    return manifest


def load_manifest(run_dir: Path | str | Dir, limits: Limits = DEFAULT_LIMITS) -> dict[str, Any]:
    """manifest.json (plus files added after the run), or the journal of a run that did not
    finish (complete: false, partial: true). ManifestError when it cannot be read or trusted."""
    if isinstance(run_dir, Dir):
        return _load(run_dir, run_dir.path.name)
    try:
        with open_dir(run_dir, limits) as d:
            return _load(d, Path(run_dir).name)
    except (OSError, PathRefused) as exc:
        raise ManifestError(f"cannot read the manifest of {run_dir}: {getattr(exc, 'strerror', None) or exc}") from None


def _latest(entries: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    latest: dict[str, dict] = {}
    for entry in entries:
        latest[entry["path"]] = entry  # a path written twice: the last write is what is on disk
    return latest


def verify_manifest(run_dir: Path | str | Dir, manifest: dict[str, Any] | None = None,
                    limits: Limits = DEFAULT_LIMITS) -> list[str]:
    """Problems found: files whose size or sha256 differ from the manifest, that are missing,
    or that are links or not regular files (never followed, never read)."""
    if not isinstance(run_dir, Dir):
        with open_dir(run_dir, limits) as d:
            return verify_manifest(d, manifest)
    d = run_dir
    manifest = manifest if manifest is not None else load_manifest(d)
    problems = []
    for entry in _latest(manifest["entries"]).values():
        if entry.get("skipped") or entry.get("kind") == "dir" or entry.get("open"):
            continue
        path = entry["path"]
        try:
            size, sha = d.hash_file(path)
        except FileNotFoundError:
            problems.append(f"{path}: missing")
            continue
        except PathRefused as exc:
            problems.append(f"{path}: {exc}" if not str(exc).startswith(path) else str(exc))
            continue
        except OSError as exc:
            problems.append(f"{path}: unreadable ({exc.strerror})")
            continue
        if size != entry["size"] or sha != entry["sha256"]:
            problems.append(f"{path}: content differs from the manifest")
    return problems


def unrecorded_files(d: Dir, manifest: dict[str, Any]) -> list[tuple[str, os.stat_result]]:
    """Everything in the run that no entry accounts for (rel, lstat), the manifests excepted."""
    listed = {e["path"] for e in manifest["entries"] if not e.get("skipped")}
    out = []
    for rel, st in d.walk():
        if rel in MANIFEST_FILES or rel in listed or stat.S_ISDIR(st.st_mode):
            continue
        out.append((rel, st))
    return out


def add_after_run(run_dir: Path | str, rel: str, data: bytes, kind: str) -> str:
    """Add a file to a finished (or killed) run, with its entry in manifest.added.jsonl. Never
    rewrites anything: the same bytes already there are kept as they are, different bytes go
    to a new name (report.2.md). Returns the path used inside the run.

    The entry is announced before the file is made (an `open` line, as a stream's), and the file
    is removed again when its entry cannot be completed: a full disk or a kill -9 at any moment
    leaves nothing that blocks a later bundle (a listed file, or no file)."""
    rel = normalize(rel)
    stem, dot, ext = rel.rpartition(".")
    with open_dir(run_dir, follow_last=False) as d:
        n = 1
        while True:
            candidate = rel if n == 1 else f"{stem}.{n}.{ext}" if dot else f"{rel}.{n}"
            st = d.lstat(candidate)
            if st is None:
                break
            if stat.S_ISREG(st.st_mode) and d.hash_file(candidate) == (len(data), hashlib.sha256(data).hexdigest()):
                if any(e["path"] == candidate and not e.get("open") for e in load_manifest(d)["entries"]):
                    return candidate  # already there and accounted for
            n += 1
            if n > 1000:
                raise PathRefused(f"{rel}: a thousand versions exist already; not adding another")
        _append_added(d, _entry(candidate, kind, added_after_run=True, open=True))
        d.write_new(candidate, data)  # removes what it began when it fails
        try:
            _append_added(d, _entry(candidate, kind, data, added_after_run=True))
        except BaseException:
            try:
                parent, name = d._parent(candidate)
                try:
                    os.unlink(name, dir_fd=parent)
                finally:
                    os.close(parent)
            except OSError:
                pass
            raise
    return candidate


def _append_added(d: Dir, entry: dict[str, Any]) -> None:
    """One whole line or none: what a full disk let through is cut off again, so that the next
    line never follows half a line."""
    fd = d.open_new(ADDED, append=True)
    try:
        size = os.fstat(fd).st_size
        view = memoryview((json.dumps(entry, sort_keys=True) + "\n").encode())
        try:
            while view:
                view = view[os.write(fd, view):]
        except OSError:
            os.ftruncate(fd, size)
            raise
    finally:
        os.close(fd)

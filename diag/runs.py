"""Opening a finished run for reading: a run directory or a bundle (.tar.gz) made by `hostpin bundle`.

Reading is confined to the run (diag.confined): every path from the manifest is normalised
and must stay inside, only regular files are read and never through a link, and what is read
is bounded per file and per run (Limits; `--max-size`, `--max-files` raise them).

A bundle is unpacked into a new private temporary directory (removed by close(), and on every
error or interruption while unpacking), member by member as the archive is read: Python's
tarfile 'data' filter where the Python has it, then hostpin's own rules (regular files and
directories only, one run directory, no member twice), under the size and member-count limits.
The rest of the archive after the last member must be the end-of-archive zeros (a damaged
header in the middle is not taken for the end), and a gzip stream must end with its checksum.
"""
from __future__ import annotations

import datetime as _dt
import errno
import gzip
import json
import os
import shutil
import signal
import stat
import tarfile
import tempfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .confined import DEFAULT_LIMITS, Dir, Limits, PathRefused, TooLarge, normalize, open_dir
from .evidence import ManifestError, command_of, load_manifest, unrecorded_files, verify_manifest
from .facts import FACT_LABELS, node_facts
from .results import result_shape_problem
from .rootfs import Root
from .safetext import one_line

__all__ = ["Run", "open_run_path", "RunError", "RunMissing", "OutOfResources", "BUNDLE_TMP_PREFIX"]

BUNDLE_TMP_PREFIX = "hostpin-bundle-"  # + owner pid + '-': diag.leftovers finds the ones of dead owners


class RunError(RuntimeError):
    """The run or bundle could not be read (exit 3); the message says which and why."""


class RunMissing(RunError):
    """The path named on the command line does not exist (exit 2)."""


class OutOfResources(RunError):
    """Not the run's fault: hostpin ran out of file descriptors (ulimit -n) or of space to unpack a
    bundle (TMPDIR). A fleet summary must stop (exit 3), never list the run as unreadable."""


_OURS = (errno.EMFILE, errno.ENFILE, errno.ENOSPC, errno.ENOMEM, errno.EDQUOT)


@dataclass
class Run:
    path: Path                      # the run directory (unpacked, for a bundle)
    source: str                     # what the user named
    manifest: dict[str, Any]
    result: dict[str, Any]
    problems: list[str] = field(default_factory=list)  # manifest verification
    dir: Dir | None = None          # the run, opened once; every read goes through it
    partial: bool = False           # killed before it finished (no manifest.json of its own)
    killed_at: str | None = None    # when a partial run last wrote anything
    unrecorded: list[str] = field(default_factory=list)  # a partial run's files its journal does not list
    running: bool = False           # a partial run whose owner still runs on this host: not killed
    journal_only: bool = False      # read from its journal: no manifest.json of its own
    _tmp: str | None = None
    _facts: dict[str, Any] | None = None

    @property
    def command(self) -> str:
        cmd = self.result.get("command")
        if isinstance(cmd, str) and cmd:
            return cmd
        return command_of(self.manifest.get("command"), self.path.name) or "unknown"

    @property
    def status(self) -> str:
        value = self.result.get("status") or self.result.get("outcome")
        if value is None and self.partial:
            return "partial"
        return str(value or "unknown")

    @property
    def from_bundle(self) -> bool:
        return self._tmp is not None

    @property
    def ended(self) -> str:
        """How a partial run ended, in words: 'killed at T', 'stopped at T: ...' (it could not write
        its evidence, a full disk), or 'still running (pid N)' (its owner still runs on this host)."""
        stopped = self.manifest.get("stopped")
        if isinstance(stopped, dict) and isinstance(stopped.get("at"), str) and isinstance(stopped.get("why"), str):
            return f"stopped at {stopped['at']}: its evidence could not be written ({stopped['why']})"
        if self.running:
            return f"still running (pid {self.manifest.get('pid')}, since {self.manifest.get('started')})"
        return f"killed at {self.killed_at or 'an unknown time'}"

    def facts(self) -> dict[str, Any]:
        """The facts the run recorded, completed from its root/ tree (read once) where it did not
        record them all: they were read with the checks, from the same readings."""
        if self._facts is not None:
            return self._facts
        recorded = self.result.get("facts")
        facts = dict(recorded) if isinstance(recorded, dict) else {}
        if any(k not in facts for k in FACT_LABELS) and self.dir is not None and self.dir.is_dir("root"):
            fresh = node_facts(Root(self.path / "root"))
            for key, value in fresh.items():
                if facts.get(key) is None:
                    facts[key] = value
        if not facts.get("host"):
            facts["host"] = self.manifest.get("host")
        # the run is anyone's: a text fact (the host, the kernel) is one line with no control character
        facts = {k: one_line(v) if isinstance(v, str) else v for k, v in facts.items()}
        self._facts = facts
        return facts

    # -- reading inside the run ----------------------------------------------------------------
    def is_file(self, rel: str) -> bool:
        try:
            return self.dir is not None and self.dir.is_file(rel)
        except PathRefused:
            return False

    def read_text(self, rel: str, limit: int | None = None, tail: bool = False) -> str | None:
        """The file's text, or None when it is absent, a link, not a regular file, outside the
        run, or over the limits."""
        if self.dir is None:
            return None
        try:
            return self.dir.read_text(rel, limit, tail)
        except (OSError, PathRefused):
            return None

    def read_jsonl(self, rel: str) -> list[dict]:
        """The JSON lines of a file (a timeline): at most the JSON limit of it is read (the rest
        is said in problems), a line too large or not JSON ends it (a killed run's last line)."""
        if self.dir is None:
            return []
        limit = self.dir.limits.json_bytes
        st = self.dir.lstat(rel)
        if st is not None and st.st_size > limit:
            self.problems.append(f"{rel}: {st.st_size:,} bytes; only the first {limit:,} are read "
                                 "(--max-files raises the limit)")
        text = self.read_text(rel, limit)
        if text is None:
            return []
        out = []
        for line in text.splitlines():
            if len(line) > 1 << 20:  # a timeline line is a few hundred bytes
                break
            try:
                value = json.loads(line)
            except (ValueError, RecursionError):
                break  # a killed run's last line may be cut
            if isinstance(value, dict):
                out.append(value)
        return out

    def detach(self) -> "Run":
        """Keep what compare reads (manifest, result, facts) and give back the directory and an
        unpacked bundle's files: one run open at a time, however many are compared."""
        self.facts()
        self.close()
        return self

    def close(self) -> None:
        if self.dir is not None:
            self.dir.close()
            self.dir = None
        if self._tmp:
            _remove_tree(self._tmp)
            self._tmp = None


def _remove_tree(path: str) -> None:
    """Remove an unpacked bundle with Ctrl-C, SIGTERM and SIGHUP held off until it is gone: a
    second Ctrl-C landing during the removal must not leave half of it behind (the signal is
    delivered, and acted on, once the directory is removed)."""
    held = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
    try:
        old = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    except (AttributeError, OSError, ValueError):  # no pthread_sigmask: remove it all the same
        old = None
    try:
        shutil.rmtree(path, ignore_errors=True)
    finally:
        if old is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)


# -- bundles --------------------------------------------------------------------------------------
_ALLOWED_TYPES = (tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.DIRTYPE)
_TRAILER_MAX = 1 << 20  # zeros after the end-of-archive blocks: a record's padding, never more


def _member_rel(m: tarfile.TarInfo, bundle: Path) -> str | None:
    """The member's path in normal form, or None for the archive's own '.' entry."""
    name = m.name
    while name.startswith("./"):
        name = name[2:]
    if name.rstrip("/") in ("", ".") and m.isdir():
        return None
    try:
        return normalize(name.rstrip("/") or name)
    except PathRefused as exc:
        raise RunError(f"{bundle}: member {m.name!r} refused: {exc}") from None


def _unpack(bundle: Path, dest: Path, limits: Limits) -> Path:
    with open(bundle, "rb") as raw:
        gz = raw.read(2) == b"\x1f\x8b"
        raw.seek(0)
        stream = gzip.GzipFile(fileobj=raw, mode="rb") if gz else raw
        try:
            return _unpack_stream(bundle, stream, dest, limits)
        except (tarfile.TarError, EOFError, zlib.error) as exc:
            raise RunError(f"{bundle} could not be read: the archive is truncated or corrupt ({exc})") from None
        except gzip.BadGzipFile as exc:
            raise RunError(f"{bundle} could not be read: the archive is corrupt ({exc})") from None
        except RecursionError:  # tarfile reads each PAX / GNU long-name header by recursing
            raise RunError(f"{bundle} could not be read: too many extended (PAX or GNU long-name) headers in a "
                           "row; a bundle has one at most per member") from None


def _unpack_stream(bundle: Path, stream, dest: Path, limits: Limits) -> Path:
    tar = tarfile.open(fileobj=stream, mode="r:")
    top: str | None = None
    count = total = 0
    with open_dir(dest, limits, follow_last=False) as out:
        for m in tar:
            count += 1
            if count > limits.files:
                raise RunError(f"{bundle}: more than {limits.files:,} members; refusing it (--max-files raises "
                               "the limit)")
            if hasattr(tarfile, "data_filter"):
                try:
                    tarfile.data_filter(m, str(dest))
                except tarfile.FilterError as exc:
                    raise RunError(f"{bundle}: member {m.name!r} refused: {exc}") from None
            rel = _member_rel(m, bundle)
            if rel is None:
                continue
            if m.type not in _ALLOWED_TYPES:
                raise RunError(f"{bundle}: member {m.name!r} is not a regular file or directory; refusing it")
            head = rel.split("/")[0]
            if top is None:
                top = head
            if head != top or (rel == head and not m.isdir()):
                raise RunError(f"{bundle}: expected one run directory inside, found {top!r} and {m.name!r}")
            if m.isdir():
                out.makedirs(rel)
                continue
            total += m.size
            if m.size > limits.file_bytes:
                raise RunError(f"{bundle}: member {m.name!r} is {m.size:,} bytes, over the limit of "
                               f"{limits.file_bytes:,} for one file; refusing it (--max-size raises the limit)")
            if total > limits.total_bytes:
                raise RunError(f"{bundle}: unpacks to more than {limits.total_bytes:,} bytes; refusing it "
                               "(--max-size raises the limit)")
            src = tar.extractfile(m)
            try:
                fd = out.open_new(rel)
            except FileExistsError:
                raise RunError(f"{bundle}: member {m.name!r} appears twice; refusing it") from None
            except (PathRefused, NotADirectoryError) as exc:
                raise RunError(f"{bundle}: member {m.name!r} refused: {exc}") from None
            with os.fdopen(fd, "wb") as fh:
                left = m.size
                while left > 0:
                    piece = src.read(min(1 << 20, left))
                    if not piece:
                        raise EOFError(f"member {m.name!r} is cut short")
                    fh.write(piece)
                    left -= len(piece)
        # what follows the last member must be the end-of-archive zeros: tarfile takes a damaged
        # header in the middle for the end, and a gzip stream is checked only when read to its end
        # (two blocks, padded to a record: 10 KiB from tarfile and GNU tar, more with a larger
        # blocking factor). Past _TRAILER_MAX it is not padding but something else: refused
        # without reading it all (4 GiB of zeros inside a 4 MB .tar.gz). No zeros at all: the
        # archive was cut at a member boundary, with members missing.
        stream.seek(tar.offset)
        trailer = 0
        while True:
            piece = stream.read(min(1 << 20, _TRAILER_MAX + 1 - trailer))
            if not piece:
                break
            if piece.strip(b"\0"):
                raise RunError(f"{bundle} could not be read: the archive is corrupt after member {count} "
                               f"(a damaged header at byte {tar.offset:,} of the tar stream)")
            trailer += len(piece)
            if trailer > _TRAILER_MAX:
                raise RunError(f"{bundle} could not be read: more than {_TRAILER_MAX:,} bytes follow the end of "
                               f"the archive (at byte {tar.offset:,} of the tar stream); a bundle ends there")
        if trailer < 2 * tarfile.BLOCKSIZE:
            raise RunError(f"{bundle} could not be read: the archive is truncated (it ends after member {count} "
                           "without the end-of-archive marker, so members may be missing)")
    if top is None:
        raise RunError(f"{bundle} could not be read: the archive holds no run directory")
    return dest / top


def _open_bundle(p: Path, limits: Limits) -> tuple[Path, str]:
    tmp = tempfile.mkdtemp(prefix=f"{BUNDLE_TMP_PREFIX}{os.getpid()}-")
    try:
        return _unpack(p, Path(tmp), limits), tmp
    except OSError as exc:
        _remove_tree(tmp)
        where = f" ({exc.filename})" if exc.filename else ""
        kind = OutOfResources if exc.errno in _OURS else RunError
        raise kind(f"cannot unpack {p} into {tmp}: {exc.strerror or exc}{where}") from None
    except (PathRefused, TooLarge) as exc:
        _remove_tree(tmp)
        raise RunError(f"{p}: {exc}") from None
    except BaseException:  # RunError, Ctrl-C, anything: the temporary directory never stays
        _remove_tree(tmp)
        raise


def _iso(ts: float) -> str:
    return _dt.datetime.fromtimestamp(ts, _dt.timezone.utc).isoformat(timespec="milliseconds")


def _read_result(d: Dir, manifest: dict, partial: bool, problems: list[str], name: str = "") -> dict[str, Any]:
    if d.lstat("result.json") is None:
        return {}
    try:
        value = d.read_json("result.json")
        if not isinstance(value, dict):
            raise ValueError("not a JSON object")
        command = command_of(manifest.get("command"), name)  # what Run.command says when the result does not
        claimed = value.get("command")
        if command and isinstance(claimed, str) and claimed != command and not claimed.startswith(command + " "):
            raise ValueError(f"damaged: it is a {claimed} result in a {command} run")  # --matrix: 'repro register --matrix'
        shape = result_shape_problem(value if "command" in value or not command else dict(value, command=command))
        if shape:  # every command that reads a run refuses the same result, naming the field
            raise ValueError(f"damaged: {shape}")
        return value
    except (OSError, PathRefused, ValueError, RecursionError) as exc:
        why = getattr(exc, "strerror", None) or str(exc)
        if partial:  # killed while writing it: what else it recorded still reads
            problems.append(f"result.json could not be read ({why}); the run was killed before it finished")
            return {}
        raise RunError(f"result.json could not be read: {why}") from None


def _owner_runs(manifest: dict[str, Any]) -> bool:
    """Whether the process that writes this journal still runs: same host, its pid alive and started
    no later than the run (a pid used again since is another process)."""
    import socket
    pid, started = manifest.get("pid"), manifest.get("started")
    if manifest.get("host") != socket.gethostname() or not isinstance(pid, int) or pid < 1 or not started:
        return False
    try:
        stat_line = Path(f"/proc/{pid}/stat").read_text()
        fields = stat_line[stat_line.rindex(")") + 2:].split()
        if fields[0] in ("Z", "X"):
            return False
        boot = next(float(x.split()[1]) for x in Path("/proc/stat").read_text().splitlines() if x.startswith("btime"))
        began = boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")
        return began <= _dt.datetime.fromisoformat(started).timestamp() + 1.0
    except (OSError, ValueError, IndexError, StopIteration):
        return False


def open_run_path(path: Path | str, limits: Limits = DEFAULT_LIMITS) -> Run:
    """A run directory or bundle, opened for reading; RunError (RunMissing) when it cannot be."""
    p = Path(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise RunMissing(f"{p} does not exist; give a run directory (hostpin-runs/...) or a bundle") from None
    except OSError as exc:
        raise RunError(f"{p} could not be read: {exc.strerror}") from None
    tmp = None
    if stat.S_ISREG(st.st_mode):
        p, tmp = _open_bundle(p, limits)
    elif not stat.S_ISDIR(st.st_mode):
        raise RunError(f"{p} is neither a run directory nor a hostpin bundle (.tar.gz)")
    d = None
    try:
        d = open_dir(p, limits, follow_last=tmp is None)
        manifest = load_manifest(d)
        partial = not manifest.get("complete", True) or bool(manifest.get("partial"))
        problems = verify_manifest(d, manifest)
        if manifest.get("journal_cut"):
            problems.append("manifest.jsonl: its last line was cut (the run was killed while writing it)")
        result = _read_result(d, manifest, partial, problems, p.name)
        killed_at, unrecorded = manifest.get("killed_at"), list(manifest.get("unrecorded") or [])
        if partial and "manifest.json" not in d.listdir():
            files = unrecorded_files(d, manifest)
            unrecorded = [rel for rel, s in files if stat.S_ISREG(s.st_mode)]
            problems += [f"{rel}: is {'a symbolic link' if stat.S_ISLNK(s.st_mode) else 'not a regular file'}: "
                         "not read" for rel, s in files if not stat.S_ISREG(s.st_mode)]
            added = {e["path"] for e in manifest["entries"] if e.get("added_after_run")}
            times = [s.st_mtime for rel, s in d.walk() if stat.S_ISREG(s.st_mode) and rel not in added
                     and rel != "manifest.added.jsonl"]
            killed_at = _iso(max(times)) if times else None
        journal_only = "manifest.json" not in d.listdir()
        running = partial and tmp is None and journal_only and _owner_runs(manifest)
        return Run(path=p, source=str(path), manifest=manifest, result=result, problems=problems, dir=d,
                   partial=partial, killed_at=killed_at, unrecorded=unrecorded, running=running,
                   journal_only=journal_only, _tmp=tmp)
    except BaseException as exc:
        if d is not None:
            d.close()
        if tmp:
            _remove_tree(tmp)
        if isinstance(exc, ManifestError):
            raise RunError(f"{path} could not be read: {exc}") from None
        if isinstance(exc, RunError):
            raise type(exc)(f"{path}: {exc}") from None
        if isinstance(exc, (PathRefused, OSError)):
            why = getattr(exc, "strerror", None) or str(exc)
            kind = OutOfResources if getattr(exc, "errno", None) in _OURS else RunError
            raise kind(f"{path} could not be read: {why}") from None
        raise

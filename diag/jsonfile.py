"""`--json-file PATH`: a command's JSON document in a file instead of (or beside) stdout.

For a launcher that parses the result while the command's own output goes to the terminal
(`hostpin watch --json-file F -- CMD`: CMD's stdout and stderr stay CMD's). The document is
the one `--json` prints, written atomically: a temporary file in PATH's directory (created
with O_EXCL, so never through a link), fsynced, then renamed over PATH. A link at PATH is
never followed nor replaced (the rules of -o: a pipe, a terminal or /dev/null is written
through); a directory or device at PATH is refused, and so is a file in a hostpin run directory
(its files are the run's evidence) and a gzip or tar archive (a bundle); the directory must exist
(none is created).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

__all__ = ["problem_with", "write_json_file", "dumps"]


def dumps(doc: Any) -> str:
    return json.dumps(doc, indent=2, default=str)


def _is_run_dir(d: Path) -> bool:
    """A hostpin run directory: its journal (manifest.jsonl), or a manifest.json of hostpin's shape
    (a web project's manifest.json is not one). Only a regular file is opened (a device's open acts)."""
    import stat
    if os.path.lexists(d / "manifest.jsonl"):
        return True
    try:
        if not stat.S_ISREG(os.lstat(d / "manifest.json").st_mode):
            return os.path.lexists(d / "manifest.json")  # something else in a manifest's place: leave it alone
        fd = os.open(d / "manifest.json", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        head = os.read(fd, 1 << 16) if stat.S_ISREG(os.fstat(fd).st_mode) else b""
    except OSError:
        head = b""
    finally:
        os.close(fd)
    return b'"entries"' in head and b'"command"' in head


def problem_with(path: Path) -> str | None:
    """Why PATH cannot take the document, or None: the output-path rules of -o (a file is replaced
    by a rename; a pipe, a terminal or /dev/null, also behind a link, is written through; any other
    link, device or directory is never followed nor replaced)."""
    from .confined import PathRefused, output_fd
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        return f"its directory {parent} does not exist"
    if _is_run_dir(parent):
        return (f"{parent} is a hostpin run directory, whose files are its evidence; write the document "
                "elsewhere")
    try:
        fd = output_fd(path, check_only=True)
    except PathRefused as exc:
        return str(exc)
    except OSError as exc:
        return exc.strerror or str(exc)
    if fd is not None:
        os.close(fd)
        return None
    if _is_archive(path):
        return ("it is a gzip or tar archive (a bundle?), never replaced by a document: it may be a run's "
                "evidence; give another name")
    return None


def _is_archive(path: Path) -> bool:
    """Whether the regular file at PATH is a gzip stream or a tar archive: a bundle named by a slip
    of the tab key (`compare a.tar.gz b.tar.gz --json-file a.tar.gz`) was replaced by the document."""
    import stat
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return False  # a pipe, a terminal, /dev/null: written through, never read here
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False  # not there (or not readable: the write will say why)
    try:
        head = os.read(fd, 512) if stat.S_ISREG(os.fstat(fd).st_mode) else b""
    except OSError:
        head = b""
    finally:
        os.close(fd)
    return head[:2] == b"\x1f\x8b" or head[257:262] == b"ustar"


def write_json_file(path: Path, text: str) -> Path:
    """Write text to PATH as -o writes (0644: a launcher of another user may read it): into a new
    file renamed over PATH, or through a pipe or terminal. OSError when it cannot."""
    from .confined import PathRefused, write_output
    path = Path(path)
    try:
        write_output(path, (text if text.endswith("\n") else text + "\n").encode(), mode=0o644)
    except PathRefused as exc:
        raise OSError(0, str(exc)) from None
    return path

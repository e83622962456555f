"""`--json-file PATH`: a command's JSON document in a file instead of (or beside) stdout.

For a launcher that parses the result while the command's own output goes to the terminal
(`hostpin watch --json-file F -- CMD`: CMD's stdout and stderr stay CMD's). The document is
the one `--json` prints, written atomically: a temporary file in PATH's directory (created
with O_EXCL, so never through a link), fsynced, then renamed over PATH. A link at PATH is
replaced, never followed; a directory, FIFO or device at PATH is refused; the directory must
exist (none is created).
"""
from __future__ import annotations

import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["problem_with", "write_json_file", "dumps"]


def dumps(doc: Any) -> str:
    return json.dumps(doc, indent=2, default=str)


def problem_with(path: Path) -> str | None:
    """Why PATH cannot take the document, or None."""
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        return f"its directory {parent} does not exist"
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return exc.strerror or str(exc)
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
        return "it is not a regular file (the file is replaced by a rename, so only a file is written)"
    return None


def write_json_file(path: Path, text: str) -> Path:
    """Write text next to PATH and rename it over PATH (0644: a launcher of another user may
    read it). OSError when it cannot."""
    path = Path(path)
    why = problem_with(path)
    if why:
        raise OSError(0, why)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent if str(path.parent) else ".")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text if text.endswith("\n") else text + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)  # a link at path is replaced by the file, never written through
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path

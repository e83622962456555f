"""Foreign text made safe to show: what a captured tree, a bundle or a live process says.

A kernel release, a process name (any user sets its own with PR_SET_NAME), a bundle's verdict,
host or member names are written by someone else. Shown raw, an escape sequence retitles or
clears the terminal, a CR overwrites the line before it, and a LF forges a line of hostpin's own
("FAKE: all verified"). Every control character (C0, DEL, C1) and the Unicode line separators
and direction overrides are written as a visible escape instead: `one_line` for a value that is
one line (a LF too), `printable` for a file's text (LF and TAB kept). `guarded_output` puts the
same filter on stdout and stderr for a whole command, so nothing reaches the terminal raw
whichever way it is printed; hostpin's own live line ("\\r\\033[K") is the one sequence let through.

>>> one_line("6.18\\x1b]0;PWNED\\x07\\rhostpin: PASS\\nFAKE: all verified")
'6.18\\\\x1b]0;PWNED\\\\x07\\\\rhostpin: PASS\\\\nFAKE: all verified'
>>> printable("line one\\nline\\ttwo\\x1b[2J")
'line one\\nline\\ttwo\\\\x1b[2J'
>>> longest_fence("a ``` b ```` c")
'`````'
"""
from __future__ import annotations

import re
import sys
from contextlib import contextmanager
from typing import Any, Iterator

__all__ = ["one_line", "printable", "md_cell", "longest_fence", "guarded_output", "LIVE_LINE"]

_UNSAFE = "\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069"
_IN_TEXT = re.compile(f"[{_UNSAFE}]")
_IN_LINE = re.compile(f"[\t\n{_UNSAFE}]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
LIVE_LINE = "\r\033[K"  # hostpin's own live line: back to the start, clear it


def _escape(m: re.Match) -> str:
    ch = m.group(0)
    return _NAMED.get(ch) or (f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else f"\\u{ord(ch):04x}")


def one_line(value: Any) -> str:
    """A foreign value as one line with every control character visible."""
    return _IN_LINE.sub(_escape, str(value))


def printable(text: str) -> str:
    """Foreign text with its lines and tabs, every other control character visible."""
    return _IN_TEXT.sub(_escape, text)


_MD = re.compile(r"([\\`*_\[\]|!#~])")


def md_cell(value: Any) -> str:
    """One line of foreign text for Markdown (a table cell, a verdict): no '|' that ends the cell,
    no link or image (a beacon), no HTML tag, no emphasis or code span it did not mean.

    >>> md_cell("6.18 | ![x](http://beacon/) <img src=y>")
    '6.18 \\\\| \\\\!\\\\[x\\\\](http://beacon/) &lt;img src=y&gt;'
    """
    return _MD.sub(r"\\\1", one_line(value)).replace("<", "&lt;").replace(">", "&gt;")


def longest_fence(text: str) -> str:
    """A code fence that no run of backticks in `text` can close (three at least)."""
    runs = [len(r) for r in re.findall(r"`+", text)]
    return "`" * max(3, max(runs, default=0) + 1)


class _Guarded:
    """A text stream that escapes control characters on their way out."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, s):
        if not isinstance(s, str):
            raise TypeError("write() argument must be str")  # click probes with b"" for a binary stream
        return self._stream.write(LIVE_LINE.join(printable(part) for part in s.split(LIVE_LINE)))

    def __getattr__(self, name):
        return getattr(self._stream, name)


@contextmanager
def guarded_output() -> Iterator[None]:
    """stdout and stderr escape control characters for the duration (restored afterwards)."""
    saved = sys.stdout, sys.stderr
    if sys.stdout is not None:
        sys.stdout = _Guarded(sys.stdout)
    if sys.stderr is not None:
        sys.stderr = _Guarded(sys.stderr)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved

"""Undo everything a reproduction did, on every exit path.

Actions are pushed as they are set up (a swap file, a cgroup, a child) and run in reverse
order by `run_all()`, which is called from a `finally`. SIGINT and SIGTERM become a
`Interrupted` exception inside the guarded block, so the same `finally` runs for Ctrl-C,
a `kill`, an error or success. Each undo is recorded, with what could not be undone.
"""
from __future__ import annotations

import signal
import time
from contextlib import contextmanager
from typing import Callable

__all__ = ["Cleanup", "Interrupted"]


class Interrupted(Exception):
    def __init__(self, signum: int):
        self.signum = signum
        super().__init__(signal.Signals(signum).name)


class Cleanup:
    def __init__(self):
        self._actions: list[tuple[str, Callable[[], list[str] | None]]] = []
        self.log: list[dict] = []

    def push(self, what: str, undo: Callable[[], list[str] | None]) -> None:
        self._actions.append((what, undo))

    def run_all(self) -> list[dict]:
        # signals during cleanup must not cut it short
        old = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            while self._actions:
                what, undo = self._actions.pop()
                t0 = time.monotonic()
                try:
                    problems = undo() or []
                except Exception as exc:  # keep undoing the rest
                    problems = [f"{type(exc).__name__}: {exc}"]
                self.log.append({"undo": what, "ok": not problems, "problems": problems,
                                 "seconds": round(time.monotonic() - t0, 3)})
        finally:
            for s, handler in old.items():
                signal.signal(s, handler)
        return self.log

    @contextmanager
    def signals_raise(self):
        def handler(signum, frame):
            raise Interrupted(signum)

        old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for s, h in old.items():
                signal.signal(s, h)

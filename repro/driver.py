"""One driver for a run made of steps: each runs in order, each registers its own undo.

A step is a small function of the run's state. It returns None to go on, or the reason the run
stops early (the rest of the steps are skipped). What a step sets up on the node (a swap file, a
cgroup, the children) is handed to `undo(what, fn)` as soon as it exists, so that it is undone,
in reverse, on every exit path: a step's error, a stop, SIGINT or SIGTERM (repro.cleanup turns
them into Interrupted inside the steps), success. The undos are logged, with what could not be
undone, and signals cannot cut them short.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

from .cleanup import Cleanup, Interrupted

__all__ = ["Driver", "Step"]

Step = Callable[[Any], "str | None"]


class Driver:
    def __init__(self, steps: Sequence[Step]):
        self.steps = tuple(steps)
        self.cleanup = Cleanup()
        self.log: list[dict] = []  # each undo as it ran (repro.cleanup.Cleanup.run_all)

    def undo(self, what: str, fn: Callable[[], list[str] | None]) -> None:
        """Register the undo of what a step has just set up; it returns the problems it met."""
        self.cleanup.push(what, fn)

    def run(self, state: Any, *, finish: Callable[[str | None], None], close: Callable[[], None],
            interrupted: Callable[[str], None]) -> list[dict]:
        """Run the steps until one says stop, then finish(reason, or None when every step ran).
        close() runs once the steps are over however they ended (an error, a signal included);
        interrupted(signal name) after it on SIGINT or SIGTERM. The undos run last, in reverse, and
        their log is returned (an error a step raised propagates after them)."""
        try:
            with self.cleanup.signals_raise():
                try:
                    try:
                        finish(self._steps(state))
                    finally:
                        close()
                except Interrupted as exc:
                    interrupted(exc.args[0])
        finally:
            self.log = self.cleanup.run_all()
        return self.log

    def _steps(self, state: Any) -> str | None:
        for step in self.steps:
            stop = step(state)
            if stop:
                return stop
        return None

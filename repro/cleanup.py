"""Undo everything a reproduction did, on every exit path.

Actions are pushed as they are set up (a swap file, a cgroup, a child) and run in reverse
order by `run_all()`, which is called from a `finally`. SIGINT and SIGTERM become a
`Interrupted` exception inside the guarded block, so the same `finally` runs for Ctrl-C,
a `kill`, an error or success. Each undo is recorded, with what could not be undone.
"""
from __future__ import annotations

import ctypes
import os
import subprocess
import shutil
import signal
import stat
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

from diag.leftovers import CLEANUP_COMMAND, SWAP_RECORDS, Leftover, find_leftovers, owner_alive, owner_pid, swap_records

from .cgroups import remove_dir

__all__ = ["Cleanup", "Interrupted", "leftovers_refusal", "remove_leftovers"]


class Interrupted(Exception):
    def __init__(self, signum: int):
        self.signum = signum
        super().__init__(signal.Signals(signum).name)


class Cleanup:
    def __init__(self):
        self._actions: list[tuple[str, Callable[[], list[str] | None]]] = []
        self.log: list[dict] = []
        self.interrupted_by: int | None = None
        self._saved: dict | None = None  # the handlers before signals_raise, given back by run_all

    def push(self, what: str, undo: Callable[[], list[str] | None]) -> None:
        self._actions.append((what, undo))

    def run_all(self) -> list[dict]:
        # signals during cleanup must not cut it short
        old = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
        old.update(self._saved or {})
        self._saved = None
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
        """The first SIGINT or SIGTERM raises Interrupted; a second one (a double Ctrl-C) is only
        noted, so that stopping the children and the cleanup are not cut short. The handlers from
        before come back when run_all() has finished, not before."""
        def handler(signum, frame):
            if self.interrupted_by is None:
                self.interrupted_by = signum
                raise Interrupted(signum)

        old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
        self._saved = old
        try:
            yield
        finally:
            if self._saved is None:  # run_all already ran inside
                for s, h in old.items():
                    signal.signal(s, h)
            else:  # until run_all: a signal now is noted, never raised outside the guarded block
                for s in old:
                    signal.signal(s, self._note)

    def _note(self, signum, frame) -> None:
        if self.interrupted_by is None:
            self.interrupted_by = signum


# -- leftovers of runs that were killed (`hostpin repro cleanup`) ---------------------------------
def leftovers_refusal() -> dict | None:
    """A refusal (for `repro register`) when killed runs left swap files, cgroups or throttles:
    a new run beside them measures their throttle and swap, not the node."""
    dead = [x for x in find_leftovers() if not x.alive]
    if not dead:
        return None
    return {"check": "leftovers", "override": "--ignore-leftovers",
            "summary": f"{len(dead)} left by killed hostpin runs ({'; '.join(x.describe() for x in dead[:3])}"
                       f"{'; ...' if len(dead) > 3 else ''}): remove them with `{CLEANUP_COMMAND}`",
            "evidence": {"leftovers": [x.to_dict() for x in dead]}}


def _remove_swap(item: Leftover) -> list[str]:
    from .swapfile import _libc
    problems = []
    if item.kind == "swap":
        if _libc.swapoff(item.path.encode()) != 0:
            err = ctypes.get_errno()
            return [f"swapoff {item.path}: {os.strerror(err)}"]
    try:
        if stat.S_ISREG(os.lstat(item.path).st_mode):
            os.unlink(item.path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        problems.append(f"cannot remove {item.path}: {exc.strerror}")
    if not problems:
        _forget_record(os.path.join(SWAP_RECORDS, os.path.basename(item.path)))
    return problems


def _forget_record(record: str) -> None:
    try:
        os.unlink(record)
    except OSError:
        pass


def _prune_records() -> None:
    """Records of dead runs whose swap file is gone (killed before it was made, or removed by hand)."""
    for record, path in swap_records().items():
        pid = owner_pid(os.path.basename(path), "swap")
        if pid is not None and not owner_alive(pid) and not os.path.lexists(path):
            _forget_record(record)


def _remove_cgroup(item: Leftover) -> list[str]:
    path = Path(item.path)
    live = [pid for pid in item.detail.get("procs", []) if os.path.exists(f"/proc/{pid}")]
    if live:
        return [f"{path} still holds pid {', '.join(map(str, live))}; not removed (end those processes first)"]
    problems = []
    if item.detail.get("version") == 1:
        for line in item.detail.get("throttles", []):
            majmin = line.split()[0]
            try:
                (path / "blkio.throttle.read_bps_device").write_text(f"{majmin} 0")
            except OSError as exc:
                problems.append(f"cannot lift the throttle {line} in {path}: {exc.strerror}")
    return problems + remove_dir(path)


def _remove_trace(item: Leftover) -> list[str]:
    from diag.trace.tracefs import remove_instance
    err = remove_instance(Path(item.path))
    return [err] if err else []


def _unmount_trace(item: Leftover) -> list[str]:
    """Unmount a tracefs a killed --trace mounted, once no instance is left in it (anyone's)."""
    try:
        left = os.listdir(Path(item.path, "instances"))
    except OSError:
        left = []
    if left:
        return [f"tracefs at {item.path} left mounted: instances {', '.join(sorted(left))} are in it"]
    r = subprocess.run(["umount", item.path], capture_output=True, text=True)
    return [] if r.returncode == 0 else [f"cannot unmount {item.path}: {r.stderr.strip()}"]


def _remove_file(item: Leftover) -> list[str]:
    try:
        if item.kind == "bundle-tmp":
            shutil.rmtree(item.path)
        else:
            os.unlink(item.path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        return [f"cannot remove {item.path}: {exc.strerror}"]
    return []


def remove_leftovers(dry_run: bool = False, pids: set[int] | None = None) -> dict:
    """Remove what killed runs left (owners dead); leave what running runs hold. The result
    lists each thing found, what was done, and what could not be undone. pids: only those
    owners' (a test cleaning up after its own run)."""
    found = [x for x in find_leftovers() if pids is None or x.pid in pids]
    order = {"swap": 0, "swap-file": 1, "cgroup": 2, "shm": 3, "bundle-tmp": 4, "trace": 5, "trace-mount": 6}
    rows, problems = [], []
    for item in sorted(found, key=lambda x: (order[x.kind], x.path)):
        row = dict(item.to_dict(), description=item.describe())
        if item.alive:
            row["action"] = "left alone: its run is going"
        elif dry_run:
            row["action"] = "would remove"
        else:
            undo = {"swap": _remove_swap, "swap-file": _remove_swap, "cgroup": _remove_cgroup,
                    "trace": _remove_trace, "trace-mount": _unmount_trace}.get(item.kind, _remove_file)
            try:
                row["problems"] = undo(item)
            except Exception as exc:  # keep removing the rest
                row["problems"] = [f"{type(exc).__name__}: {exc}"]
            row["action"] = "removed" if not row["problems"] else "could not remove"
            problems += row["problems"]
        rows.append(row)
    if not dry_run and pids is None:
        _prune_records()
    dead = [r for r in rows if not r["alive"]]
    if not found:
        verdict = "nothing left by hostpin runs on this node"
    elif dry_run:
        verdict = f"{len(dead)} left by killed runs would be removed" + (
            f"; {len(rows) - len(dead)} held by running runs left alone" if len(rows) > len(dead) else "")
    else:
        done = sum(1 for r in dead if r["action"] == "removed")
        verdict = f"removed {done} of {len(dead)} left by killed runs" + (
            f"; {len(rows) - len(dead)} held by running runs left alone" if len(rows) > len(dead) else "") + (
            "; could not remove: " + "; ".join(problems) if problems else "")
    return {"tool": "hostpin", "command": "repro cleanup", "dry_run": dry_run, "found": rows,
            "status": "failed" if problems else "clean", "problems": problems, "verdict": verdict}

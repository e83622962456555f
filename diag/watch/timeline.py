"""Writing what a watch saw, as it happens: the timeline and the stacks of every thread.

timeline.jsonl gets one JSON line per sample, appended and flushed (fsynced in a durable
run), so a watch that is killed keeps everything up to that moment. To keep hours of
sampling small, a thread's frames are written only when they changed since its last line
(readers keep the last stack seen per thread), and sleeping threads with nothing to say
are counted, not listed.
"""
from __future__ import annotations

import json
from typing import Any, Iterable

from .. import process
from ..evidence import RunDir

__all__ = ["TimelineWriter", "write_stacks"]


class TimelineWriter:
    def __init__(self, run: RunDir, rel: str = "timeline.jsonl"):
        self.rel = rel
        self.stream = run.open_stream(rel)
        self.lines = 0
        self._frames: dict[int, list[str]] = {}

    def write(self, sample: dict[str, Any], keep: Iterable[int] = ()) -> None:
        """keep: threads always listed (those in a pin phase)."""
        keep = set(keep)
        procs = {}
        for pid, p in (sample.get("procs") or {}).items():
            threads, quiet = {}, {}
            for tid, th in (p.get("threads") or {}).items():
                tid = int(tid)
                frames = th.get("frames")
                changed = frames is not None and frames != self._frames.get(tid)
                if th.get("state") in ("D", "R") or changed or tid in keep or tid == int(pid):
                    entry = {k: v for k, v in th.items() if k != "frames"}
                    if changed:
                        entry["frames"] = frames
                        self._frames[tid] = frames
                    threads[tid] = entry
                else:
                    quiet[th.get("state") or "?"] = quiet.get(th.get("state") or "?", 0) + 1
            procs[pid] = dict({k: v for k, v in p.items() if k != "threads"}, threads=threads,
                              **({"quiet_threads": quiet} if quiet else {}))
        line = dict(sample, procs=procs)
        self.stream.write(json.dumps(line, separators=(",", ":"), default=str) + "\n")
        self.lines += 1

    def close(self) -> None:
        self.stream.close(kind="timeline", lines=self.lines)


def write_stacks(run: RunDir, rel: str, pids: Iterable[int], title: str, proc: str = "/proc",
                 labels: dict[int, str] | None = None) -> str:
    """Every thread of every process: state, wchan, system call and kernel stack, in one file
    (`### tid N state D wchan W` sections, as `hostpin report` reads them)."""
    lines = [f"# {title}: every thread of every watched process"]
    for pid in pids:
        st = process.read_status(pid, proc=proc)
        lines.append(f"\n## {(labels or {}).get(pid, 'pid')} {pid} {st.name if st else '(gone)'}")
        for tid in process.list_tasks(pid, proc) or [pid]:
            ts = process.read_task_stat(pid, tid, proc=proc)
            call = process.read_syscall(pid, tid, proc=proc)
            text, why = process.read_stack(pid, tid, proc=proc)
            callname = None
            if call is not None:
                callname = "running" if call.running else (process.syscall_name(call.nr) or call.nr)
            lines.append(f"### tid {tid} state {ts.state if ts else '?'} wchan {process.read_wchan(pid, tid, proc=proc)}"
                         f" syscall {callname if callname is not None else '?'}")
            lines.append(text.rstrip() if text else f"(stack unreadable: {why})")
    run.add_file(rel, ("\n".join(lines) + "\n").encode(), kind="stacks")
    return rel

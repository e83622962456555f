"""The text of a tracefs trace_pipe, parsed into events (pure).

One line per event, `COMM-TID [CPU] FLAGS SECONDS: NAME: FIELDS`; a `<stack trace>` event is
followed by ` => frame` lines; `CPU:N [LOST M EVENTS]` says the ring overwrote M events.
Only the fields the budget needs are taken from each event's text.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Iterable, Iterator

__all__ = ["Event", "LineParser", "parse_lines", "parse_text"]

_HEAD = re.compile(r"^\s*(.+)-(\d+)\s+(?:\(\s*[-\d]+\)\s+)?\[(\d+)\]\s+(\S+\s+)?(\d+\.\d+): (.*)$")
_LOST = re.compile(r"^CPU:(\d+) \[LOST (\d+) EVENTS\]")
_SWITCH = re.compile(r"prev_pid=(-?\d+) prev_prio=\S+ prev_state=(\S+) ==> next_comm=.* next_pid=(-?\d+) next_prio=")
_WAKE = re.compile(r" pid=(\d+) prio=")
_RQ_ISSUE = re.compile(r"^(\d+),(\d+) (\S+) (\d+) \(.*?\) (\d+) \+ (\d+)")
_RQ_DONE = re.compile(r"^(\d+),(\d+) (\S+) \(.*?\) (\d+) \+ (\d+)")
_BIO = re.compile(r"^(\d+),(\d+) (\S+) (\d+) \+ (\d+)")
_NUM = re.compile(r"(\w+)=(-?\d+)")


@dataclass
class Event:
    """One trace event: when (seconds, the instance's clock), where, whose context, what."""
    ts: float
    cpu: int
    pid: int                      # the context's thread id (common_pid)
    name: str                     # 'sched_switch', 'block_rq_issue', ..., 'stack', 'lost'
    args: dict = field(default_factory=dict)


def _fields(name: str, body: str) -> dict | None:
    if name == "sched_switch":
        m = _SWITCH.search(body)
        return {"prev": int(m.group(1)), "state": m.group(2), "next": int(m.group(3))} if m else None
    if name in ("sched_wakeup", "sched_wakeup_new", "sched_waking"):
        m = _WAKE.search(body)
        return {"tid": int(m.group(1))} if m else None
    if name == "block_rq_issue":
        m = _RQ_ISSUE.match(body)
        return {"dev": f"{m.group(1)}:{m.group(2)}", "rwbs": m.group(3), "sector": int(m.group(5)),
                "bytes": int(m.group(6)) * 512} if m else None
    if name == "block_rq_complete":
        m = _RQ_DONE.match(body)
        return {"dev": f"{m.group(1)}:{m.group(2)}", "rwbs": m.group(3), "sector": int(m.group(4)),
                "bytes": int(m.group(5)) * 512} if m else None
    if name == "block_bio_queue":
        m = _BIO.match(body)
        return {"dev": f"{m.group(1)}:{m.group(2)}", "rwbs": m.group(3), "sector": int(m.group(4)),
                "bytes": int(m.group(5)) * 512} if m else None
    if name == "nvidia_dev_xid":
        nums = dict(_NUM.findall(body))
        return {"text": body.strip()[:200], **{k: int(v) for k, v in nums.items()}}
    return {"text": body.strip()[:120]} if body.strip() else {}


def _split_head(line: str) -> tuple[str, str, str, str] | None:
    """The common case without a regular expression (a third of the cost): tid, cpu, ts, rest."""
    head, sep, rest = line.partition(": ")
    lb = head.rfind(" [")
    if not sep or lb < 0:
        return None
    rb = head.find("]", lb)
    task = head[:lb].rstrip()
    dash = task.rfind("-")
    ts = head[rb + 1:].rsplit(None, 1)
    if rb < 0 or dash < 0 or not ts or not task[dash + 1:].isdigit():
        return None
    return task[dash + 1:], head[lb + 2:rb], ts[-1], rest


class LineParser:
    """Lines in, events out; a stack's frames become one 'stack' event when the next event begins."""

    def __init__(self):
        self._stack: Event | None = None
        self.unparsed = 0

    def feed(self, line: str) -> Iterator[Event]:
        if line.startswith(" => "):
            if self._stack is not None:
                self._stack.args["frames"].append(line[4:].strip())
            return
        if self._stack is not None:
            yield self._stack
            self._stack = None
        if not line.strip() or line.startswith("#"):
            return
        head = _split_head(line)
        if head is None:
            m = _HEAD.match(line)
            if m is None:
                lost = _LOST.match(line)
                if lost:
                    yield Event(0.0, int(lost.group(1)), 0, "lost", {"n": int(lost.group(2))})
                else:
                    self.unparsed += 1
                return
            head = (m.group(2), m.group(3), m.group(5), m.group(6))
        tid, cpu, ts, rest = head
        if rest.startswith("<stack trace>"):
            self._stack = Event(float(ts), int(cpu), int(tid), "stack", {"frames": []})
            return
        name, _, body = rest.partition(": ")
        name = name.rstrip(":")
        args = _fields(name, body)
        if args is None:
            self.unparsed += 1
            return
        yield Event(float(ts), int(cpu), int(tid), name, args)

    def flush(self) -> Iterator[Event]:
        if self._stack is not None:
            yield self._stack
            self._stack = None


def parse_lines(lines: Iterable[str]) -> list[Event]:
    """Every event of a trace's lines, in their order.

    >>> parse_lines(["  cat-42 [001] ..... 10.500000: sched_wakeup: comm=cat pid=42 prio=120 target_cpu=001"])[0].args
    {'tid': 42}
    """
    p = LineParser()
    out = [e for line in lines for e in p.feed(line)]
    out.extend(p.flush())
    return out


def parse_text(text: str) -> list[Event]:
    return parse_lines(text.splitlines())

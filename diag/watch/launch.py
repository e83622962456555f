"""`hostpin watch -- CMD ARGS...`: run a launcher's command under the watch, unchanged.

CMD runs as hostpin's child in its own process group, with hostpin's stdin, stdout and
stderr; signals sent to hostpin (SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2,
SIGWINCH, SIGCONT) are passed to that group once, and at a terminal CMD's group gets the
foreground, so Ctrl-C reaches it directly. hostpin exits with CMD's exit code, 128+N when a
signal N ended it. While CMD lives, its whole process tree is sampled; every pin phase in
any of its threads gets its own tracker, and so does the load around the pins (a copy from
swap, a file read, an allocation in a process's own faults: diag.watch.load); one that lasts
longer than a few seconds gets a line on stderr every --heartbeat seconds. Its JSON goes to
--json-file only: stdout and stderr are CMD's. The run directory keeps CMD's whole life. The
watch only reads: it never signals CMD except to pass on a signal sent to hostpin.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Callable

from ..evidence import RunDir
from ..exitcodes import EXIT_CMD_NOT_EXECUTABLE, EXIT_CMD_NOT_FOUND
from ..facts import node_facts
from ..rootfs import Root
from .attach import Clock, Stalls, WatchOptions, finish_result, load_progress, nvidia_loaded, region_wants
from .book import PhaseBook
from .load import LoadBook
from .render import heartbeat_line
from .result import WatchResult
from .sampler import Sampler, descendants
from .timeline import TimelineWriter, write_stacks
from .traced import finish_trace, start_trace

__all__ = ["run_command", "FORWARDED", "TREE_EVERY_S", "IDLE_EVERY_S"]

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
             signal.SIGWINCH, signal.SIGCONT)
TREE_EVERY_S = 2.0   # how often CMD's process tree is looked up again (one pass over /proc)
IDLE_EVERY_S = 60.0  # outside pin phases, one timeline line per minute keeps a long life small


def _foreground(pgid: int) -> int | None:
    """Give CMD's group the terminal, as a shell would; the previous owner, or None."""
    try:
        fd = sys.stdin.fileno()
        if not os.isatty(fd) or os.tcgetpgrp(fd) != os.getpgrp():
            return None
        old = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
        try:
            os.tcsetpgrp(fd, pgid)
        finally:
            signal.signal(signal.SIGTTOU, old)
        return os.getpgrp()
    except (OSError, ValueError):
        return None


def _take_back(pgid: int | None) -> None:
    if pgid is None:
        return
    old = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    try:
        os.tcsetpgrp(sys.stdin.fileno(), pgid)
    except (OSError, ValueError):
        pass
    finally:
        signal.signal(signal.SIGTTOU, old)


def _exited(child: subprocess.Popen) -> bool:
    """Whether CMD has ended, left unreaped (a zombie whose /proc still tells how it ended)."""
    try:
        return os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return child.poll() is not None
    except InterruptedError:
        return False


def run_command(argv: list[str], opts: WatchOptions, run: RunDir, heartbeat: Callable[[str], None],
                root: Root | None = None, umask: int | None = None) -> WatchResult:
    """CMD's life under the watch; umask: the one hostpin was started with, which CMD gets back
    (hostpin's own files are private, CMD's are CMD's business)."""
    root = root or Root("/")
    result = WatchResult(mode="command", pid=None, argv=list(argv), size_bytes=opts.size_bytes,
                         interval_s=opts.interval, run_dir=str(run.path))
    clock = Clock()
    sampler = Sampler(root)
    result.facts = node_facts(Root(root.path, run=run))
    received: list[int] = []
    target: list[int] = []  # CMD's pid once it runs: a signal that comes before is passed on right after

    def forward(signum, frame):
        received.append(signum)
        if not target:
            return
        try:
            os.killpg(target[0], signum)
        except ProcessLookupError:
            pass

    # passed on from before CMD starts: CMD may print (a launcher's "ready") and be signalled at once
    old = {s: signal.signal(s, forward) for s in FORWARDED}
    try:
        keep = {} if umask is None else {"umask": umask}
        child = subprocess.Popen(argv, process_group=0, **keep) if sys.version_info >= (3, 11) else \
            subprocess.Popen(argv, preexec_fn=lambda: os.setpgid(0, 0), **keep)
    except (FileNotFoundError, PermissionError, OSError) as exc:
        for s_, h in old.items():
            signal.signal(s_, h)
        if isinstance(exc, FileNotFoundError):
            result.outcome, result.exit_code = "gone", EXIT_CMD_NOT_FOUND
            result.verdict = f"{argv[0]}: command not found"
        else:
            result.outcome, result.exit_code = "gone", EXIT_CMD_NOT_EXECUTABLE
            result.verdict = f"{argv[0]}: cannot run it: {exc.strerror or exc}"
        return result
    target.append(child.pid)
    for signum in list(received):  # what came while it was being started
        try:
            os.killpg(child.pid, signum)
        except ProcessLookupError:
            pass
    result.pid = child.pid
    tracer = start_trace(run, [child.pid], clock.t0, result.notes) if opts.trace else None
    owner = _foreground(child.pid)
    book = PhaseBook(opts.size_bytes, sampler.page, nvidia=nvidia_loaded(root), interval_s=opts.interval)
    load = LoadBook(sampler.page, interval_s=opts.interval)
    writer = TimelineWriter(run)
    stalls = Stalls(run, opts.stall_after, sampler.proc)
    tree: list[int] = [child.pid]
    tree_at = last_line = -1e9
    said: dict[tuple[int, int], float] = {}
    samples = 0
    try:
        next_tick = time.monotonic()
        while True:
            t = clock.now()
            if t - tree_at >= TREE_EVERY_S:
                tree, tree_at = descendants(root, child.pid), t
                if tracer is not None:
                    tracer.follow(tree)
            s = sampler.sample(t, tree, book.active_tids(), region_wants(book, load))
            samples += 1
            started, ended = book.update(s)
            for ph in ended:
                tr = next((tr for p, tr in book.closed if p is ph), None)
                load.pin_ended(ph.pid, ph.ended_t, tr.expected * tr.page if tr is not None and tr.expected else None)
            lstarted, lended = load.update(s, pinning=book.pinning())
            prog = book.progress() or load_progress(load)
            s["progress"] = prog or {"phase": "run"}
            if book.open or load.open or started or ended or lstarted or lended or t - last_line >= IDLE_EVERY_S:
                writer.write(s, keep={tid for tids in book.active_tids().values() for tid in tids})
                last_line = t
            stalls.check(book, t, lambda e: heartbeat(
                f"hostpin: pid {e['pid']} no progress for {e['quiet_s']:.0f} s inside a pin (bound {e['bound']}); "
                f"stacks kept in {run.path / e['stacks']}"))
            for (pid, tid), (ph, tr) in book.open.items():
                age = t - ph.started_t
                if age >= opts.quiet_s and t - said.get((pid, tid), -1e9) >= opts.heartbeat and tr.progress:
                    said[(pid, tid)] = t
                    heartbeat(heartbeat_line(pid, tr.progress, sampler.page))
            for pid, (lph, ltr) in load.open.items():
                age = t - lph.started_t
                if age >= opts.quiet_s and t - said.get((pid, -1), -1e9) >= opts.heartbeat and ltr.progress:
                    said[(pid, -1)] = t
                    heartbeat(heartbeat_line(pid, dict(ltr.progress, phase=lph.kind), sampler.page))
            for ph in ended:
                if (ph.pid, ph.tid) in said:
                    done = next(r for r in book.results() if r.pid == ph.pid and r.tid == ph.tid
                                and r.started_s == round(ph.started_t, 3))
                    heartbeat(f"hostpin: pid {ph.pid} pin {done.outcome} after {done.seconds:.1f} s, bound "
                              f"{done.bound or 'unknown'}")
            if _exited(child):
                break
            next_tick += opts.interval
            delay = next_tick - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            else:
                next_tick = time.monotonic()
        # one last look, CMD still a zombie: the phases of processes that ended close as they ended
        # (killed by a signal: exited inside the pin; by an exit code: the pin had returned)
        s = sampler.sample(clock.now(), tree, book.active_tids())
        book.update(s)
        writer.write(dict(s, progress={"phase": "end"}))
    finally:
        for s_, h in old.items():
            signal.signal(s_, h)
        _take_back(owner)
        writer.close()
        if tracer is not None:
            tracer.stop()
    rc = child.wait()
    if book.open:  # CMD ended while a thread was in a pin: close it as it stands
        result.stacks.append(write_stacks(run, "stacks-open-phases.txt", [p for p, _ in book.open], "at the end",
                                          proc=sampler.proc))
    result.command_exit = {"returncode": rc if rc >= 0 else None, "signal": -rc if rc < 0 else None,
                           "signals_passed": [signal.Signals(x).name for x in received]}
    result.exit_code = rc if rc >= 0 else 128 - rc
    result.outcome = "command"
    result.stalls = stalls.events
    finish_result(result, book, sampler, clock, samples, load)
    finish_trace(tracer, result)
    return result

"""`hostpin watch`: the command line of the watch (registered into diag's group by diag.cli)."""
from __future__ import annotations

import json
import signal

import click

from .. import cliopts
from ..cliopts import SIZE, FiniteRange, json_option, open_run, out_option, unwritten_exit
from ..exitcodes import EXIT_INTERRUPTED
from ..units import SIZE_EXAMPLE

__all__ = ["watch"]


class _Heartbeat:
    """--heartbeat lines for --pid, where the launcher form has them built in."""

    def __init__(self, every: float, pid: int):
        from .render import heartbeat_line
        self.every, self.pid, self.line = every, pid, heartbeat_line
        self._last = -1e9

    def __call__(self, prog: dict) -> None:
        t = prog.get("elapsed_s") or 0.0
        if t - self._last >= self.every:
            self._last = t
            click.echo(self.line(self.pid, prog), err=True)


@click.command("watch", context_settings={"allow_interspersed_args": False})
@click.option("--pid", type=click.IntRange(min=1), default=None,
              help="Attach to this process (read-only: it is never signalled, traced or stopped).")
@click.option("--size", type=SIZE, default=None,
              help=f"Bytes the pin covers, one call of one process ({SIZE_EXAMPLE}); for percent done and the ETA "
                   "where the process itself does not show the total.")
@click.option("--interval", type=FiniteRange(min=0.05, max=10), default=0.5, show_default=True,
              help="Seconds between samples.")
@click.option("--deadline", type=FiniteRange(min=1), default=None,
              help="Stop watching after this many seconds (default: when the pin returns or the process exits).")
@click.option("--stall-after", type=FiniteRange(min=0.5), default=120.0, show_default=True,
              help="No progress for this long inside a pin: every thread's stack is kept and a line printed "
                   "(the process is left alone).")
@click.option("--heartbeat", type=FiniteRange(min=0.5), default=None,
              help="Seconds between stderr lines during a pin phase (launcher form: default 30; --pid: off, a "
                   "terminal gets a live line instead).")
@click.option("--trace", "trace", is_flag=True,
              help="Measure where each pin phase's time goes inside the kernel (tracefs; root): phases[].time_budget.")
@json_option
@out_option
@click.argument("command", nargs=-1, type=click.UNPROCESSED, metavar="[-- CMD ARGS...]")
def watch(pid, size, interval, deadline, stall_after, heartbeat, trace, as_json, out, command):
    """Name the cause of a pin while it happens: attach to a process, or run a command under the watch.

    \b
    hostpin watch --pid 4711 --size 47GiB     a process that is pinning now
    hostpin watch -- python serve.py ...      a launcher's command, unchanged

    Prints whether the pin progresses, what it waits on (the bound, with the evidence behind
    it) and when it will finish. Without --size the ETA comes from what the process shows (a
    swap-in bound: the pages still in its VmSwap at its swap-in rate); where nothing tells the
    total it says "ETA needs --size". Kernel stacks need root. Evidence: timeline.jsonl,
    stacks-*.txt and result.json in a run directory.

    \b
    --pid exit codes: 0 the pin returned; 1 the watch ended first (deadline, the process
    exited or was killed inside the pin, or no pin was seen); 2 bad command line; 3 nothing
    to watch (no such process, a zombie, or a kernel thread, which has no user memory and
    cannot pin), or the pin returned but its evidence could not be kept; 130 interrupted.
    Launcher exit codes: CMD's own, 128+N when signal N ended it, 127 CMD not found, 126
    CMD cannot be run; evidence that could not be kept is a warning, never another code.
    """
    from .attach import WatchOptions
    from ..resultbase import write_result
    from .render import ProgressLine, render_watch

    if (pid is None) == (not command):
        raise click.UsageError("give either --pid PID or a command after --, e.g. hostpin watch --pid 4711 or "
                               "hostpin watch -- python serve.py")
    if trace:
        from .traced import refuse_trace_without_root
        refuse_trace_without_root()
    opts = WatchOptions(size_bytes=size, interval=interval, deadline=deadline, stall_after=stall_after,
                        heartbeat=heartbeat or 30.0, trace=trace)
    # CMD's life and exit code come first: a run directory that cannot be made, or a disk that
    # fills while CMD runs, loses the evidence (a warning on stderr), never CMD
    run = open_run(out, "watch", durable=True, keep_going=True)
    old = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        if pid is not None:
            from .attach import watch_pid
            bar = ProgressLine(page=_page())
            tick = _Heartbeat(heartbeat, pid) if heartbeat else bar
            result = watch_pid(pid, opts, run, on_progress=tick)
            bar.done()
        else:
            signal.signal(signal.SIGTERM, old)  # the launcher passes SIGTERM on to CMD instead
            from .launch import run_command
            cliopts.COMMAND_EXIT = True  # the exit code is CMD's, whatever could not be written
            result = run_command(list(command), opts, run, heartbeat=lambda line: click.echo(line, err=True),
                                 umask=cliopts.CALLER_UMASK)
    finally:
        signal.signal(signal.SIGTERM, old)
    data = write_result(run, result)
    where = f"evidence: {run.path}" if run.lost is None else f"the evidence could not be kept: {run.lost}"
    if run.lost is not None and pid is not None:  # decided first: 1 stays 1, a pin that returned becomes 3
        result.exit_code = unwritten_exit(result.exit_code)
        data["exit_code"] = result.exit_code
    if pid is None:
        click.echo(f"hostpin: {result.verdict} ({where})", err=True)
        if as_json:
            click.echo(json.dumps(data, indent=2, default=str))
    else:
        click.echo(json.dumps(data, indent=2, default=str) if as_json else render_watch(result))
        if run.lost is not None:
            click.echo(f"hostpin: error: {where}", err=True)
    return result.exit_code if result.outcome != "interrupted" else EXIT_INTERRUPTED


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def _page() -> int:
    from ..pagesize import live_page_size
    return live_page_size()

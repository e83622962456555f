"""`hostpin watch`: the command line of the watch (registered into diag's group by diag.cli)."""
from __future__ import annotations

import json
import signal
import time

import click

from .. import cliopts
from ..cliopts import SIZE, FiniteRange, InputError, json_option, json_to_file, open_run, out_option, unwritten_exit
from ..exitcodes import EXIT_INTERRUPTED
from ..units import SIZE_EXAMPLE
from .attach import QUIET_AFTER_S

__all__ = ["watch"]


class _Heartbeat:
    """--heartbeat lines for --pid, where the launcher form has them built in."""

    def __init__(self, every: float, pid: int, page: int = 4096):
        from .render import heartbeat_line
        self.every, self.pid, self.line, self.page = every, pid, heartbeat_line, page
        self._last = -1e9

    def __call__(self, prog: dict) -> None:
        # the watch's clock, not the phase's elapsed time: that starts again at each phase, and a
        # line was then owed until the new phase had run as long as the old one
        t = time.monotonic()
        if t - self._last >= self.every:
            self._last = t
            click.echo(self.line(self.pid, prog, self.page), err=True)  # the node's page size, not 4 KiB


@click.command("watch", context_settings={"allow_interspersed_args": False})
@click.option("--pid", type=click.IntRange(min=1), default=None,
              help="Attach to this process (read-only: it is never signalled, traced or stopped).")
@click.option("--size", type=SIZE, default=None,
              help=f"Bytes the pin covers, one call of one process ({SIZE_EXAMPLE}); for percent done and the ETA "
                   "where the process itself does not show the total.")
@click.option("--interval", type=FiniteRange(min=0.05, max=10), default=0.5, show_default=True,
              help="Seconds between samples.")
@click.option("--deadline", type=FiniteRange(min=1), default=None,
              help="Stop watching after this many seconds (default: when the process is quiet or exits).")
@click.option("--until", type=click.Choice(["quiet", "pin"]), default="quiet", show_default=True,
              help="--pid: follow the whole load (pins, and the copies, reads and allocations around them) until "
                   "the process is quiet; or stop when the first pin returns (pin).")
@click.option("--quiet-after", type=FiniteRange(min=0.5), default=QUIET_AFTER_S, show_default=True,
              metavar="SECONDS",
              help="--pid --until quiet: end after this many seconds with no pin, swap-in, file read or memory "
                   "growth.")
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
def watch(pid, size, interval, deadline, until, quiet_after, stall_after, heartbeat, trace, as_json, out, command):
    """Name the cause of a pin while it happens: attach to a process, or run a command under the watch.

    \b
    hostpin watch --pid 4711 --size 47GiB     a process that is pinning now
    hostpin watch -- python serve.py ...      a launcher's command, unchanged

    Prints whether the pin progresses, what it waits on (the bound, with the evidence behind
    it) and when it will finish. Without --size the ETA comes from what the process shows (a
    swap-in bound: the pages still in its VmSwap at its swap-in rate); where nothing tells the
    total it says "ETA needs --size". Kernel stacks need root. Evidence: timeline.jsonl,
    stacks-*.txt and result.json in a run directory.

    After a pin returns, --pid keeps following the process while it is busy with memory in
    its own faults (copy-from-swap, file-read, alloc: phases that are not pins, each with
    its bound and ETA) and ends when it has been quiet for --quiet-after seconds.

    \b
    --pid exit codes: 0 every pin returned and the process went quiet or exited (--until
    pin: the pin returned); 1 the watch ended first (deadline, the process exited or was
    killed inside a pin, or nothing was seen); 2 bad command line; 3 nothing to watch (no
    such process, a zombie, or a kernel thread, which cannot pin), the outcome is unknown
    (the process vanished between two samples inside a pin), or the pins returned but the
    evidence could not be kept; 130 interrupted.
    Launcher exit codes: CMD's own, 128+N when signal N ended it, 127 CMD not found, 126
    CMD cannot be run; evidence that could not be kept is a warning, never another code. The
    launcher form leaves stdout and stderr to CMD: its JSON goes to --json-file.
    """
    from .attach import WatchOptions
    from ..resultbase import write_result
    from .render import ProgressLine, render_watch

    if (pid is None) == (not command):
        raise click.UsageError("give either --pid PID or a command after --, e.g. hostpin watch --pid 4711 or "
                               "hostpin watch -- python serve.py")
    from click.core import ParameterSource
    ctx = click.get_current_context()
    given = [f"--{n.replace('_', '-')}" for n in ("until", "quiet_after")
             if ctx.get_parameter_source(n) == ParameterSource.COMMANDLINE]
    if command and given:  # the launcher form watches CMD's whole life: these would be silently ignored
        verb = "go" if len(given) > 1 else "goes"
        raise click.UsageError(f"{' and '.join(given)} {verb} with --pid: the launcher form watches CMD until it ends")
    if until == "pin" and "--quiet-after" in given:
        raise click.UsageError("--quiet-after goes with --until quiet: --until pin ends when the first pin returns")
    if command and as_json:
        raise click.UsageError("--json would mix hostpin's JSON into CMD's stdout; write it to a file with "
                               "--json-file PATH")
    if trace:
        from .traced import refuse_trace_without_root
        refuse_trace_without_root()
    opts = WatchOptions(size_bytes=size, interval=interval, deadline=deadline, stall_after=stall_after,
                        heartbeat=heartbeat or 30.0, until=until, quiet_after=quiet_after, trace=trace)
    # CMD's life and exit code come first: a run directory that cannot be made, or a disk that
    # fills while CMD runs, loses the evidence (a warning on stderr), never CMD
    run = open_run(out, "watch", durable=True, keep_going=True)
    old = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        if pid is not None:
            from .attach import watch_pid
            page = _page()
            bar = ProgressLine(page=page)
            tick = _Heartbeat(heartbeat, pid, page) if heartbeat else bar
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
    try:
        json_to_file(data)
    except InputError as exc:  # the same rule; the launcher form keeps CMD's code and warns
        click.echo(f"hostpin: warning: {exc}" if pid is None else f"hostpin: error: {exc}", err=True)
        if pid is not None:
            result.exit_code = unwritten_exit(result.exit_code)
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

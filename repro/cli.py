"""The `hostpin` console command: diag's verbs plus the `repro` group.

Errors at the command line are one line on stderr with exit code 2; domain errors are
click exceptions with a clear message and the exit code of diag/exitcodes.py; nothing prints
a traceback to a user, not even a Ctrl-C while the command is still starting up.
"""
from __future__ import annotations

import os
import signal
import sys


def _interrupted_at_start_up(signum, frame):  # nothing is set up yet but the probe's child: kill it
    cancel = getattr(sys.modules.get("diag.cuda"), "cancel_early", None)  # None while it is still importing
    if cancel is not None:
        cancel()
    os.write(2, b"hostpin: interrupted\n")
    os._exit(130)


if __name__ == "__main__" or os.path.basename(sys.argv[0]) == "hostpin":
    signal.signal(signal.SIGINT, _interrupted_at_start_up)
    signal.signal(signal.SIGTERM, _interrupted_at_start_up)
    signal.signal(signal.SIGHUP, _interrupted_at_start_up)
    from diag.cuda import start_early  # light (json, os, threading): the probe's child starts before click
    start_early(sys.argv[1:])

import click  # noqa: E402

from diag import cliopts  # noqa: E402
from diag.cli import cli  # noqa: E402
from diag.cliopts import (RANKS, RATE, SIZE, FiniteRange, GuardedStream, InputError, check_margin,  # noqa: E402
                          evidence_exit, json_errors, json_option, json_to_file, open_run, out_option, unexpected)
from diag.exitcodes import EXIT_INTERRUPTED, EXIT_OK, EXIT_UNEVALUATED, EXIT_USAGE  # noqa: E402
from diag.safetext import guarded_output  # noqa: E402
from diag.units import SIZE_EXAMPLE  # noqa: E402

__all__ = ["main", "cli"]


@cli.group()
def repro():
    """Reproduce pinning stalls and failures for real, under a watchdog (acts on the node)."""


@repro.command("register")
@click.option("--size", type=SIZE, required=True, help=f"Bytes to pin per rank ({SIZE_EXAMPLE}).")
@click.option("--method", type=click.Choice(["register", "hostalloc", "mlock", "pin_memory"]), default="register",
              show_default=True,
              help="cudaHostRegister of a mapped region, cudaHostAlloc, or mlock (no GPU; the same kernel fault path). "
                   "With --allocator torch: hostalloc is torch.empty(SIZE, pin_memory=True), register is "
                   "torch.cuda.cudart().cudaHostRegister of a tensor's storage, pin_memory is Tensor.pin_memory() "
                   "of the region.")
@click.option("--allocator", type=click.Choice(["cuda", "torch"]), default="cuda", show_default=True,
              help="Pin with cuda-bindings (cuda), or through PyTorch in the child (torch; catalog 18).")
@click.option("--python", "python", type=click.Path(dir_okay=False), default=None,
              help="With --allocator torch: the interpreter the child runs under, the launcher's (default: "
                   "hostpin's own); it must import torch.")
@click.option("--register-flags", type=click.Choice(["default", "readonly", "portable", "mapped"]), default="default",
              show_default=True, help="cudaHostRegister flags (register only).")
@click.option("--source", default="anon", show_default=True, metavar="anon|shm|file:PATH",
              help="What backs the region: anonymous memory, a /dev/shm file, or a file on disk.")
@click.option("--map", "map_", type=click.Choice(["private", "shared"]), default="private", show_default=True)
@click.option("--thp/--no-thp", default=None, help="madvise(MADV_HUGEPAGE) or (MADV_NOHUGEPAGE); default: neither.")
@click.option("--prefault/--no-prefault", default=True, show_default=True,
              help="Touch every page before pinning (parallel MADV_POPULATE_WRITE).")
@click.option("--chunk", type=SIZE, default=None, help="Pin in calls of this size (the 512 GiB workaround).")
@click.option("--ranks", type=RANKS, default=1, show_default=True, help="Children pinning their own region at once.")
@click.option("--swap-out", type=SIZE, default=None,
              help="Push this much of the region into swap for real before pinning (memory cgroup limit).")
@click.option("--swap-in-rate", type=RATE, default=None,
              help="Throttle reads from the swap device for the pinning child, e.g. 11MB/s (v1 blkio, v2 io.max).")
@click.option("--read-rate", type=RATE, default=None,
              help="Throttle reads from the device behind the region for the child: the file's disk for "
                   "--source file:PATH (its page cache is dropped first, so the pin reads it), the swap device "
                   "for a region in swap; e.g. 16MB/s.")
@click.option("--make-swap", type=SIZE, default=None,
              help="Create a temporary swap file of this size for the run (at least 40 KiB).")
@click.option("--swap-dir", type=click.Path(file_okay=False), default="/var/tmp", show_default=True,
              help="Where --make-swap puts its file (a disk file system: ext4, xfs).")
@click.option("--deadline", type=FiniteRange(min=1), default=1800.0, show_default=True,
              help="Hard limit in seconds for the whole run: stacks are captured, then the child is killed.")
@click.option("--stall-after", type=FiniteRange(min=0.5), default=120.0, show_default=True,
              help="No progress for this long = stalled (stacks captured, child killed).")
@click.option("--interval", type=FiniteRange(min=0.05, max=10), default=0.5, show_default=True,
              help="Watchdog sampling interval in seconds.")
@click.option("--margin", default="5%", show_default=True, help="Memory that must stay free (refusal threshold).")
@click.option("--force", is_flag=True, help="Run even when the headroom check says the node cannot take it.")
@click.option("--ignore-leftovers", is_flag=True,
              help="Run even beside swap files, cgroups or throttles left by killed runs "
                   "(see `hostpin repro cleanup`).")
@click.option("--device", type=click.IntRange(min=0), default=None,
              help="CUDA device of every rank (default: rank i uses GPU i, as preflight assumes; ranks past the "
                   "last GPU wrap round, so on a one-GPU node all share GPU 0).")
@click.option("--devices", "devices", default=None, metavar="0,1",
              help="Each rank's CUDA device, one per --ranks (a single one: every rank's); not with --device.")
@click.option("--trace", "trace", is_flag=True,
              help="Measure where the pin's time goes inside the kernel (tracefs; root): time_budget in the result.")
@click.option("--no-calibrate", is_flag=True, help="Skip measuring this node's clean rate first (256 MiB).")
@click.option("--register-twice", is_flag=True, help="Register the first chunk a second time (catalog 10).")
@click.option("--prefault-threads", type=click.IntRange(min=1, max=256), default=None,
              help="Threads for the prefault (default: CPUs, at most 16).")
@click.option("--matrix", is_flag=True, help="Run methods x THP x prefault at this size and print one table.")
@json_option
@out_option
@json_errors("repro register")
def register_cmd(size, method, allocator, python, register_flags, source, map_, thp, prefault, chunk, ranks, swap_out, swap_in_rate,
                 read_rate, make_swap, swap_dir, deadline, stall_after, interval, margin, force, ignore_leftovers,
                 device, devices, no_calibrate, register_twice, prefault_threads, matrix, as_json, out, trace=False):
    """Pin SIZE for real in a child process while a watchdog (diag.watch) shows where the time goes.

    \b
    Outcomes: completed, slow, failed (CUDA error and catalog entry), stalled, killed
    (deadline), unkillable, refused (not enough headroom; --force), interrupted.
    Exit code 0: completed or slow; 1: failed, stalled, killed, unkillable; 3: no GPU for a
    CUDA method, or the run could not be set up; 4: refused (headroom; leftovers of killed runs:
    `hostpin repro cleanup`); 130: interrupted. Everything set up is removed on every exit.
    An existing --source file:PATH is only ever mapped read-only (registered read-only); a new
    path is created by the run and removed afterwards.
    """
    import json as _json

    from .register import ReproError, ReproOptions, ReproUsageError, run_repro, validate
    from .render import ProgressLine, render_result

    if not (source in ("anon", "shm", "uffd") or (source.startswith("file:") and len(source) > 5)):
        raise click.BadParameter(f"{source!r} is not a source; use anon, shm or file:PATH, e.g. file:/data/table.bin",
                                 param_hint="'--source'")
    check_margin(None, None, margin)
    if make_swap is not None:
        from .swapfile import MIN_PAGES, PAGE
        if make_swap < MIN_PAGES * PAGE:
            raise click.BadParameter(f"{make_swap} bytes is smaller than a swap area can be; use at least "
                                     f"{MIN_PAGES * PAGE // 1024}KiB, e.g. --make-swap 1GiB",
                                     param_hint="'--make-swap'")
        if not os.path.isdir(swap_dir):
            raise click.BadParameter(f"{swap_dir!r} is not a directory; give an existing directory on a disk file "
                                     "system (ext4, xfs), e.g. --swap-dir /var/tmp", param_hint="'--swap-dir'")
        from .swapfile import swap_dir_problem
        why = swap_dir_problem(swap_dir)
        if why:
            raise click.BadParameter(why, param_hint="'--swap-dir'")
    if devices is not None:
        from diag.placement import parse_devices
        try:
            devices = parse_devices(devices)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="'--devices'")
        if matrix and len(devices) > 1:
            raise click.BadParameter("--matrix runs one rank per case: give it one device", param_hint="'--devices'")
    torch_call = None
    if allocator == "torch":
        if method == "mlock":
            raise click.BadParameter("--allocator torch pins through PyTorch: use hostalloc, register or pin_memory",
                                     param_hint="'--method'")
        torch_call = {"hostalloc": "empty", "register": "register", "pin_memory": "pin_memory"}[method]
        method = "hostalloc" if method == "pin_memory" else method
        if matrix:
            raise click.BadParameter("--matrix runs the cuda-bindings methods; give one --method with --allocator "
                                     "torch", param_hint="'--matrix'")
    elif method == "pin_memory":
        raise click.BadParameter("pin_memory is PyTorch's: give --allocator torch", param_hint="'--method'")
    elif python is not None:
        raise click.BadParameter("--python goes with --allocator torch", param_hint="'--python'")
    if python is not None and not os.access(python, os.X_OK):
        import shutil
        found = shutil.which(python) if "/" not in python else None  # a name, as a shell would look it up
        example = f"its path: {found}" if found else "e.g. /opt/venv/bin/python"
        raise click.BadParameter(f"{python!r} is not an executable file; give the launcher's interpreter, "
                                 f"{example}", param_hint="'--python'")
    opts = ReproOptions(size=size, method=method, register_flags=register_flags, source=source, map=map_, thp=thp,
                        prefault=prefault, chunk=chunk, ranks=ranks, swap_out=swap_out, swap_in_rate=swap_in_rate,
                        read_rate=read_rate, make_swap=make_swap, swap_dir=swap_dir, deadline=deadline, stall_after=stall_after,
                        interval=interval, force=force, device=device, devices=devices, calibrate=not no_calibrate,
                        register_twice=register_twice, margin=margin, ignore_leftovers=ignore_leftovers,
                        allocator=allocator, torch_call=torch_call, python=python,
                        trace=trace)
    if trace:
        from diag.watch.traced import refuse_trace_without_root
        refuse_trace_without_root()
    if prefault_threads:
        opts.prefault_threads = prefault_threads
    try:
        validate(opts)
    except ReproUsageError as exc:
        raise click.UsageError(str(exc))
    run = open_run(out, "repro-register", durable=True)
    if matrix:
        from .matrix import run_matrix
        from .render import render_matrix
        result = run_matrix(opts, run)
        run.finish(result)
        json_to_file(result)
        click.echo(_json.dumps(result, indent=2, default=str) if as_json else render_matrix(result["rows"], size, str(run.path)))
        return evidence_exit(run, result["exit_code"])
    from diag.results import ReproRegisterResult, write_result

    from .outcome import build_result
    bar = ProgressLine()
    try:
        result = build_result(run_repro(opts, run, on_tick=bar))
    except ReproError as exc:
        bar.done()
        data = write_result(run, ReproRegisterResult(outcome="unevaluated", error=str(exc), exit_code=EXIT_UNEVALUATED,
                                                     verdict=f"not run: {exc}", run_dir=str(run.path)))
        err = InputError(f"{exc} (evidence: {run.path})")
        json_to_file(data)
        if as_json:
            click.echo(_json.dumps(data, indent=2, default=str))
            err.json_printed = True  # the typed result was the answer; json_errors prints nothing more
        raise err from None
    bar.done()
    data = write_result(run, result)
    json_to_file(data)
    click.echo(_json.dumps(data, indent=2, default=str) if as_json else render_result(result))
    return evidence_exit(run, result.exit_code)


@repro.command("staging")
@click.option("--device", type=click.IntRange(min=0), default=0, show_default=True, help="CUDA device.")
@click.option("--sides", "sides_text", default="pageable,pinned,control", show_default=True,
              metavar="pageable,pinned,control",
              help="Which bursts to run, in one sequence: copies from pageable buffers, from pinned buffers, and "
                   "the control arm (the same bursts as memcpy between pageable buffers, no CUDA). "
                   "--sides control needs no GPU: it measures this node's noise floor.")
@click.option("--bytes", "nbytes", type=SIZE, default="3GiB", show_default=True, help="Bytes per burst.")
@click.option("--threads", type=click.IntRange(min=1, max=1024), default=24, show_default=True,
              help="Concurrent copies each burst is split over.")
@click.option("--direction", type=click.Choice(["h2d", "d2h", "both"]), default="h2d", show_default=True)
@click.option("--bursts", type=click.IntRange(min=1, max=100), default=2, show_default=True,
              help="Bursts of each side per repeat.")
@click.option("--order", type=click.Choice(["alternate", "pageable-first", "pinned-first", "control-first"]),
              default="alternate", show_default=True,
              help="alternate runs the sides forward then backward (ABCCBA): no side is favoured by going first.")
@click.option("--repeat", type=click.IntRange(min=1, max=100), default=3, show_default=True,
              help="Repeats, each in a fresh process (with its own CUDA context); every figure is their median.")
@click.option("--hold", "hold_s", type=click.IntRange(min=0, max=3600), default=0, show_default=True,
              help="Seconds to keep watching after the last burst: is the memory returned over time?")
@click.option("--settle-tolerance", type=SIZE, default="1MiB", show_default=True,
              help="A reading has settled when two in a row, 0.15 s apart, agree within this.")
@click.option("--settle-max", type=FiniteRange(min=0.2, max=120), default=3.0, show_default=True,
              help="Seconds to wait for a reading to settle; an unsettled one is used and reported as such.")
@click.option("--force", is_flag=True, help="Run even when MemAvailable is below what the bursts need.")
@json_option
@out_option
def staging_cmd(device, sides_text, nbytes, threads, direction, bursts, order, repeat, hold_s, settle_tolerance,
                settle_max, force, as_json, out):
    """Host memory that copies leave behind, against a control arm that does the same without CUDA.

    \b
    Bursts of --threads concurrent copies of --bytes, from pageable buffers, from pinned
    (cudaHostAlloc) buffers, and as plain memcpy (the control), in one sequence per fresh
    process. After each burst the buffers are freed and the memory accounting settles: in use
    (MemTotal - MemAvailable) without the pages parked on per-CPU free lists and the watermark
    boost's share, net of the process's RSS. What stays is attributed to the driver only when
    it exceeds the control arm by more than twice the noise, and is located (vmalloc, shmem, kernel,
    unevictable, pins outstanding, the cgroup). Exit code 0: measured; 1: every repeat failed;
    3: no GPU for a CUDA side (--sides control runs without one); 4: refused.
    """
    import json as _json

    from diag.results import write_result

    from .register import exit_code_for
    from .render import render_staging
    from .staging import StagingOptions, parse_sides, run_staging

    try:
        sides = parse_sides(sides_text)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="'--sides'")
    if order.endswith("-first") and order[:-len("-first")] not in sides:
        raise click.BadParameter(f"{order} needs {order[:-len('-first')]} in --sides", param_hint="'--order'")
    opts = StagingOptions(bytes=nbytes, threads=threads, direction=direction, bursts=bursts, order=order,
                          repeat=repeat, hold_s=hold_s, device=device, sides=sides, settle_tolerance=settle_tolerance,
                          settle_max_s=settle_max, force=force)
    run = open_run(out, "repro-staging")
    progress = (lambda text: click.echo(f"hostpin repro staging: {text}", err=True)) if sys.stderr.isatty() else None
    result = run_staging(opts, run, progress=progress)
    result.exit_code = exit_code_for(result.outcome)
    doc = write_result(run, result)
    json_to_file(doc)
    click.echo(_json.dumps(doc, indent=2, default=str) if as_json else render_staging(doc))
    return evidence_exit(run, result.exit_code)


def _json_error(argv: list[str], message: str, exit_code: int) -> None:
    """--json is answered on every exit path, a bad command line included."""
    if "--json" in argv:
        import json as _json
        command = " ".join(a for a in argv[:2] if not a.startswith("-"))
        click.echo(_json.dumps({"tool": "hostpin", "command": command, "status": "error", "exit_code": exit_code,
                                "verdict": message}, indent=2))


@repro.command("cleanup")
@click.option("--dry-run", is_flag=True, help="List what would be removed; change nothing.")
@json_option
@json_errors("repro cleanup")
def cleanup_cmd(dry_run, as_json):
    """Remove swap files, cgroups (with their read throttles), /dev/shm files, unpacked
    bundles and --trace's tracefs instances (and the tracefs it mounted) left by hostpin runs
    that were killed (their owner's pid, in each name, no longer runs). What a running run holds
    is left alone.

    Exit code 0: nothing of a killed run is left (or --dry-run); 3: something could not be
    removed (named, with why).
    """
    from .cleanup import remove_leftovers

    result = remove_leftovers(dry_run=dry_run)
    result["exit_code"] = EXIT_UNEVALUATED if result["problems"] else EXIT_OK
    json_to_file(result)
    if as_json:
        click.echo(_json_dumps(result))
    else:
        click.echo(f"hostpin repro cleanup: {result['verdict']}")
        for row in result["found"]:
            click.echo(f"  {row['action']}: {row['description']}"
                       + (f" ({'; '.join(row['problems'])})" if row.get("problems") else ""))
    return result["exit_code"]


def _json_dumps(obj) -> str:
    import json as _json
    return _json.dumps(obj, indent=2, default=str)


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    # from here on a Ctrl-C or SIGTERM unwinds, so that every `finally` (a bundle's temporary
    # directory, a reproduction's cleanup) runs; a reproduction installs its own handlers
    # (SIGHUP, the terminal closing, too). Only the first one unwinds: a second Ctrl-C a few ms
    # later lands in that cleanup (a bundle's rmtree) and must not cut it short.
    # The later ones are ignored by the kernel (SIG_IGN), also while the interpreter exits, which
    # would otherwise reset a Python handler to the default and die of the signal after cleaning up.
    stops = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {s: signal.getsignal(s) for s in stops}
    fired = []

    def _unwind(signum, frame):
        fired.append(signum)
        for s in stops:
            signal.signal(s, signal.SIG_IGN)
        raise KeyboardInterrupt

    for s in stops:
        signal.signal(s, _unwind)
    try:
        with guarded_output():  # nothing foreign reaches the terminal raw (diag.safetext)
            _main(args, argv)
    finally:
        if _FAILED_STREAMS:  # the interpreter's own flush at exit must not fail again (it would exit 120)
            for name in _FAILED_STREAMS:
                setattr(sys, name, open(os.devnull, "w", encoding="utf-8"))
            _FAILED_STREAMS.clear()
        # no signal came: the caller's handlers come back (a caller in the same process, such as a
        # test, must not keep SIG_IGN, which every child it starts would inherit through exec)
        if not fired:
            for s, handler in previous.items():
                signal.signal(s, handler if handler is not None else signal.SIG_DFL)


_FAILED_STREAMS: list[str] = []  # "stdout"/"stderr" that could not be written this command


def _main(args: list[str], argv: list[str] | None) -> None:
    # evidence is private: whatever creates a file during the command (a child's log, a stream)
    # makes it 0600 at most; files meant to be shared (--prometheus) set their mode themselves.
    # CMD of `hostpin watch -- CMD` gets the caller's own umask back (diag.watch.launch).
    cliopts.CALLER_UMASK = os.umask(0o077)
    os.umask(cliopts.CALLER_UMASK | 0o077)
    # what cannot be shown (stderr on a full disk, /dev/full, a closed pipe) never changes the answer
    closed = _reopen_closed_std_fds()
    streams = sys.stdout, sys.stderr
    out, err = sys.stdout, sys.stderr = GuardedStream(sys.stdout), GuardedStream(sys.stderr)
    for fd, stream in ((1, out), (2, err)):
        if fd in closed:
            stream.failed = "it is closed"
    try:
        code = _run(args, argv)
        out.flush()
        if out.failed and code == EXIT_OK and not cliopts.COMMAND_EXIT:  # the result itself was not written
            click.echo(f"hostpin: error: could not write the output to stdout: {out.failed}", err=True)
            code = EXIT_UNEVALUATED
        err.flush()
    finally:
        if not (out.failed or err.failed):  # a caller in the same process (a test) gets its streams back
            sys.stdout, sys.stderr = streams
        _FAILED_STREAMS.extend(name for name, s in (("stdout", out), ("stderr", err)) if s.failed)
        cliopts.COMMAND_EXIT = False
    sys.exit(code)


def _reopen_closed_std_fds() -> set[int]:
    """Started with stdin, stdout or stderr closed (`>&-`), the next file hostpin opens would take
    its number and receive what is meant for it: each closed one is /dev/null instead."""
    closed = set()
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            closed.add(fd)
    for fd in sorted(closed):
        new = os.open(os.devnull, os.O_RDWR)
        if new != fd:
            os.dup2(new, fd)
            os.close(new)
    if 1 in closed:
        sys.stdout = open(1, "w", encoding="utf-8", closefd=False)
    if 2 in closed:
        sys.stderr = open(2, "w", encoding="utf-8", closefd=False)
    return closed


def _run(args: list[str], argv: list[str] | None) -> int:
    """The command's exit code, from the one table (diag/exitcodes.py), on every path."""
    try:
        rv = cli.main(args=argv, prog_name="hostpin", standalone_mode=False)
    except click.UsageError as exc:
        click.echo(f"hostpin: error: {exc.format_message()}", err=True)
        if not getattr(exc, "json_printed", False):
            _json_error(args, exc.format_message(), EXIT_USAGE)
        return EXIT_USAGE
    except click.ClickException as exc:
        click.echo(f"hostpin: error: {exc.format_message()}", err=True)
        return exc.exit_code
    except (click.exceptions.Abort, KeyboardInterrupt):
        click.echo("hostpin: interrupted", err=True)
        return EXIT_INTERRUPTED
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except SystemExit as exc:  # sys.exit(N) from inside a command (the gate's one line, interrupted)
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else EXIT_UNEVALUATED)
    except Exception as exc:  # a bug: still one line, and where; HOSTPIN_DEBUG=1 for the traceback
        if os.environ.get("HOSTPIN_DEBUG"):
            raise
        click.echo(f"hostpin: error: {unexpected(exc, 'internal error')}", err=True)
        return EXIT_UNEVALUATED
    return rv if isinstance(rv, int) else EXIT_OK


if __name__ == "__main__":
    main()

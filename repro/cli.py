"""The `hostpin` console command: diag's verbs plus the `repro` group.

Errors at the command line are one line on stderr with exit code 2; domain errors are
click exceptions with a clear message; nothing prints a traceback to a user.
"""
from __future__ import annotations

import sys

import click

from diag.cli import RANKS, RATE, SIZE, _margin, cli, json_option, open_run, out_option
from diag.units import SIZE_EXAMPLE
from diag.exitcodes import EXIT_INTERRUPTED, EXIT_UNEVALUATED, EXIT_USAGE

__all__ = ["main", "cli"]


@cli.group()
def repro():
    """Reproduce pinning stalls and failures for real, under a watchdog (acts on the node)."""


@repro.command("register")
@click.option("--size", type=SIZE, required=True, help=f"Bytes to pin per rank ({SIZE_EXAMPLE}).")
@click.option("--method", type=click.Choice(["register", "hostalloc", "mlock"]), default="register", show_default=True,
              help="cudaHostRegister of a mapped region, cudaHostAlloc, or mlock (no GPU; the same kernel fault path).")
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
@click.option("--make-swap", type=SIZE, default=None, help="Create a temporary swap file of this size for the run.")
@click.option("--swap-dir", type=click.Path(file_okay=False), default="/var/tmp", show_default=True,
              help="Where --make-swap puts its file (a disk file system: ext4, xfs).")
@click.option("--deadline", type=click.FloatRange(min=1), default=1800.0, show_default=True,
              help="Hard limit in seconds for the whole run: stacks are captured, then the child is killed.")
@click.option("--stall-after", type=click.FloatRange(min=0.5), default=120.0, show_default=True,
              help="No progress for this long = stalled (stacks captured, child killed).")
@click.option("--interval", type=click.FloatRange(min=0.05, max=10), default=0.5, show_default=True,
              help="Watchdog sampling interval in seconds.")
@click.option("--margin", default="5%", show_default=True, help="Memory that must stay free (refusal threshold).")
@click.option("--force", is_flag=True, help="Run even when the headroom check says the node cannot take it.")
@click.option("--device", type=click.IntRange(min=0), default=0, show_default=True, help="CUDA device.")
@click.option("--no-calibrate", is_flag=True, help="Skip measuring this node's clean rate first (256 MiB).")
@click.option("--register-twice", is_flag=True, help="Register the first chunk a second time (catalog 10).")
@click.option("--prefault-threads", type=click.IntRange(min=1, max=256), default=None,
              help="Threads for the prefault (default: CPUs, at most 16).")
@click.option("--matrix", is_flag=True, help="Run methods x THP x prefault at this size and print one table.")
@json_option
@out_option
def register_cmd(size, method, register_flags, source, map_, thp, prefault, chunk, ranks, swap_out, swap_in_rate,
                 read_rate, make_swap, swap_dir, deadline, stall_after, interval, margin, force, device, no_calibrate,
                 register_twice, prefault_threads, matrix, as_json, out):
    """Pin SIZE for real in a child process while a watchdog (diag.watch) shows where the time goes.

    \b
    Outcomes: completed, slow, failed (CUDA error and catalog entry), stalled, killed
    (deadline), unkillable, refused (not enough headroom; --force), interrupted.
    Exit code 0: completed or slow; 1: failed, stalled, killed, unkillable; 3: no GPU for a
    CUDA method; 4: refused; 130: interrupted. Everything set up is removed on every exit.
    """
    import json as _json

    from .register import ReproError, ReproOptions, ReproUsageError, exit_code_for, run_repro, validate
    from .render import ProgressLine, render_result

    if not (source in ("anon", "shm", "uffd") or (source.startswith("file:") and len(source) > 5)):
        raise click.BadParameter(f"{source!r} is not a source; use anon, shm or file:PATH, e.g. file:/data/table.bin",
                                 param_hint="'--source'")
    _margin(None, None, margin)
    opts = ReproOptions(size=size, method=method, register_flags=register_flags, source=source, map=map_, thp=thp,
                        prefault=prefault, chunk=chunk, ranks=ranks, swap_out=swap_out, swap_in_rate=swap_in_rate,
                        read_rate=read_rate, make_swap=make_swap, swap_dir=swap_dir, deadline=deadline, stall_after=stall_after,
                        interval=interval, force=force, device=device, calibrate=not no_calibrate,
                        register_twice=register_twice, margin=margin)
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
        click.echo(_json.dumps(result, indent=2, default=str) if as_json else render_matrix(result["rows"], size, str(run.path)))
        return result["exit_code"]
    bar = ProgressLine()
    try:
        result = run_repro(opts, run, on_tick=bar)
    except ReproError as exc:
        bar.done()
        run.finish({"outcome": "unevaluated", "error": str(exc)})
        err = click.ClickException(f"{exc} (evidence: {run.path})")
        err.exit_code = EXIT_UNEVALUATED
        raise err
    bar.done()
    result["exit_code"] = exit_code_for(result["outcome"])
    run.finish(result)
    click.echo(_json.dumps(result, indent=2, default=str) if as_json else render_result(result))
    return result["exit_code"]


@repro.command("staging")
@click.option("--device", type=click.IntRange(min=0), default=0, show_default=True, help="CUDA device.")
@click.option("--bytes", "nbytes", type=SIZE, default="3GiB", show_default=True, help="Bytes per burst.")
@click.option("--threads", type=click.IntRange(min=1, max=1024), default=24, show_default=True,
              help="Concurrent copies each burst is split over.")
@click.option("--direction", type=click.Choice(["h2d", "d2h", "both"]), default="h2d", show_default=True)
@click.option("--bursts", type=click.IntRange(min=1, max=100), default=2, show_default=True,
              help="Bursts of each side per repeat.")
@click.option("--order", type=click.Choice(["alternate", "pageable-first", "pinned-first"]), default="alternate",
              show_default=True, help="alternate is ABBA: neither side is favoured by going first.")
@click.option("--repeat", type=click.IntRange(min=1, max=100), default=3, show_default=True,
              help="Repeats, each in a fresh process with its own CUDA context.")
@click.option("--hold", "hold_s", type=click.IntRange(min=0, max=3600), default=0, show_default=True,
              help="Seconds to keep watching after the last burst: is the memory returned over time?")
@click.option("--samples", type=click.IntRange(min=1, max=50), default=5, show_default=True,
              help="Readings of the memory counters per step (their median is used).")
@click.option("--force", is_flag=True, help="Run even when MemAvailable is below a burst plus 1 GiB.")
@json_option
@out_option
def staging_cmd(device, nbytes, threads, direction, bursts, order, repeat, hold_s, samples, force, as_json, out):
    """Host memory left behind by copies from pageable memory, against pinned memory.

    Bursts of --threads concurrent copies of --bytes from pageable buffers and from pinned
    (cudaHostAlloc) buffers; after each, the buffers are freed and the allocator trimmed, and
    the memory in use (MemTotal - MemAvailable) is compared with the process's RSS: what no
    process counter shows is the driver's staging memory. Exit code 0: measured; 1: every
    repeat failed; 3: no GPU; 4: refused.
    """
    import json as _json

    from .register import exit_code_for
    from .render import render_staging
    from .staging import StagingOptions, run_staging

    opts = StagingOptions(bytes=nbytes, threads=threads, direction=direction, bursts=bursts, order=order,
                          repeat=repeat, hold_s=hold_s, device=device, samples=samples, force=force)
    run = open_run(out, "repro-staging")
    progress = (lambda text: click.echo(f"hostpin repro staging: {text}", err=True)) if sys.stderr.isatty() else None
    result = run_staging(opts, run, progress=progress)
    result["exit_code"] = exit_code_for(result["outcome"])
    run.finish(result)
    click.echo(_json.dumps(result, indent=2, default=str) if as_json else render_staging(result))
    return result["exit_code"]


def main(argv: list[str] | None = None) -> None:
    try:
        rv = cli.main(args=argv, prog_name="hostpin", standalone_mode=False)
    except click.UsageError as exc:
        click.echo(f"hostpin: error: {exc.format_message()}", err=True)
        sys.exit(EXIT_USAGE)
    except click.ClickException as exc:
        click.echo(f"hostpin: error: {exc.format_message()}", err=True)
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        click.echo("hostpin: interrupted", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except KeyboardInterrupt:
        click.echo("hostpin: interrupted", err=True)
        sys.exit(EXIT_INTERRUPTED)
    sys.exit(rv if isinstance(rv, int) else 0)


if __name__ == "__main__":
    main()

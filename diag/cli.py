"""The observing half of the `hostpin` command: preflight and snapshot.

Library code returns data; only this module and repro.cli print. Results go to stdout,
progress and errors to stderr. The console entry point is repro.cli:main, which adds the
`repro` verbs to this group (diag never imports repro).
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from .exitcodes import EXIT_FAIL, EXIT_OK, EXIT_UNEVALUATED
from .units import SIZE_EXAMPLE, SizeError, parse_rate, parse_size

__all__ = ["cli", "SIZE", "RATE", "RANKS", "out_option", "json_option", "open_run"]


class SizeType(click.ParamType):
    name = "SIZE"

    def convert(self, value, param, ctx):
        if isinstance(value, int):
            return value
        try:
            return parse_size(value)
        except SizeError as exc:
            self.fail(str(exc), param, ctx)


class RateType(click.ParamType):
    name = "RATE"

    def convert(self, value, param, ctx):
        if isinstance(value, int):
            return value
        try:
            return parse_rate(value)
        except SizeError as exc:
            self.fail(str(exc), param, ctx)


class RanksType(click.ParamType):
    name = "N"

    def convert(self, value, param, ctx):
        try:
            n = int(value)
        except (TypeError, ValueError):
            n = None
        if n is None or n < 1:
            self.fail(f"{value!r} is not a rank count; use a whole number >= 1, e.g. --ranks 2", param, ctx)
        return n


SIZE, RATE, RANKS = SizeType(), RateType(), RanksType()


def _margin(ctx, param, value):
    text = str(value).strip()
    try:
        if text.endswith("%"):
            pct = float(text[:-1])
            if not 0 <= pct < 100:
                raise ValueError
        else:
            parse_size(text)
    except (ValueError, SizeError):
        raise click.BadParameter(f"{value!r} is not a margin; use a percentage of MemTotal or a size, "
                                 f"e.g. 5% or 8GiB", ctx, param)
    return text


def out_option(f):
    return click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
                        help="Parent directory for the run directory (default ./hostpin-runs).")(f)


def json_option(f):
    return click.option("--json", "as_json", is_flag=True,
                        help="Print the result as JSON on stdout (also when it fails).")(f)


def open_run(out: Path | None, command: str, durable: bool = False):
    from .evidence import RunDir, new_run_dir
    for _ in range(20):  # another hostpin (a rank beside this one) may take the same name this second
        path = new_run_dir(out, command)
        try:
            return RunDir(path, command, sys.argv, durable=durable)
        except FileExistsError:
            continue
        except OSError as exc:
            raise click.ClickException(f"cannot create the run directory {path}: {exc.strerror}; "
                                       "choose another with --out")
    raise click.ClickException(f"cannot create a run directory under {out or 'hostpin-runs'}: every name is taken")


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="hostpin", prog_name="hostpin")
def cli():
    """hostpin: preflight, reproduce and prove pinned host memory problems on NVIDIA GPU nodes.

    \b
    hostpin preflight --size 47.2GiB --ranks 2    gate a launch (exit 0 ok, 1 fail, 3 not evaluated)
    hostpin snapshot                              capture this node's state for offline reading
    hostpin repro register --size 47GiB           pin for real under a watchdog

    Every command keeps its raw evidence in a run directory (./hostpin-runs/...).
    """


@cli.command()
@click.option("--size", type=SIZE, default=None,
              help=f"Bytes each rank will pin ({SIZE_EXAMPLE}). Without it: node state only.")
@click.option("--ranks", type=RANKS, default=1, show_default=True, help="Ranks on this node, each pinning --size.")
@click.option("--method", type=click.Choice(["register", "hostalloc", "mlock"]), default="register",
              show_default=True, help="cudaHostRegister of a mapping, cudaHostAlloc, or mlock (no GPU).")
@click.option("--thp/--no-thp", default=None,
              help="Whether the region uses transparent huge pages (default: what the THP policy gives a madvised region).")
@click.option("--source", type=click.Choice(["anon", "shm", "file"]), default="anon", show_default=True,
              help="What backs the region: anonymous memory, a /dev/shm file, or a file on disk.")
@click.option("--map", "map_", type=click.Choice(["private", "shared"]), default="private", show_default=True,
              help="How the region is mapped.")
@click.option("--readonly", is_flag=True, help="The launcher registers with cudaHostRegisterReadOnly.")
@click.option("--chunk", type=SIZE, default=None, help="The launcher pins in calls of this size.")
@click.option("--margin", default="5%", show_default=True, callback=_margin,
              help="Memory to keep free beyond the plan: a percentage of MemTotal or a size.")
@click.option("--reserve", type=SIZE, default=None,
              help="More memory each rank needs beyond its table, e.g. the staging memory that "
                   "`hostpin repro staging` measured for copies from pageable buffers.")
@click.option("--root", "root", type=click.Path(path_type=Path), default=None,
              help="Evaluate a captured tree offline: a snapshot run directory, its bundle (.tar.gz), "
                   "or a directory with proc/ and sys/.")
@click.option("--no-cuda", is_flag=True, help="Do not start the CUDA probe (device checks are skipped).")
@click.option("--cuda-timeout", type=click.FloatRange(min=0.5), default=15.0, show_default=True,
              help="Seconds before a hung CUDA probe is killed.")
@click.option("--sample", type=click.FloatRange(min=0), default=1.0, show_default=True,
              help="Seconds to sample the swap-in rate when swap is in use (0: do not sample).")
@click.option("--skip", "skip", multiple=True, metavar="CHECK", help="Skip a check by id (repeatable).")
@click.option("--strict", is_flag=True, help="Warnings fail too (exit 1).")
@click.option("--prometheus", "prometheus", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the figures in node_exporter's textfile format to this file (atomically).")
@json_option
@out_option
def preflight(size, ranks, method, thp, source, map_, readonly, chunk, margin, reserve, root, no_cuda,
              cuda_timeout, sample, skip, strict, prometheus, as_json, out):
    """Say whether this node can pin the plan now, with the reason and the remedy.

    Exit code 0: nothing failed (warnings allowed); 1: a check failed (or a warning with
    --strict); 2: bad command line; 3: the node could not be evaluated.
    """
    from .checks import Plan, all_checks
    from .preflight import run_preflight
    from .render import render_preflight

    known = {c.id for c in all_checks()}
    for name in skip:
        if name not in known:
            raise click.BadParameter(f"{name!r} is not a check; use one of {', '.join(sorted(known))}",
                                     param_hint="'--skip'")
    opened = None
    if root is not None and root.is_file():
        from .runs import RunError, open_run_path
        try:
            opened = open_run_path(root)  # a bundle: unpacked to a temporary directory
        except RunError as exc:
            raise click.BadParameter(str(exc), param_hint="'--root'") from None
        root = opened.path
    if root is not None and not root.is_dir():
        raise click.BadParameter(f"{str(root)!r} is not a directory; use e.g. --root hostpin-runs/RUN",
                                 param_hint="'--root'")
    plan = Plan(size_bytes=size, ranks=ranks, method=method, thp=thp, source=source, map=map_,
                readonly=readonly, chunk_bytes=chunk, margin=margin, reserve_bytes=reserve or 0)
    run = open_run(out, "preflight")
    cuda = "off" if no_cuda else ("captured" if root is not None else "probe")
    try:
        result = run_preflight(plan, root or "/", run=run, cuda=cuda, cuda_timeout=cuda_timeout, skip=tuple(skip),
                               sample_s=sample)
    finally:
        if opened is not None:
            opened.close()
    if strict and result["status"] == "warn":
        result["exit_code"] = EXIT_FAIL
        result["verdict"] += " (--strict: warnings fail)"
    if prometheus is not None:
        import time as _time
        from .prometheus import write_textfile
        try:
            result["prometheus"] = str(write_textfile(result, prometheus, _time.time()))
        except OSError as exc:
            raise click.ClickException(f"cannot write {prometheus}: {exc.strerror}")
    run.finish(result)
    if as_json:
        click.echo(json.dumps(result, indent=2, default=str))
    else:
        click.echo(render_preflight(result))
    return result["exit_code"]


@cli.command()
@click.option("--root", "root", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
              help="Copy a tree from this directory instead of the live machine.")
@click.option("--no-cuda", is_flag=True, help="Do not run the CUDA probe.")
@click.option("--no-commands", is_flag=True, help="Do not run nvidia-smi, dmesg and uname.")
@click.option("--cuda-timeout", type=click.FloatRange(min=0.5), default=15.0, show_default=True)
@json_option
@out_option
def snapshot(root, no_cuda, no_commands, cuda_timeout, as_json, out):
    """Capture /proc, /sys, driver and CUDA facts into a run directory, without judging.

    Read it back with `hostpin preflight --root RUN_DIR`; keep it as a test fixture.
    """
    from .snapshot import take_snapshot

    run = open_run(out, "snapshot")
    result = take_snapshot(run, root or "/", cuda=not no_cuda, cuda_timeout=cuda_timeout, commands=not no_commands)
    run.finish(result)
    if as_json:
        click.echo(json.dumps(result, indent=2))
    else:
        cuda = result["cuda"]
        click.echo(f"snapshot: {result['files']} files captured, {result['skipped']} skipped "
                   f"(reasons in manifest.json); CUDA: {cuda['status'] + ': ' + (cuda['message'] or '') if cuda else 'not probed'}")
        click.echo(f"evidence: {result['run_dir']}")
        click.echo(f"read it back: hostpin preflight --root {result['run_dir']}")
    return EXIT_OK if result["files"] else EXIT_UNEVALUATED


def _open(path: str):
    from .runs import RunError, open_run_path
    try:
        return open_run_path(path)
    except RunError as exc:
        raise click.BadParameter(str(exc), param_hint="RUN") from None


@cli.command()
@click.argument("run_path", metavar="RUN")
@click.option("--format", "fmt", type=click.Choice(["markdown", "text"]), default="markdown", show_default=True)
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the report here (default: stdout; report.md is also kept in a run directory).")
@click.option("--no-picture", is_flag=True, help="Do not draw the timeline picture of a pin run.")
def report(run_path, fmt, output, no_picture):
    """Render a run (a directory or a bundle) for a bug report: verdict first, facts, tables,
    the key kernel stack, raw evidence in collapsed sections; a pin run also gets timeline.png
    (with matplotlib: pip install 'hostpin[plot]')."""
    from .evidence import register_file
    from .plot import PlotUnavailable, timeline_png
    from .report import render_report

    run = _open(run_path)
    try:
        picture = None
        writable_run = run._tmp is None and os.access(run.path, os.W_OK)
        if run.command == "repro register" and not no_picture:
            samples = run.read_jsonl("timeline.jsonl")
            target = (run.path / "timeline.png") if writable_run else (output.parent if output else Path(".")) / "timeline.png"
            try:
                timeline_png(samples, target, title=run.result.get("verdict") or "")
                picture = "timeline.png"
                if writable_run:
                    register_file(run.path, "timeline.png", "picture")
            except PlotUnavailable as exc:
                click.echo(f"hostpin: note: {exc}", err=True)
        text = render_report(run, fmt=fmt, picture=picture)
        if output:
            output.write_text(text)
            click.echo(f"report: {output}", err=True)
        else:
            click.echo(text)
        if writable_run and fmt == "markdown":
            (run.path / "report.md").write_text(text)
            register_file(run.path, "report.md", "report")
    finally:
        run.close()
    return EXIT_OK


@cli.command()
@click.argument("run_dir", metavar="RUN_DIR", type=click.Path(file_okay=False, path_type=Path))
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="The .tar.gz to write (default: RUN_DIR's name + .tar.gz here).")
@click.option("--redact", is_flag=True, help="Replace host names, IP/MAC addresses, user names, serials and UUIDs "
                                             "with tokens (listed in redactions.json in the bundle).")
@json_option
def bundle(run_dir, output, redact, as_json):
    """Pack a run into one verified .tar.gz to attach (every sha256 checked first, no links followed)."""
    from .bundle import BundleError, make_bundle
    try:
        result = make_bundle(run_dir, output, redact=redact)
    except BundleError as exc:
        raise click.ClickException(str(exc))
    if as_json:
        click.echo(json.dumps(result, indent=2))
    else:
        click.echo(f"bundle: {result['bundle']} ({result['files']} files, {result['bytes']:,} bytes, every file "
                   f"verified against the manifest{'; redacted: ' + str(len(result['redactions'])) + ' identifiers' if redact else ''})")
    return EXIT_OK


@cli.command()
@click.argument("runs", metavar="RUN_A RUN_B [RUN_C ...]", nargs=-1, required=True)
@click.option("--format", "fmt", type=click.Choice(["markdown", "text"]), default="text", show_default=True)
@json_option
def compare(runs, fmt, as_json):
    """Runs or nodes side by side: what differs first (verdicts, kernel, driver, THP, swap and
    swap-in rate, free order-9 memory, headroom, pin times and rates), equal facts folded."""
    from .compare import comparison_rows, render_compare
    if len(runs) < 2:
        raise click.BadParameter("give at least two runs, e.g. hostpin compare hostpin-runs/A hostpin-runs/B",
                                 param_hint="RUN")
    opened = [_open(r) for r in runs]
    try:
        if as_json:
            differ, equal = comparison_rows(opened)
            click.echo(json.dumps({"runs": [r.source for r in opened], "differ": differ, "equal": equal}, indent=2))
        else:
            click.echo(render_compare(opened, fmt=fmt))
    finally:
        for r in opened:
            r.close()
    return EXIT_OK


from .watch.cli import watch as _watch  # noqa: E402  (the module needs the options above)

cli.add_command(_watch)

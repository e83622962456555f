"""The observing half of the `hostpin` command: preflight and snapshot.

Library code returns data; only this module and repro.cli print. Results go to stdout,
progress and errors to stderr. The console entry point is repro.cli:main, which adds the
`repro` verbs to this group (diag never imports repro).

Exit codes are one table for every command (diag/exitcodes.py): a path that does not exist
is a bad command line (2); an input that cannot be read or evaluated, or an output that
cannot be written, is 3 with one line saying what and why, never a traceback.
"""
from __future__ import annotations

import functools
import json
import os
import re
import sys
import traceback
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click

from .exitcodes import EXIT_OK, EXIT_UNEVALUATED
from .cliopts import (MAX_CUDA_TIMEOUT_S, MAX_RANKS, MAX_SAMPLE_S, RANKS, RATE, SIZE, FiniteRange, InputError,
                      _error_to_json_file, evidence_exit, json_option, json_to_file, open_run, out_option,
                      unwritten_exit)
from .units import SIZE_EXAMPLE, SizeError, parse_size
from .watch.cli import watch as _watch

__all__ = ["cli", "SIZE", "RATE", "RANKS", "MAX_RANKS", "FiniteRange", "out_option", "json_option", "json_to_file",
           "open_run", "InputError",
           "evaluating", "unexpected", "json_errors"]


def unexpected(exc: BaseException, head: str) -> str:
    """One line for an error nobody planned for: what, and where in hostpin it happened."""
    tb = traceback.extract_tb(exc.__traceback__)
    where = f" (at {Path(tb[-1].filename).name}:{tb[-1].lineno})" if tb else ""
    text = " ".join(f"{head}: {type(exc).__name__}: {exc}{where}".split())
    return (text[:400] + " ...") if len(text) > 400 else text + "; HOSTPIN_DEBUG=1 shows the traceback"


@contextmanager
def evaluating(what: str):
    """Anything unexpected while evaluating someone's input is exit 3 with one line (a damaged
    or unexpected value in a run, a tree, a bundle), not a traceback."""
    try:
        yield
    except (click.ClickException, click.exceptions.Exit, click.exceptions.Abort):
        raise
    except Exception as exc:
        if os.environ.get("HOSTPIN_DEBUG"):
            raise
        raise InputError(unexpected(exc, f"could not evaluate {what}")) from None


def json_errors(command: str):
    """With --json, an error is a JSON object on stdout too (status 'error', exit_code, error)."""
    def deco(f):
        @functools.wraps(f)
        def wrapper(*args, **kw):
            try:
                return f(*args, **kw)
            except click.ClickException as exc:
                if not getattr(exc, "json_printed", False):
                    doc = {"tool": "hostpin", "command": command, "status": "error", "exit_code": exc.exit_code,
                           "error": exc.format_message(), "verdict": exc.format_message()}
                    if kw.get("as_json"):
                        click.echo(json.dumps(doc, indent=2))
                        exc.json_printed = True  # main() must not answer a second time
                    _error_to_json_file(doc)
                raise
        return wrapper
    return deco


FLEET_AFTER = 6  # compare: more runs than this read as a fleet summary, not one column per run


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


def limits_options(f):
    f = click.option("--max-files", type=click.IntRange(min=1), default=None, metavar="N",
                     help="Most files a bundle may hold or a run may list (default 20000).")(f)
    return click.option("--max-size", type=SIZE, default=None, metavar="SIZE",
                        help="Most bytes read from one run or unpacked from one bundle (default 1GiB; one file "
                             "at most a quarter of it, at least 256MiB).")(f)


def _limits(max_size: int | None, max_files: int | None):
    from .confined import Limits
    return Limits.for_total(max_size, max_files)


def _gate_format(argv: list[str]) -> str | None:
    """'line' or 'npd' when argv is `preflight ... --format line|npd`, read before click parses it: a
    command line that fails to parse later (or a bad site file) must still answer in one line."""
    if not argv or argv[0] != "preflight":
        return None
    fmt = None
    for i, a in enumerate(argv):
        if a == "--":
            break
        if a == "--format" and i + 1 < len(argv):
            fmt = argv[i + 1]
        elif a.startswith("--format="):
            fmt = a.split("=", 1)[1]
    return fmt if fmt in ("line", "npd") else None


class NonEmptyPath(click.Path):
    """A path option that refuses the empty string (click would read it as '.', the current directory)."""

    def convert(self, value, param, ctx):
        if isinstance(value, str) and not value.strip():
            self.fail("an empty path; give a file name", param, ctx)
        return super().convert(value, param, ctx)


def _not_empty(ctx, param, value):
    if isinstance(value, str) and not value.strip():
        what = {"VERSION": "a version, e.g. 2.11.0"}.get(getattr(param, "metavar", None), "a path")
        raise click.BadParameter(f"an empty value; give {what}, or leave the option out")
    return value


_ANSWERED: int | None = None  # the exit code of a gate line already printed (--format line|npd)


class HostpinGroup(click.Group):
    """Every command that writes a run takes --config: the site file fills its options' defaults."""
    group_class = type  # `hostpin repro` is one too

    def main(self, args=None, *rest, **kwargs):
        argv = list(sys.argv[1:] if args is None else args)
        gate = _gate_format(argv)
        if gate is None:
            return super().main(args, *rest, **kwargs)
        global _ANSWERED
        _ANSWERED = None
        try:
            from .gate import unevaluated_line
            return super().main(args, *rest, **kwargs)
        except click.UsageError as exc:  # exit 2 (npd: unknown); the full message goes to stderr
            click.echo(unevaluated_line(exc.format_message()))
            raise
        except (click.exceptions.Abort, KeyboardInterrupt):
            if _ANSWERED is not None:  # interrupted after the one line was printed: that answer stands
                sys.exit(_ANSWERED)
            click.echo("hostpin: not evaluated: interrupted")
            if gate == "npd":  # node-problem-detector knows 0, 1 and 2: unknown
                sys.exit(2)
            raise

    def add_command(self, cmd: click.Command, name: str | None = None) -> None:
        from .config import config_option
        if not isinstance(cmd, click.Group) and any(p.name == "out" for p in cmd.params):
            cmd.params.append(config_option())
        super().add_command(cmd, name)


def _gate_errors(func):
    """With --format line/npd, what the gate prints is one line whatever happens: node-problem-detector
    reads a traceback's exit code 1 as "problem", so an error inside preflight becomes "unknown"."""
    import functools

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        if kwargs.get("fmt") not in ("line", "npd"):
            return func(*args, **kwargs)
        from .gate import NPD_UNKNOWN, unevaluated_line
        try:
            return func(*args, **kwargs)
        except (click.UsageError, KeyboardInterrupt):
            raise
        except click.ClickException as exc:
            why, code = exc.format_message(), exc.exit_code
        except Exception as exc:  # one line for the machine reading it; the traceback is no use at 80 chars
            why, code = f"{type(exc).__name__}: {exc}", EXIT_UNEVALUATED
        click.echo(unevaluated_line(why))
        click.echo(f"hostpin: error: {why}", err=True)
        return NPD_UNKNOWN if kwargs["fmt"] == "npd" else max(code, EXIT_UNEVALUATED)
    return wrapper


@click.group(cls=HostpinGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="hostpin", prog_name="hostpin")
def cli():
    """hostpin: preflight, reproduce and prove pinned host memory problems on NVIDIA GPU nodes.

    \b
    hostpin preflight --size 47.2GiB --ranks 2    gate a launch (exit 0 ok, 1 fail, 3 not evaluated)
    hostpin snapshot                              capture this node's state for offline reading
    hostpin repro register --size 47GiB           pin for real under a watchdog

    Every command keeps its raw evidence in a run directory (./hostpin-runs/...).
    """


def _torch_plan(size, chunk, method, source, torch_version, alloc_conf):
    """(the PyTorch request as a dict, the method and source it implies) for --allocator torch; torch is
    never imported. A setting PyTorch would refuse is a bad command line (exit 2)."""
    from click.core import ParameterSource
    from . import torchalloc
    if torch_version is not None:
        if torchalloc.parse_version(torch_version) is None:
            raise click.BadParameter(f"{torch_version!r} is not a PyTorch version; use e.g. 2.11.0",
                                     param_hint="'--torch-version'")
        version, version_source = torch_version, "--torch-version"
    else:
        version = torchalloc.installed_version()
        version_source = ("the torch distribution installed beside hostpin" if version else
                          "no torch distribution beside hostpin, no --torch-version")
    if alloc_conf is not None:
        confs, conf_source, hint = {"--alloc-conf": alloc_conf}, "--alloc-conf", "'--alloc-conf'"
    else:
        confs = torchalloc.conf_from_env(os.environ)
        conf_source, hint = ("hostpin's environment" if confs else "none set (hostpin's environment has "
                             "neither PYTORCH_CUDA_ALLOC_CONF nor PYTORCH_ALLOC_CONF)"), " and ".join(confs) or "PYTORCH_CUDA_ALLOC_CONF"
    try:
        req = torchalloc.plan_request(size or 0, chunk, version=version, version_source=version_source,
                                      confs=confs, conf_source=conf_source)
    except ValueError as exc:
        raise click.BadParameter(f"PyTorch would refuse these settings: {exc}", param_hint=hint) from None
    ctx = click.get_current_context()
    if ctx.get_parameter_source("method") in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT) \
            and method != req.method:
        raise click.BadParameter(f"with --allocator torch PyTorch decides the method: {req.method} here "
                                 "(pinned_use_cuda_host_register:True gives register, else hostalloc)",
                                 param_hint="'--method'")
    if ctx.get_parameter_source("source") == ParameterSource.COMMANDLINE and source != "anon":
        raise click.BadParameter("with --allocator torch the region is PyTorch's own (anonymous or driver "
                                 "memory)", param_hint="'--source'")
    return (req.to_dict() if size else None), req.method, "anon"


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
@click.option("--readonly/--no-readonly", default=False,
              help="The launcher registers with cudaHostRegisterReadOnly (--no-readonly: it does not, "
                   "whatever the site file says).")
@click.option("--chunk", type=SIZE, default=None, help="The launcher pins in calls of this size.")
@click.option("--margin", default="5%", show_default=True, callback=_margin,
              help="Memory to keep free beyond the plan: a percentage of MemTotal or a size.")
@click.option("--reserve", type=SIZE, default=None,
              help="More memory each rank needs beyond its table, e.g. the staging memory that "
                   "`hostpin repro staging` measured for copies from pageable buffers.")
@click.option("--root", "root", type=click.Path(path_type=Path), default=None,
              help="Evaluate a captured tree offline: a snapshot run directory, its bundle (.tar.gz), "
                   "or a directory with proc/ and sys/.")
@click.option("--no-cuda/--cuda", "no_cuda", default=False,
              help="Do not start the CUDA probe (device checks are skipped); --cuda: start it, whatever the "
                   "site file says.")
@click.option("--cuda-timeout", type=FiniteRange(min=0.5, max=MAX_CUDA_TIMEOUT_S), default=15.0, show_default=True,
              help="Seconds before a hung CUDA probe is killed (at most 3600).")
@click.option("--sample", type=FiniteRange(min=0, max=MAX_SAMPLE_S), default=1.0, show_default=True,
              help="Seconds to sample the swap-in demand when swap is in use (0: do not sample; at most 60).")
@click.option("--swap-in-rate", "swap_rate", type=RATE, default=None,
              help="What this node's swap device delivers to a pin, if you measured it (e.g. 40MB/s, "
                   "12000pages/s); default: a figure per kind of device (see the README).")
@click.option("--pid", "pid", type=click.IntRange(min=1), default=None,
              help="Evaluate the memory cgroup (and swap) of this process, the one that will pin, "
                   "instead of preflight's own (a DaemonSet reads its own otherwise).")
@click.option("--cgroup", "cgroup_path", default=None, metavar="PATH", callback=_not_empty,
              help="Evaluate this memory cgroup: a directory (/sys/fs/cgroup/...) or a cgroup path "
                   "(/kubepods.slice/...); 'none' says the pinning process is in no memory-limited cgroup.")
@click.option("--file", "table_file", type=NonEmptyPath(dir_okay=False), default=None,
              help="The table's file, with --source file: its file system decides catalog 9 (tmpfs, "
                   "hugetlbfs and ramfs allow writable shared pins; fsdax refuses every pin).")
@click.option("--skip", "skip", multiple=True, metavar="CHECK",
              help="Skip a check by id (repeatable); --skip none: skip nothing the site file named.")
@click.option("--strict/--no-strict", default=False,
              help="Warnings fail too (exit 1), and a check that could warn but lacks its readings makes the "
                   "run unevaluated (exit 3); --no-strict: not, whatever the site file says.")
@click.option("--prometheus", "prometheus", type=NonEmptyPath(dir_okay=False, path_type=Path), default=None,
              help="Also write the figures in node_exporter's textfile format to this file (atomically).")
@click.option("--allocator", type=click.Choice(["cuda", "torch"]), default="cuda", show_default=True,
              help="Who asks the driver to pin: the launcher itself (cuda), or PyTorch's caching host allocator "
                   "(torch: torch.empty(..., pin_memory=True), Tensor.pin_memory()), which rounds each request up "
                   "to a power of two; the plan then uses what PyTorch asks for (catalog 18).")
@click.option("--torch-version", "torch_version", default=None, metavar="VERSION", callback=_not_empty,
              help="With --allocator torch: the launcher's PyTorch version (default: the torch distribution "
                   "installed beside hostpin, read from its metadata; torch is never imported).")
@click.option("--alloc-conf", "alloc_conf", default=None, metavar="SETTINGS",
              help="With --allocator torch: the launcher's PYTORCH_CUDA_ALLOC_CONF (default: "
                   "PYTORCH_CUDA_ALLOC_CONF / PYTORCH_ALLOC_CONF of hostpin's own environment).")
@click.option("--format", "fmt", type=click.Choice(["table", "line", "npd"]), default="table", show_default=True,
              help="line: one short line starting 'hostpin: ' (a Slurm drain reason); npd: the same line with "
                   "node-problem-detector's exit codes (0 ok, 1 problem, 2 unknown).")
@json_option
@out_option
@limits_options
@_gate_errors
@json_errors("preflight")
def preflight(size, ranks, method, thp, source, map_, readonly, chunk, margin, reserve, root, no_cuda,
              cuda_timeout, sample, swap_rate, pid, cgroup_path, table_file, skip, strict, prometheus, allocator,
              torch_version, alloc_conf, as_json, out, fmt, max_size, max_files):
    """Say whether this node can pin the plan now, with the reason and the remedy.

    Exit code 0: nothing failed (warnings allowed); 1: a check failed (or a warning with
    --strict); 2: bad command line; 3: the node could not be evaluated (a check crashed, a
    reading is damaged, or a reading that decides the verdict is not in a captured tree), or the
    run directory or --prometheus file could not be written. With --format npd: 0 ok, 1 problem,
    2 unknown. The plan and settings can come from a site file (--config).
    """
    from .cgroup import CgroupError

    if as_json and fmt != "table":
        raise click.UsageError("give --json or --format, not both")
    probe = None
    if not no_cuda and root is None:  # the probe's child takes longest: it starts before the imports below
        from .cuda import ProbeRun, take_early  # (or before click's: the console command's start_early)
        probe = take_early(cuda_timeout) or ProbeRun(cuda_timeout)
        click.get_current_context().call_on_close(probe.cancel)  # a bad option below leaves no child
    else:
        from .cuda import cancel_early
        cancel_early()
    from .checks import Plan
    from .checks.suite import all_checks
    from .preflight import run_preflight
    from .confined import PathRefused
    from .results import result_dict, write_result

    known = {c.id for c in all_checks()}
    if "none" in skip:  # clears what came before it (the site file's list, or earlier --skip)
        skip = tuple(skip[len(skip) - list(reversed(skip)).index("none"):])
        click.get_current_context().params["skip"] = skip  # the run records what was in effect
    for name in skip:
        if name not in known:
            raise click.BadParameter(f"{name!r} is not a check; use one of {', '.join(sorted(known))}",
                                     param_hint="'--skip'")
    if pid is not None and cgroup_path is not None:
        raise click.BadParameter("give --pid or --cgroup, not both", param_hint="'--pid'")
    if pid is not None and root is not None:
        raise click.BadParameter("--pid reads a live process; with --root give --cgroup PATH instead",
                                 param_hint="'--pid'")
    if table_file is not None and source != "file":
        raise click.BadParameter("--file goes with --source file", param_hint="'--file'")
    if prometheus is not None and not (prometheus.parent if str(prometheus.parent) else Path(".")).is_dir():
        raise InputError(f"cannot write {prometheus}: its directory {prometheus.parent} does not exist "
                         "(give node_exporter's textfile directory; none is created)")
    json_file = click.get_current_context().meta.get("hostpin.json_file")
    if prometheus is not None and json_file is not None and os.path.abspath(prometheus) == os.path.abspath(json_file):
        click.get_current_context().meta.pop("hostpin.json_file")  # nor the error document into it
        raise click.BadParameter(f"{str(json_file)!r} is also the --prometheus file: give each its own path",
                                 param_hint="'--json-file'")
    torch_plan = None
    if allocator == "torch":
        torch_plan, method, source = _torch_plan(size, chunk, method, source, torch_version, alloc_conf)
    elif torch_version is not None or alloc_conf is not None:
        raise click.BadParameter("--torch-version and --alloc-conf go with --allocator torch",
                                 param_hint="'--torch-version'" if torch_version is not None else "'--alloc-conf'")
    opened = None
    if root is not None:
        if not os.path.lexists(root):
            raise click.BadParameter(f"{str(root)!r} does not exist; use e.g. --root hostpin-runs/RUN",
                                     param_hint="'--root'")
        is_run = root.is_dir() and any(os.path.lexists(root / m) for m in ("manifest.json", "manifest.jsonl"))
        if root.is_file() or is_run:  # a bundle (unpacked to a temporary directory) or a run: read as runs are
            from .runs import RunError, RunMissing, open_run_path
            try:
                opened = open_run_path(root, _limits(max_size, max_files))
            except RunMissing as exc:
                raise click.BadParameter(str(exc), param_hint="'--root'") from None
            except RunError as exc:
                raise InputError(str(exc)) from None
            root = opened.path
        elif not root.is_dir():
            raise click.BadParameter(f"{str(root)!r} is not a directory; use e.g. --root hostpin-runs/RUN",
                                     param_hint="'--root'")
    try:
        plan = Plan(size_bytes=size, ranks=ranks, method=method, thp=thp, source=source, map=map_,
                    readonly=readonly, chunk_bytes=chunk, margin=margin, reserve_bytes=reserve or 0, file=table_file,
                    allocator=allocator, torch=torch_plan)
        # the verdict never depends on whether its evidence can be kept: judged all the same
        run = open_run(out, "preflight", keep_going=True)
        cuda = "off" if no_cuda else ("captured" if root is not None else "probe")
        with evaluating(str(root) if root is not None else "this node"):
            try:
                result = run_preflight(plan, root or "/", run=run, cuda=cuda, cuda_timeout=cuda_timeout,
                                       skip=tuple(skip), sample_s=sample, strict=strict,
                                       pid=pid if pid is not None else "self", cgroup_path=cgroup_path,
                                       swap_rate=swap_rate, probe=probe,
                                       warm=("diag.render",) if fmt == "table" and not as_json else ("diag.gate",))
            except CgroupError as exc:
                run.finish({"tool": "hostpin", "command": "preflight", "status": "error", "exit_code": 2,
                            "verdict": str(exc)})
                raise click.BadParameter(str(exc), param_hint="'--pid'" if pid is not None else "'--cgroup'") from None
    finally:
        if opened is not None:
            opened.close()
    result.run_dir = str(run.path) if run.made else None
    prom_error = None
    if prometheus is not None:
        import time as _time
        from .prometheus import write_textfile
        try:
            result.prometheus = str(write_textfile(result, prometheus, _time.time()))
        except (OSError, PathRefused) as exc:
            prom_error = f"cannot write {prometheus}: {getattr(exc, 'strerror', None) or exc}"
            result.errors.append(f"prometheus: {prom_error}")
            result.verdict += f"; and the Prometheus file could not be written ({prom_error})"
    from .config import record_config
    record_config(run, result)
    data = write_result(run, result)
    lost = run.lost
    if lost:
        lost = f"the evidence could not be kept ({lost})"
        result.errors.append(f"evidence: {lost}")
        result.verdict += f"; {lost}"
    if lost or prom_error:  # judged first: a failed plan stays 1, a pass whose output was not written is 3
        result.exit_code = unwritten_exit(result.exit_code)
        data = result_dict(result)
    try:
        json_to_file(data)
    except InputError as exc:  # the same rule: the verdict stands, a pass whose file was not written is 3
        click.echo(f"hostpin: {exc}", err=True)
        result.exit_code = unwritten_exit(result.exit_code)
        data = result_dict(result)
    if as_json:
        click.echo(json.dumps(data, indent=2, default=str))
    elif fmt != "table":
        global _ANSWERED
        from .gate import npd_exit_code, short_line
        # the verdict, decided first; what could not be written goes to stderr below
        click.echo(short_line(data))
        # the answer is given: a Ctrl-C from now on must not turn it into "interrupted" (HostpinGroup.main)
        _ANSWERED = npd_exit_code(data) if fmt == "npd" else result.exit_code
        if data.get("status") not in ("pass", "warn", "fail"):
            click.echo(f"hostpin: error: {data.get('verdict')}", err=True)  # the whole message
        for why in filter(None, (prom_error, lost)):
            click.echo(f"hostpin: error: {why}", err=True)
        return npd_exit_code(data) if fmt == "npd" else result.exit_code
    else:
        from .render import render_preflight  # tabulate: the table alone needs it, not --json or the gate line
        click.echo(render_preflight(data))
    for why in filter(None, (prom_error, lost)):
        click.echo(f"hostpin: error: {why}", err=True)
    return result.exit_code


@cli.command()
@click.option("--root", "root", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
              help="Copy a tree from this directory instead of the live machine.")
@click.option("--no-cuda", is_flag=True, help="Do not run the CUDA probe.")
@click.option("--no-commands", is_flag=True, help="Do not run nvidia-smi, dmesg and uname.")
@click.option("--cuda-timeout", type=FiniteRange(min=0.5, max=MAX_CUDA_TIMEOUT_S), default=15.0, show_default=True,
              help="Seconds before a hung CUDA probe is killed (at most 3600).")
@json_option
@out_option
@json_errors("snapshot")
def snapshot(root, no_cuda, no_commands, cuda_timeout, as_json, out):
    """Capture /proc, /sys, driver and CUDA facts into a run directory, without judging.

    Read it back with `hostpin preflight --root RUN_DIR`; keep it as a test fixture. A --root
    tree is copied without following any link in it (a link is recorded as one, with its
    target). Exit code 0: captured; 2: bad command line; 3: nothing could be captured.
    """
    from .snapshot import take_snapshot

    run = open_run(out, "snapshot")
    with evaluating(str(root) if root else "this node"):
        result = take_snapshot(run, root or "/", cuda=not no_cuda, cuda_timeout=cuda_timeout,
                               commands=not no_commands)
    run.finish(result)
    json_to_file(result)
    if as_json:
        click.echo(json.dumps(result, indent=2))
    else:
        cuda = result["cuda"]
        click.echo(f"snapshot: {result['files']} files captured, {result['skipped']} skipped "
                   f"(reasons in manifest.json); CUDA: {cuda['status'] + ': ' + (cuda['message'] or '') if cuda else 'not probed'}")
        click.echo(f"evidence: {result['run_dir']}")
        click.echo(f"read it back: hostpin preflight --root {result['run_dir']}")
    return evidence_exit(run, EXIT_OK if result["files"] else EXIT_UNEVALUATED)


def _open(path: str, limits=None):
    from .confined import DEFAULT_LIMITS
    from .runs import OutOfResources, RunError, RunMissing, open_run_path
    if not str(path).strip():  # '' is not the current directory
        raise click.BadParameter("an empty name is not a run; give a run directory or a bundle", param_hint="RUN")
    try:
        return open_run_path(path, limits or DEFAULT_LIMITS)
    except RunMissing as exc:
        raise click.BadParameter(str(exc), param_hint="RUN") from None
    except OutOfResources as exc:
        error = InputError(str(exc))
        error.ours = True  # hostpin's own limits (ulimit -n, TMPDIR's space), not the run's damage
        raise error from None
    except RunError as exc:
        raise InputError(str(exc)) from None


def _owns(path: Path) -> bool:
    try:
        st = os.stat(path)
    except OSError:
        return False
    return st.st_uid == os.geteuid() and os.access(path, os.W_OK)


def _streamed(output: Path) -> bool:
    """Whether -o is written through (stdout, a pipe, a terminal): nothing is put beside it."""
    return str(output) == "-" or (os.path.lexists(output) and not os.path.isfile(output))


def _inside(output: Path, run_path: Path) -> bool:
    """Whether the file -o names would land inside the run directory (through links, .. or not)."""
    parent = os.path.realpath(output.parent if str(output.parent) else ".")
    top = os.path.realpath(run_path)
    return parent == top or parent.startswith(top.rstrip("/") + "/")


def _write_beside(output: Path, suffix: str, data: bytes) -> Path:
    """A new file next to the -o report (never over an existing one): REPORT.timeline.png, .2, ..."""
    for n in range(1, 1000):
        target = output.with_name(f"{output.stem}{'' if n == 1 else f'.{n}'}.{suffix}")
        try:
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except FileExistsError:
            continue
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        return target
    raise FileExistsError(f"{output.parent}: too many {suffix} files already")


def _budget_picture(run, keep_in_run: bool) -> str | None:
    """budget.png (--trace's time split and I/O latency) added to the run, for its main phase."""
    from .plot import PlotUnavailable, budget_png
    from .report import budgets_of
    phases = budgets_of(run.result or {})
    if not phases or not keep_in_run:
        return None
    main = max(phases, key=lambda p: p["time_budget"].get("wall_s") or 0)
    import tempfile
    try:
        with tempfile.TemporaryDirectory(prefix="hostpin-plot-") as tmp:
            target = Path(tmp) / "budget.png"
            budget_png(main["time_budget"], target, title=str(run.result.get("verdict") or ""))
            png = target.read_bytes()
        from .evidence import add_after_run
        return add_after_run(run.path, "budget.png", png, "picture")
    except PlotUnavailable as exc:
        click.echo(f"hostpin: note: {exc}", err=True)
    except (OSError, ValueError) as exc:
        click.echo(f"hostpin: note: budget.png not kept in the run: {exc}", err=True)
    return None


def _timeline_png(samples: list[dict], title: str, page_size) -> bytes:
    """The picture's bytes, drawn in a private temporary directory (never where the run is)."""
    import tempfile
    from .plot import DEFAULT_PAGE, timeline_png
    if not isinstance(page_size, int) or isinstance(page_size, bool) or page_size < 4096 or page_size & (page_size - 1):
        page_size = DEFAULT_PAGE
    with tempfile.TemporaryDirectory(prefix="hostpin-plot-") as tmp:
        target = Path(tmp) / "timeline.png"
        timeline_png(samples, target, title=title, page_size=page_size)
        return target.read_bytes()


@cli.command()
@click.argument("run_path", metavar="RUN")
@click.option("--format", "fmt", type=click.Choice(["markdown", "text"]), default="markdown", show_default=True)
@click.option("-o", "--output", type=NonEmptyPath(dir_okay=False, path_type=Path), default=None,
              help="Write the report here (default: stdout). A run directory of yours also keeps report.md "
                   "(and timeline.png); a bundle's picture is kept only next to -o FILE.")
@click.option("--no-picture", is_flag=True, help="Do not draw the timeline picture of a pin run.")
@limits_options
def report(run_path, fmt, output, no_picture, max_size, max_files):
    """Render a run (a directory or a bundle) for a bug report: verdict first, facts, tables,
    the key kernel stack, raw evidence in collapsed sections; a pin run also gets timeline.png
    (with matplotlib: pip install 'hostpin[plot]').

    Nothing in the run is rewritten: report.md and timeline.png are added as new files with
    their entries in manifest.added.jsonl (a different report goes to report.2.md). Exit code
    0: rendered; 2: RUN does not exist; 3: RUN could not be read, or -o not written.
    """
    from .evidence import add_after_run
    from .plot import PlotUnavailable
    from .report import render_report

    run = _open(run_path, _limits(max_size, max_files))
    try:
        if output is not None and not run.from_bundle and _inside(output, run.path):
            raise click.BadParameter(f"{output} is inside the run being read ({run_path}), whose files are its "
                                     "evidence; write the report elsewhere (a run of yours keeps report.md anyway)",
                                     param_hint="'-o'")
        keep_in_run = not run.from_bundle and _owns(run.path)
        picture = None
        with evaluating(run_path):
            if run.command == "repro register" and not no_picture:
                png = None
                try:
                    png = _timeline_png(run.read_jsonl("timeline.jsonl"), str(run.result.get("verdict") or ""),
                                        run.result.get("page_size"))
                except PlotUnavailable as exc:
                    click.echo(f"hostpin: note: {exc}", err=True)
                if png and keep_in_run:
                    try:
                        picture = add_after_run(run.path, "timeline.png", png, "picture")
                    except (OSError, ValueError) as exc:
                        click.echo(f"hostpin: note: timeline.png not kept in the run: {exc}", err=True)
                elif png and output and not _streamed(output):
                    try:
                        picture = _write_beside(output, "timeline.png", png).name
                    except OSError as exc:
                        raise InputError(f"cannot write the picture next to {output}: {exc.strerror or exc}") from None
                elif png:
                    click.echo("hostpin: note: the timeline picture of a bundle is kept only next to a report "
                               "written with -o FILE", err=True)
            budget_picture = _budget_picture(run, keep_in_run) if not no_picture else None
            text = render_report(run, fmt=fmt, picture=picture, budget_picture=budget_picture)
        if output:
            from .confined import PathRefused, write_output
            try:  # a new file renamed over -o, or through a pipe or terminal (-, /dev/stdout); a link never replaced
                write_output(output, text.encode())
            except PathRefused as exc:
                raise InputError(f"cannot write the report to {output}: {exc}") from None
            except OSError as exc:
                raise InputError(f"cannot write the report to {output}: {exc.strerror or exc}") from None
            click.echo(f"report: {output}", err=True)
        else:
            click.echo(text)
        if keep_in_run and fmt == "markdown":
            try:
                add_after_run(run.path, "report.md", text.encode(), "report")
            except (OSError, ValueError) as exc:
                click.echo(f"hostpin: note: report.md not kept in the run: {exc}", err=True)
    finally:
        run.close()
    return EXIT_OK


@cli.command()
@click.argument("run_dir", metavar="RUN_DIR", type=click.Path())
@click.option("-o", "--output", type=NonEmptyPath(dir_okay=False, path_type=Path), default=None,
              help="The .tar.gz to write (default: RUN_DIR's name + .tar.gz here).")
@click.option("--redact", is_flag=True, help="Replace host names, IP/MAC addresses, user names, serials, UUIDs, "
                                             "Kubernetes pod UIDs, container and machine IDs with tokens (listed "
                                             "in redactions.json in the bundle).")
@json_option
@limits_options
@json_errors("bundle")
def bundle(run_dir, output, redact, as_json, max_size, max_files):
    """Pack a run into one verified .tar.gz to attach (every sha256 checked first, no links followed).

    A run killed before it finished is packed as partial: the files its journal lists are
    verified, the ones it did not get to record are kept and marked. Exit code 0: packed;
    2: RUN_DIR does not exist; 3: it could not be read or vouched for, or the bundle not written.
    """
    from .bundle import BundleError, BundleMissing, make_bundle
    if not run_dir.strip():  # '' is not the current directory
        raise click.BadParameter("an empty name is not a run directory; give one (hostpin-runs/...)",
                                 param_hint="RUN_DIR")
    run_dir = Path(run_dir)
    with evaluating(str(run_dir)):
        try:
            result = make_bundle(run_dir, output, redact=redact, limits=_limits(max_size, max_files))
        except BundleMissing as exc:
            raise click.BadParameter(str(exc), param_hint="RUN_DIR") from None
        except BundleError as exc:
            raise InputError(str(exc)) from None
    streamed = result["streamed"]  # the bundle went to stdout or a pipe: what is said about it goes to stderr
    json_to_file(result)
    if as_json:
        click.echo(json.dumps(result, indent=2), err=streamed)
    else:
        stopped = result.get("stopped")
        ended = (f"stopped at {stopped['at']}: its evidence could not be written" if stopped
                 else f"killed at {result['killed_at']}")
        partial = (f"; PARTIAL run ({ended}): "
                   + (f"{len(result['unrecorded'])} files it did not get to record are kept and marked "
                      f"({', '.join(result['unrecorded'][:4])})" if result["unrecorded"] else "its journal verified")
                   if result["partial"] else "")
        click.echo(f"bundle: {result['bundle']} ({result['files']} files, {result['bytes']:,} bytes, every file "
                   f"verified against the manifest{partial}"
                   f"{'; redacted: ' + str(len(result['redactions'])) + ' identifiers' if redact else ''})",
                   err=streamed)
    return EXIT_OK


@cli.command()
@click.argument("runs", metavar="RUN_A RUN_B [RUN_C ...]", nargs=-1, required=True)
@click.option("--format", "fmt", type=click.Choice(["markdown", "text"]), default="text", show_default=True)
@click.option("--columns", is_flag=True, help=f"One column per run even past {FLEET_AFTER} runs (default: "
                                              "a fleet summary there).")
@json_option
@limits_options
@json_errors("compare")
def compare(runs, fmt, columns, as_json, max_size, max_files):
    """Runs or nodes side by side: what differs first (verdicts, kernel, driver, THP, swap and
    swap-in rate, free order-9 memory, headroom, pin times and rates), equal facts folded.

    Past a handful of runs, a fleet summary instead: nodes per verdict and the checks behind
    them, each figure that differs with its min / median / max and the nodes that stand out,
    and groups of nodes sharing kernel, driver and THP settings. A directory that holds run
    directories (hostpin-runs/, or one per node as srun --out gives) stands for all of them.

    A run that cannot be read (a damaged manifest or result, a directory with no manifest, a node's
    directory with no run in it) does not stop a fleet summary: it is counted in the first line and
    listed, with why, under "could not be read" (--json: `unreadable`).

    Exit code 0: compared (a fleet summary also when some runs could not be read: they are named);
    2: fewer than two runs, or one does not exist; 3: a run could not be read (columns), or fewer
    than two could (fleet).
    """
    from .compare import comparison_rows, render_compare
    from .fleet import fleet_summary, render_fleet
    paths, unreadable = _expand_runs(runs)
    if len(paths) + len(unreadable) < 2:
        raise click.BadParameter("give at least two runs, e.g. hostpin compare hostpin-runs/A hostpin-runs/B",
                                 param_hint="RUN")
    fleet = len(paths) + len(unreadable) > FLEET_AFTER and not columns
    if unreadable and not fleet:
        raise InputError(f"{unreadable[0]['path']}: {unreadable[0]['problem']}")
    limits = _limits(max_size, max_files)
    opened = []
    try:
        for path in paths:  # each read and given back at once: one directory open, one bundle unpacked
            try:
                run = _open(path, limits)
                try:
                    with evaluating(path):
                        opened.append(run.detach())
                finally:
                    run.close()
            except InputError as exc:
                if not fleet or getattr(exc, "ours", False):
                    raise
                why = exc.message[len(path):].lstrip(": ") if exc.message.startswith(path) else exc.message
                unreadable.append({"path": path, "problem": why})
        if fleet and len(opened) < 2:
            why = "; ".join(f"{u['path']}: {u['problem']}" for u in unreadable[:3])
            raise InputError(f"{len(unreadable)} runs could not be read, {len(opened)} left: fewer than two to "
                             f"compare: {why}")
        with evaluating(", ".join(runs)):
            wants_doc = as_json or click.get_current_context().meta.get("hostpin.json_file") is not None
            doc = None
            if fleet:
                summary = fleet_summary(opened, unreadable)
                doc = summary
                text = json.dumps(summary, indent=2, default=str) if as_json else render_fleet(summary, fmt=fmt)
            else:
                if wants_doc:
                    differ, equal = comparison_rows(opened)
                    doc = {"runs": [r.source for r in opened], "differ": differ, "equal": equal}
                text = json.dumps(doc, indent=2, default=str) if as_json else render_compare(opened, fmt=fmt)
        if doc is not None:
            json_to_file(doc)
        click.echo(text)
    finally:
        for r in opened:
            r.close()
    return EXIT_OK


_MANIFESTS = ("manifest.json", "manifest.jsonl")


def _is_run(p: Path) -> bool:
    return any(os.path.lexists(p / m) for m in _MANIFESTS)


def _dirs(p: Path) -> list[Path]:
    try:
        return [c for c in sorted(p.iterdir()) if not c.is_symlink() and c.is_dir()]
    except OSError:
        return []


_NO_MANIFEST = "no manifest.json (nor manifest.jsonl): not a readable hostpin run"
_RUN_NAME = re.compile(r"^\d{8}-\d{6}-")


def _looks_like_run(p: Path) -> bool:
    """A run directory whose manifest is gone: a run's other files, or a run's name (time-command-host)."""
    return bool(_RUN_NAME.match(p.name)) or any(os.path.lexists(p / f) for f in
                                                  ("result.json", "manifest.added.jsonl", "root", "probes"))


def _expand_runs(args) -> tuple[list[str], list[dict[str, str]]]:
    """Each argument as given, except a directory without a manifest: the run directories inside it
    (and one level below, for one directory per node), in name order; links are not followed.
    Also what looks like a run there but cannot be one: a directory with no manifest, a node's
    directory with no run in it ([{path, problem}])."""
    out: list[str] = []
    bad: list[dict[str, str]] = []
    for arg in args:
        p = Path(arg)
        if p.is_dir() and not p.is_symlink() and not _is_run(p) and not _looks_like_run(p):
            found, lost = [], []
            for child in _dirs(p):
                if _is_run(child):
                    found.append(str(child))
                elif _looks_like_run(child):
                    lost.append({"path": str(child), "problem": _NO_MANIFEST})
                else:  # a node's directory: its runs
                    mine = len(found) + len(lost)
                    for g in _dirs(child):
                        if _is_run(g):
                            found.append(str(g))
                        elif _looks_like_run(g):
                            lost.append({"path": str(g), "problem": _NO_MANIFEST})
                    if len(found) + len(lost) == mine:
                        lost.append({"path": str(child), "problem": "holds no run directory"})
            if not found and not lost:
                raise click.BadParameter(f"{arg} holds no run directories (none with a manifest.json)",
                                         param_hint="RUN")
            out += found
            bad += lost
        else:
            out.append(arg)
    return out, bad


cli.add_command(_watch)

"""`hostpin preflight`: whether this node can pin the plan now (diag.preflight), as a table, JSON, or
the gate's one line (--format line|npd).

The console command starts the CUDA probe's child before click is imported (diag.cuda.start_early,
called first in repro.cli); this command takes that child (take_early) or starts its own, before its
own imports.
"""
from __future__ import annotations

import functools
import json
import os
from pathlib import Path

import click

from .. import cliopts
from ..cliopts import (MAX_CUDA_TIMEOUT_S, MAX_SAMPLE_S, RANKS, RATE, SIZE, FiniteRange, InputError, NonEmptyPath,
                       check_margin, evaluating, json_errors, json_option, json_to_file, limits_of, limits_options,
                       not_empty, open_run, out_option, unwritten_exit)
from ..exitcodes import EXIT_UNEVALUATED
from ..units import SIZE_EXAMPLE

__all__ = ["preflight"]


def _gate_errors(func):
    """With --format line/npd, what the gate prints is one line whatever happens: node-problem-detector
    reads a traceback's exit code 1 as "problem", so an error inside preflight becomes "unknown"."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        if kwargs.get("fmt") not in ("line", "npd"):
            return func(*args, **kwargs)
        from ..gate import NPD_UNKNOWN, unevaluated_line
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


def _torch_plan(size, chunk, method, source, torch_version, alloc_conf):
    """(the PyTorch request as a dict, the method and source it implies) for --allocator torch; torch is
    never imported. A setting PyTorch would refuse is a bad command line (exit 2)."""
    from click.core import ParameterSource
    from .. import torchalloc
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


@click.command()
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
@click.option("--margin", default="5%", show_default=True, callback=check_margin,
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
@click.option("--cgroup", "cgroup_path", default=None, metavar="PATH", callback=not_empty,
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
@click.option("--torch-version", "torch_version", default=None, metavar="VERSION", callback=not_empty,
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
    from ..cgroup import CgroupError

    if as_json and fmt != "table":
        raise click.UsageError("give --json or --format, not both")
    probe = None
    if not no_cuda and root is None:  # the probe's child takes longest: it starts before the imports below
        from ..cuda import ProbeRun, take_early  # (or before click's: the console command's start_early)
        probe = take_early(cuda_timeout) or ProbeRun(cuda_timeout)
        click.get_current_context().call_on_close(probe.cancel)  # a bad option below leaves no child
    else:
        from ..cuda import cancel_early
        cancel_early()
    from ..checks import Plan
    from ..checks.suite import all_checks
    from ..preflight import run_preflight
    from ..confined import PathRefused
    from ..results import result_dict, write_result

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
            from ..runs import RunError, RunMissing, open_run_path
            try:
                opened = open_run_path(root, limits_of(max_size, max_files))
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
        from ..prometheus import write_textfile
        try:
            result.prometheus = str(write_textfile(result, prometheus, _time.time()))
        except (OSError, PathRefused) as exc:
            prom_error = f"cannot write {prometheus}: {getattr(exc, 'strerror', None) or exc}"
            result.errors.append(f"prometheus: {prom_error}")
            result.verdict += f"; and the Prometheus file could not be written ({prom_error})"
    from ..config import record_config
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
        from ..gate import npd_exit_code, short_line
        # the verdict, decided first; what could not be written goes to stderr below
        click.echo(short_line(data))
        # the answer is given: a Ctrl-C from now on must not turn it into "interrupted" (HostpinGroup.main)
        cliopts.GATE_ANSWERED = npd_exit_code(data) if fmt == "npd" else result.exit_code
        if data.get("status") not in ("pass", "warn", "fail"):
            click.echo(f"hostpin: error: {data.get('verdict')}", err=True)  # the whole message
        for why in filter(None, (prom_error, lost)):
            click.echo(f"hostpin: error: {why}", err=True)
        return npd_exit_code(data) if fmt == "npd" else result.exit_code
    else:
        from ..render import render_preflight  # tabulate: the table alone needs it, not --json or the gate line
        click.echo(render_preflight(data))
    for why in filter(None, (prom_error, lost)):
        click.echo(f"hostpin: error: {why}", err=True)
    return result.exit_code


"""`hostpin compare`: runs or nodes side by side, or past a handful of them a fleet summary."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import click

from ..cliopts import InputError, evaluating, json_errors, json_option, json_to_file, limits_of, limits_options
from ..exitcodes import EXIT_OK
from .runarg import open_run_arg

__all__ = ["compare", "FLEET_AFTER"]

FLEET_AFTER = 6  # compare: more runs than this read as a fleet summary, not one column per run


@click.command()
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
    from ..compare import comparison_rows, render_compare
    from ..fleet import fleet_summary, render_fleet
    paths, unreadable = _expand_runs(runs)
    if len(paths) + len(unreadable) < 2:
        raise click.BadParameter("give at least two runs, e.g. hostpin compare hostpin-runs/A hostpin-runs/B",
                                 param_hint="RUN")
    fleet = len(paths) + len(unreadable) > FLEET_AFTER and not columns
    if unreadable and not fleet:
        raise InputError(f"{unreadable[0]['path']}: {unreadable[0]['problem']}")
    limits = limits_of(max_size, max_files)
    opened = []
    try:
        for path in paths:  # each read and given back at once: one directory open, one bundle unpacked
            try:
                run = open_run_arg(path, limits)
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


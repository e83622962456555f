"""The observing half of the `hostpin` command: the group and diag's verbs in it.

Each verb is a module of diag.commands (preflight, snapshot, report, bundle, compare) and watch is
diag.watch.cli; the options they share are diag.cliopts. Library code returns data; only the command
lines print. Results go to stdout, progress and errors to stderr. The console entry point is
repro.cli:main, which adds the `repro` verbs to this group (diag never imports repro).

Exit codes are one table for every command (diag/exitcodes.py): a path that does not exist
is a bad command line (2); an input that cannot be read or evaluated, or an output that
cannot be written, is 3 with one line saying what and why, never a traceback.
"""
from __future__ import annotations

import sys

import click

import importlib

from . import cliopts
from .cliopts import (MAX_RANKS, RANKS, RATE, SIZE, FiniteRange, InputError, evaluating, json_errors,  # noqa: F401
                      json_option, json_to_file, open_run, out_option, unexpected)

# each verb's module, imported when the verb is run or listed (`hostpin preflight` does not import watch:
# 94 ms of a 0.26 s --no-cuda preflight on the H200, measured by bench/gpu_preflight_speed.sh)
VERBS = {"preflight": "diag.commands.preflight", "snapshot": "diag.commands.snapshot",
         "report": "diag.commands.report", "bundle": "diag.commands.bundle", "compare": "diag.commands.compare",
         "watch": "diag.watch.cli"}

__all__ = ["cli", "SIZE", "RATE", "RANKS", "MAX_RANKS", "FiniteRange", "out_option", "json_option", "json_to_file",
           "open_run", "InputError",
           "evaluating", "unexpected", "json_errors"]


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


class HostpinGroup(click.Group):
    """Every command that writes a run takes --config: the site file fills its options' defaults."""
    group_class = type  # `hostpin repro` is one too

    def main(self, args=None, *rest, **kwargs):
        argv = list(sys.argv[1:] if args is None else args)
        gate = _gate_format(argv)
        if gate is None:
            return super().main(args, *rest, **kwargs)
        cliopts.GATE_ANSWERED = None
        try:
            from .gate import unevaluated_line
            return super().main(args, *rest, **kwargs)
        except click.UsageError as exc:  # exit 2 (npd: unknown); the full message goes to stderr
            click.echo(unevaluated_line(exc.format_message()))
            raise
        except (click.exceptions.Abort, KeyboardInterrupt):
            if cliopts.GATE_ANSWERED is not None:  # interrupted after the one line was printed: that answer stands
                sys.exit(cliopts.GATE_ANSWERED)
            click.echo("hostpin: not evaluated: interrupted")
            if gate == "npd":  # node-problem-detector knows 0, 1 and 2: unknown
                sys.exit(2)
            raise

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(getattr(self, "lazy", {})))

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        lazy = getattr(self, "lazy", {})
        if name in lazy and name not in self.commands:
            self.add_command(getattr(importlib.import_module(lazy[name]), name), name)
        return super().get_command(ctx, name)

    def add_command(self, cmd: click.Command, name: str | None = None) -> None:
        from .config import config_option
        if not isinstance(cmd, click.Group) and any(p.name == "out" for p in cmd.params):
            cmd.params.append(config_option())
        super().add_command(cmd, name)


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


cli.lazy = dict(VERBS)  # type: ignore[attr-defined]

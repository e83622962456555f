"""`hostpin snapshot`: this node's /proc, /sys, driver and CUDA facts captured into a run directory."""
from __future__ import annotations

import json
from pathlib import Path

import click

from ..cliopts import (MAX_CUDA_TIMEOUT_S, FiniteRange, evaluating, evidence_exit, json_errors, json_option,
                       json_to_file, open_run, out_option)
from ..exitcodes import EXIT_OK, EXIT_UNEVALUATED

__all__ = ["snapshot"]


@click.command()
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
    from ..snapshot import take_snapshot

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

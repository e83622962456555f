"""A run (a directory or a bundle) given as a command's argument, opened for reading: report and compare.

Not in diag.cliopts, which diag.watch.cli imports: diag.runs reads watch results, and the shared options
must not import what imports them.
"""
from __future__ import annotations

import click

from ..cliopts import InputError

__all__ = ["open_run_arg"]


def open_run_arg(path: str, limits=None):
    """The run (a directory or a bundle) a RUN argument names, opened for reading: a missing one is a
    bad command line (2), one that cannot be read InputError (3)."""
    from ..confined import DEFAULT_LIMITS
    from ..runs import OutOfResources, RunError, RunMissing, open_run_path
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

"""`hostpin bundle`: a run packed into one verified .tar.gz to attach."""
from __future__ import annotations

import json
from pathlib import Path

import click

from ..cliopts import (InputError, NonEmptyPath, evaluating, json_errors, json_option, json_to_file, limits_of,
                       limits_options)
from ..exitcodes import EXIT_OK

__all__ = ["bundle"]


@click.command()
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
    from ..bundle import BundleError, BundleMissing, make_bundle
    if not run_dir.strip():  # '' is not the current directory
        raise click.BadParameter("an empty name is not a run directory; give one (hostpin-runs/...)",
                                 param_hint="RUN_DIR")
    run_dir = Path(run_dir)
    with evaluating(str(run_dir)):
        try:
            result = make_bundle(run_dir, output, redact=redact, limits=limits_of(max_size, max_files))
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

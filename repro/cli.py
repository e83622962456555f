"""The `hostpin` console command: diag's verbs plus the `repro` group.

Errors at the command line are one line on stderr with exit code 2; domain errors are
click exceptions with a clear message; nothing prints a traceback to a user.
"""
from __future__ import annotations

import sys

import click

from diag.cli import cli
from diag.exitcodes import EXIT_INTERRUPTED, EXIT_USAGE

__all__ = ["main", "cli"]


@cli.group()
def repro():
    """Reproduce pinning stalls and failures for real, under a watchdog (acts on the node)."""


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

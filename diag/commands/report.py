"""`hostpin report`: a run (a directory or a bundle) rendered for a bug report, with its pictures."""
from __future__ import annotations

import os
from pathlib import Path

import click

from ..cliopts import InputError, NonEmptyPath, evaluating, limits_of, limits_options
from ..exitcodes import EXIT_OK
from .runarg import open_run_arg

__all__ = ["report"]


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
    from ..plot import PlotUnavailable, budget_png
    from ..report import budgets_of
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
        from ..evidence import add_after_run
        return add_after_run(run.path, "budget.png", png, "picture")
    except PlotUnavailable as exc:
        click.echo(f"hostpin: note: {exc}", err=True)
    except (OSError, ValueError) as exc:
        click.echo(f"hostpin: note: budget.png not kept in the run: {exc}", err=True)
    return None


def _timeline_png(samples: list[dict], title: str, page_size) -> bytes:
    """The picture's bytes, drawn in a private temporary directory (never where the run is)."""
    import tempfile
    from ..plot import DEFAULT_PAGE, timeline_png
    if not isinstance(page_size, int) or isinstance(page_size, bool) or page_size < 4096 or page_size & (page_size - 1):
        page_size = DEFAULT_PAGE
    with tempfile.TemporaryDirectory(prefix="hostpin-plot-") as tmp:
        target = Path(tmp) / "timeline.png"
        timeline_png(samples, target, title=title, page_size=page_size)
        return target.read_bytes()



@click.command()
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
    from ..evidence import add_after_run
    from ..plot import PlotUnavailable
    from ..report import render_report

    run = open_run_arg(run_path, limits_of(max_size, max_files))
    try:
        if output is not None and not run.from_bundle and _inside(output, run.path):
            raise click.BadParameter(f"{output} is inside the run being read ({run_path}), whose files are its "
                                     "evidence; write the report elsewhere (a run of yours keeps report.md anyway)",
                                     param_hint="'-o'")
        if (output is not None and run.from_bundle and os.path.lexists(output) and os.path.exists(run.source)
                and os.path.samefile(output, run.source)):
            raise click.BadParameter(f"{output} is the bundle being read; write the report elsewhere",
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
            from ..confined import PathRefused, write_output
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

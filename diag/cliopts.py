"""The options and helpers every `hostpin` command line shares (diag.cli and its verbs in diag.commands,
diag.watch.cli, repro.cli): sizes, rates and rank counts as parameter types, --out, --json and the read limits,
the run directory, exit 3's error and the one line for an unexpected one.

Below every CLI module and importing none of them, so the verbs' modules can share it without
importing each other.
"""
from __future__ import annotations

import functools
import json
import os
import sys
import traceback
from contextlib import contextmanager
from pathlib import Path

import click

from .exitcodes import EXIT_OK, EXIT_UNEVALUATED
from .units import SizeError, parse_rate, parse_size

__all__ = ["InputError", "SizeType", "RateType", "RanksType", "FiniteRange", "SIZE", "RATE", "RANKS",
           "out_option", "json_option", "open_run", "GuardedStream", "evidence_exit", "unwritten_exit",
           "CALLER_UMASK", "COMMAND_EXIT", "GATE_ANSWERED", "unexpected", "evaluating", "json_errors",
           "check_margin", "limits_options", "limits_of", "NonEmptyPath", "not_empty"]


class InputError(click.ClickException):
    """Exit 3: the input could not be read or evaluated, or the output could not be written."""
    exit_code = EXIT_UNEVALUATED

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))


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


MAX_RANKS = 1024     # ranks on one node: far past any GPU count, and repro starts one child per rank
MAX_SAMPLE_S = 60.0   # --sample: a minute of swap-in demand is plenty, and it holds up every prolog
MAX_CUDA_TIMEOUT_S = 3600.0  # --cuda-timeout: an hour; past ~2.1e6 s the selector's timer overflows


class RanksType(click.ParamType):
    name = "N"

    def convert(self, value, param, ctx):
        try:
            n = int(value)
        except (TypeError, ValueError):
            n = None
        if n is None or not 1 <= n <= MAX_RANKS:
            self.fail(f"{value!r} is not a rank count; use a whole number from 1 to {MAX_RANKS}, e.g. --ranks 2",
                      param, ctx)
        return n


class FiniteRange(click.FloatRange):
    """A FloatRange that also refuses nan and inf (which compare as neither below nor above)."""

    def convert(self, value, param, ctx):
        rv = super().convert(value, param, ctx)
        if rv != rv or rv in (float("inf"), float("-inf")):
            self.fail(f"{value!r} is not a finite number of seconds", param, ctx)
        return rv


SIZE, RATE, RANKS = SizeType(), RateType(), RanksType()
CALLER_UMASK: int | None = None  # the umask hostpin was started with, before it made its own files private
COMMAND_EXIT = False  # the exit code is CMD's (`watch -- CMD`): an output that failed does not change it
GATE_ANSWERED: int | None = None  # the exit code of a gate line already printed (preflight --format line|npd)


def out_option(f):
    return click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
                        help="Parent directory for the run directory (default ./hostpin-runs).")(f)


def _json_file(ctx: click.Context, param: click.Parameter, value: Path | None) -> Path | None:
    if value is not None:
        from .jsonfile import problem_with
        why = problem_with(value)
        cfg = ctx.meta.get("hostpin.config")  # --config is eager: the site file is known by now
        if not why and cfg is not None and _same_file(value, cfg.path):
            why = f"it is the site file (--config {cfg.path}); write the document elsewhere"
        if why:
            raise click.BadParameter(f"cannot write {value}: {why}", ctx, param)
        ctx.meta["hostpin.json_file"] = value
    return value


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


class _FilePath(click.Path):
    def convert(self, value, param, ctx):
        if isinstance(value, str) and not value.strip():  # Path('') would be '.', "a directory"
            self.fail("an empty path; give a file name", param, ctx)
        return super().convert(value, param, ctx)


def json_option(f):
    f = click.option("--json-file", type=_FilePath(dir_okay=False, path_type=Path), default=None, metavar="PATH",
                     expose_value=False, callback=_json_file,
                     help="Also write the --json document to PATH, atomically (the rules of -o: a link at PATH is "
                          "never followed nor replaced).")(f)
    return click.option("--json", "as_json", is_flag=True,
                        help="Print the result as JSON on stdout (also when it fails).")(f)


def json_to_file(doc) -> None:
    """With --json-file PATH: the command's JSON document (the one --json prints) into PATH,
    atomically. One that cannot be written is exit 3 with one line."""
    ctx = click.get_current_context(silent=True)
    path = ctx.meta.get("hostpin.json_file") if ctx is not None else None
    if path is None:
        return
    from .jsonfile import dumps, write_json_file
    try:
        write_json_file(path, dumps(doc))
    except OSError as exc:
        raise InputError(f"cannot write {path}: {exc.strerror or exc}") from None


def _error_to_json_file(doc: dict) -> None:
    ctx = click.get_current_context(silent=True)
    path = ctx.meta.get("hostpin.json_file") if ctx is not None else None
    if path is not None:
        from .jsonfile import dumps, write_json_file
        try:
            write_json_file(path, dumps(doc))
        except OSError:
            pass  # the error itself is the answer, on stderr


def open_run(out: Path | None, command: str, durable: bool = False, keep_going: bool = False):
    """The command's run directory; InputError when it cannot be made, or with keep_going a run
    that keeps nothing (RunDir.unkept, its `lost` says why): the command still decides."""
    if not keep_going:
        return _open_run(out, command, durable)
    try:
        return _open_run(out, command, durable)
    except InputError as exc:
        from .evidence import RunDir, new_run_dir
        return RunDir.unkept(new_run_dir(out, command), command, exc.message, sys.argv)


def _open_run(out: Path | None, command: str, durable: bool = False):
    from .evidence import RunDir, new_run_dir
    if out is not None and os.path.exists(out) and not os.path.isdir(out):
        raise InputError(f"cannot create a run directory under {out}: it is not a directory; "
                         "choose another with --out")
    for _ in range(20):  # another hostpin (a rank beside this one) may take the same name this second
        path = new_run_dir(out, command)
        try:
            return RunDir(path, command, sys.argv, durable=durable)
        except FileExistsError:
            continue
        except OSError as exc:
            raise InputError(f"cannot create the run directory {path}: {exc.strerror or exc}; "
                             "choose another with --out") from None
    raise InputError(f"cannot create a run directory under {out or 'hostpin-runs'}: every name is taken; "
                     "choose another with --out")


class GuardedStream:
    """sys.stdout or sys.stderr, whose failed writes (a full disk under `2>>log`, /dev/full, a closed
    pipe) are swallowed and remembered: a message that cannot be shown never changes what the
    command decided, nor its exit code. main() makes stdout's failure exit 3 for a command that
    had otherwise passed (the output could not be written)."""

    def __init__(self, stream):
        self.failed: str | None = None
        if stream is None:  # the interpreter found the descriptor closed
            stream, self.failed = open(os.devnull, "w", encoding="utf-8"), "it is closed"
        self._stream = stream

    def write(self, text):
        try:
            return self._stream.write(text)
        except (OSError, ValueError) as exc:
            self._fail(exc)
            return len(text)

    def flush(self):
        try:
            self._stream.flush()
        except (OSError, ValueError) as exc:
            self._fail(exc)

    def _fail(self, exc):
        if self.failed is None:
            self.failed = getattr(exc, "strerror", None) or str(exc)
        try:  # drop what is buffered, so that the interpreter's own flush at exit does not fail again
            self._stream = open(os.devnull, "w", encoding="utf-8")
        except OSError:
            pass

    def __getattr__(self, name):
        return getattr(self._stream, name)


def evidence_exit(run, code: int) -> int:
    """The exit code once the run is finished: as decided, or 3 for a success whose evidence could
    not be kept (a full disk), said on stderr."""
    if getattr(run, "lost", None) is None:
        return code
    click.echo(f"hostpin: error: the evidence could not be kept ({run.lost})", err=True)
    return unwritten_exit(code)


def unwritten_exit(code: int) -> int:
    """The exit code once an output could not be written: what was decided stands (1 a failure, or
    any code but 0), and a pass becomes 3, "could not write the output"."""
    return EXIT_UNEVALUATED if code == EXIT_OK else code


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


def check_margin(ctx, param, value):
    """--margin: a percentage of MemTotal or a size (a callback, and repro register's check)."""
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


def limits_of(max_size: int | None, max_files: int | None):
    """The read limits --max-size and --max-files give (diag.confined.Limits)."""
    from .confined import Limits
    return Limits.for_total(max_size, max_files)


class NonEmptyPath(click.Path):
    """A path option that refuses the empty string (click would read it as '.', the current directory)."""

    def convert(self, value, param, ctx):
        if isinstance(value, str) and not value.strip():
            self.fail("an empty path; give a file name", param, ctx)
        return super().convert(value, param, ctx)


def not_empty(ctx, param, value):
    if isinstance(value, str) and not value.strip():
        what = {"VERSION": "a version, e.g. 2.11.0"}.get(getattr(param, "metavar", None), "a path")
        raise click.BadParameter(f"an empty value; give {what}, or leave the option out")
    return value

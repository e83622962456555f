"""The site configuration file: the plan and the gate's settings in one place, so that a launcher,
a Slurm prolog or a DaemonSet says only `hostpin preflight`.

    # /etc/hostpin/hostpin.toml
    [plan]                      # hostpin preflight's plan: --size, --ranks, --method, --thp, ...
    size = "47.2GiB"
    ranks = 2
    method = "register"
    thp = true
    [preflight]                 # any other preflight option: margin, reserve, skip, strict, ...
    margin = "5%"
    skip = ["kernel"]
    [runs]
    dir = "/var/lib/hostpin/runs"   # every command's --out (a relative one: from the file's directory)

The file is found at --config PATH, else $HOSTPIN_CONFIG, else /etc/hostpin/hostpin.toml when it
exists (`--config none` reads no file). It only fills the defaults of the options (click's
default_map): an option given on the command line wins. Every value is checked when the file is
read, by the option that would take it, so a bad file is one line naming the file, the section and
the key (exit 2), before anything runs. The run records what was in effect and where it came from.
"""
from __future__ import annotations

import hashlib
import os
import stat
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser, packaged (pyproject installs it there)
    import tomli as tomllib

__all__ = ["DEFAULT_PATH", "ENV_VAR", "ConfigError", "SiteConfig", "load_config", "config_option",
           "effective_settings", "record_config"]

DEFAULT_PATH = Path("/etc/hostpin/hostpin.toml")
ENV_VAR = "HOSTPIN_CONFIG"
MAX_BYTES = 1 << 20
META_KEY = "hostpin.config"

PLAN_KEYS = ("size", "ranks", "method", "thp", "source", "map", "readonly", "chunk", "reserve", "allocator")
# per-invocation choices, not site policy: they stay on the command line
NOT_FROM_FILE = {"root", "json", "format", "config", "out", "help"}
SECTIONS = {
    "plan": "the plan preflight judges: " + ", ".join(PLAN_KEYS),
    "preflight": "hostpin preflight's other options (margin, reserve, skip, strict, no-cuda, cuda-timeout, "
                 "sample, prometheus)",
    "runs": "dir: where every command writes its run directory (--out)",
}


class ConfigError(Exception):
    """A configuration file that cannot be used; the message is one line naming the file and key."""


@dataclass
class SiteConfig:
    path: Path
    sha256: str
    data: bytes
    tables: dict[str, dict[str, Any]]
    # command name -> {parameter name: value from the file}; "*" applies to every command that has it
    defaults: dict[str, dict[str, Any]] = field(default_factory=dict)

    def defaults_for(self, command: click.Command) -> dict[str, Any]:
        names = {p.name for p in command.params}
        out = {k: v for k, v in self.defaults.get("*", {}).items() if k in names}
        if command.name in self.defaults:
            out.update(self.defaults[command.name])
        return out

    def describe(self) -> dict[str, Any]:
        return {"path": str(self.path), "sha256": self.sha256, "file": self.tables}


def _key(text: str) -> str:
    return text.strip().lstrip("-").replace("_", "-")


def _option_by_key(command: click.Command) -> dict[str, click.Option]:
    """Each option of a command under the names a file may use: its long flag without dashes."""
    out: dict[str, click.Option] = {}
    for p in command.params:
        if isinstance(p, click.Option):
            for opt in p.opts:
                if opt.startswith("--") and _key(opt) not in NOT_FROM_FILE:
                    out[_key(opt)] = p
    return out


def _toml_type(param: click.Option) -> tuple[tuple[type, ...], str]:
    """The TOML type a key must have: what the option's type takes from a command line, not whatever
    Python would coerce (2.9 ranks, true ranks, a bare number of bytes)."""
    t = param.type
    if param.is_flag or isinstance(t, click.types.BoolParamType):
        return (bool,), "true or false"
    if isinstance(t, click.types.IntParamType) or getattr(t, "name", "") == "N":
        return (int,), "a whole number, e.g. 2"
    if isinstance(t, click.types.FloatParamType):
        return (int, float), "a number, e.g. 15"
    if getattr(t, "name", "") in ("SIZE", "RATE"):
        return (str,), "a string with a unit, e.g. \"47GiB\"" if t.name == "SIZE" else \
            "a string with a unit, e.g. \"40MB/s\""
    return (str,), "a string, e.g. \"5%\"" if param.name == "margin" else "a string"


def _check_type(where: str, param: click.Option, value: Any) -> None:
    types, what = _toml_type(param)
    if isinstance(value, bool) and bool not in types or not isinstance(value, types):
        shown = str(value).lower() if isinstance(value, bool) else repr(value)  # as TOML writes it
        raise ConfigError(f"{where}: {shown} is not {what}")


def _check_value(where: str, command: click.Command, param: click.Option, value: Any) -> Any:
    """Convert a value the way the option would, so a bad value is caught now, named by its key."""
    if isinstance(value, dict):
        raise ConfigError(f"{where}: a table is not a value; give e.g. {param.opts[-1].lstrip('-')} = ...")
    if param.multiple and not isinstance(value, list):
        raise ConfigError(f"{where}: give a list, e.g. [\"{value}\"]")
    if not param.multiple and isinstance(value, list):
        raise ConfigError(f"{where}: give one value, not a list")
    if param.is_flag and not isinstance(value, bool):
        raise ConfigError(f"{where}: {value!r} is not true or false")
    for item in (value if isinstance(value, list) else [value]):
        _check_type(where, param, item)
    ctx = click.Context(command)
    try:
        return param.process_value(ctx, value)
    except click.BadParameter as exc:
        raise ConfigError(f"{where}: {exc.message}") from None
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: {value!r} is not a value this option takes ({exc})") from None


def _check_skip(where: str, names: list[str]) -> None:
    from .checks.suite import all_checks
    known = {c.id for c in all_checks()}
    for name in names:
        if name not in known:
            raise ConfigError(f"{where}: {name!r} is not a check; use one of {', '.join(sorted(known))}")


def _validate(path: Path, tables: dict[str, Any], root: click.Group) -> dict[str, dict[str, Any]]:
    defaults: dict[str, dict[str, Any]] = {}
    preflight = root.get_command(click.get_current_context(silent=True), "preflight")  # imported if lazy
    for section, body in tables.items():
        if section not in SECTIONS:
            raise ConfigError(f"{path}: unknown section or key {section!r}; the file holds the tables "
                              f"[{'], ['.join(SECTIONS)}]")
        if not isinstance(body, dict):
            raise ConfigError(f"{path}: {section!r} must be a table: [{section}] on its own line, then keys")
        if section == "runs":
            for key, value in body.items():
                where = f"{path}: [runs] {key}"
                if _key(key) != "dir":
                    raise ConfigError(f"{where}: unknown key; [runs] holds dir (where run directories go)")
                if not isinstance(value, str) or not value.strip():
                    raise ConfigError(f"{where}: give a directory as a string, e.g. dir = \"/var/lib/hostpin/runs\"")
                defaults.setdefault("*", {})["out"] = _runs_dir(where, value, path.parent)
            continue
        options = _option_by_key(preflight)
        allowed = PLAN_KEYS if section == "plan" else tuple(k for k in options if k not in PLAN_KEYS)
        for key, value in body.items():
            where = f"{path}: [{section}] {key}"
            k = _key(key)
            negated = next((p for p in options.values() if f"--{k}" in p.secondary_opts), None)
            if negated is not None:
                raise ConfigError(f"{where}: write {_key(negated.opts[0])} = false instead")
            if k not in allowed:
                other = "preflight" if section == "plan" else "plan"
                hint = (f"; it belongs in [{other}]" if k in options and k not in allowed
                        else f"; it is given on the command line only" if k in NOT_FROM_FILE
                        else f"; [{section}] holds {', '.join(sorted(allowed))}")
                raise ConfigError(f"{where}: unknown key{hint}")
            param = options[k]
            if param.name in defaults.get("preflight", {}):
                raise ConfigError(f"{where}: set twice (as {param.name})")
            _check_value(where, preflight, param, value)
            if param.name == "skip":
                _check_skip(where, value)
            defaults.setdefault("preflight", {})[param.name] = value
    return defaults


def _kind(mode: int) -> str:
    return ("a directory" if stat.S_ISDIR(mode) else "a named pipe" if stat.S_ISFIFO(mode)
            else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a regular file")


def _read_regular(path: Path) -> bytes:
    """The file's first MAX_BYTES + 1 bytes, never blocking: a FIFO, a device or a directory is
    refused before it is opened (a named pipe would hang every command, a Slurm prolog among them,
    and a device's open() has effects of its own); a link to a file is followed, as a Kubernetes
    ConfigMap mounts one."""
    before = os.stat(path)
    if not stat.S_ISREG(before.st_mode):
        raise OSError(0, f"it is {_kind(before.st_mode)}, not a file")
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != (before.st_dev, before.st_ino):
            raise OSError(0, "it was replaced while it was read")
        chunks, left = [], MAX_BYTES + 1
        while left > 0:
            piece = os.read(fd, left)
            if not piece:
                break
            chunks.append(piece)
            left -= len(piece)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _runs_dir(where: str, value: str, base: Path) -> str:
    """[runs] dir, relative to the file's own directory; a file or a dangling link there is named now."""
    p = Path(value).expanduser()
    p = p if p.is_absolute() else base / p
    if os.path.islink(p) and not p.exists():
        raise ConfigError(f"{where}: {str(p)!r} is a symbolic link to {os.readlink(p)!r}, which does not exist")
    if p.exists() and not p.is_dir():
        raise ConfigError(f"{where}: {str(p)!r} is a file, not a directory")
    return str(p)


def load_config(value: str | None, root: click.Group, default_path: Path | None = None) -> SiteConfig | None:
    """The site file named by --config/$HOSTPIN_CONFIG, or the default one when it exists; None for none."""
    if value is not None and value.strip().lower() == "none":
        return None
    default_path = default_path or DEFAULT_PATH
    if value:
        path = Path(value)
    elif default_path.exists() or default_path.is_symlink():
        path = default_path
    else:
        return None
    path = Path(os.path.abspath(path))  # recorded as given, whatever the directory the run is made from
    try:
        data = _read_regular(path)
    except OSError as exc:
        raise ConfigError(f"cannot read the configuration file {path}: {exc.strerror}; "
                          f"give another with --config PATH, or --config none") from None
    if len(data) > MAX_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_BYTES >> 20} MiB; not a hostpin configuration file")
    try:
        tables = tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text; not a hostpin configuration file") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    except RecursionError:  # tomllib parses nested arrays and tables recursively
        raise ConfigError(f"{path}: nested too deeply; not a hostpin configuration file") from None
    defaults = _validate(path, tables, root)
    return SiteConfig(path=path, sha256=hashlib.sha256(data).hexdigest(), data=data, tables=tables,
                      defaults=defaults)


def _load_into_context(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    try:
        cfg = load_config(value, ctx.find_root().command)
    except ConfigError as exc:
        raise click.UsageError(str(exc), ctx) from None
    ctx.meta[META_KEY] = cfg
    if cfg is not None:
        ctx.default_map = {**(ctx.default_map or {}), **cfg.defaults_for(ctx.command)}


def config_option() -> click.Option:
    """--config, processed before every other option so that the file fills their defaults."""
    return click.Option(["--config"], metavar="PATH|none", envvar=ENV_VAR, is_eager=True, expose_value=False,
                        callback=_load_into_context,
                        help=f"Site configuration file (TOML; default {DEFAULT_PATH} when it exists, or "
                             f"${ENV_VAR}; 'none': no file). Options on the command line win over it.")


_SOURCE_WORDS = {"COMMANDLINE": "command line", "ENVIRONMENT": "environment", "DEFAULT_MAP": "file",
                 "DEFAULT": "default", "PROMPT": "prompt"}


def _jsonable(value: Any) -> Any:
    if isinstance(value, (tuple, list)):
        return [_jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


def effective_settings(ctx: click.Context) -> dict[str, Any]:
    """What the command ran with: the file (path, sha256, content) and each option's value and origin."""
    cfg: SiteConfig | None = ctx.meta.get(META_KEY)
    settings = {}
    for p in ctx.command.params:
        if not isinstance(p, click.Option) or p.name in ("config", "help") or p.name not in ctx.params:
            continue
        source = ctx.get_parameter_source(p.name)
        settings[p.name] = {"value": _jsonable(ctx.params[p.name]),
                            "from": _SOURCE_WORDS.get(source.name if source else "DEFAULT", "default")}
    out: dict[str, Any] = {"path": None, "sha256": None}
    if cfg is not None:
        out.update(cfg.describe())
    out["settings"] = settings
    return out


def record_config(run, result) -> None:
    """Keep the file itself in the run (config/hostpin.toml) and what was in effect in the result."""
    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return
    cfg: SiteConfig | None = ctx.meta.get(META_KEY)
    if cfg is not None and run is not None:
        run.add_file("config/hostpin.toml", cfg.data, kind="config", source=str(cfg.path))
    result.config = effective_settings(ctx)

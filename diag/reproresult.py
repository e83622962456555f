"""The result of `hostpin repro register`, as typed data: a diag.resultbase.Result that repro builds
(repro.outcome.build_result) and every reader (report, compare, the CLI's --json) reads by field.

Here, below diag.results, so that diag reads what repro writes without importing repro. Reading a
recorded result checks every field's JSON type against its annotation and names the first one
that is wrong (`ranks[0].seconds is a str, not a number`): a damaged result is refused whole,
never half rendered. Keys this version does not know are kept in `extra` and written back.

Versions: none (recorded before results had a schema), 1 (a schema, but the run's figures were
untyped keys beside a handful of fields), 2 (every key typed). Older ones read as version 2 and
say so in `upgraded_from`; every key they had is kept.
"""
from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar

from .resultbase import Result

__all__ = ["ReproRegisterResult", "RankResult", "PinError", "PrefaultFigures", "Stopped", "Throttle", "Undo",
           "ResultDamaged"]


class ResultDamaged(ValueError):
    """A recorded result whose field has the wrong JSON type; the message names the field."""


@dataclass
class PinError:
    """The failed call of a rank: its name, error code and name, and the catalog entry it matches."""
    message: str | None = None
    call: str | None = None
    code: int | None = None
    name: str | None = None            # cudaErrorInvalidValue, or an errno's name
    catalog: int | None = None         # diag/catalog.py entry
    meaning: str | None = None


@dataclass
class PrefaultFigures:
    seconds: float | None = None
    rate_gib_s: float | None = None
    threads: int | None = None
    method: str | None = None
    skipped: str | None = None         # why there was nothing to prefault (cudaHostAlloc allocates its own)


@dataclass
class RankResult:
    rank: int
    outcome: str                       # completed, failed, stalled, killed, unkillable
    pid: int | None = None
    device: int | None = None          # the CUDA device its child opened (None: none, as with mlock)
    exit_status: int | None = None     # the child's, as waitpid says; negative: the signal that ended it
    seconds: float | None = None
    rate_gib_s: float | None = None
    chunks: list[dict[str, Any]] | None = None   # per --chunk: offset, bytes, seconds
    prefault: PrefaultFigures | None = None
    error: PinError | None = None
    unpin_s: float | None = None


@dataclass
class Undo:
    """One step of the cleanup: what was undone, whether it all went, what could not be."""
    undo: str
    ok: bool
    problems: list[str] = field(default_factory=list)
    seconds: float | None = None


@dataclass
class Stopped:
    """Why the watchdog stopped the run early (stall, deadline) and where it was."""
    reason: str
    phase: str | None = None
    at_s: float | None = None
    progress: dict[str, Any] = field(default_factory=dict)


@dataclass
class Throttle:
    devices: list[str] = field(default_factory=list)
    read_bytes_per_s: int | None = None


@dataclass
class ReproRegisterResult(Result):
    SCHEMA: ClassVar[str] = "hostpin.repro-register"
    SCHEMA_VERSION: ClassVar[int] = 2

    outcome: str                       # repro.outcome.OUTCOMES
    verdict: str = ""
    exit_code: int | None = None
    tool: str = "hostpin"
    command: str = "repro register"
    options: dict[str, Any] = field(default_factory=dict)   # the run's options as given
    run_dir: str | None = None
    # the pin
    seconds: float | None = None       # the pin: the slowest rank's, or how long it ran when stopped
    rate_gib_s: float | None = None    # all ranks together
    clean_rate_gib_s: float | None = None   # this node's, measured on 256 MiB first
    slowdown: float | None = None      # clean rate / this run's rate per rank
    pinned_pages: int | None = None
    expected_pages: int | None = None
    page_size: int | None = None
    progress_counter: str | None = None     # what pinned_pages counts
    bound: str | None = None
    bound_reason: str | None = None
    bound_evidence: str | None = None  # the same as bound_reason (kept for readers of the first layout)
    bound_frame: str | None = None
    bound_counts: dict[str, int] = field(default_factory=dict)
    first_bound_at_s: float | None = None
    catalog: int | None = None         # the entry the bound names
    eta_at_20pct: dict[str, Any] | None = None
    eta_error: float | None = None     # (ETA given at 20% - the real end) / the real end
    swapin_pages_during_pin: int | None = None
    swapin_pages_per_s: float | None = None
    pin_figures: dict[str, Any] | None = None   # what the children showed over the pin (Tracker.figures)
    copy_from_swap: dict[str, Any] | None = None  # Tensor.pin_memory(): its copy's swap-in (catalog 19)
    ranks: list[RankResult] = field(default_factory=list)
    # what the run set up, and undid
    swap_file: str | None = None
    swapped_out_bytes: list[int | None] = field(default_factory=list)   # per rank, before the pin
    swap_out_steps: list[dict[str, Any]] = field(default_factory=list)
    cgroups: list[str] = field(default_factory=list)
    throttle: Throttle | None = None
    calibration: dict[str, Any] | None = None
    file_cache: dict[str, Any] | None = None
    torch: dict[str, Any] | None = None     # --allocator torch: what PyTorch asks the driver for
    cleanup: list[Undo] = field(default_factory=list)
    # how it ended, when not by itself
    refusal: dict[str, Any] | None = None   # refused: the check, its summary and evidence
    stopped: Stopped | None = None
    kill: dict[str, Any] | None = None      # the evidence taken before the kill (stacks, dmesg)
    undo_kill: dict[str, Any] | None = None
    interrupted_by: str | None = None
    error: str | None = None                # not run: why
    # the watchdog and --trace
    watchdog: dict[str, Any] | None = None
    trace: dict[str, Any] | None = None
    phases: list[dict[str, Any]] = field(default_factory=list)   # --trace: each rank's time budget
    time_budget: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)
    facts: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)   # keys this version does not know, kept as they were
    upgraded_from: int | None = None        # 0: recorded without a schema; 1: schema 1

    @property
    def failed_catalog(self) -> list[int]:
        return [r.error.catalog for r in self.ranks if r.error is not None and r.error.catalog]

    def failed_rank(self) -> RankResult | None:
        return next((r for r in self.ranks if r.outcome == "failed"), None)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ReproRegisterResult":
        """A recorded result, checked field by field; ResultDamaged names the first wrong one."""
        if not isinstance(data, dict):
            raise ResultDamaged(f"the result is {_kind(data)}, not an object")
        version = data.get("schema_version") if data.get("schema") == cls.SCHEMA else 0
        if not isinstance(version, int) or isinstance(version, bool):
            raise ResultDamaged(f"schema_version is {_kind(version)}, not a whole number")
        if data.get("schema") == cls.SCHEMA and not 1 <= version <= cls.SCHEMA_VERSION:
            raise ResultDamaged(f"schema_version {version} is not one this hostpin reads (1 to {cls.SCHEMA_VERSION}"
                                + ("; a later hostpin wrote it)" if version > cls.SCHEMA_VERSION else ")"))
        if "outcome" not in data:
            raise ResultDamaged("outcome is missing")
        result = _build(cls, {k: v for k, v in data.items() if k not in ("schema", "schema_version")}, "")
        result.upgraded_from = version if version < cls.SCHEMA_VERSION else None
        return result


# -- reading JSON into the dataclasses, checking each field's type ---------------------------------
def _kind(v: Any) -> str:
    """'null', 'a str', 'an int': what a JSON value is, as Python read it."""
    if v is None:
        return "null"
    name = type(v).__name__
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}"


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def _build(cls: type, data: dict[str, Any], where: str) -> Any:
    hints = _hints(cls)
    names = {f.name for f in dataclasses.fields(cls) if f.init} - {"extra", "upgraded_from"}
    kwargs = {}
    for name in names & set(data):
        kwargs[name] = _value(data[name], hints[name], f"{where}{name}")
    missing = [f.name for f in dataclasses.fields(cls) if f.name in names and f.name not in kwargs
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        raise ResultDamaged(f"{where}{missing[0]} is missing")
    if "extra" in {f.name for f in dataclasses.fields(cls)}:
        kwargs["extra"] = {k: v for k, v in data.items() if k not in names and k != "upgraded_from"}
    return cls(**kwargs)


def _value(value: Any, hint: Any, where: str) -> Any:
    """value as the type hint says (nested dataclasses built), or ResultDamaged naming `where`."""
    if dataclasses.is_dataclass(hint) and isinstance(value, hint):
        return value  # built by repro already
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _value(value, inner[0], where) if len(inner) == 1 else value
    if hint is Any:
        return value
    if dataclasses.is_dataclass(hint):
        if not isinstance(value, dict):
            raise ResultDamaged(f"{where} is {_kind(value)}, not an object")
        return _build(hint, value, f"{where}.")
    if origin is list or hint is list:
        if not isinstance(value, list):
            raise ResultDamaged(f"{where} is {_kind(value)}, not a list")
        item = args[0] if args else Any
        return [_value(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict or hint is dict:
        if not isinstance(value, dict):
            raise ResultDamaged(f"{where} is {_kind(value)}, not an object")
        item = args[1] if len(args) == 2 else Any
        return {k: _value(v, item, f"{where}.{k}") for k, v in value.items()}
    if hint is bool:
        if not isinstance(value, bool):
            raise ResultDamaged(f"{where} is {_kind(value)}, not true or false")
        return value
    if hint is int:
        if not isinstance(value, int) or isinstance(value, bool):
            raise ResultDamaged(f"{where} is {_kind(value)}, not a whole number")
        return value
    if hint is float:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise ResultDamaged(f"{where} is {_kind(value)}, not a number")
        if value != value or value in (float("inf"), float("-inf")):
            raise ResultDamaged(f"{where} is {value!r}, not a number")
        return value
    if hint is str:
        if not isinstance(value, str):
            raise ResultDamaged(f"{where} is {_kind(value)}, not a string")
        return value
    return value

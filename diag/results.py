"""Typed results: what each command decides, as dataclasses with a schema name and version.

A result is turned into JSON by one function, `result_dict`, and written into its run by one
function, `write_result`; what reads a result (report, compare, the Prometheus writer, the
CLI's --json) reads fields, never prose: `binding` is a field, not the word "cgroup" in a
sentence. `load_result` reads any recorded result back, including runs recorded before
results had a schema (they are upgraded on reading, and say so in `upgraded_from`).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

from .reproresult import RankResult, ReproRegisterResult, ResultDamaged, _kind
from .resultbase import Result, result_dict, write_result
from .watch.result import WatchResult

__all__ = ["Result", "CheckResult", "PreflightResult", "ReproRegisterResult", "RankResult", "ResultDamaged",
           "SideFigures", "StagingResult",
           "result_dict", "write_result",
           "load_result", "preflight_result", "repro_result"]


@dataclass
class CheckResult:
    id: str
    title: str
    status: str                       # pass | warn | fail | skip | error
    summary: str
    remedy: str | None = None
    catalog: list[int] = field(default_factory=list)      # entries the check covers
    predicted: list[int] = field(default_factory=list)    # entries whose condition holds on this node
    missing: list[str] = field(default_factory=list)      # inputs not captured / unreadable / damaged
    evidence: dict[str, Any] = field(default_factory=dict)


@dataclass
class PreflightResult(Result):
    SCHEMA: ClassVar[str] = "hostpin.preflight"
    SCHEMA_VERSION: ClassVar[int] = 2

    status: str                              # pass | warn | fail | error
    exit_code: int
    verdict: str
    plan: dict[str, Any] = field(default_factory=dict)
    root: str | None = None
    live: bool = True
    run_dir: str | None = None
    host: str | None = None
    kernel: str | None = None
    machine: str | None = None
    page_size: int | None = None
    page_size_source: str | None = None
    checks: list[CheckResult] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)
    cuda: dict[str, Any] | None = None
    duration_s: float | None = None
    # the figures that readers quote, as fields
    binding: str | None = None               # 'MemAvailable' or 'cgroup': where the plan's memory binds
    binding_dir: str | None = None           # the cgroup directory that binds
    binding_bytes: int | None = None         # memory available at the binding level
    need_bytes: int | None = None            # the plan as the binding level counts it
    margin_bytes: int | None = None
    predicted_pin_seconds: float | None = None  # pinning the part of the plan that could be in swap
    swap_used_bytes: int | None = None
    swapin_pages_per_s: float | None = None  # swap-in demand sampled now (not the device's capacity)
    free_huge_bytes: int | None = None       # free blocks of the THP order
    catalog_predicted: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)        # checks that could not be evaluated, with why
    not_captured: list[str] = field(default_factory=list)
    prometheus: str | None = None
    config: dict[str, Any] | None = None     # the site file and each setting's value and origin (--config)
    torch: dict[str, Any] | None = None      # --allocator torch: what PyTorch asks the driver for, and the rules
    upgraded_from: int | None = None         # set when read from an older recorded result

    def check(self, check_id: str) -> CheckResult | None:
        return next((c for c in self.checks if c.id == check_id), None)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "PreflightResult":
        version = data.get("schema_version") if data.get("schema") == cls.SCHEMA else 1
        checks = [CheckResult(**{k: c.get(k) for k in ("id", "title", "status", "summary", "remedy")},
                              catalog=list(c.get("catalog") or []), predicted=list(c.get("predicted") or []),
                              missing=list(c.get("missing") or []), evidence=dict(c.get("evidence") or {}))
                  for c in data.get("checks") or [] if isinstance(c, dict)]
        names = {f.name for f in dataclasses.fields(cls)} - {"checks"}
        kwargs = {k: data.get(k) for k in names if k in data}
        kwargs.setdefault("status", data.get("status") or "error")
        kwargs.setdefault("exit_code", data.get("exit_code", 3))
        kwargs.setdefault("verdict", data.get("verdict") or "")
        result = cls(checks=checks, **{k: v for k, v in kwargs.items() if v is not None or k in ("status",)})
        if version == 1:
            _upgrade_preflight_v1(result)
        return result


def _upgrade_preflight_v1(r: PreflightResult) -> None:
    """Runs recorded before the schema kept these figures only inside the checks' evidence."""
    r.upgraded_from = 1
    head = r.check("headroom")
    ev = head.evidence if head else {}
    legacy = ev.get("binding")
    if isinstance(legacy, str) and r.binding is None:
        # the one place prose is read: schema 1 wrote the binding as a sentence
        r.binding = "cgroup" if legacy.startswith("cgroup") else "MemAvailable"
        cg = ev.get("cgroup") or {}
        r.binding_dir = cg.get("limit_dir") if r.binding == "cgroup" else None
    if r.binding_bytes is None:
        r.binding_bytes = ev.get("binding_bytes")
    if r.need_bytes is None:
        r.need_bytes = ev.get("need_with_tables_bytes")
    swap = r.check("swap")
    sev = swap.evidence if swap else {}
    if r.swapin_pages_per_s is None:
        r.swapin_pages_per_s = (sev.get("swapin_sample") or {}).get("pages_per_s")
        if r.swapin_pages_per_s is None and swap and not sev.get("swap_total_bytes"):
            r.swapin_pages_per_s = 0.0
    if r.swap_used_bytes is None:
        r.swap_used_bytes = sev.get("swap_used_bytes") if swap else (r.facts or {}).get("swap_used_bytes")
    if r.free_huge_bytes is None:
        r.free_huge_bytes = (r.facts or {}).get("free_order9_bytes")


@dataclass
class SideFigures:
    """One side of a staging measurement (bytes); the first five fields are the JSON contract."""
    retained_bytes: float | None
    retained_range_bytes: list
    noise_bytes: int | None
    attribution: dict[str, float | None]
    throughput_gb_s: float | None
    beyond_control_bytes: float | None = None
    beyond_control_range_bytes: list | None = None
    attributed: bool = False
    first_burst_bytes: float | None = None
    uncorrected_bytes: float | None = None
    uncorrected_range_bytes: list | None = None
    bursts: int = 0


@dataclass
class StagingResult(Result):
    """`hostpin repro staging`'s result. Schema 2: corrected for per-CPU lists, with a control arm,
    an effect attributed past the noise; 3: past twice the noise (same fields). Results recorded
    by the first version (no schema) stay dicts: they are uncorrected."""
    SCHEMA: ClassVar[str] = "hostpin.repro.staging"
    SCHEMA_VERSION: ClassVar[int] = 3

    outcome: str
    verdict: str
    sides: dict[str, SideFigures] = field(default_factory=dict)
    corrections: list[dict] = field(default_factory=list)
    options: dict = field(default_factory=dict)
    run_dir: str = ""
    sequence: list[str] = field(default_factory=list)
    facts: dict | None = None
    repeats: int = 0
    failures: list[dict] = field(default_factory=list)
    figures: dict = field(default_factory=dict)   # run-level: reset, exit, hold, drift, confounders seen
    reserve_bytes: int | None = None
    reserve_hint: str | None = None
    exit_code: int | None = None
    tool: str = "hostpin"
    command: str = "repro staging"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "StagingResult":
        side_names = {f.name for f in dataclasses.fields(SideFigures)}
        sides = {}
        for name, s in (data.get("sides") or {}).items():
            if isinstance(s, dict):
                kw = {k: v for k, v in s.items() if k in side_names}
                kw.setdefault("retained_bytes", None)
                kw.setdefault("retained_range_bytes", [None, None])
                kw.setdefault("noise_bytes", None)
                kw.setdefault("attribution", {})
                kw.setdefault("throughput_gb_s", None)
                sides[name] = SideFigures(**kw)
        names = {f.name for f in dataclasses.fields(cls)} - {"sides"}
        kwargs = {k: data[k] for k in names if k in data}
        kwargs.setdefault("outcome", data.get("outcome") or "unknown")
        kwargs.setdefault("verdict", data.get("verdict") or "")
        return cls(sides=sides, **kwargs)


_SCHEMAS = {PreflightResult.SCHEMA: PreflightResult, ReproRegisterResult.SCHEMA: ReproRegisterResult,
            StagingResult.SCHEMA: StagingResult, WatchResult.SCHEMA: WatchResult}


def _result_class(data: dict[str, Any]) -> type | None:
    cls = _SCHEMAS.get(data.get("schema"))
    if cls is None and "schema" not in data:  # recorded before results had a schema
        cls = {"preflight": PreflightResult, "repro register": ReproRegisterResult}.get(data.get("command"))
        if cls is ReproRegisterResult and data.get("status") == "error":
            cls = None  # what --json prints when the command could not run at all: no result of its kind
    return cls


def load_result(data: Any) -> Result | dict[str, Any]:
    """A recorded result as its dataclass; a result of a kind with no schema yet stays a dict.
    A repro register result with a field of the wrong type raises ResultDamaged (a ValueError)."""
    if not isinstance(data, dict):
        return {}
    cls = _result_class(data)
    return cls.from_dict(data) if cls else data


def preflight_result(data: dict[str, Any]) -> PreflightResult | None:
    r = load_result(data)
    return r if isinstance(r, PreflightResult) else None


def repro_result(data: dict[str, Any]) -> ReproRegisterResult | None:
    r = load_result(data)
    return r if isinstance(r, ReproRegisterResult) else None


# the fields every reader (report, compare, the Prometheus writer) renders, and the JSON type each must have
_STR_FIELDS = ("schema", "command", "status", "outcome", "verdict", "remedy", "mode", "bound", "binding")
_INT_FIELDS = ("schema_version", "exit_code")
_LIST_FIELDS = ("checks", "phases", "cases", "errors", "not_captured", "unrecorded", "catalog_predicted")
_DICT_FIELDS = ("facts", "sides", "figures", "config", "plan")
_COMMAND_OF_SCHEMA = {PreflightResult.SCHEMA: "preflight", ReproRegisterResult.SCHEMA: "repro register",
                      StagingResult.SCHEMA: "repro staging", WatchResult.SCHEMA: "watch"}
_PREFLIGHT_FIGURES = ("binding_bytes", "need_bytes", "margin_bytes", "predicted_pin_seconds", "swap_used_bytes",
                      "swapin_pages_per_s", "free_huge_bytes", "page_size", "duration_s")
_DEPTH_MAX = 64  # hostpin's own results nest 8 levels at most
_NUMBER_MAX = 10 ** 20  # 21 digits and more: no byte count, page or nanosecond a run records (a float's range ends at 309)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _budget_problem(b: Any, where: str) -> str | None:
    """What makes a --trace time budget (diag.trace.budget's) unreadable to report and its
    picture, naming the field; None when it reads."""
    from .trace.budget import CAUSES

    if not isinstance(b, dict):
        return f"{where} is {_kind(b)}, not an object"
    causes = b.get("causes")
    if causes is not None and not isinstance(causes, dict):
        return f"{where}.causes is {_kind(causes)}, not an object"
    for cause, seconds in (causes or {}).items():
        if cause not in CAUSES:
            return f"{where}.causes.{cause} is no cause a trace measures ({', '.join(CAUSES)})"
        if not _is_number(seconds):
            return f"{where}.causes.{cause} is {_kind(seconds)}, not a number"
    io = b.get("io")
    if io is not None and not isinstance(io, dict):
        return f"{where}.io is {_kind(io)}, not an object"
    figures = [(f"{where}.{k}", b.get(k)) for k in ("wall_s", "covered_s", "explained", "dropped", "inferred_s")]
    figures += [(f"{where}.io.{k}", (io or {}).get(k)) for k in ("requests", "bytes", "bios", "sleeps")]
    devices = (io or {}).get("devices")
    if devices is not None and not isinstance(devices, (dict, list)):
        return f"{where}.io.devices is {_kind(devices)}, not an object"
    for name in ("request_latency", "sleep_latency"):
        dist = (io or {}).get(name)
        if dist is None:
            continue
        if not isinstance(dist, dict):
            return f"{where}.io.{name} is {_kind(dist)}, not an object"
        hist = dist.get("histogram_ms")
        if hist is not None and not (isinstance(hist, list) and all(
                isinstance(h, list) and len(h) == 2 and all(map(_is_number, h)) for h in hist)):
            return f"{where}.io.{name}.histogram_ms is not a list of [ms, count] pairs"
    for name, value in figures:
        if value is not None and not _is_number(value):
            return f"{name} is {_kind(value)}, not a number"
    return None


def result_shape_problem(data: dict[str, Any]) -> str | None:
    """What makes a recorded result unreadable as one, naming the field; None when it reads.
    Numbers must be finite (hostpin never writes NaN), the rendered fields must have their types."""
    for name in _STR_FIELDS:
        if name in data and data[name] is not None and not isinstance(data[name], str):
            return f"{name} is {_kind(data[name])}, not a string"
    for name in _INT_FIELDS:
        if name in data and data[name] is not None and (not isinstance(data[name], int) or isinstance(data[name], bool)):
            return f"{name} is {_kind(data[name])}, not a whole number"
    cls, version = _SCHEMAS.get(data.get("schema")), data.get("schema_version")
    if cls is not None and isinstance(version, int) and not 1 <= version <= cls.SCHEMA_VERSION:
        return (f"schema_version {version} of {cls.SCHEMA} is not one this hostpin reads (1 to {cls.SCHEMA_VERSION}"
                + ("; a later hostpin wrote it)" if version > cls.SCHEMA_VERSION else ")"))
    if cls is PreflightResult or data.get("command") == "preflight":
        for name in _PREFLIGHT_FIGURES:  # quoted by compare and report as sizes, times and rates
            if data.get(name) is not None and not _is_number(data[name]):
                return f"{name} is {_kind(data[name])}, not a number"
        for i, c in enumerate(data.get("checks") or []):
            if isinstance(c, dict) and c.get("evidence") is not None and not isinstance(c["evidence"], dict):
                return f"checks[{i}].evidence is {_kind(c['evidence'])}, not an object"
    for name in _LIST_FIELDS:
        if name in data and data[name] is not None and not isinstance(data[name], list):
            return f"{name} is {_kind(data[name])}, not a list"
    for name in _DICT_FIELDS:
        if name in data and data[name] is not None and not isinstance(data[name], dict):
            return f"{name} is {_kind(data[name])}, not an object"
    for i, c in enumerate(data.get("checks") or []):
        if not isinstance(c, dict) or not isinstance(c.get("id"), str) or not isinstance(c.get("status"), str):
            return f"checks[{i}] is not a check (an object with a string id and status)"
    for name in ("phases", "cases"):
        for i, item in enumerate(data.get(name) or []):
            if not isinstance(item, dict):
                return f"{name}[{i}] is {_kind(item)}, not an object"
    for i, item in enumerate(data.get("phases") or []):
        if item.get("time_budget") is not None:
            problem = _budget_problem(item["time_budget"], f"phases[{i}].time_budget")
            if problem:
                return problem
    for i, item in enumerate(data.get("unrecorded") or []):
        if not isinstance(item, str):
            return f"unrecorded[{i}] is {_kind(item)}, not a path"
    for side, figures in (data.get("sides") or {}).items():
        if not isinstance(figures, dict):
            return f"sides.{side} is {_kind(figures)}, not an object"
    for name, value in (data.get("facts") or {}).items():  # rendered as sizes by report and compare
        if name.endswith("_bytes") and value is not None and (not isinstance(value, (int, float))
                                                               or isinstance(value, bool)):
            return f"facts.{name} is {_kind(value)}, not a number"
    claimed = _COMMAND_OF_SCHEMA.get(data.get("schema"))
    command = data.get("command")
    if claimed and isinstance(command, str) and command != claimed and not command.startswith(claimed + " "):
        return f"schema {data['schema']} is not a {command} result's"
    stack = [("", data, 0)]
    while stack:  # iterative: a crafted result may be deep
        where, value, depth = stack.pop()
        if depth > _DEPTH_MAX:  # refused alike by every reader, whatever its own stack's depth when it parsed
            return f"{where.partition('.')[0].partition('[')[0]} is nested deeper than a run ever writes ({_DEPTH_MAX} levels)"
        if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
            return f"{where or 'a value'} is {value!r}, not a number"
        if isinstance(value, int) and not -_NUMBER_MAX < value < _NUMBER_MAX:
            return f"{where or 'a value'} is a number of {len(str(abs(value)))} digits, past any figure a run records"
        if isinstance(value, dict):
            stack += [(f"{where}.{k}" if where else str(k), v, depth + 1) for k, v in value.items()]
        elif isinstance(value, list):
            stack += [(f"{where}[{i}]", v, depth + 1) for i, v in enumerate(value)]
    if _result_class(data) is ReproRegisterResult:
        try:  # a typed result: every field as its type says
            ReproRegisterResult.from_dict(data)
        except ResultDamaged as exc:
            return str(exc)
    return None

"""The base of every typed result: a dataclass with a schema name and version, its JSON form
(`result_dict`) and its one writer into a run (`write_result`).

Below diag.results (preflight, repro) and diag.watch.result, which both build on it.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

__all__ = ["Result", "result_dict", "write_result"]


@dataclass
class Result:
    SCHEMA: ClassVar[str] = "hostpin.result"
    SCHEMA_VERSION: ClassVar[int] = 1

    def to_dict(self) -> dict[str, Any]:
        return result_dict(self)


def result_dict(result: Result) -> dict[str, Any]:
    """The JSON form of any result: its fields, nested dataclasses as objects, and its schema."""
    out = {"schema": result.SCHEMA, "schema_version": result.SCHEMA_VERSION}
    for f in dataclasses.fields(result):
        value = getattr(result, f.name)
        if f.name == "extra":
            out.update({k: v for k, v in value.items() if k not in out})
            continue
        out[f.name] = _plain(value)
    return out


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def write_result(run, result: Result) -> dict[str, Any]:
    """The one writer: the result's JSON into the run (result.json, manifest), returned for --json."""
    data = result_dict(result)
    if run is not None:
        run.finish(data)
    return data

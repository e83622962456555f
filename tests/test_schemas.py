"""The published JSON Schemas (diag/schemas/, shipped in the wheel and the sdist) against real outputs:
every recorded result under tests/fixtures/ and fresh runs of each command here.

A schema requires the fields the README documents and allows more (other fields come and go
between versions; a launcher that reads the documented ones keeps working).
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

jsonschema = pytest.importorskip("jsonschema")

import diag  # noqa: E402
from diag.results import load_result, result_dict  # noqa: E402

from conftest import FIXTURES, REPO, hostpin  # noqa: E402

SCHEMAS = Path(diag.__file__).parent / "schemas"
NAMES = ("hostpin.preflight", "hostpin.watch", "hostpin.repro-register", "hostpin.repro.staging", "hostpin.compare")
BY_COMMAND = {"preflight": "hostpin.preflight", "watch": "hostpin.watch", "repro register": "hostpin.repro-register",
              "repro register --matrix": "hostpin.repro-register", "repro staging": "hostpin.repro.staging"}


def schema(name: str) -> dict:
    return json.loads((SCHEMAS / f"{name}.schema.json").read_text())


def problems(name: str, data) -> list[str]:
    validator = jsonschema.Draft202012Validator(schema(name))
    return [f"{'/'.join(map(str, e.absolute_path)) or '(top)'}: {e.message[:300]}"
            for e in validator.iter_errors(data)]


def branch_problems(name: str, branch: str, data) -> list[str]:
    """What one branch of the schema's anyOf (result, matrix, columns, fleet, error) says of data."""
    sch = schema(name)
    sub = dict(sch["$defs"][branch], **{"$defs": sch["$defs"]})
    return [f"{'/'.join(map(str, e.absolute_path)) or '(top)'}: {e.message[:200]}"
            for e in jsonschema.Draft202012Validator(sub).iter_errors(data)]


def check_valid(name: str, data) -> None:
    found = problems(name, data)
    if found:  # anyOf hides which branch failed: name what each says
        for branch in ("result", "columns", "fleet", "matrix"):
            if branch in schema(name)["$defs"]:
                found += [f"  as {branch}: {p}" for p in branch_problems(name, branch, data)[:5]]
    assert not found, "\n".join(found)


@pytest.mark.parametrize("name", NAMES)
def test_each_schema_is_a_schema_and_names_its_fields(name):
    sch = schema(name)
    jsonschema.Draft202012Validator.check_schema(sch)
    bare = []

    def walk(node, where):
        if isinstance(node, dict):
            types = node.get("type")
            if (types == "object" or (isinstance(types, list) and "object" in types)) and not (
                    "properties" in node or isinstance(node.get("additionalProperties"), dict) or "description" in node):
                bare.append(where)
            for k, v in node.items():
                walk(v, f"{where}/{k}")
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{where}/{i}")
    walk(sch, "")
    assert not bare, f"objects with neither fields nor a description: {bare}"
    for branch in ("result", "columns", "fleet", "error"):
        if branch in sch["$defs"]:
            d = sch["$defs"][branch]
            assert d["required"] and d["additionalProperties"] is True, branch
            assert set(d["required"]) <= set(d["properties"]), branch


def test_a_documented_field_is_required():
    """A result that lacks a field the README documents does not validate (the schema is not a bare object)."""
    data = json.loads((FIXTURES / "h200-watch-file-register" / "result.json").read_text())
    check_valid("hostpin.watch", data)
    del data["phases"]
    assert problems("hostpin.watch", data)
    assert branch_problems("hostpin.watch", "result", data) == ["(top): 'phases' is a required property"]
    data = result_dict(load_result(json.loads((FIXTURES / "h200-preflight" / "result.json").read_text())))
    check_valid("hostpin.preflight", data)
    data["binding_bytes"] = "a lot"
    assert branch_problems("hostpin.preflight", "result", data) == [
        "binding_bytes: 'a lot' is not of type 'integer', 'null'"]


def _recorded():
    out = []
    for path in sorted(FIXTURES.rglob("*result.json")):  # repro-result.json: a result kept without its run
        data = json.loads(path.read_text())
        name = BY_COMMAND.get(data.get("command"))
        if name == "hostpin.repro.staging" and data.get("schema") != name:
            continue  # the first staging version (no schema): uncorrected, it stays a dict (StagingResult's docstring)
        if name:
            out.append(pytest.param(path, name, id=str(path.parent.relative_to(FIXTURES))))
    return out


@pytest.mark.parametrize("path, name", _recorded())
def test_every_recorded_result_validates(path, name):
    data = json.loads(path.read_text())
    if data.get("schema") or data.get("command") == "repro register --matrix":
        check_valid(name, data)  # as written
    loaded = load_result(data)
    if not isinstance(loaded, dict):
        check_valid(name, result_dict(loaded))  # as every reader sees it (older runs upgraded on reading)


def test_the_register_schema_gives_every_typed_field_its_type():
    """hostpin.repro-register names each field of diag.reproresult.ReproRegisterResult (and of its
    ranks, errors, cleanup steps) with the JSON type of its annotation, and schema 2 requires them all."""
    import dataclasses
    import types
    import typing
    from diag import reproresult as rr
    sch = schema("hostpin.repro-register")
    scalar = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array", dict: "object"}

    def json_types(hint):
        args = typing.get_args(hint)
        if typing.get_origin(hint) in (typing.Union, types.UnionType):
            return {t for a in args for t in json_types(a)}
        if hint is type(None):
            return {"null"}
        if dataclasses.is_dataclass(hint):
            return {"object"}
        return {scalar[typing.get_origin(hint) or hint]}

    def schema_types(prop):
        if "$ref" in prop:
            return {"object"}
        if "anyOf" in prop:
            return {t for p in prop["anyOf"] for t in schema_types(p)}
        if "const" in prop:
            return {"string"}
        t = prop["type"]
        return set(t) if isinstance(t, list) else {t}

    for cls, name in ((rr.ReproRegisterResult, "result"), (rr.RankResult, "rank"), (rr.PinError, "pin_error"),
                      (rr.PrefaultFigures, "prefault"), (rr.Undo, "undo"), (rr.Stopped, "stopped"),
                      (rr.Throttle, "throttle")):
        props = sch["$defs"][name]["properties"]
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if f.name == "extra":
                continue
            assert f.name in props, (name, f.name)
            assert schema_types(props[f.name]) == json_types(hints[f.name]), (name, f.name)
    every = sch["$defs"]["result"]["allOf"][0]["then"]["required"]
    assert set(every) == set(sch["$defs"]["result"]["properties"]) - {"upgraded_from"}


def test_a_register_result_of_schema_2_lacking_or_mistyping_a_field_does_not_validate():
    data = result_dict(load_result(json.loads((FIXTURES / "ci-repro-swap-mlock" / "result.json").read_text())))
    check_valid("hostpin.repro-register", data)
    for change, expected in ((lambda d: d.pop("stopped"), "(top): 'stopped' is a required property"),
                             (lambda d: d["ranks"][0].update(seconds="3 s"), "ranks/0/seconds: '3 s' is not of type"),
                             (lambda d: d["cleanup"][0].pop("ok"), "cleanup/0: 'ok' is a required property")):
        bad = json.loads(json.dumps(data))
        change(bad)
        found = branch_problems("hostpin.repro-register", "result", bad)
        assert len(found) == 1 and found[0].startswith(expected), found
    old = json.loads((FIXTURES / "ci-repro-swap-mlock" / "result.json").read_text())
    del old["eta_error"]  # recorded without a schema: only the fields every version has are required
    assert branch_problems("hostpin.repro-register", "result", old) == []


def test_the_recorded_results_cover_every_command():
    names = {p.values[1] for p in _recorded()}
    assert names == set(NAMES) - {"hostpin.compare"}


# -- fresh runs of each command here ---------------------------------------------------------------
def _json(r):
    assert r.stdout.strip(), r.stderr
    return json.loads(r.stdout)


def test_preflight_json_validates_pass_fail_and_error(tmp_path):
    for size in ("1GiB", "100TiB"):  # this node's verdict either way, and one it cannot fit
        r = hostpin("preflight", "--size", size, "--ranks", "2", "--no-cuda", "--json", "--out", str(tmp_path))
        data = _json(r)
        assert data["schema"] == "hostpin.preflight" and r.returncode == data["exit_code"]
        check_valid("hostpin.preflight", data)
    data = _json(hostpin("preflight", "--skip", "nosuch", "--json", "--no-cuda", "--out", str(tmp_path)))
    assert data["status"] == "error" and data["exit_code"] == 2
    check_valid("hostpin.preflight", data)


def test_preflight_of_a_captured_tree_validates(tmp_path):
    r = hostpin("preflight", "--root", str(FIXTURES / "h200-fc-snapshot"), "--size", "47.2GiB", "--ranks", "2",
                "--json", "--out", str(tmp_path))
    check_valid("hostpin.preflight", _json(r))


def test_compare_json_validates_columns_and_fleet(tmp_path):
    runs = [str(FIXTURES / n) for n in ("ci-preflight", "h200-preflight")]
    data = _json(hostpin("compare", *runs, "--json"))
    assert set(data) >= {"runs", "differ", "equal"}
    check_valid("hostpin.compare", data)
    fleet = [str(p.parent) for p in sorted(FIXTURES.glob("*/result.json"))
             if json.loads(p.read_text()).get("command") in ("preflight", "snapshot", "repro register")]
    assert len(fleet) > 6
    data = _json(hostpin("compare", *fleet, "--json"))
    assert data["mode"] == "fleet"
    check_valid("hostpin.compare", data)


def test_staging_json_validates(tmp_path):
    r = hostpin("repro", "staging", "--sides", "control", "--bytes", "64MiB", "--threads", "2", "--bursts", "1",
                "--repeat", "1", "--json", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    check_valid("hostpin.repro.staging", _json(r))


def test_watch_json_validates(tmp_path):
    f = tmp_path / "watch.json"  # the launcher form's JSON goes to --json-file (stdout is CMD's)
    r = hostpin("watch", "--json-file", str(f), "--out", str(tmp_path), "--", "true")
    assert r.returncode == 0, r.stderr
    data = json.loads(f.read_text())
    assert data["outcome"] == "command" and data["phases"] == []
    check_valid("hostpin.watch", data)


def test_repro_register_json_validates(tmp_path):
    r = hostpin("repro", "register", "--size", "16MiB", "--method", "mlock", "--no-calibrate", "--json",
                "--out", str(tmp_path))
    data = _json(r)
    assert data["outcome"] in ("completed", "slow"), data.get("verdict")
    check_valid("hostpin.repro-register", data)


def test_the_schemas_ship_in_the_wheel_and_the_sdist_and_the_tests_in_neither(tmp_path):
    """Built here, offline (the test extra brings build and setuptools >= 77). The sdist carries no
    test file: the tests need the clone (fixtures, bench/, deploy/), and half of them were no use."""
    pytest.importorskip("build")
    import tarfile
    import zipfile
    assert sorted(p.name for p in SCHEMAS.glob("*.schema.json")) == sorted(f"{n}.schema.json" for n in NAMES)
    r = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--sdist", "--wheel", "--outdir",
                        str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    wheel = zipfile.ZipFile(next(tmp_path.glob("*.whl"))).namelist()
    sdist = [n.split("/", 1)[1] for n in tarfile.open(next(tmp_path.glob("*.tar.gz"))).getnames() if "/" in n]
    want = {f"diag/schemas/{n}.schema.json" for n in NAMES}
    assert want <= set(wheel) and want <= set(sdist)
    assert not [n for n in wheel + sdist if n.startswith("tests/")]
    assert "LICENSE" in sdist and "deploy/slurm/hostpin-gate" in sdist
    meta = next(n for n in wheel if n.endswith("METADATA"))
    text = zipfile.ZipFile(next(tmp_path.glob("*.whl"))).read(meta).decode()
    assert "License-Expression: Apache-2.0" in text and "Requires-Dist: cuda-bindings>=12.8" in text

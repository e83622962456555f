"""Typed results: one writer, a schema on every result, readers that take fields, and runs recorded
before the schema (tests/fixtures) still loading, rendering and comparing."""
from __future__ import annotations

import json
import re

import pytest

from diag.checks import Plan
from diag.preflight import run_preflight
from diag.prometheus import render_textfile
from diag.render import render_preflight
from diag.report import render_report
from diag.results import PreflightResult, ReproRegisterResult, load_result, result_dict
from diag.runs import open_run_path
from diag.units import GiB

from conftest import FIXTURES, GPU_SNAPSHOT

# recorded run directories: a result.json with its manifest (a fixture of a result alone, such as a
# recorded trace's, is read by its own tests)
OLD_RUNS = sorted(p.name for p in FIXTURES.iterdir() if (p / "result.json").is_file()
                  and ((p / "manifest.json").is_file() or (p / "manifest.jsonl").is_file()))


def test_a_new_result_round_trips():
    r = run_preflight(Plan(size_bytes=int(47.2 * GiB), ranks=2), GPU_SNAPSHOT, cuda="captured")
    data = result_dict(r)
    assert data["schema"] == "hostpin.preflight" and data["schema_version"] == 2
    again = load_result(json.loads(json.dumps(data)))
    assert isinstance(again, PreflightResult) and again.upgraded_from is None
    assert result_dict(again) == data
    assert again.binding == "MemAvailable" and again.binding_bytes == data["checks"][
        [c["id"] for c in data["checks"]].index("headroom")]["evidence"]["binding_bytes"]


@pytest.mark.parametrize("name", OLD_RUNS)
def test_old_recorded_runs_load_and_render(name):
    data = json.loads((FIXTURES / name / "result.json").read_text())
    loaded = load_result(data)
    run = open_run_path(FIXTURES / name)
    try:
        text = render_report(run, fmt="markdown")
    finally:
        run.close()
    assert text.startswith("# hostpin ")
    if data.get("command") == "preflight":
        assert isinstance(loaded, PreflightResult) and loaded.upgraded_from == 1
        assert loaded.binding == "MemAvailable" and loaded.binding_bytes
        assert render_preflight(result_dict(loaded)).startswith("hostpin preflight: ")
        assert "hostpin_headroom_bytes{binding=\"MemAvailable\"}" in render_textfile(data, 0.0)
    elif data.get("command") == "repro register":
        assert isinstance(loaded, ReproRegisterResult)
        assert loaded.upgraded_from == (data["schema_version"] if "schema" in data else 0)
        assert result_dict(loaded)["outcome"] == data["outcome"]
        assert {k for k in data} <= set(result_dict(loaded))


# every repro register result recorded here, a run directory's or a result kept alone
REGISTER_RECORDS = sorted(str(p.relative_to(FIXTURES)) for p in FIXTURES.rglob("*result.json")
                          if json.loads(p.read_text()).get("command") == "repro register")


def test_the_register_records_cover_each_layout():
    layouts = {json.loads((FIXTURES / p).read_text()).get("schema_version") for p in REGISTER_RECORDS}
    assert layouts == {None, 1} and len(REGISTER_RECORDS) >= 9
    assert "h200-repro-torch-pin-memory/repro-result.json" in REGISTER_RECORDS


@pytest.mark.parametrize("rel", REGISTER_RECORDS)
def test_a_recorded_register_run_loads_typed_field_by_field(rel, tmp_path):
    """Runs recorded without a schema (the CI and H200 runs) and with schema 1 (a few typed fields
    beside untyped keys) read as schema 2: each rank a RankResult, its error a PinError, every
    key of the record a field (nothing left over in extra), every value kept; and they render."""
    from diag.evidence import RunDir
    from diag.reproresult import PinError, PrefaultFigures, RankResult, Undo
    data = json.loads((FIXTURES / rel).read_text())
    r = load_result(data)
    assert isinstance(r, ReproRegisterResult) and r.extra == {}
    assert r.ranks and all(isinstance(rk, RankResult) for rk in r.ranks)
    assert all(isinstance(rk.error, PinError) for rk in r.ranks if rk.outcome == "failed")
    assert all(isinstance(rk.prefault, PrefaultFigures) for rk in r.ranks if "prefault" in
               data["ranks"][rk.rank])
    assert r.cleanup and all(isinstance(u, Undo) for u in r.cleanup)
    out = result_dict(r)
    assert out["schema"] == "hostpin.repro-register" and out["schema_version"] == 2
    for key, value in data.items():  # a superset of the record, every value as it was
        if key not in ("schema_version", "upgraded_from"):
            got = out[key]
            if key == "ranks":
                got = [{k: v for k, v in rk.items() if k in old} for rk, old in zip(got, value)]
            assert got == value, key
    again = load_result(json.loads(json.dumps(out)))
    assert again.upgraded_from is None and result_dict(again) == dict(out, upgraded_from=None)
    run = RunDir(tmp_path / "run", "repro-register")
    run.finish(out)  # as a run of today: report and compare read it
    text = render_report(open_run_path(tmp_path / "run"), fmt="markdown")
    assert re.search(rf"\| outcome +\| {data['outcome']} +\|", text), text[:2000]
    if data.get("pinned_pages") is not None:
        assert f"{data['pinned_pages']:,} of {data['expected_pages']:,} pages" in text
    for rk in data["ranks"] if len(data["ranks"]) > 1 or any("error" in rk for rk in data["ranks"]) else ():
        assert re.search(rf"\| +{rk['rank']} +\| {rk['outcome']} ", text), text[:2000]


def test_a_failed_rank_is_read_by_field(tmp_path):
    r = load_result(json.loads((FIXTURES / "h200-repro-fileshared-fail" / "result.json").read_text()))
    rank = r.failed_rank()
    assert rank.error.name == "cudaErrorInvalidValue (1)" and rank.error.code == 1 and rank.error.catalog == 9
    assert r.failed_catalog == [9]


@pytest.mark.parametrize("field, value, named", [
    ("seconds", "slow", "seconds is a str, not a number"),
    ("ranks", {"0": {}}, "ranks is a dict, not a list"),
    ("ranks", [{"rank": 0}], "ranks[0].outcome is missing"),
    ("ranks", [{"rank": "0", "outcome": "completed"}], "ranks[0].rank is a str, not a whole number"),
    ("ranks", [{"rank": 0, "outcome": "failed", "error": {"code": "1"}}], "ranks[0].error.code is a str"),
    ("cleanup", [{"undo": "swapoff", "ok": "yes"}], "cleanup[0].ok is a str, not true or false"),
    ("stopped", {"phase": "pin"}, "stopped.reason is missing"),
    ("notes", [3], "notes[0] is an int, not a string"),
    ("pinned_pages", 1.5, "pinned_pages is a float, not a whole number"),
    ("outcome", None, "outcome is null, not a string"),
])
def test_a_mistyped_register_field_is_named(field, value, named):
    from diag.results import ResultDamaged, result_shape_problem
    data = json.loads((FIXTURES / "ci-repro-swap-mlock" / "result.json").read_text())
    data[field] = value
    with pytest.raises(ResultDamaged, match=named.replace("[", r"\[").replace("]", r"\]").replace(".", r"\.")):
        load_result(data)
    assert named in result_shape_problem(data)


def test_the_binding_is_a_field_not_a_sentence(tree):
    """Prometheus labels the headroom by the `binding` field: a cgroup that binds says cgroup."""
    t = tree(GPU_SNAPSHOT)
    leaf = next(p for p in t.path.glob("sys/fs/cgroup/process_api/*/memory.max")).parent
    (leaf / "memory.max").write_text(str(8 * GiB))
    (leaf / "memory.current").write_text(str(1 * GiB))
    r = run_preflight(Plan(size_bytes=GiB, method="hostalloc"), t.path, cuda="captured")
    text = render_textfile(r, 1.0)
    assert f'hostpin_headroom_bytes{{binding="cgroup"}} {r.binding_bytes}' in text
    r.checks = []  # no check left to read prose from: the figures stand on their own
    assert f'binding="cgroup"' in render_textfile(r, 1.0)


def test_repro_failed_catalog_field():
    data = json.loads((FIXTURES / "h200-repro-fileshared-fail" / "result.json").read_text())
    assert load_result(data).failed_catalog == [9]


def test_staging_results_recorded_on_the_h200_load_typed_and_round_trip():
    """Staging results of schema 2 are StagingResult (report and compare read their fields); the
    first version's results (no schema, uncorrected) stay dicts rather than being dressed up."""
    import json
    from diag.results import SideFigures, StagingResult, load_result, result_dict
    from conftest import FIXTURES
    for case in sorted((FIXTURES / "h200-staging-8").iterdir()):
        data = json.loads((case / "result.json").read_text())
        typed = load_result(data)
        assert isinstance(typed, StagingResult), case.name
        assert all(isinstance(s, SideFigures) for s in typed.sides.values())
        # a schema-2 record is rewritten as the current schema; every field is kept as it was
        assert dict(result_dict(typed), schema_version=None) == dict(data, schema_version=None), case.name
    old = json.loads(next((FIXTURES / "h200-staging").glob("*/result.json")).read_text())
    assert isinstance(load_result(old), dict)


def test_watch_results_are_typed_and_round_trip():
    """hostpin watch writes a diag.results.Result; load_result reads it back as WatchResult."""
    from diag.results import load_result, result_dict
    from diag.watch.result import PhaseResult, WatchResult
    r = WatchResult(mode="pid", pid=4711, outcome="completed", verdict="pinned", size_bytes=256 << 20,
                    phases=[PhaseResult(pid=4711, tid=4711, comm="python", kind="mlock", started_s=0.3,
                                        seen_start=False, outcome="completed", seconds=12.5, bound="swap-in",
                                        bound_counts={"swap-in": 24}, catalog=1)])
    data = result_dict(r)
    assert data["schema"] == "hostpin.watch" and data["phases"][0]["bound"] == "swap-in"
    back = load_result(data)
    assert isinstance(back, WatchResult) and isinstance(back.phases[0], PhaseResult)
    assert result_dict(back) == data


@pytest.mark.parametrize("command", ["report", "compare", "report, the result naming no command"])
def test_a_register_result_with_a_mistyped_field_is_exit_3_in_one_line(tmp_path, command):
    """Read by the real CLI: a run whose result.json has a rank's seconds as text is refused
    whole (exit 3), in one line that names the field; before, report rendered around it. (bundle
    packs the evidence as the manifest vouches for it, without reading the result.)"""
    import hashlib
    import shutil
    from conftest import hostpin
    run = tmp_path / "run"
    shutil.copytree(FIXTURES / "ci-repro-swap-mlock", run)
    doc = json.loads((run / "result.json").read_text())
    doc["ranks"][0]["seconds"] = "3 s"
    if command.endswith("no command"):  # the manifest says what it is (repro-register)
        del doc["command"]
    data = json.dumps(doc).encode()
    (run / "result.json").write_bytes(data)
    manifest = json.loads((run / "manifest.json").read_text())  # the manifest vouches for it: only the field is wrong
    entry = next(e for e in manifest["entries"] if e["path"] == "result.json")
    entry.update(sha256=hashlib.sha256(data).hexdigest(), size=len(data))
    (run / "manifest.json").write_text(json.dumps(manifest))
    args = {"report": ["report", str(run)], "compare": ["compare", str(run), str(FIXTURES / "ci-preflight")]}.get(
        command, ["report", str(run)])
    r = hostpin(*args)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 3 and len(lines) == 1, r.stderr
    assert lines[0].startswith("hostpin: error:") and "ranks[0].seconds is a str, not a number" in lines[0]
    assert "Traceback" not in r.stderr

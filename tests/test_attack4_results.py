"""The fourth attack, on the typed `repro register` result: a recorded run (the CI machine's
ci-repro-swap-mlock, copied) whose result.json is forged or damaged, then read by `report` and
`compare`. Each edge case is named; every one must be exit 3 with one line naming the field (never
an internal error), or read as it always did."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import FIXTURES, hostpin

RUN = FIXTURES / "ci-repro-swap-mlock"
PAST_A_FLOAT = 10 ** 400  # 401 digits: JSON reads it, float() cannot


def _forged(tmp_path: Path, change) -> Path:
    run = tmp_path / RUN.name
    shutil.copytree(RUN, run)
    doc = json.loads((run / "result.json").read_text())
    change(doc)
    (run / "result.json").write_text(json.dumps(doc))
    return run


def _refused(tmp_path: Path, run: Path, names: str) -> None:
    """report and compare both refuse the run: exit 3, one line, naming `names`, no internal error."""
    for argv in (("report", str(run), "-o", str(tmp_path / "report.md")), ("compare", str(run), str(RUN))):
        r = hostpin(*argv, timeout=60)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 3 and len(lines) == 1, (argv[0], r.returncode, r.stderr)
        assert "could not evaluate" not in r.stderr and names in r.stderr, (argv[0], r.stderr)
    assert not (tmp_path / "report.md").exists()


def _set(path: str, value):
    def change(doc):
        *parents, last = path.split(".")
        node = doc
        for p in parents:
            node = node[int(p)] if isinstance(node, list) else node.setdefault(p, {})
        node[last] = value
    return change


@pytest.mark.parametrize("field", ["seconds", "rate_gib_s", "slowdown", "first_bound_at_s", "swapin_pages_per_s",
                                   "ranks.0.rate_gib_s", "watchdog.watchdog_cpu_pct_of_core"])
def test_a_number_past_any_float_in_a_repro_result_is_damage(tmp_path, field):
    """A 401-digit number in a float field (or in the untyped watchdog figures) was 'could not
    evaluate ...: OverflowError: int too large to convert to float' from report and compare."""
    run = _forged(tmp_path, _set(field, PAST_A_FLOAT))
    _refused(tmp_path, run, field.replace(".0.", "[0]."))


def test_a_number_past_any_float_in_a_list_of_bytes_or_the_stopped_progress_is_damage(tmp_path):
    run = _forged(tmp_path, lambda d: d.update(swapped_out_bytes=[PAST_A_FLOAT]))
    _refused(tmp_path, run, "swapped_out_bytes[0]")
    run = tmp_path / "stopped"
    run.mkdir()
    run = _forged(run, lambda d: d.update(stopped={"reason": "stall", "phase": "pin", "at_s": 1.0,
                                                   "progress": {"eta_s": PAST_A_FLOAT}}))
    _refused(tmp_path, run, "stopped.progress.eta_s")


def test_a_fact_of_the_wrong_type_is_damage_naming_it(tmp_path):
    """facts.mem_total_bytes as text was "TypeError: '<' not supported between ..." (an internal error)."""
    run = _forged(tmp_path, lambda d: d.update(facts={"mem_total_bytes": "x"}))
    _refused(tmp_path, run, "facts.mem_total_bytes")


def test_options_without_the_size_still_render(tmp_path):
    """A result whose options lack the size (or have it as text) was "KeyError: 'size'": the plan
    line is left out, the rest renders."""
    for options in ({"method": "mlock"}, {"size": "big", "method": "mlock", "source": "anon", "map": "private",
                                          "prefault": True}):
        run = _forged(tmp_path, lambda d: d.update(options=options))
        r = hostpin("report", str(run), "--format", "text", timeout=60)
        assert r.returncode == 0 and "internal error" not in r.stderr, r.stderr
        assert "hostpin repro register" in r.stdout, r.stdout[:300]
        shutil.rmtree(run)


@pytest.mark.parametrize("change, names", [
    (lambda d: d.update(command="preflight", status="pass", verdict="PASS: 10 GiB can be pinned"), "preflight"),
    (lambda d: d.update(command="watch"), "watch"),
    (lambda d: d.update(command="repro staging"), "repro staging"),
    (lambda d: d.update(schema="hostpin.preflight", schema_version=2), "hostpin.preflight"),
    (lambda d: d.update(schema="hostpin.watch", schema_version=1), "hostpin.watch"),
], ids=["command-preflight", "command-watch", "command-staging", "schema-preflight", "schema-watch"])
def test_a_result_that_claims_another_command_than_its_run_is_damage(tmp_path, change, names):
    """A repro register run whose result says 'preflight' rendered as "hostpin preflight: PASS"."""
    run = _forged(tmp_path, change)
    _refused(tmp_path, run, names)


@pytest.mark.parametrize("version", [3, 0, -1, PAST_A_FLOAT], ids=["3", "0", "-1", "401-digits"])
def test_a_schema_version_this_hostpin_does_not_read_is_damage(tmp_path, version):
    """schema_version 3 (a later layout) was read as 2 without a word; 0 and -1 were 'upgraded from -1'."""
    run = _forged(tmp_path, lambda d: d.update(schema="hostpin.repro-register", schema_version=version))
    _refused(tmp_path, run, "schema_version")


def test_a_verdict_of_16_mib_in_one_word_renders_in_seconds(tmp_path):
    """The timeline picture's title wrapped the whole verdict (textwrap is quadratic in a word's
    length): 6 MB took 9 s, 20 MB over a minute, 30 MB (under the 32 MiB a result may be) minutes."""
    run = _forged(tmp_path, lambda d: d.update(verdict="A" * (16 << 20)))
    r = hostpin("report", str(run), "-o", str(tmp_path / "report.md"), timeout=45)
    assert r.returncode == 0, r.stderr


TRACED = json.loads((FIXTURES / "ci-trace-swap-mlock" / "result.json").read_text())  # a real --trace budget


def _budget(change):
    def forge(doc):
        doc["phases"] = json.loads(json.dumps(TRACED["phases"]))
        change(doc["phases"][0]["time_budget"])
    return forge


@pytest.mark.parametrize("change, names", [
    (lambda b: b["causes"].update(io="x"), "phases[0].time_budget.causes.io is a str"),
    (lambda b: b.update(wall_s="x"), "phases[0].time_budget.wall_s is a str"),
    (lambda b: b.update(explained="x"), "phases[0].time_budget.explained is a str"),
    (lambda b: b.update(causes=[1]), "phases[0].time_budget.causes is a list"),
    (lambda b: b.update(causes={f"c{i}": 1.0 for i in range(5000)}), "phases[0].time_budget.causes.c0 is no cause"),
    (lambda b: b["io"].update(requests="x"), "phases[0].time_budget.io.requests is a str"),
    (lambda b: b["io"].update(bytes="x"), "phases[0].time_budget.io.bytes is a str"),
    (lambda b: b["io"].update(devices=5), "phases[0].time_budget.io.devices is an int"),
    (lambda b: b.update(io=[1]), "phases[0].time_budget.io is a list"),
    (lambda b: b["io"].update(request_latency=[1]), "phases[0].time_budget.io.request_latency is a list"),
    (lambda b: b["io"]["request_latency"].update(histogram_ms=[[1], "x"]), "request_latency.histogram_ms is not"),
    (lambda b: b.clear() or b.update(x=1) and None, None),
], ids=["cause-text", "wall-text", "explained-text", "causes-list", "5000-causes", "requests-text", "bytes-text",
        "devices-number", "io-list", "latency-list", "histogram-pairs", "empty-budget"])
def test_a_damaged_time_budget_is_damage_naming_it(tmp_path, change, names):
    """A --trace budget with a figure of the wrong type was an internal error from report (its table
    or budget.png: "TypeError: unsupported operand type(s) for /", "IndexError" in the picture),
    and 5000 causes no trace has took report 54 s to draw. A budget with no figures still renders."""
    run = _forged(tmp_path, _budget(change))
    if names is None:
        r = hostpin("report", str(run), "-o", str(tmp_path / "report.md"), timeout=60)
        assert r.returncode == 0 and "could not evaluate" not in r.stderr, r.stderr
        return
    _refused(tmp_path, run, names)


def test_a_real_time_budget_still_renders(tmp_path):
    run = _forged(tmp_path, _budget(lambda b: None))
    r = hostpin("report", str(run), "--format", "text", timeout=60)
    assert r.returncode == 0 and "Time budget (--trace)" in r.stdout, r.stderr


PREFLIGHT = FIXTURES / "ci-preflight"


@pytest.mark.parametrize("change, names", [
    (lambda d: d.update(binding_bytes="x"), "binding_bytes is a str, not a number"),
    (lambda d: d.update(need_bytes=[1]), "need_bytes is a list, not a number"),
    (lambda d: d["checks"][0].update(evidence=[1]), "checks[0].evidence is a list, not an object"),
    (lambda d: d.update(schema="hostpin.preflight", schema_version=9), "schema_version 9 of hostpin.preflight"),
    (lambda d: d.update(schema="hostpin.preflight", schema_version=0), "schema_version 0 of hostpin.preflight"),
], ids=["binding-text", "need-list", "evidence-list", "version-9", "version-0"])
def test_a_forged_preflight_result_is_damage_naming_the_field(tmp_path, change, names):
    """compare quoted binding_bytes as a size ("TypeError: '<' not supported") and folded a check's
    evidence as an object (an internal error); a later schema_version was read as this one."""
    run = tmp_path / PREFLIGHT.name
    shutil.copytree(PREFLIGHT, run)
    doc = json.loads((run / "result.json").read_text())
    change(doc)
    (run / "result.json").write_text(json.dumps(doc))
    for argv in (("report", str(run), "-o", str(tmp_path / "report.md")), ("compare", str(run), str(PREFLIGHT))):
        r = hostpin(*argv, timeout=60)
        assert r.returncode == 3 and len(r.stderr.strip().splitlines()) == 1, (argv[0], r.stderr)
        assert names in r.stderr and "could not evaluate" not in r.stderr, (argv[0], r.stderr)


def test_a_result_nested_deep_is_damage_to_every_reader_alike(tmp_path):
    """975 levels of objects in a result: report read it (exit 0) and compare, whose stack was
    deeper when it parsed, called it nested too deep (exit 3). Past 64 levels (hostpin nests 8 at
    most) it is damage to both; 500 here (what json.dumps writes from inside pytest)."""
    deep: dict = {}
    for _ in range(500):
        deep = {"a": deep}
    run = _forged(tmp_path, lambda d: d["options"].update(deep=deep))
    _refused(tmp_path, run, "nested")

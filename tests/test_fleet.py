"""The site configuration file, the one-line gate output, and `hostpin compare` on a fleet made from
captured trees (bench/compare_fleet.py: copies of the GPU machine's snapshot with planted outliers,
each judged by the real `hostpin preflight --root`)."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import FIXTURES, REPO, hostpin

SITE = """\
[plan]
size = "47.2GiB"
ranks = 2
method = "hostalloc"

[preflight]
margin = "8GiB"
skip = ["kernel"]
no-cuda = true

[runs]
dir = "{runs}"
"""


def _site(tmp_path: Path, text: str | None = None) -> Path:
    path = tmp_path / "hostpin.toml"
    path.write_text(text if text is not None else SITE.format(runs=tmp_path / "site-runs"))
    return path


# -- site configuration ---------------------------------------------------------------------------------
def test_site_file_gives_the_plan_and_the_run_records_it(tmp_path):
    site = _site(tmp_path)
    r = hostpin("preflight", "--config", str(site), "--root", str(FIXTURES / "h200-fc-snapshot"), "--json")
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    assert result["plan"]["describe"] == "2 x 47.2 GiB by hostalloc" and result["plan"]["margin"] == "8GiB"
    assert next(c for c in result["checks"] if c["id"] == "kernel")["status"] == "skip"
    assert Path(result["run_dir"]).parent == tmp_path / "site-runs"          # [runs] dir
    cfg = result["config"]
    import hashlib
    assert cfg["path"] == str(site) and cfg["sha256"] == hashlib.sha256(site.read_bytes()).hexdigest()
    assert cfg["settings"]["method"] == {"value": "hostalloc", "from": "file"}
    assert cfg["settings"]["root"]["from"] == "command line"
    assert cfg["settings"]["strict"] == {"value": False, "from": "default"}
    kept = Path(result["run_dir"]) / "config" / "hostpin.toml"
    assert kept.read_bytes() == site.read_bytes()
    manifest = json.loads((Path(result["run_dir"]) / "manifest.json").read_text())
    assert any(e["path"] == "config/hostpin.toml" and e["kind"] == "config" for e in manifest["entries"])


def test_command_line_wins_over_the_site_file(tmp_path):
    site = _site(tmp_path)
    r = hostpin("preflight", "--config", str(site), "--root", str(FIXTURES / "h200-fc-snapshot"), "--json",
                "--method", "register", "--ranks", "1", "--out", str(tmp_path / "mine"))
    result = json.loads(r.stdout)
    assert result["plan"]["describe"] == "1 x 47.2 GiB by register"
    assert result["config"]["settings"]["method"] == {"value": "register", "from": "command line"}
    assert result["config"]["settings"]["size"]["from"] == "file"
    assert Path(result["run_dir"]).parent == tmp_path / "mine"


def test_environment_variable_and_none(tmp_path):
    site = _site(tmp_path)
    env = {**__import__("os").environ, "HOSTPIN_CONFIG": str(site)}
    r = hostpin("preflight", "--root", str(FIXTURES / "h200-fc-snapshot"), "--json", env=env)
    assert json.loads(r.stdout)["plan"]["method"] == "hostalloc"
    r = hostpin("preflight", "--config", "none", "--root", str(FIXTURES / "h200-fc-snapshot"), "--json",
                "--out", str(tmp_path / "r"), env=env)
    result = json.loads(r.stdout)
    assert result["plan"]["method"] == "register" and result["config"]["path"] is None


def test_default_path_is_read_when_present(tmp_path, monkeypatch):
    """/etc/hostpin/hostpin.toml itself is not touched (five people share this machine): the default
    path is pointed at a file here, in-process."""
    import diag.config
    from repro.cli import cli
    site = _site(tmp_path)
    monkeypatch.delenv("HOSTPIN_CONFIG", raising=False)
    monkeypatch.setattr(diag.config, "DEFAULT_PATH", site)
    r = CliRunner().invoke(cli, ["preflight", "--root", str(FIXTURES / "h200-fc-snapshot"), "--json"])
    assert json.loads(r.output)["config"]["path"] == str(site)
    monkeypatch.setattr(diag.config, "DEFAULT_PATH", tmp_path / "absent.toml")
    r = CliRunner().invoke(cli, ["preflight", "--root", str(FIXTURES / "h200-fc-snapshot"), "--json",
                                 "--out", str(tmp_path / "r")])
    assert json.loads(r.output)["config"]["path"] is None


def test_snapshot_takes_the_runs_directory_from_the_site_file(tmp_path):
    site = _site(tmp_path)
    r = hostpin("snapshot", "--config", str(site), "--root", str(FIXTURES / "h200-reference"), "--no-cuda",
                "--no-commands", "--json")
    assert r.returncode == 0, r.stderr
    assert Path(json.loads(r.stdout)["run_dir"]).parent == tmp_path / "site-runs"


@pytest.mark.parametrize("text, says", [
    ('[plan]\nsize = "47XB"\n', "[plan] size: '47XB' is not a size; use e.g. 47GiB"),
    ("[plan]\nranks = 0\n", "[plan] ranks: 0 is not a rank count"),
    ('[plan]\nmethod = "magic"\n', "[plan] method: 'magic' is not one of"),
    ('[plan]\nthp = "yes"\n', "[plan] thp: 'yes' is not true or false"),
    ("[plan]\nno-thp = true\n", "[plan] no-thp: write thp = false instead"),
    ('[plan]\nmargin = "5%"\n', "[plan] margin: unknown key; it belongs in [preflight]"),
    ('[preflight]\nmargin = "lots"\n', "[preflight] margin: 'lots' is not a margin"),
    ('[preflight]\nskip = ["nosuchcheck"]\n', "[preflight] skip: 'nosuchcheck' is not a check"),
    ('[preflight]\nskip = "kernel"\n', '[preflight] skip: give a list, e.g. ["kernel"]'),
    ('[preflight]\nroot = "/"\n', "[preflight] root: unknown key; it is given on the command line only"),
    ('[preflight]\nstrict = 1\n', "[preflight] strict: 1 is not true or false"),
    ("[runs]\ndir = 5\n", "[runs] dir: give a directory as a string"),
    ('[gpu]\nsize = "1GiB"\n', "unknown section or key 'gpu'"),
    ('size = "1GiB"\n', "unknown section or key 'size'"),
    ("[plan\n", "not valid TOML"),
    (b"\xff\xfe[plan]\n", "not UTF-8 text"),
])
def test_a_bad_site_file_is_one_line_naming_the_key_exit_2(tmp_path, text, says):
    site = tmp_path / "bad.toml"
    site.write_bytes(text if isinstance(text, bytes) else text.encode())
    for command in (["preflight", "--no-cuda"], ["snapshot", "--no-cuda"]):  # every command refuses it
        r = hostpin(*command, "--config", str(site), "--out", str(tmp_path / "runs"))
        assert r.returncode == 2, r.stderr
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"hostpin: error: {site}: "), r.stderr
        assert says in lines[0] and r.stdout == ""
    assert not (tmp_path / "runs").exists()  # refused before anything ran


def test_a_missing_site_file_named_on_the_command_line_is_an_error(tmp_path):
    r = hostpin("preflight", "--config", str(tmp_path / "nope.toml"))
    assert r.returncode == 2 and "cannot read the configuration file" in r.stderr and "No such file" in r.stderr


def test_the_site_file_follows_new_preflight_options():
    """The keys are preflight's own options, read from the command: an option added there is a key."""
    import click

    from diag.cli import cli
    from diag.config import PLAN_KEYS, _option_by_key
    keys = _option_by_key(cli.get_command(None, "preflight"))
    assert set(PLAN_KEYS) <= set(keys)
    assert {"margin", "skip", "strict", "no-cuda", "cuda-timeout", "sample", "prometheus", "reserve"} <= set(keys)
    assert not {"root", "json", "format", "out", "config"} & set(keys)
    assert all(isinstance(p, click.Option) for p in keys.values())


# -- compare at fleet scale ---------------------------------------------------------------------------
def _bench():
    spec = importlib.util.spec_from_file_location("compare_fleet", REPO / "bench" / "compare_fleet.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    bench = _bench()
    out = tmp_path_factory.mktemp("fleet")
    runs = bench.generate(40, out, workers=1)
    return bench, out, runs


def test_fleet_summary_names_the_planted_outliers_in_under_80_lines(fleet):
    bench, out, runs = fleet
    assert len(runs) == 40
    r = hostpin("compare", *map(str, runs))
    assert r.returncode == 0, r.stderr
    text = r.stdout
    lines = text.splitlines()
    assert len(lines) < 80 and max(map(len, lines)) <= 130
    assert lines[0] == "hostpin compare: 40 runs from 40 nodes: 3 FAIL, 1 WARN, 36 PASS"
    planted = bench.planted(40)
    for node, what in planted.items():
        assert node in text, f"{node} ({what}) not named"
    low, swap, thp, kern, drv, nogpu = planted
    figures = text[text.index("figures that differ"):text.index("equal on every node")]
    row = lambda label: "\n".join(l for l in figures.splitlines() if l.strip().startswith(label)  # noqa: E731
                                  or l.strip().startswith("->"))
    assert f"{low} 38 GiB" in row("MemAvailable") and f"{swap} 30 GiB" in row("swap used")
    assert f"{thp} always" in row("THP enabled") and f"{kern} 6.11.0" in row("kernel")
    assert f"{drv} 590.44.01 open" in row("NVIDIA driver") and f"{nogpu} not loaded" in row("NVIDIA driver")
    verdicts = text[:text.index("figures that differ")]
    assert f"FAIL      3  headroom 2" in verdicts and all(n in verdicts for n in (low, kern, nogpu))
    # the rolling upgrade (every tenth node on a newer kernel) is a group, not four outliers
    groups = text[text.index("groups by kernel"):]
    assert "6.18.50-fc-v700-gpu" in groups and not {"gpu-n0003", "gpu-n0023", "gpu-n0033"} & set(figures.split())


def test_fleet_summary_json_has_every_node_and_columns_still_work(fleet):
    bench, out, runs = fleet
    r = hostpin("compare", str(out), "--json")  # a directory of per-node directories stands for its runs
    summary = json.loads(r.stdout)
    assert summary["mode"] == "fleet" and summary["runs"] == 40
    assert sum(v["count"] for v in summary["verdicts"].values()) == 40
    assert set(summary["stand_out"]) == set(bench.planted(40))
    low, nogpu = list(bench.planted(40))[0], list(bench.planted(40))[5]
    mem = next(d for d in summary["differ"] if d["key"] == "mem_available_bytes")
    assert {o["node"] for o in mem["outliers"]} == {low, nogpu}
    assert mem["outliers"][0] == {"node": nogpu, "value": mem["min"]}  # the furthest from the median first
    assert sum(g["count"] for g in summary["groups"]) == 40
    r = hostpin("compare", *map(str, runs[:8]), "--columns")
    assert r.returncode == 0 and "run 8" in r.stdout and "fleet summary" not in r.stdout


def test_compare_of_a_directory_with_no_runs_is_a_clear_error(tmp_path):
    (tmp_path / "empty").mkdir()
    r = hostpin("compare", str(tmp_path / "empty"), str(FIXTURES / "ci-preflight"))
    assert r.returncode == 2 and "holds no run directories" in r.stderr


def test_fleet_summary_on_the_captured_runs(tmp_path):
    """Seven real runs of different kinds (preflights, pins, a staging run): a summary, no crash."""
    names = ["h200-preflight", "ci-preflight", "h200-repro-swap32", "ci-repro-swap-mlock", "h200-repro-ranks2",
             "h200-repro-fileshared-fail", "h200-staging/defaults"]
    r = hostpin("compare", *[str(FIXTURES / n) for n in names])
    assert r.returncode == 0, r.stderr
    # both machines call themselves "vm": one host, its runs told apart by their directories
    assert r.stdout.startswith("hostpin compare: 7 runs from 1 node: 1 FAIL")
    assert "FAIL          1  device 1, driver 1, headroom 1: vm:ci-preflight" in r.stdout
    assert "vm:h200-repro-swap32 108,323" in r.stdout  # the swap-bound pin's swap-in rate stands out
    summary = json.loads(hostpin("compare", *[str(FIXTURES / n) for n in names], "--json").stdout)
    assert len(summary["sources"]) == 7 and summary["nodes"] == 1


@pytest.fixture
def damaged_fleet(fleet, tmp_path):
    """A copy of the fleet with one node's run damaged each way a disk or a copy damages it."""
    import shutil
    bench, out, runs = fleet
    copy = tmp_path / "fleet"
    shutil.copytree(out, copy, symlinks=True)
    run = {p.name: next(p.iterdir()) for p in copy.iterdir()}
    (run["gpu-n0010"] / "manifest.json").write_text("{not json")
    (run["gpu-n0011"] / "manifest.json").unlink()          # its journal is still there: read, not vouched for
    (run["gpu-n0012"] / "manifest.json").unlink()
    (run["gpu-n0012"] / "manifest.jsonl").unlink()           # nothing left to read it by
    shutil.rmtree(run["gpu-n0014"])                          # a node's directory emptied
    (run["gpu-n0015"] / "result.json").write_bytes((run["gpu-n0015"] / "result.json").read_bytes()[:100])
    (run["gpu-n0016"] / "result.json").write_text("[]")
    (run["gpu-n0017"] / "manifest.json").write_text("null")
    (run["gpu-n0018"] / "manifest.json").unlink()
    (run["gpu-n0018"] / "manifest.jsonl").write_text("{garbage\n")
    return copy


def test_a_damaged_run_does_not_hide_the_rest_of_the_fleet(damaged_fleet):
    r = hostpin("compare", str(damaged_fleet))
    assert r.returncode == 0, r.stderr
    head = r.stdout.splitlines()[0]
    assert head.startswith("hostpin compare: 33 runs from 33 nodes: 3 FAIL") and "7 more could not be read" in head
    unread = r.stdout[r.stdout.index("could not be read (7)"):r.stdout.index("figures that differ")]
    for node, why in [("gpu-n0010", "manifest.json is not valid JSON"), ("gpu-n0012", "no manifest.json"),
                      ("gpu-n0014", "holds no run directory"), ("gpu-n0015", "result.json could not be read"),
                      ("gpu-n0016", "result.json could not be read: not a JSON object"),
                      ("gpu-n0017", "manifest.json is not a JSON object"),
                      ("gpu-n0018", "manifest.jsonl")]:
        line = next(l for l in unread.splitlines() if node in l)
        assert why in line, line
        if node == "gpu-n0018":  # a journal whose first line is garbage: damaged, whichever check saw it first
            assert "damaged" in line, line
    assert "cannot be vouched for" in r.stdout and "gpu-n0011" in r.stdout
    summary = json.loads(hostpin("compare", str(damaged_fleet), "--json").stdout)
    assert summary["unreadable"] == 7 and summary["runs"] == 33
    unread = {part for u in summary["unverified"] if not u["read"] for part in u["path"].split("/")}
    assert {f"gpu-n00{n}" for n in (10, 12, 14, 15, 16, 17, 18)} <= unread
    assert next(u for u in summary["unverified"] if u["read"])["node"] == "gpu-n0011"


def test_a_damaged_run_among_a_few_is_still_exit_3(fleet, tmp_path):
    import shutil
    bench, out, runs = fleet
    a, b = shutil.copytree(runs[0], tmp_path / "a"), runs[1]
    (a / "manifest.json").write_text("{not json")
    r = hostpin("compare", str(a), str(b))
    assert r.returncode == 3 and "manifest.json is not valid JSON" in r.stderr


def test_a_figure_missing_on_some_nodes_differs(fleet):
    """The node made from the CI machine's snapshot has no GPU: GPUs is not equal on every node."""
    bench, out, runs = fleet
    nogpu = list(bench.planted(40))[5]
    r = hostpin("compare", str(out))
    equal = r.stdout[r.stdout.index("equal on every node"):].split("\n\n")[0]
    assert "GPUs" not in equal
    gpus = next(l for l in r.stdout.splitlines() if l.strip().startswith("GPUs"))
    assert "(none) on 1" in gpus
    summary = json.loads(hostpin("compare", str(out), "--json").stdout)
    d = next(d for d in summary["differ"] if d["key"] == "gpus")
    assert d["absent"] == [nogpu] and {"node": nogpu, "value": "(none)"} in d["outliers"]
    # two runs: the same
    r = hostpin("compare", str(FIXTURES / "h200-preflight"), str(FIXTURES / "ci-preflight"))
    differs = r.stdout[:r.stdout.index("equal:")]
    assert "GPUs" in differs and "memhp_default_state" in differs


# -- the site file's types, a file that is not one, the runs directory, overriding it ------------------
@pytest.mark.parametrize("text, says", [
    ("[plan]\nsize = -5\n", '[plan] size: -5 is not a string with a unit, e.g. "47GiB"'),
    ("[plan]\nsize = 5\n", '[plan] size: 5 is not a string with a unit'),
    ('[plan]\nsize = "-5"\n', "[plan] size: '-5' is not a size"),
    ("[plan]\nranks = 2.9\n", "[plan] ranks: 2.9 is not a whole number"),
    ("[plan]\nranks = true\n", "[plan] ranks: true is not a whole number"),
    ('[plan]\nranks = "2"\n', "[plan] ranks: '2' is not a whole number"),
    ("[preflight]\nmargin = 5\n", "[preflight] margin: 5 is not a string"),
    ('[preflight]\ncuda-timeout = "30"\n', "[preflight] cuda-timeout: '30' is not a number"),
    ("[preflight]\nskip = [1]\n", "[preflight] skip: 1 is not a string"),
    ("[plan]\nreserve = 1073741824\n", "[plan] reserve: 1073741824 is not a string with a unit"),
])
def test_the_site_file_values_have_the_types_the_options_take(tmp_path, text, says):
    site = tmp_path / "bad.toml"
    site.write_text(text)
    r = hostpin("preflight", "--no-cuda", "--config", str(site), "--out", str(tmp_path / "runs"))
    assert r.returncode == 2 and says in r.stderr and str(site) in r.stderr, r.stderr


def test_a_site_file_that_is_a_named_pipe_is_refused_at_once(tmp_path):
    import os
    fifo = tmp_path / "hostpin.toml"
    os.mkfifo(fifo)
    r = hostpin("preflight", "--no-cuda", "--config", str(fifo), "--format", "npd", timeout=20)
    assert r.returncode == 2 and "it is a named pipe" in r.stderr
    assert r.stdout.startswith("hostpin: not evaluated: site file hostpin.toml: it is a named pipe")
    r = hostpin("preflight", "--no-cuda", "--config", str(tmp_path), timeout=20)
    assert r.returncode == 2 and "it is a directory" in r.stderr


def test_the_runs_directory_is_checked_and_relative_to_the_file(tmp_path):
    (tmp_path / "afile").write_text("x")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    for value, says in [("afile", "[runs] dir: '%s' is a file, not a directory" % (tmp_path / "afile")),
                        ("dangling", "[runs] dir: '%s' is a symbolic link to" % (tmp_path / "dangling"))]:
        site = _site(tmp_path, f'[runs]\ndir = "{value}"\n')
        r = hostpin("preflight", "--no-cuda", "--config", str(site))
        assert r.returncode == 2 and says in r.stderr, r.stderr
    site = _site(tmp_path, SITE.format(runs="site-runs"))
    r = subprocess.run([sys.executable, "-m", "repro.cli", "preflight", "--config", "hostpin.toml", "--root",
                        str(FIXTURES / "h200-fc-snapshot"), "--json"], cwd=tmp_path / "..", capture_output=True,
                       text=True, env={**__import__("os").environ, "PYTHONPATH": str(REPO)})
    # run from elsewhere: the file is not found there; from its directory's parent by a relative path
    r = subprocess.run([sys.executable, "-m", "repro.cli", "preflight", "--config", f"{tmp_path.name}/hostpin.toml",
                        "--root", str(FIXTURES / "h200-fc-snapshot"), "--json"], cwd=tmp_path.parent,
                       capture_output=True, text=True, env={**__import__("os").environ, "PYTHONPATH": str(REPO)})
    result = json.loads(r.stdout)
    assert Path(result["run_dir"]).parent == tmp_path / "site-runs"
    assert result["config"]["path"] == str(site)  # absolute, whatever the directory it ran from


def test_booleans_and_skip_from_the_file_can_be_overridden(tmp_path):
    site = _site(tmp_path, '[plan]\nreadonly = true\n[preflight]\nstrict = true\nno-cuda = true\n'
                           'skip = ["kernel", "thp"]\n')
    r = hostpin("preflight", "--config", str(site), "--root", str(FIXTURES / "h200-fc-snapshot"), "--json",
                "--no-strict", "--no-readonly", "--skip", "none", "--out", str(tmp_path / "r"))
    result = json.loads(r.stdout)
    s = result["config"]["settings"]
    assert s["strict"] == {"value": False, "from": "command line"} and s["readonly"]["value"] is False
    assert s["skip"] == {"value": [], "from": "command line"}
    assert all(c["status"] != "skip" for c in result["checks"] if c["id"] in ("kernel", "thp"))
    r = hostpin("preflight", "--config", str(site), "--root", str(FIXTURES / "h200-fc-snapshot"), "--json",
                "--skip", "none", "--skip", "thp", "--cuda", "--out", str(tmp_path / "r"))
    s = json.loads(r.stdout)["config"]["settings"]
    assert s["skip"]["value"] == ["thp"] and s["no_cuda"] == {"value": False, "from": "command line"}
    r = hostpin("preflight", "--no-cuda", "--strict", "--root", str(FIXTURES / "h200-fc-snapshot"),  # old spellings
                "--readonly", "--json", "--out", str(tmp_path / "r"))
    assert json.loads(r.stdout)["config"]["settings"]["strict"]["value"] is True


# -- one line on every exit path ----------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["line", "npd"])
@pytest.mark.parametrize("args, cause", [
    (["--config", "{bad}"], "bad.toml: not valid TOML"),
    (["--size", "abc"], "--size: abc is not a size"),
    (["--skip", "nosuchcheck"], "--skip: nosuchcheck is not a check"),
    (["--root", "/nonexistent"], "--root: /nonexistent does not exist"),
    (["--bogus"], "No such option --bogus"),
    (["--prometheus", "/proc/nope/x.prom"], "cannot write proc/nope/x.prom"),
])
def test_every_exit_of_the_gate_prints_one_line_cause_first(tmp_path, fmt, args, cause):
    (tmp_path / "bad.toml").write_text("[plan\n")
    args = [a.replace("{bad}", str(tmp_path / "bad.toml")) for a in args]
    r = hostpin("preflight", "--no-cuda", "--config", "none", "--root", str(FIXTURES / "h200-fc-snapshot"),
                "--out", str(tmp_path / "r"), *args, "--format", fmt)
    lines = r.stdout.splitlines()
    assert len(lines) == 1 and len(lines[0]) <= 80, r.stdout
    assert lines[0].startswith(f"hostpin: not evaluated: {cause}"), lines[0]
    assert r.returncode == 2 if fmt == "npd" or "prom" not in cause else r.returncode == 3
    assert r.stderr.strip() and "Traceback" not in r.stderr  # the whole message too

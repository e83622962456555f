"""The README's examples after the quick start, run as written: every `hostpin ...` and
`python bench/...` line of its sh blocks, in a scratch directory holding what a clone ships
(tests/fixtures, deploy, bench), with the venv's commands first on the PATH, as after
`. .venv/bin/activate`. Lines that need a cluster, a shared file system, the network or /etc
(srun, clush, kubectl, install, pip) are left to the tests that cover them (test_slurm.py,
test_deploy_kubernetes.py). Where the README shows a one-line result, it must be what ran."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

pytestmark = pytest.mark.slow
README = (REPO / "README.md").read_text()
AFTER_QUICK_START = README[README.index("### Installing it as a tool"):]
ELSEWHERE = re.compile(r"\bsrun\b|\bclush\b|\bkubectl\b|/shared/|\bpip\b|^install ")


def _examples() -> list[str]:
    lines = []
    for block in re.findall(r"```sh\n(.*?)```", AFTER_QUICK_START, re.S):
        for line in block.splitlines():
            command = re.sub(r"\s+#.*$", "", line).strip()
            if re.match(r"(hostpin|python bench/)", command) and not ELSEWHERE.search(command):
                lines.append(command)
    return lines


def test_the_readme_has_the_examples_this_test_runs():
    commands = _examples()
    assert len(commands) >= 12
    assert "hostpin compare fleet" in commands
    assert any(c.startswith("python bench/compare_fleet.py") for c in commands)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    d = tmp_path_factory.mktemp("readme")
    for sub in ("tests/fixtures", "deploy", "bench"):
        shutil.copytree(REPO / sub, d / sub)
    return d


@pytest.mark.parametrize("command", _examples())
def test_readme_example_runs_as_written(scratch, command):
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "HOSTPIN_CONFIG": "none"}
    r = subprocess.run(["bash", "-c", command], cwd=scratch, env=env, capture_output=True, text=True, timeout=300)
    assert "Traceback" not in r.stderr, r.stderr
    # a verdict is an answer: 0 (fits, or warnings) or 1 (does not fit); anything else is a broken example
    assert r.returncode in (0, 1), f"{command}: exit {r.returncode}: {r.stderr[-500:]}"
    if "--format line" in command or "--format npd" in command:
        assert r.stdout.strip() in README, f"README does not show what `{command}` printed: {r.stdout}"


def test_readme_fleet_summary_is_what_the_commands_print(tmp_path):
    """The fleet section's output block, line for line (`...` stands for lines left out), against a real
    run of the commands above it: the bench's 100 nodes, then `hostpin compare fleet`."""
    section = README[README.index("### Many runs: `hostpin compare` at fleet scale"):]
    shown = re.search(r"```\n(hostpin compare: .*?)```", section, re.S).group(1).splitlines()
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "HOSTPIN_CONFIG": "none"}
    shutil.copytree(REPO / "tests" / "fixtures", tmp_path / "tests" / "fixtures")
    shutil.copytree(REPO / "bench", tmp_path / "bench")
    r = subprocess.run(["bash", "-c", "python bench/compare_fleet.py --nodes 100 --keep --dir fleet --repeat 1 "
                        ">/dev/null && hostpin compare fleet"], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-500:]
    printed = r.stdout.splitlines()
    at = 0
    for line in shown:
        if line.strip() == "...":
            continue
        assert line in printed[at:], f"README shows {line!r}; compare printed:\n{r.stdout}"
        at = printed.index(line, at) + 1
    # a line left out is marked: where the README skips printed lines, it says `...`
    assert len(shown) < len(printed) and any(l.strip() == "..." for l in shown)


def test_readme_offline_example_works_after_a_second_snapshot(tmp_path):
    block = README[README.index("### Offline: a customer's snapshot"):]
    snap, pre = [re.sub(r"\s+#.*$", "", l).strip() for l in
                 re.search(r"```sh\n(.*?)```", block, re.S).group(1).splitlines()[:2]]
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "HOSTPIN_CONFIG": "none"}
    for command in (snap + " --no-cuda", snap + " --no-cuda", pre + " --no-cuda"):
        r = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=120)
        assert r.returncode in (0, 1), f"{command}: exit {r.returncode}: {r.stderr[-300:]}"
    assert len(list((tmp_path / "snapshots").iterdir())) == 2


def test_readme_preflight_output_is_what_the_command_prints(tmp_path):
    """The Preflight section's first block, every line but the evidence path, against a real run."""
    section = README[README.index("## Preflight"):]
    block = re.search(r"```\n\$ (hostpin preflight [^\n]+)\n(.*?)```", section, re.S)
    command, shown = block.group(1), block.group(2).splitlines()
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "HOSTPIN_CONFIG": "none"}
    shutil.copytree(REPO / "tests" / "fixtures", tmp_path / "tests" / "fixtures")
    r = subprocess.run(["bash", "-c", command + " --out runs"], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-500:]
    printed = r.stdout.splitlines()
    for line in shown:
        if line.startswith("evidence: "):
            assert any(p.startswith("evidence: ") for p in printed)
            continue
        assert line in printed, f"README shows {line!r}; preflight printed:\n{r.stdout}"
    assert len([p for p in printed if p[:4] in ("PASS", "WARN", "FAIL", "SKIP", "ERRO")]) == \
        len([s for s in shown if s[:4] in ("PASS", "WARN", "FAIL", "SKIP", "ERRO")])


def test_sudo_in_the_readme_names_the_venvs_command(tmp_path):
    """sudo resets PATH (secure_path), so the activated venv's `hostpin` is not found under it:
    every sudo line names the venv's command, and that command runs with sudo's PATH."""
    bare = [line for line in README.splitlines() if re.search(r"\bsudo hostpin\b", line)]
    assert not bare, bare
    assert "sudo .venv/bin/hostpin" in README
    command = Path(sys.executable).parent / "hostpin"  # what `pip install` put in the venv
    r = subprocess.run([str(command), "--version"], env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "hostpin" in r.stdout, r.stderr


def test_the_readme_alert_rules_fire_on_what_they_say(tmp_path):
    """The Prometheus rules shown, evaluated on the textfiles of two real runs: one that fails its
    plan (status 2) and one that cannot be evaluated (status 4, a damaged meminfo). "Cannot pin"
    is for the first only; the second has its own alert."""
    yaml = pytest.importorskip("yaml")
    block = re.search(r"### Monitoring.*?```yaml\n(.*?)```", README, re.S).group(1)
    rules = {r["alert"]: r for g in yaml.safe_load(block)["groups"] for r in g["rules"]}
    tree = tmp_path / "damaged"
    (tree / "proc").mkdir(parents=True)
    (tree / "sys").mkdir()
    (tree / "proc" / "meminfo").write_text("MemTotal: garbage\n")
    runs = {"fail": ["--size", "100TiB", "--method", "mlock", "--no-cuda"],
            "not evaluated": ["--root", str(tree), "--size", "1GiB"]}
    statuses = {}
    for name, args in runs.items():
        prom = tmp_path / f"{name.replace(' ', '-')}.prom"
        subprocess.run([sys.executable, "-m", "repro.cli", "preflight", *args, "--prometheus", str(prom),
                        "--out", str(tmp_path / "runs")], cwd=REPO, capture_output=True, timeout=120,
                       env={**os.environ, "HOSTPIN_CONFIG": "none"})
        statuses[name] = float(re.search(r"^hostpin_preflight_status\{.*\} (\S+)$", prom.read_text(), re.M).group(1))
    assert statuses == {"fail": 2.0, "not evaluated": 4.0}

    def fires(rule: str, value: float) -> bool:
        metric, op, threshold = re.fullmatch(r"(\w+) (==|>=|>|<=|<) (\S+)", rules[rule]["expr"]).groups()
        assert metric == "hostpin_preflight_status"
        t = float(threshold)
        return {"==": value == t, ">=": value >= t, ">": value > t, "<=": value <= t, "<": value < t}[op]

    assert "cannot pin" in rules["HostpinPreflightFailing"]["annotations"]["summary"]
    assert fires("HostpinPreflightFailing", statuses["fail"])
    assert not fires("HostpinPreflightFailing", statuses["not evaluated"])
    assert fires("HostpinPreflightNotEvaluated", statuses["not evaluated"])
    assert not fires("HostpinPreflightNotEvaluated", statuses["fail"])


def test_what_the_examples_write_is_ignored_by_git():
    """Run from a clone, the examples leave their outputs there (--out, -o, --dir, and hostpin-runs/
    by default): git must not list them as untracked files."""
    if not (REPO / ".git").exists() or shutil.which("git") is None:
        pytest.skip("not a git clone")
    outputs = {"hostpin-runs/x"}
    for command in _examples():
        for flag, value in re.findall(r"(--out|-o|--dir)\s+(\S+)", command):
            outputs.add(f"{value}/x" if flag in ("--out", "--dir") else value)
    assert {"snapshots/x", "swap32.tar.gz", "ci.tar.gz", "fleet/x"} <= outputs
    r = subprocess.run(["git", "check-ignore", "--no-index", *sorted(outputs)], cwd=REPO, capture_output=True,
                       text=True, timeout=60)
    assert set(r.stdout.split()) == outputs, f"not ignored: {sorted(outputs - set(r.stdout.split()))}"


def test_every_bench_script_has_a_row_in_bench_readme():
    """bench/README.md's table names every script in bench/ (a new engineer reads what it measures,
    where it runs, how long it takes and its last figure there)."""
    table = (REPO / "bench" / "README.md").read_text()
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    named = {m for line in rows for m in re.findall(r"`([\w.]+\.(?:sh|py))", line.split("|")[1])}
    scripts = {p.name for p in (REPO / "bench").iterdir() if p.suffix in (".sh", ".py")}
    assert scripts - named == set(), f"bench scripts without a row: {sorted(scripts - named)}"
    assert named - scripts == set(), f"rows for scripts that are gone: {sorted(named - scripts)}"

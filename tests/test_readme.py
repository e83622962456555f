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

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

"""Shared fixtures: the captured trees, a copy helper for constructed edge cases, a CLI runner."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
FIXTURES = HERE / "fixtures"
REFERENCE = FIXTURES / "h200-reference"          # shared/reference/h200-2026-11-30, verbatim
GPU_SNAPSHOT = FIXTURES / "h200-fc-snapshot"     # hostpin snapshot on the GPU machine (H200, 580.159.04)
CI_SNAPSHOT = FIXTURES / "ci-vm-snapshot"        # hostpin snapshot on the CI machine (no GPU, cgroup v1)
REPO = HERE.parent

IS_ROOT = os.geteuid() == 0


def cgroups_unusable() -> str | None:
    """Why this machine cannot make the run cgroups the live tests need, or None."""
    if not IS_ROOT:
        return "needs root"
    from repro.cgroups import CgroupError, cgroup_layout
    try:
        cgroup_layout()
    except CgroupError as exc:
        return str(exc)
    return None

# the suite's commands must not pick up a site file this machine may have (/etc/hostpin/hostpin.toml);
# tests of the site file name theirs
os.environ.setdefault("HOSTPIN_CONFIG", "none")

_STOPS = [getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP")]


@pytest.fixture(autouse=True)
def _signal_dispositions_come_back():
    """A command run in this process must leave SIGINT/SIGTERM/SIGHUP as it found them: an ignored
    one (SIG_IGN) is inherited through exec by every child a later test starts, which then cannot be
    killed by that signal. The test fails on a leak; the dispositions are restored either way."""
    before = {s: signal.getsignal(s) for s in _STOPS}
    yield
    after = {s: signal.getsignal(s) for s in _STOPS}
    for s, handler in before.items():
        signal.signal(s, handler if handler is not None else signal.SIG_DFL)
    leaked = [signal.Signals(s).name for s in _STOPS if after[s] is signal.SIG_IGN and before[s] is not signal.SIG_IGN]
    assert not leaked, f"the test left {leaked} ignored"


@pytest.fixture
def tree(tmp_path):
    """A writable copy of a captured tree, for edge cases built from a real capture.

    tree(GPU_SNAPSHOT) -> path of the copy's root/; write(rel, text) changes one file.
    """
    class Tree:
        def __call__(self, source: Path) -> "Tree":
            copy = Tree()
            copy.base = tmp_path / f"tree{len(list(tmp_path.glob('tree*')))}"
            src = source / "root" if (source / "root").is_dir() else source
            copy.path = copy.base / "root"
            shutil.copytree(src, copy.path, symlinks=False)
            # keep the snapshot's record of empty directories next to the copy
            if (source / "manifest.json").exists():
                shutil.copy(source / "manifest.json", copy.base / "manifest.json")
            if (source / "probes").is_dir():
                shutil.copytree(source / "probes", copy.base / "probes")
            return copy

        def write(self, rel: str, text: str) -> None:
            target = self.path / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)

        def remove(self, rel: str) -> None:
            target = self.path / rel
            if target.is_dir():
                shutil.rmtree(target)
            elif target.exists():
                target.unlink()

        def set_cuda(self, result: dict) -> None:
            (self.base / "probes").mkdir(exist_ok=True)
            (self.base / "probes" / "cuda.json").write_text(json.dumps(result))

    return Tree()


def hostpin(*args: str, timeout: float = 120, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run the real console entry point in a fresh interpreter."""
    return subprocess.run([sys.executable, "-m", "repro.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, env=env)


@pytest.fixture
def run_cli(tmp_path):
    def _run(*args: str, **kw) -> subprocess.CompletedProcess:
        out = tmp_path / "runs"
        if "--out" not in args and args and args[0] in ("preflight", "snapshot"):
            args = (*args, "--out", str(out))
        return hostpin(*args, **kw)
    return _run

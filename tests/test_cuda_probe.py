"""The CUDA probe degrades to a clear result, never a traceback or a hang."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from diag import cuda


def test_probe_on_this_machine_is_a_clean_result():
    result = cuda.probe_in_child(timeout=60)
    assert result["returncode"] == 0 and "Traceback" not in result["stderr"]
    assert result["status"] in ("ok", "no_driver", "no_device", "driver_too_old", "no_bindings")
    assert result["message"]
    if not Path("/proc/driver/nvidia/version").exists():
        assert result["status"] == "no_driver" and "libcuda" in result["message"]
        assert result["devices"] == []
    else:
        assert result["status"] == "ok" and result["devices"]


def test_a_hung_probe_is_killed_at_the_timeout(tmp_path, monkeypatch):
    """Edge case named: a driver that never answers. The child's interpreter is made to hang
    at start-up (a sitecustomize that sleeps), which is what a stuck cuInit looks like from here."""
    (tmp_path / "sitecustomize.py").write_text("import time\ntime.sleep(60)\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    t0 = time.monotonic()
    result = cuda.probe_in_child(timeout=1.5)
    assert result["status"] == "timeout" and "did not answer within 1.5 s" in result["message"]
    assert time.monotonic() - t0 < 10


def test_error_names():
    pytest.importorskip("cuda.bindings")
    from cuda.bindings import runtime
    assert cuda.error_name(runtime.cudaError_t(1)) == "cudaErrorInvalidValue (1)"
    assert cuda.error_name(runtime.cudaError_t(712)) == "cudaErrorHostMemoryAlreadyRegistered (712)"


@pytest.mark.parametrize("stdout", ['{"status": "ok", "devices": []}', '[1, 2]', 'Segmentation fault\n{"status": "ok"}',
                                    '{"status": "splendid", "devices": []}'])
def test_a_garbled_probe_is_an_error(tmp_path, monkeypatch, stdout):
    """Edge case named: the child prints something other than the probe's JSON (a wrapper, a crash
    message, a half-written object). A sitecustomize prints it and exits before the probe runs."""
    (tmp_path / "sitecustomize.py").write_text(
        f"import os, sys\nsys.stdout.write({stdout!r} + '\\n')\nsys.stdout.flush()\nos._exit(0)\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    result = cuda.probe_in_child(timeout=30)
    assert result["status"] == "error" and "without a usable result" in result["message"]
    assert result["devices"] == []


def _hanging_probe(tmp_path, monkeypatch) -> Path:
    """A probe child that hangs at start-up (as a stuck cuInit would) and writes its pid first;
    the hostpin process itself starts normally."""
    pidfile = tmp_path / "probe.pid"
    (tmp_path / "sitecustomize.py").write_text(
        "import os, sys, time\n"
        "if 'diag.cuda' in getattr(sys, 'orig_argv', []):\n"
        f"    open({str(pidfile)!r}, 'w').write(str(os.getpid()))\n"
        "    time.sleep(60)\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return pidfile


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_bad_option_after_the_probe_started_leaves_no_child(tmp_path, monkeypatch):
    """preflight starts the probe's child before its imports; an option found bad after that (an
    unknown --skip needs the check list) kills it: no child outlives the command."""
    pidfile = _hanging_probe(tmp_path, monkeypatch)
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "repro.cli", "preflight", "--skip", "nosuch", "--out",
                           str(tmp_path / "runs")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "'nosuch' is not a check" in proc.stderr
    assert time.monotonic() - t0 < 30
    deadline = time.monotonic() + 10
    while not pidfile.exists() and time.monotonic() < deadline:  # the child may not have got that far
        time.sleep(0.05)
    if pidfile.exists():
        pid = int(pidfile.read_text())
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(pid), f"the probe's child {pid} outlived the command"


def test_preflight_records_where_the_probe_spent_its_time(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "repro.cli", "preflight", "--size", "1GiB", "--json", "--out",
                           str(tmp_path)], capture_output=True, text=True, timeout=120)
    data = json.loads(proc.stdout)
    assert data["cuda"]["duration_s"] > 0
    probe = json.loads(next(tmp_path.glob("*/probes/cuda.json")).read_text())
    steps = probe["timings_s"]
    if probe["status"] == "no_bindings":
        assert steps == {}
    else:
        assert 0 < steps["import_bindings"] <= probe["duration_s"]
        assert list(steps) == sorted(steps, key=steps.get)  # each step ends after the one before

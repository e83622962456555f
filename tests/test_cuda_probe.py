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
    # the answer is taken at its newline: the child may still be exiting (None) and is reaped apart
    assert result["returncode"] in (0, None) and "Traceback" not in result["stderr"]
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


def test_the_console_command_starts_the_probe_before_click_and_kills_it_on_a_usage_error(tmp_path, monkeypatch):
    """`hostpin preflight` starts the probe's child first (start_early, before click and the
    readers are imported); a --size that click rejects ends the command before preflight takes
    the child, and the command kills it at exit."""
    pidfile = _hanging_probe(tmp_path, monkeypatch)
    with open(tmp_path / "sitecustomize.py", "a") as fh:  # hostpin itself: click takes 1.5 s to import
        fh.write("class _SlowClick:\n"
                 "    def find_spec(self, name, path=None, target=None):\n"
                 "        if name == 'click':\n"
                 "            time.sleep(1.5)\n"
                 "if 'diag.cuda' not in getattr(sys, 'orig_argv', []):\n"
                 "    sys.meta_path.insert(0, _SlowClick())\n")
    proc = subprocess.run([sys.executable, "-m", "repro.cli", "preflight", "--size", "bogus", "--out",
                           str(tmp_path / "runs")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert pidfile.exists(), "no probe child was started before click was imported"
    pid, deadline = int(pidfile.read_text()), time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid), f"the probe's child {pid} outlived the command"


def test_a_cuda_timeout_starts_the_probe_in_preflight_itself(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "repro.cli", "preflight", "--size", "1GiB", "--cuda-timeout", "20",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode in (0, 1, 3) and "Traceback" not in proc.stderr
    probe = json.loads(next(tmp_path.glob("*/probes/cuda.json")).read_text())
    assert probe["parent_at"]["early"] is False


def test_no_early_probe_where_the_command_says_no_cuda(tmp_path, monkeypatch):
    pidfile = _hanging_probe(tmp_path, monkeypatch)
    proc = subprocess.run([sys.executable, "-m", "repro.cli", "preflight", "--size", "bogus", "--no-cuda"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    time.sleep(0.5)
    assert not pidfile.exists()


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
    at = probe["parent_at"]  # epoch stamps: spawned, the child began, the parent read it, needed it, had it
    assert at["early"] is True  # started by the console command, before click (no --cuda-timeout given)
    assert at["spawn"] <= at["popen_returned"] <= at["read"] <= at["joined"]
    assert at["spawn"] < probe["began_at"] < at["read"] and at["needed"] <= at["joined"]

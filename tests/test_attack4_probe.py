"""The fourth attack on the CUDA probe's reading (its answer taken at the first newline, the child
reaped by a thread): a probe child that answers and never exits, and one that writes without end.
Each child is a real interpreter, made so by a sitecustomize on PYTHONPATH (as test_cuda_probe)."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from diag import cuda
from test_cuda_probe import _alive


def _probe_child(tmp_path: Path, monkeypatch, body: str) -> Path:
    pidfile = tmp_path / "probe.pid"
    (tmp_path / "sitecustomize.py").write_text(
        "import json, os, sys, time\n"
        "if 'diag.cuda' in getattr(sys, 'orig_argv', []):\n"
        f"    open({str(pidfile)!r}, 'w').write(str(os.getpid()))\n" + body)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return pidfile


def test_a_probe_that_answers_and_never_exits_does_not_outlive_snapshot(tmp_path, monkeypatch):
    """Edge case named: the answer comes, then the child hangs (a driver stuck closing its files).
    `hostpin snapshot` took the answer and exited; the reaping thread died with it and the child
    ran on, orphaned, for ever."""
    pidfile = _probe_child(tmp_path, monkeypatch,
                           "    sys.stdout.write(json.dumps({'status': 'no_driver', 'devices': [], 'message': 'm'}) + '\\n')\n"
                           "    sys.stdout.flush()\n"
                           "    time.sleep(300)\n")
    r = subprocess.run([sys.executable, "-m", "repro.cli", "snapshot", "--out", str(tmp_path / "snaps")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    pid = int(pidfile.read_text())
    try:
        deadline = time.monotonic() + 5
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(pid), f"the probe's child {pid} outlived hostpin snapshot"
    finally:
        if _alive(pid):
            os.kill(pid, 9)


def test_a_probe_that_writes_without_end_is_stopped_at_1_mib(tmp_path, monkeypatch):
    """Edge case named: a child that writes without a newline (garbage, or an answer of gigabytes).
    The parent read it all until the timeout, its buffer copied at every read (115 MB of RSS in
    15 s here; more on a faster node); now it stops at 1 MiB and says so."""
    pidfile = _probe_child(tmp_path, monkeypatch,
                           "    chunk = b'x' * (1 << 16)\n"
                           "    while True:\n"
                           "        os.write(1, chunk)\n")
    t0 = time.monotonic()
    result = cuda.probe_in_child(timeout=30)
    assert time.monotonic() - t0 < 15, "read until the timeout"
    assert result["status"] == "error" and "more than 1,048,576 bytes without a newline" in result["message"]
    assert not _alive(int(pidfile.read_text()))


def test_a_probe_that_writes_half_an_answer_and_hangs_times_out(tmp_path, monkeypatch):
    """Edge case named: a partial line, then nothing: the timeout answers, and the child is killed."""
    pidfile = _probe_child(tmp_path, monkeypatch, "    os.write(1, b'{\"status\": \"no_dri')\n    time.sleep(300)\n")
    t0 = time.monotonic()
    result = cuda.probe_in_child(timeout=2)
    assert result["status"] == "timeout" and time.monotonic() - t0 < 10
    assert not _alive(int(pidfile.read_text()))

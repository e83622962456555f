"""The CUDA probe degrades to a clear result, never a traceback or a hang."""
from __future__ import annotations

import os
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

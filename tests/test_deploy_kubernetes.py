"""deploy/kubernetes: the manifests against Kubernetes' own schema (kubernetes-validate, strict), the
DaemonSet's command run for real on this machine, and node-problem-detector's plugin contract
(pkg/custompluginmonitor/plugin/plugin.go: exit 0 OK, 1 NonOK, anything else Unknown; stdout
trimmed and cut at max_output_length) for `preflight --format npd` and for the relay script."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import FIXTURES, REPO, hostpin

K8S = REPO / "deploy" / "kubernetes"
RELAY = K8S / "hostpin-npd-status"
MONITOR = K8S / "hostpin-monitor.json"
# a plan this machine can pin whatever the other tests running here do to swap, fragmentation and pressure
PASSING = ('[plan]\nsize = "256MiB"\nmethod = "mlock"\n[preflight]\nno-cuda = true\nsample = 0\n'
           'skip = ["swap", "fragmentation", "psi"]\n')


def _docs() -> list[dict]:
    yaml = pytest.importorskip("yaml")
    return [d for d in yaml.safe_load_all((K8S / "hostpin-daemonset.yaml").read_text()) if d]


def _daemonset() -> dict:
    return next(d for d in _docs() if d["kind"] == "DaemonSet")


def _site_toml() -> str:
    return next(d for d in _docs() if d["kind"] == "ConfigMap")["data"]["hostpin.toml"]


def _one_line(stdout: str) -> str:
    """NPD keeps stdout trimmed; the contract here is one line of at most 80 characters."""
    lines = stdout.strip().splitlines()
    assert len(lines) == 1, stdout
    assert len(lines[0]) <= 80 and lines[0].startswith("hostpin: "), lines[0]
    return lines[0]


# -- manifests --------------------------------------------------------------------------------------
def test_manifests_validate_against_the_kubernetes_schema():
    kv = pytest.importorskip("kubernetes_validate")
    docs = _docs()
    assert [d["kind"] for d in docs] == ["Namespace", "ConfigMap", "DaemonSet"]
    for doc in docs:
        kv.validate(doc, kv.latest_version(), strict=True)  # raises ValidationError naming the field
    broken = json.loads(json.dumps(_daemonset()))
    broken["spec"]["template"]["spec"]["hostPid"] = True  # a misspelt field must not pass
    with pytest.raises(kv.ValidationError):
        kv.validate(broken, kv.latest_version(), strict=True)


def test_daemonset_is_what_the_probe_and_the_headroom_check_need():
    pod = _daemonset()["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert pod["runtimeClassName"] == "nvidia" and pod["hostPID"] is True
    assert container["securityContext"]["privileged"] is True
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert "limits" not in container.get("resources", {})  # its own limit would be judged as the workload's
    assert "nvidia.com/gpu" not in json.dumps(container.get("resources", {}))
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["site"] == "/etc/hostpin"  # the site file lands where hostpin looks by default


def test_the_shipped_site_file_is_one_hostpin_accepts(tmp_path):
    assert _site_toml() == (REPO / "deploy" / "hostpin.toml").read_text()  # the ConfigMap carries it verbatim
    site = tmp_path / "hostpin.toml"
    site.write_text(_site_toml())
    r = hostpin("preflight", "--config", str(site), "--root", str(FIXTURES / "h200-fc-snapshot"), "--json",
                "--out", str(tmp_path / "runs"))
    result = json.loads(r.stdout)
    assert result["plan"]["describe"] == "2 x 47.2 GiB by register"
    assert result["config"]["settings"]["thp"] == {"value": True, "from": "file"}


# -- the DaemonSet's command, run here --------------------------------------------------------------
def _shim(tmp_path: Path) -> Path:
    shim = tmp_path / "hostpin"
    shim.write_text(f"#!/bin/sh\nexec {sys.executable} -m repro.cli \"$@\"\n")
    shim.chmod(0o755)
    return shim


def _loop_once(tmp_path: Path, site_text: str) -> dict:
    site = tmp_path / "hostpin.toml"
    site.write_text(site_text)
    (tmp_path / "textfile").mkdir(exist_ok=True)  # the kubelet makes it (hostPath DirectoryOrCreate); hostpin never does
    script = _daemonset()["spec"]["template"]["spec"]["containers"][0]["args"][0]
    env = {"PATH": os.environ["PATH"], "HOSTPIN": str(_shim(tmp_path)), "HOSTPIN_CONFIG": str(site),
           "HOSTPIN_ONCE": "1", "HOSTPIN_KEEP_RUNS": "2", "HOSTPIN_RUNS": str(tmp_path / "runs"),
           "HOSTPIN_STATUS": str(tmp_path / "npd-status"),
           "HOSTPIN_TEXTFILE": str(tmp_path / "textfile" / "hostpin.prom"), "PYTHONPATH": str(REPO)}
    r = subprocess.run(["/bin/sh", "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    relay = subprocess.run([str(RELAY), str(tmp_path / "npd-status"), "900"], capture_output=True, text=True,
                           timeout=10)
    return {"log": r.stdout, "relay": relay, "status": (tmp_path / "npd-status").read_text(),
            "textfile": (tmp_path / "textfile" / "hostpin.prom").read_text()}


def test_daemonset_command_with_the_shipped_plan_marks_this_node_unsafe(tmp_path):
    """This machine (no GPU, 24 GiB) cannot pin 2 x 47.2 GiB by register: problem, with the numbers."""
    parser = pytest.importorskip("prometheus_client.parser")
    out = _loop_once(tmp_path, _site_toml())
    code, line = out["status"].rstrip("\n").split(" ", 1)
    assert code == "1" and line.startswith("hostpin: headroom ") and "< 95.5 GiB" in line
    assert out["relay"].returncode == 1 and _one_line(out["relay"].stdout) == line
    families = {f.name: f for f in parser.text_string_to_metric_families(out["textfile"])}
    assert families["hostpin_preflight_status"].samples[0].value == 2
    assert line in out["log"]


def test_daemonset_textfile_says_not_evaluated_after_a_bad_site_file(tmp_path):
    """A verdict that fitted, then a site file that cannot be read: node_exporter must not keep
    exporting the old verdict; and the pruning leaves what is not a hostpin run alone."""
    parser = pytest.importorskip("prometheus_client.parser")
    status = lambda text: {f.name: f for f in parser.text_string_to_metric_families(text)}[  # noqa: E731
        "hostpin_preflight_status"].samples[0].value
    assert status(_loop_once(tmp_path, PASSING)["textfile"]) == 0
    (tmp_path / "runs" / "lost+found").mkdir()
    (tmp_path / "runs" / "notes.txt").write_text("mine")
    for _ in range(3):
        out = _loop_once(tmp_path, "[plan]\nsize = 5\n")
    assert out["status"].startswith("2 hostpin: not evaluated") and out["relay"].returncode == 2
    assert status(out["textfile"]) == 4
    assert sorted(p.name for p in (tmp_path / "textfile").iterdir()) == ["hostpin.prom"]
    out = _loop_once(tmp_path, PASSING)
    assert status(out["textfile"]) == 0
    assert (tmp_path / "runs" / "lost+found").is_dir() and (tmp_path / "runs" / "notes.txt").exists()


def test_daemonset_command_on_a_plan_that_fits_says_ok_and_keeps_few_runs(tmp_path):
    for _ in range(3):
        out = _loop_once(tmp_path, PASSING)
    assert out["status"].startswith("0 hostpin: ok: can pin 1 x 256 MiB by mlock")
    assert out["relay"].returncode == 0 and _one_line(out["relay"].stdout).startswith("hostpin: ok")
    assert len(list((tmp_path / "runs").iterdir())) == 2  # HOSTPIN_KEEP_RUNS
    assert [p.name for p in (tmp_path / "textfile").iterdir()] == ["hostpin.prom"]


# -- node-problem-detector --------------------------------------------------------------------------
def test_monitor_config_is_one_node_problem_detector_accepts():
    """The checks NPD's config.go makes (plugin "custom", rule timeout <= global timeout, a permanent
    rule's condition has a default), and the relay at the path where the ConfigMap is mounted."""
    cfg = json.loads(MONITOR.read_text())
    assert cfg["plugin"] == "custom"
    secs = lambda text: float(text.rstrip("s"))  # noqa: E731  (NPD durations here are in seconds)
    (rule,) = cfg["rules"]
    assert secs(rule["timeout"]) <= secs(cfg["pluginConfig"]["timeout"]) < secs(cfg["pluginConfig"]["invoke_interval"])
    assert rule["type"] == "permanent" and rule["condition"] == "HostPinningUnsafe"
    assert rule["condition"] in {c["type"] for c in cfg["conditions"]}
    assert Path(rule["path"]).name == RELAY.name and cfg["pluginConfig"]["max_output_length"] == 80
    script = _daemonset()["spec"]["template"]["spec"]["containers"][0]["args"][0]
    assert f"status=${{HOSTPIN_STATUS:-{rule['args'][0]}}}" in script  # NPD reads where the DaemonSet writes


@pytest.mark.parametrize("content, age, code, says", [
    ("0 hostpin: ok: can pin 2 x 47.2 GiB by register\n", 0, 0, "hostpin: ok"),
    ("1 hostpin: headroom 38 GiB < 94.8 GiB\n", 0, 1, "hostpin: headroom 38 GiB < 94.8 GiB"),
    ("2 hostpin: not evaluated: /proc/meminfo is unreadable\n", 0, 2, "not evaluated"),
    ("0 hostpin: ok\n", 3600, 2, "s old"),                       # the DaemonSet stopped: no stale OK
    ("1 Traceback (most recent call last):\n", 0, 2, "unreadable verdict"),
    ("7 hostpin: ok\n", 0, 2, "hostpin: ok"),                    # an exit code NPD does not define
    ("", 0, 2, "unreadable verdict"),
    ("1 hostpin: " + "x" * 200 + "\n", 0, 1, "hostpin: xxx"),    # cut to 80
    (None, 0, 2, "no verdict"),
    ("0 hostpin: ok\r\n", 0, 0, "hostpin: ok"),                   # CRLF: no CR passed on
    ("1\r\n", 0, 2, "unreadable verdict"),
    ("1 hostpin: \x1b[31mred\x1b[0m\x07 here\n", 0, 1, "hostpin: red here"),  # no escapes, no controls
    ("0 hostpin: ok\n", -3600, 2, "in the future"),             # a clock gone wrong is not fresh
])
def test_relay_obeys_the_plugin_contract(tmp_path, content, age, code, says):
    status = tmp_path / "npd-status"
    if content is not None:
        status.write_text(content)
        old = time.time() - age
        os.utime(status, (old, old))
    r = subprocess.run([str(RELAY), str(status), "900"], capture_output=True, text=True, timeout=10)
    assert r.returncode == code
    assert says in _one_line(r.stdout)
    assert all(32 <= ord(c) < 127 for c in r.stdout.rstrip("\n")) and r.stderr == ""


def test_relay_with_a_max_age_that_is_not_a_number_is_unknown(tmp_path):
    status = tmp_path / "npd-status"
    status.write_text("0 hostpin: ok\n")
    r = subprocess.run([str(RELAY), str(status), "15m"], capture_output=True, text=True, timeout=10)
    assert r.returncode == 2 and r.stderr == "" and "MAX_AGE" in _one_line(r.stdout)


@pytest.mark.parametrize("args, code, says", [
    (["--root", str(FIXTURES / "h200-preflight"), "--size", "47.2GiB", "--ranks", "2", "--method", "hostalloc"],
     0, "hostpin: ok: can pin 2 x 47.2 GiB by hostalloc"),
    (["--root", str(FIXTURES / "h200-fc-snapshot"), "--size", "47.2GiB", "--ranks", "2"],
     0, "hostpin: ok: can pin 2 x 47.2 GiB by register"),
    (["--root", str(FIXTURES / "h200-fc-snapshot"), "--size", "60GiB", "--ranks", "2", "--method", "hostalloc"],
     0, "hostpin: warning: headroom leaves 4 GiB < margin 6.3 GiB"),
    (["--root", str(FIXTURES / "h200-fc-snapshot"), "--size", "60GiB", "--ranks", "2", "--method", "hostalloc",
      "--strict"], 1, "hostpin: warning (strict): headroom"),
    (["--root", str(FIXTURES / "ci-preflight"), "--size", "47.2GiB", "--ranks", "2"],
     1, "hostpin: headroom 23.2 GiB < 95.5 GiB (+driver, device)"),
    # the reference capture lacks the process's cgroup, PSI and CUDA facts: accepted explicitly
    (["--root", str(FIXTURES / "h200-reference"), "--size", "60GiB", "--ranks", "2", "--method", "hostalloc",
      "--cgroup", "none", "--skip", "psi", "--no-cuda"], 0, "hostpin: warning: headroom leaves 4 GiB < margin 6.3 GiB"),
    (["--root", str(FIXTURES / "h200-reference"), "--size", "64GiB", "--ranks", "2", "--method", "hostalloc",
      "--cgroup", "none", "--skip", "psi", "--no-cuda"], 1, "hostpin: headroom 125 GiB < 130 GiB"),
    (["--root", str(FIXTURES / "h200-reference"), "--size", "60GiB", "--ranks", "2", "--method", "hostalloc"],
     2, "hostpin: not evaluated:"),
    (["--root", str(FIXTURES / "h200-staging")], 2, "hostpin: not evaluated:"),
    # issue 19: judged first, whatever could be written: this machine has no NVIDIA driver, a problem (1)
    (["--no-cuda", "--out", "/proc/hostpin-cannot-write-here"], 1, "hostpin: driver: no NVIDIA driver"),
])
def test_preflight_format_npd_obeys_the_plugin_contract(tmp_path, args, code, says):
    if "--out" not in args:
        args = [*args, "--out", str(tmp_path / "runs")]
    r = hostpin("preflight", "--format", "npd", *args)
    assert r.returncode == code, r.stderr
    assert _one_line(r.stdout).startswith(says)


def test_the_sdist_ships_the_deploy_files_and_the_license(tmp_path):
    """pipx and uv install the command only; the deploy/ files come with the sdist (MANIFEST.in)."""
    import tarfile
    r = subprocess.run([sys.executable, "-c", "import sys; from setuptools import build_meta as b; "
                        "print(b.build_sdist(sys.argv[1]))", str(tmp_path)], cwd=REPO, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-500:]
    with tarfile.open(tmp_path / r.stdout.split()[-1]) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    assert {"LICENSE", "deploy/hostpin.toml", "deploy/slurm/hostpin-gate", "deploy/kubernetes/hostpin-npd-status",
            "deploy/kubernetes/hostpin-daemonset.yaml", "deploy/kubernetes/hostpin-monitor.json"} <= names

"""hostpin report, bundle, compare and --prometheus on real run directories kept as fixtures
(from the GPU machine and the CI machine)."""
from __future__ import annotations

import io
import json
import shutil
import tarfile
from pathlib import Path

import pytest

from diag.bundle import BundleError, Redactor, make_bundle
from diag.compare import comparison_rows, render_compare
from diag.evidence import RunDir, load_manifest, verify_manifest
from diag.prometheus import render_textfile
from diag.report import render_report
from diag.runs import RunError, open_run_path

from conftest import CI_SNAPSHOT, FIXTURES, GPU_SNAPSHOT, hostpin


def copy_run(tmp_path, name) -> Path:
    dest = tmp_path / Path(name).name
    shutil.copytree(FIXTURES / name, dest)
    return dest


# -- report -----------------------------------------------------------------------------------
def test_report_of_a_gpu_preflight_leads_with_the_verdict(tmp_path):
    run = open_run_path(copy_run(tmp_path, "h200-preflight"))
    text = render_report(run)
    lines = text.splitlines()
    assert lines[0] == "# hostpin preflight: PASS"
    assert lines[2].startswith("**this node can pin 2 x 47.2 GiB by hostalloc")
    for fact in ("6.18.44-fc-v657-gpu", "580.159.04 open", "NVIDIA H200 (0000:00:06.0)", "THP enabled", "madvise",
                 "free in order >= 9 blocks"):
        assert fact in text
    assert "## Checks" in text and "<details>" in text and "root/proc/meminfo" in text
    assert len(text) < 65536


def test_report_of_a_failing_ci_preflight_shows_failures_with_remedies(tmp_path):
    text = render_report(open_run_path(copy_run(tmp_path, "ci-preflight")))
    checks = text[text.index("## Checks"):]
    assert checks.index("FAIL") < checks.index("WARN")
    assert "free 72.7 GiB or shrink the plan" in checks and "not loaded" in text


def test_report_of_the_swap_bound_registration(tmp_path):
    """The picture, linked and registered in the manifest, and the driver's swap-in stack."""
    pytest.importorskip("matplotlib")
    run_dir = copy_run(tmp_path, "h200-repro-swap32")
    r = hostpin("report", str(run_dir))
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("# hostpin repro register: SLOW\n\n**32 GiB registered in 28.0 s")
    assert "![pin timeline](timeline.png)" in r.stdout
    stack = r.stdout[r.stdout.index("## Kernel stack"):]
    assert stack.index("do_swap_page") < stack.index("pin_user_pages") < stack.index("os_lock_user_pages")
    png = run_dir / "timeline.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert (run_dir / "report.md").read_text().strip() == r.stdout.strip()
    paths = {e["path"] for e in load_manifest(run_dir)["entries"]}
    assert {"timeline.png", "report.md"} <= paths
    assert verify_manifest(run_dir) == []


def test_report_of_a_failed_registration_names_the_error_and_catalog(tmp_path):
    text = render_report(open_run_path(copy_run(tmp_path, "h200-repro-fileshared-fail")), fmt="text")
    assert "cudaErrorInvalidValue (1)" in text and "catalog 9" in text
    assert "#" not in text.splitlines()[0] and "<details>" not in text


def test_report_of_a_killed_run_uses_the_kill_stacks(tmp_path):
    text = render_report(open_run_path(copy_run(tmp_path, "h200-repro-swap32-throttled")))
    assert "deadline" in text.splitlines()[2]
    stack = text[text.index("## Kernel stack"):]
    assert "do_swap_page" in stack and "stacks-deadline.txt" in stack


def test_report_of_staging_and_matrix(tmp_path):
    text = render_report(open_run_path(copy_run(tmp_path, "h200-staging/defaults")))
    # recorded before per-CPU free lists were counted: said to be uncorrected, no --reserve advice
    assert "## Staging memory" in text and "pageable" in text and "UNCORRECTED" in text.splitlines()[2]
    assert "apply:" not in text
    text = render_report(open_run_path(copy_run(tmp_path, "h200-repro-matrix16")))
    assert "register 35.8 GiB/s with THP on and prefault on" in text.splitlines()[2]
    assert "hostalloc" in text[text.index("## Matrix"):]


def test_report_says_what_it_left_out(tmp_path):
    text = render_report(open_run_path(copy_run(tmp_path, "h200-fc-snapshot")))
    assert "more files are in the run directory" in text.splitlines()[-1]


# -- bundle ---------------------------------------------------------------------------------------
def test_bundle_round_trip(tmp_path):
    run_dir = copy_run(tmp_path, "ci-repro-swap-mlock")
    out = tmp_path / "b.tar.gz"
    info = make_bundle(run_dir, out)
    assert info["verified"] and out.exists()
    run = open_run_path(out)
    try:
        assert run.problems == [] and run.result["outcome"] == "slow"
        originals = {p.relative_to(run_dir) for p in run_dir.rglob("*") if p.is_file()}
        unpacked = {p.relative_to(run.path) for p in run.path.rglob("*") if p.is_file()}
        assert originals == unpacked
        text = render_report(run)
        assert "## Result" in text and "## Kernel stack" in text and "do_swap_page" in text
    finally:
        run.close()


def test_bundle_refuses_a_changed_file(tmp_path):
    run_dir = copy_run(tmp_path, "ci-preflight")
    (run_dir / "root/proc/meminfo").write_text("MemTotal: 1 kB\n")
    with pytest.raises(BundleError, match="root/proc/meminfo: content differs"):
        make_bundle(run_dir, tmp_path / "b.tar.gz")


def test_bundle_refuses_symlinks_and_unlisted_files(tmp_path):
    run_dir = copy_run(tmp_path, "ci-preflight")
    (run_dir / "root/etc-shadow").symlink_to("/etc/shadow")
    with pytest.raises(BundleError, match="symbolic link"):
        make_bundle(run_dir, tmp_path / "b.tar.gz")
    (run_dir / "root/etc-shadow").unlink()
    (run_dir / "notes.txt").write_text("mine")
    with pytest.raises(BundleError, match="not in the manifest"):
        make_bundle(run_dir, tmp_path / "b.tar.gz")


def test_a_tampered_bundle_is_reported_and_a_hostile_one_refused(tmp_path):
    run_dir = copy_run(tmp_path, "ci-preflight")
    make_bundle(run_dir, tmp_path / "b.tar.gz")
    with tarfile.open(tmp_path / "b.tar.gz") as tar:
        members = [(m, tar.extractfile(m).read()) for m in tar.getmembers()]
    with tarfile.open(tmp_path / "t.tar.gz", "w:gz") as tar:
        for m, data in members:
            if m.name.endswith("root/proc/meminfo"):
                data = data.replace(b"MemTotal", b"MemTotaL")
            tar.addfile(m, io.BytesIO(data))
    run = open_run_path(tmp_path / "t.tar.gz")
    assert any("root/proc/meminfo" in p for p in run.problems)
    assert "does not match its manifest" in render_report(run)
    run.close()
    with tarfile.open(tmp_path / "evil.tar.gz", "w:gz") as tar:
        info = tarfile.TarInfo("../../etc/x")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    with pytest.raises(RunError, match="outside"):
        open_run_path(tmp_path / "evil.tar.gz")


IDENTIFIERS = {
    "HOST": "gpu-node-17", "IPv4": "10.24.3.17", "IPv6": "fe80::1ff:fe23:4567:890a", "MAC": "0a:1b:2c:3d:4e:5f",
    "USER": "alice", "SERIAL": "1653824128621", "UUID": "919a0c4a-3faa-73bf-3f9b-844bc132342b",
}


def _identifying_run(tmp_path) -> Path:
    """A run whose files carry each kind of identifier, the way real captures do (edge case built
    on the CI snapshot: a named host, an address, a user's home, an nvidia-smi serial)."""
    run = RunDir(tmp_path / "run-gpu-node-17", "snapshot", ["hostpin", "snapshot", "--out", "/home/alice/runs"])
    run.add_file("root/proc/sys/kernel/hostname", b"gpu-node-17\n")
    run.add_file("root/proc/version", b"Linux version 6.8.0 (alice@gpu-node-17) (gcc) #1 SMP\n")
    run.add_file("commands/uname.txt", b"Linux gpu-node-17 6.8.0-49-generic #49 SMP x86_64 GNU/Linux\n")
    run.add_file("commands/ip.txt", f"inet {IDENTIFIERS['IPv4']}/24\ninet6 {IDENTIFIERS['IPv6']}/64\n"
                                   f"link/ether {IDENTIFIERS['MAC']} brd ff:ff:ff:ff:ff:ff\n".encode())
    smi = (CI_SNAPSHOT.parent / "h200-reference/commands/nvidia-smi-q-head.txt").read_text()
    smi = smi.replace("GPU-919a0c4a-3faa-73bf-3f9b-844bc132342b", f"GPU-{IDENTIFIERS['UUID']}")
    run.add_file("commands/nvidia-smi-q.txt", smi.encode())
    run.add_file("root/proc/meminfo", (CI_SNAPSHOT / "root/proc/meminfo").read_bytes())
    run.add_file("root/sys/kernel/mm/transparent_hugepage/enabled", b"always [madvise] never\n")
    run.add_json("notes.json", {"path": "/home/alice/tables/t.bin", "peer": IDENTIFIERS["IPv4"],
                                "host": "gpu-node-17", "mac": IDENTIFIERS["MAC"].upper()})
    run.finish({"command": "snapshot", "status": "captured", "verdict": "captured on gpu-node-17"})
    return run.path


def test_redaction_is_complete_and_consistent(tmp_path):
    run_dir = _identifying_run(tmp_path)
    out = tmp_path / "r.tar.gz"
    info = make_bundle(run_dir, out, redact=True)
    with tarfile.open(out) as tar:
        names = tar.getnames()
        texts = {m.name: tar.extractfile(m).read().decode() for m in tar.getmembers() if m.isfile()}
    blob = "\n".join(list(texts.values()) + names)
    for kind, value in IDENTIFIERS.items():
        assert value not in blob, f"{kind} {value} survived redaction"
    assert IDENTIFIERS["MAC"].upper() not in blob
    listing = json.loads(next(v for k, v in texts.items() if k.endswith("redactions.json")))["tokens"]
    kinds = {t["kind"] for t in listing}
    assert {"HOST", "IP", "MAC", "USER", "SERIAL", "UUID"} <= kinds
    host_token = next(v for k, v in texts.items() if k.endswith("kernel/hostname")).strip()
    assert host_token.startswith("REDACTED-HOST-")
    assert all(host_token in texts[k] for k in texts if k.endswith(("uname.txt", "notes.json", "proc/version")))
    assert host_token in next(n for n in names if "run-" in n)  # the directory name too
    assert "1653824128621" not in json.dumps(listing)  # the listing never carries originals
    run = open_run_path(out)
    assert run.problems == [] and run.manifest["redacted"] is True
    run.close()
    assert info["redactions"] == listing


def test_redaction_leaves_proc_words_alone():
    """Edge case named: a host called 'vm' must not turn '/proc/zoneinfo: vm stats threshold' into a token."""
    r = Redactor(["vm"])
    zoneinfo = (GPU_SNAPSHOT / "root/proc/zoneinfo").read_text()
    assert r.apply(zoneinfo, "root/proc/zoneinfo") == zoneinfo
    assert r.apply("host vm\n", "result.json") == "host REDACTED-HOST-1\n"


# -- compare ------------------------------------------------------------------------------------------
def test_compare_puts_differences_first_and_folds_the_rest(tmp_path):
    runs = [open_run_path(FIXTURES / "h200-preflight"), open_run_path(FIXTURES / "ci-preflight")]
    differ, equal = comparison_rows(runs)
    labels = [row[0] for row in differ]
    for label in ("verdict", "kernel", "NVIDIA driver", "MemAvailable", "headroom (binding)", "check headroom"):
        assert label in labels
    assert "THP enabled" in [row[0] for row in equal]
    text = render_compare(runs, fmt="markdown")
    assert text.index("| differs") < text.index("<details><summary>")
    assert "figures are equal" in text


def test_compare_across_a_bundle_and_directories(tmp_path):
    make_bundle(copy_run(tmp_path, "h200-repro-swap32"), tmp_path / "a.tar.gz")
    r = hostpin("compare", str(tmp_path / "a.tar.gz"), str(FIXTURES / "ci-repro-swap-mlock"),
                str(FIXTURES / "h200-repro-ranks2"))
    assert r.returncode == 0, r.stderr
    assert "pin time" in r.stdout and "bound" in r.stdout and "28.0 s" in r.stdout
    r = hostpin("compare", str(FIXTURES / "ci-preflight"))
    assert r.returncode == 2 and "at least two runs" in r.stderr


# -- Prometheus ------------------------------------------------------------------------------------------
def test_prometheus_textfile_parses_and_carries_the_figures(tmp_path):
    parser = pytest.importorskip("prometheus_client.parser")
    target = tmp_path / "textfile" / "hostpin.prom"
    target.parent.mkdir()  # node_exporter's textfile directory: hostpin never creates it
    r = hostpin("preflight", "--root", str(FIXTURES / "h200-preflight"), "--size", "47.2GiB", "--ranks", "2",
                "--prometheus", str(target), "--json", "--out", str(tmp_path / "runs"))
    result = json.loads(r.stdout)
    families = {f.name: f for f in parser.text_string_to_metric_families(target.read_text())}
    status = families["hostpin_preflight_status"].samples[0]
    assert status.value == {"pass": 0, "warn": 1, "fail": 2}[result["status"]]
    checks = {s.labels["check"]: s.value for s in families["hostpin_preflight_check_status"].samples}
    assert set(checks) == {c["id"] for c in result["checks"]}
    head = next(c for c in result["checks"] if c["id"] == "headroom")["evidence"]
    assert families["hostpin_headroom_bytes"].samples[0].value == head["binding_bytes"]
    assert families["hostpin_mem_available_bytes"].samples[0].value == result["facts"]["mem_available_bytes"]
    assert families["hostpin_swapin_pages_per_second"].samples[0].value == 0
    assert [p.name for p in target.parent.iterdir()] == ["hostpin.prom"]  # no temporary file left


def test_prometheus_render_is_pure_and_escapes_labels():
    text = render_textfile({"status": "fail", "plan": {"method": 'reg"ister', "ranks": 2},
                            "checks": [{"id": "headroom", "status": "fail", "evidence": {}}], "facts": {}}, 1.5)
    assert 'method="reg\\"ister"' in text and "hostpin_preflight_timestamp_seconds 1.5" in text

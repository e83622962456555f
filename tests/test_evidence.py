"""The evidence store: every item in the manifest, nothing lost when a run is killed."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap

from diag.evidence import RunDir, load_manifest, verify_manifest

from conftest import REPO

FIELDS = {"path", "kind", "source", "size", "sha256", "started", "duration_s", "returncode", "timed_out",
          "truncated", "skipped", "reason"}


def test_entries_have_every_field(tmp_path):
    run = RunDir(tmp_path / "r", "test")
    run.add_file("root/proc/x", b"hello\n", source="/proc/x")
    run.add_skip("root/proc/y", "absent", source="/proc/y")
    run.add_json("probes/p.json", {"a": 1}, kind="probe")
    run.run_command("echo", ["echo", "hi"], timeout=5)
    run.finish({"status": "pass"})
    manifest = json.loads((tmp_path / "r" / "manifest.json").read_text())
    for e in manifest["entries"]:
        assert FIELDS <= set(e), e
    by = {e["path"]: e for e in manifest["entries"]}
    assert by["root/proc/y"]["skipped"] and by["root/proc/y"]["reason"] == "absent"
    assert by["commands/echo.txt"]["returncode"] == 0
    assert (tmp_path / "r" / "commands/echo.txt").read_text() == "hi\n"
    assert verify_manifest(tmp_path / "r") == []


def test_command_timeout_and_missing_binary(tmp_path):
    run = RunDir(tmp_path / "r", "test")
    e = run.run_command("slow", [sys.executable, "-c", "import time; print('started', flush=True); time.sleep(10)"],
                        timeout=1.0)
    assert e["timed_out"] is True and e["returncode"] is None and e["duration_s"] < 5
    assert (tmp_path / "r" / "commands/slow.txt").read_text() == "started\n"
    e = run.run_command("nope", ["hostpin-no-such-binary"], timeout=1)
    assert e["skipped"] and "not found" in e["reason"]


def test_tampering_is_detected(tmp_path):
    run = RunDir(tmp_path / "r", "test")
    run.add_file("a.txt", b"original")
    run.finish()
    (tmp_path / "r" / "a.txt").write_bytes(b"changed!")
    assert verify_manifest(tmp_path / "r") == ["a.txt: content differs from the manifest"]
    (tmp_path / "r" / "a.txt").unlink()
    assert verify_manifest(tmp_path / "r") == ["a.txt: missing"]


def test_a_killed_run_keeps_everything_written_so_far(tmp_path):
    """A real child writes evidence, then SIGKILLs itself mid-run: the journal and files stay."""
    script = textwrap.dedent(f"""
        import os, signal, sys
        sys.path.insert(0, {str(REPO)!r})
        from diag.evidence import RunDir
        run = RunDir({str(tmp_path / 'r')!r}, "test", durable=True)
        run.add_file("one.txt", b"1")
        s = run.open_stream("timeline.jsonl")
        s.write('{{"t": 0.5}}\\n')
        run.add_file("two.txt", b"2")
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    proc = subprocess.run([sys.executable, "-c", script])
    assert proc.returncode == -signal.SIGKILL
    manifest = load_manifest(tmp_path / "r")
    assert manifest["complete"] is False and manifest["partial"] is True and manifest["command"] == "test"
    assert [e["path"] for e in manifest["entries"]] == ["one.txt", "timeline.jsonl", "two.txt"]
    assert manifest["entries"][1]["open"] is True  # the stream it was writing, accounted for at once
    assert (tmp_path / "r" / "timeline.jsonl").read_text() == '{"t": 0.5}\n'
    assert verify_manifest(tmp_path / "r") == []

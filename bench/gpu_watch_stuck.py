"""The H200's stuck file registration again, with its control (bench/gpu_quickstart_smoke.sh runs it).

bench/gpu_watch_attach.sh case B found cudaHostRegister of a 16 GiB MAP_PRIVATE file, page cache
dropped and reads throttled to 280 MB/s, spinning 200 s in the kernel (840k faults/s, nothing
read, nothing pinned), which `hostpin watch` did not see as a pin and repro did not call a stall.
This runs 4 GiB of the same file, page cache dropped (--read-rate 4GB/s: dropped, never binding),
registered by `repro register` with `hostpin watch --pid` on its child, once with the read-only
flag and once with default flags (MAP_PRIVATE: the writes are private copies, the file is never
written), and prints per arm repro's outcome, bound, seconds and the watch's phase, stall, verdict.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_watch_attach as g  # noqa: E402  (its helpers: HP, watch, collect, phase_line, log)

SIZE_GIB = 4
# the first GPU run of this script (default flags were then turned into readonly for any existing
# file) spun in both arms below at 280 MB/s and at 4 GB/s; a freshly written (warm) file
# registered read-only in 1.2 s (bench/gpu_file_safety_leftovers.sh A2). Which part is the cause:
ARMS = (("readonly-cold", "4GB/s", "--register-flags", "readonly"),
        ("default-cold", "4GB/s", "--register-flags", "default"))


def arm(runs: Path, path: Path, name: str, rate: str, *extra: str) -> list[str]:
    out = runs / name
    r = g.subprocess.Popen([*g.HP, "repro", "register", "--json", "--out", str(out), "--size", f"{SIZE_GIB}GiB",
                            "--method", "register", "--source", f"file:{path}", "--map", "private", "--no-prefault",
                            "--read-rate", rate, "--stall-after", "30", "--deadline", "90", "--ignore-leftovers", *extra],
                           cwd=g.REPO, stdout=g.subprocess.PIPE, stderr=g.subprocess.PIPE, text=True)
    child, end = None, time.monotonic() + 120
    while time.monotonic() < end and child is None and r.poll() is None:
        for ev in out.glob("*repro-register*/events.jsonl"):
            text = ev.read_text()
            if '"pin_start"' in text:
                child = json.loads(text.splitlines()[0])["pid"]
        time.sleep(0.2)
    w = g.watch(out, "--pid", str(child), "--stall-after", "20", "--deadline", "80") if child else None
    stdout, stderr = r.communicate(timeout=200)
    res = json.loads(stdout) if stdout.strip().startswith("{") else {"verdict": stderr[-600:]}
    lines = [f"{name} ({rate}): repro {res.get('outcome')} after {res.get('seconds')} s, bound {res.get('bound')} "
             f"{res.get('bound_counts')}, stopped {(res.get('stopped') or {}).get('reason')}",
             f"    verdict: {res.get('verdict')}"]
    if w:
        wres = g.collect(w, 60)
        lines.append(g.phase_line("watch --pid", wres))
        lines.append(f"    watch stalls: {[s.get('reason') or s for s in wres.get('stalls') or []]}; "
                     f"verdict: {wres.get('verdict')}")
    else:
        lines.append("  watch: the child never reached its pin")
    return lines


def main() -> int:
    runs = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/stuck")
    runs.mkdir(parents=True, exist_ok=True)
    path = Path("/var/tmp/hostpin-stuck-4g.bin")
    lines = []
    try:
        chunk = b"\x5a" * (64 << 20)
        with open(path, "wb") as fh:
            for _ in range(SIZE_GIB * 16):
                fh.write(chunk)
            fh.flush()
            os.fsync(fh.fileno())
        for name, rate, *extra in ARMS:
            lines += arm(runs, path, name, rate, *extra)
            g.log("\n".join(lines[-4:]))
    finally:
        path.unlink(missing_ok=True)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A fleet of preflight runs made from captured trees, and the time `hostpin compare` takes on it.

    python bench/compare_fleet.py [--nodes 1000] [--dir DIR] [--keep] [--workers 2]

Each node is a copy of the GPU machine's snapshot (tests/fixtures/h200-fc-snapshot) with its own
host name and MemAvailable within 3% of the capture's; every tenth node runs a newer kernel build
(a rolling upgrade). A few nodes are planted outliers (PLANTED: low memory, swap in use, THP
always, a 6.11 kernel, a 590 driver, and one node made from the CI machine's snapshot, which has no
GPU). Every run is made by the real command, `hostpin preflight --root TREE` with the plan below,
in-process (a fresh interpreter per run would take 1,000 x 0.3 s). Then it times `hostpin
compare` on all of them, as a user runs it (a fresh process, the run directories as arguments),
for the fleet summary and for --json, and checks that the summary names every planted node.
Target (issue 12): under 5 s for 1,000 runs on the CI machine (2 cores).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import multiprocessing
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures"
BASE = FIXTURES / "h200-fc-snapshot"
NO_GPU = FIXTURES / "ci-vm-snapshot"
PLAN = ["--size", "47.2GiB", "--ranks", "2", "--no-thp"]
GIB_KB = 1 << 20


def node_name(i: int) -> str:
    return f"gpu-n{i:04d}"


def planted(nodes: int) -> dict[str, str]:
    """Node name -> what was planted, spread over the fleet so a small fleet has them all too."""
    what = ["MemAvailable 38 GiB", "30 GiB of swap in use", "THP enabled=always defrag=always",
            "kernel 6.11.0", "driver 590.44.01", "no GPU (the CI machine's snapshot)"]
    slots = [int(nodes * f) for f in (0.137, 0.421, 0.555, 0.777, 0.888, 0.333)]
    if len(set(slots)) < len(slots) or nodes < 12:
        raise SystemExit(f"--nodes {nodes}: too few nodes to plant {len(what)} outliers apart; use 12 or more")
    return {node_name(i): w for i, w in zip(slots, what)}


def _edit_meminfo(path: Path, **kb: int) -> None:
    lines = []
    for line in path.read_text().splitlines():
        key = line.split(":", 1)[0]
        if key in kb:
            line = f"{key + ':':<16}{kb[key]:>8} kB"
        lines.append(line)
    path.write_text("\n".join(lines) + "\n")


def _meminfo_kb(path: Path, key: str) -> int:
    m = re.search(rf"^{re.escape(key)}:\s+(\d+) kB", path.read_text(), re.M)
    return int(m.group(1))


def make_tree(dest: Path, i: int, nodes: int, rng: random.Random) -> Path:
    """A captured tree for node i: the snapshot's run directory layout (root/ + probes/), edited."""
    name = node_name(i)
    what = planted(nodes).get(name, "")
    source = NO_GPU if what.startswith("no GPU") else BASE
    shutil.copytree(source / "root", dest / "root", symlinks=True)
    shutil.copytree(source / "probes", dest / "probes")
    shutil.copy(source / "manifest.json", dest / "manifest.json")  # the snapshot's record of what was absent
    root = dest / "root"
    (root / "proc/sys/kernel").mkdir(parents=True, exist_ok=True)
    (root / "proc/sys/kernel/hostname").write_text(name + "\n")
    meminfo = root / "proc/meminfo"
    if source is BASE:
        avail = int(_meminfo_kb(meminfo, "MemAvailable") * rng.uniform(0.97, 1.0))
        free = int(_meminfo_kb(meminfo, "MemFree") * avail / _meminfo_kb(meminfo, "MemAvailable"))
        _edit_meminfo(meminfo, MemAvailable=avail, MemFree=free)
        if i % 10 == 3:
            (root / "proc/sys/kernel/osrelease").write_text("6.18.50-fc-v700-gpu\n")
    if what.startswith("MemAvailable"):
        _edit_meminfo(meminfo, MemAvailable=38 * GIB_KB, MemFree=38 * GIB_KB)
    elif what.startswith("30 GiB of swap"):
        _edit_meminfo(meminfo, SwapTotal=64 * GIB_KB, SwapFree=34 * GIB_KB)
        (root / "proc/swaps").write_text("Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n"
                                         f"/dev/nvme0n1p3                          partition\t{64 * GIB_KB}\t"
                                         f"{30 * GIB_KB}\t-2\n")
    elif what.startswith("THP"):
        (root / "sys/kernel/mm/transparent_hugepage/enabled").write_text("[always] madvise never\n")
        (root / "sys/kernel/mm/transparent_hugepage/defrag").write_text("[always] defer defer+madvise madvise never\n")
    elif what.startswith("kernel"):
        (root / "proc/sys/kernel/osrelease").write_text("6.11.0\n")
    elif what.startswith("driver"):
        version = root / "proc/driver/nvidia/version"
        version.write_text(version.read_text().replace("580.159.04", "590.44.01"))
    return dest


def _preflight_in_process(args: list[str]) -> int:
    from repro.cli import cli
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return cli.main(args=args, prog_name="hostpin", standalone_mode=False)


def _make_nodes(job: tuple[list[int], int, str, int]) -> list[str]:
    indexes, nodes, out, seed = job
    os.environ["HOSTPIN_CONFIG"] = "none"  # the fleet's plan is the one above, not this machine's site file
    made = []
    with tempfile.TemporaryDirectory(prefix="hostpin-fleet-tree-") as tmp:
        for i in indexes:
            rng = random.Random(seed * 100_003 + i)
            tree = make_tree(Path(tmp) / node_name(i), i, nodes, rng)
            node_out = Path(out) / node_name(i)
            rc = _preflight_in_process(["preflight", "--root", str(tree), *PLAN, "--out", str(node_out),
                                        "--format", "line"])
            if rc not in (0, 1):
                raise RuntimeError(f"preflight on {tree} exited {rc}")
            made += [str(p) for p in node_out.iterdir()]
            shutil.rmtree(tree)
    return made


def generate(nodes: int, out: Path, workers: int = 2, seed: int = 12) -> list[Path]:
    """Make one preflight run per node under out/NODE/; return the run directories in node order."""
    out.mkdir(parents=True, exist_ok=True)
    jobs = [(list(range(w, nodes, workers)), nodes, str(out), seed) for w in range(workers)]
    if workers == 1:
        made = _make_nodes(jobs[0])
    else:
        with multiprocessing.get_context("fork").Pool(workers) as pool:
            made = [p for chunk in pool.map(_make_nodes, jobs) for p in chunk]
    return sorted(Path(p) for p in made)


def time_compare(runs: list[Path], *extra: str) -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "repro.cli", "compare", *map(str, runs), *extra],
                          capture_output=True, text=True, cwd=REPO)
    return time.perf_counter() - t0, proc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--dir", type=Path, default=None, help="where the runs go (default: a temporary directory)")
    ap.add_argument("--keep", action="store_true", help="keep the runs (printed at the end)")
    ap.add_argument("--workers", type=int, default=min(4, os.cpu_count() or 1))
    ap.add_argument("--repeat", type=int, default=3, help="times each compare is timed (the median is reported)")
    opts = ap.parse_args()
    base = opts.dir or Path(tempfile.mkdtemp(prefix="hostpin-fleet-"))
    try:
        t0 = time.perf_counter()
        runs = generate(opts.nodes, base, opts.workers)
        made_s = time.perf_counter() - t0
        print(f"generated {len(runs)} preflight runs in {made_s:.1f} s ({opts.workers} workers) under {base}")
        times, jtimes = [], []
        for _ in range(opts.repeat):
            t, proc = time_compare(runs)
            times.append(t)
            jt, jproc = time_compare(runs, "--json")
            jtimes.append(jt)
        if proc.returncode != 0 or jproc.returncode != 0:
            print(proc.stderr or jproc.stderr, file=sys.stderr)
            return 1
        lines = proc.stdout.splitlines()
        missing = [n for n in planted(opts.nodes) if n not in proc.stdout]
        summary = json.loads(jproc.stdout)
        print(proc.stdout)
        print(f"hostpin compare, {len(runs)} runs: {sorted(times)[len(times) // 2]:.2f} s median of {len(times)} "
              f"(min {min(times):.2f}, max {max(times):.2f}); --json {sorted(jtimes)[len(jtimes) // 2]:.2f} s; "
              f"summary {len(lines)} lines; target < 5 s and < 80 lines")
        print(f"planted outliers named: {len(planted(opts.nodes)) - len(missing)} of {len(planted(opts.nodes))}"
              + (f"; MISSING: {', '.join(missing)}" if missing else "")
              + f"; JSON verdicts: { {k: v['count'] for k, v in summary['verdicts'].items()} }")
        ok = not missing and len(lines) < 80 and sorted(times)[len(times) // 2] < 5
        return 0 if ok else 1
    finally:
        if opts.keep:
            print(f"runs kept under {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

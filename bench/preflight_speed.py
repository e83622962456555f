"""Wall time of `hostpin preflight`, as a launcher sees it (a fresh process each time), and the
floors under it.

    python bench/preflight_speed.py [--runs 15] [--cuda] [--floor] [--size 47.2GiB --ranks 2] [--json]

Prints the median, min and max wall time over the runs, and the median CPU time (user + system,
which a loaded machine inflates less than wall time), with and without the CUDA probe. --floor
adds what the probe cannot go below: an interpreter that starts and exits (with and without
site), a child that only imports cuda.bindings and calls cuInit (the probe's floor), and the
probe's own child (`python -m diag.cuda probe`) with the median of its steps (timings_s: import,
cuInit, devices, NVML).

The children run with bytecode caching on (PYTHONDONTWRITEBYTECODE removed from their
environment), as an installed hostpin runs; the first run of each case is not counted (it warms the
page cache and writes the .pyc files). Run from the checkout to time (`-m repro.cli` from the
current directory). Targets (issue 20): with the probe within 0.35 s on the GPU machine (or within
0.05 s of the probe's floor), --no-cuda within 20% of the CPU machine's time.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

FLOOR_CUINIT = "from cuda.bindings import driver; driver.cuInit(0)"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def _bindings_dir() -> str | None:
    """The directory holding the `cuda` namespace package (site-packages), found without importing cuda.bindings."""
    import importlib.util
    try:
        spec = importlib.util.find_spec("cuda")
    except (ImportError, ValueError):
        return None
    paths = list(spec.submodule_search_locations or []) if spec else []
    return os.path.dirname(paths[0]) if paths else None


def time_cmd(cmd: list[str], runs: int, keep_stdout: bool = False) -> dict:
    env = _env()
    subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # warm, not counted
    walls, cpus, outs = [], [], []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE if keep_stdout else subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
        walls.append(time.perf_counter() - t0)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        if keep_stdout:
            outs.append(proc.stdout)
    out = {"runs": runs, "median_s": round(statistics.median(walls), 4), "min_s": round(min(walls), 4),
           "max_s": round(max(walls), 4), "cpu_median_s": round(statistics.median(cpus), 4)}
    if keep_stdout:
        out["stdout"] = outs
    return out


def probe_steps(outputs: list[bytes]) -> dict:
    """The median of each step the probe's child timed, and the statuses it gave."""
    steps: dict[str, list[float]] = {}
    statuses = set()
    for raw in outputs:
        try:
            data = json.loads(raw.decode(errors="replace") or "null")
        except json.JSONDecodeError:
            continue
        if isinstance(data, dict):
            statuses.add(str(data.get("status")))
            for k, v in (data.get("timings_s") or {}).items():
                steps.setdefault(k, []).append(v)
    return {"statuses": sorted(statuses), "steps_median_s": {k: round(statistics.median(v), 4) for k, v in steps.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--cuda", action="store_true", help="also time runs with the CUDA probe")
    ap.add_argument("--floor", action="store_true", help="also time the floors under the probe")
    ap.add_argument("--size", default="47.2GiB")
    ap.add_argument("--ranks", default="2")
    ap.add_argument("--json", action="store_true")
    opts = ap.parse_args()
    py = sys.executable
    report: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        plan = [py, "-m", "repro.cli", "preflight", "--size", opts.size, "--ranks", opts.ranks, "--out", tmp]
        cases = {"preflight --no-cuda": plan + ["--no-cuda"]}
        if opts.cuda:
            cases["preflight (CUDA probe)"] = plan
        if opts.floor:
            cases.update({"python -c pass": [py, "-c", "pass"], "python -S -c pass": [py, "-S", "-c", "pass"],
                          "floor: import cuda.bindings + cuInit": [py, "-c", FLOOR_CUINIT]})
            where = _bindings_dir()
            if where:  # what a probe child started without site (-I -S) would save
                cases["floor without site (-I -S)"] = [py, "-I", "-S", "-c",
                                                       f"import sys; sys.path.insert(0, {where!r}); {FLOOR_CUINIT}"]
            cases["probe child: python -m diag.cuda probe"] = [py, "-m", "diag.cuda", "probe"]
        for name, cmd in cases.items():
            r = time_cmd(cmd, opts.runs, keep_stdout=name.startswith("probe child"))
            if "stdout" in r:
                r.update(probe_steps(r.pop("stdout")))
            report[name] = r
    report["environment"] = {"python": sys.version.split()[0], "cpus": os.cpu_count(),
                             "load_1min": round(os.getloadavg()[0], 2),
                             "PYTHONDONTWRITEBYTECODE_in_caller": "PYTHONDONTWRITEBYTECODE" in os.environ}
    if opts.json:
        print(json.dumps(report, indent=2))
        return
    for name, r in report.items():
        if name == "environment":
            print("environment: " + ", ".join(f"{k} {v}" for k, v in r.items()))
            continue
        line = (f"{name:42s} median {r['median_s']:.3f} s  min {r['min_s']:.3f}  max {r['max_s']:.3f}  "
                f"cpu {r['cpu_median_s']:.3f} s  ({r['runs']} runs)")
        if "steps_median_s" in r:
            line += f"\n{'':42s} status {','.join(r['statuses'])}; steps (s since the probe began): " + \
                ", ".join(f"{k} {v:.3f}" for k, v in r["steps_median_s"].items())
        print(line)


if __name__ == "__main__":
    main()

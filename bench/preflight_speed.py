"""Wall time of `hostpin preflight`, as a launcher sees it (a fresh process each time), and the
floors under it.

    python bench/preflight_speed.py [--runs 15] [--cuda] [--floor] [--size 47.2GiB --ranks 2] [--json]

Prints the median, min and max wall time over the runs, and the median CPU time (user + system,
which a loaded machine inflates less than wall time), with and without the CUDA probe. --floor
adds what the probe cannot go below: an interpreter that starts and exits (with and without
site), a child that only imports cuda.bindings and calls cuInit (the probe's floor), and the
probe's own child (`python -m diag.cuda probe`) with the median of its steps (timings_s: import,
cuInit, devices, NVML). --cuda also gives the stages of a preflight with the probe, in s since the
command was launched (from probes/cuda.json's epoch stamps): spawn (the child started), child_began
(its interpreter and diag.cuda are up), import_bindings, cuInit, devices, nvml_done (NVML's thread,
beside cuInit), child_done, read (the parent has its JSON), needed (the first check that reads it),
joined, checks_done (the last check), exit (the command ended).

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
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

SMI_QUERY = ["nvidia-smi", "--query-compute-apps=pid,process_name,used_memory,gpu_bus_id", "--format=csv"]  # as diag.gpuprocs runs it
FLOOR_CUINIT = "from cuda.bindings import driver; driver.cuInit(0)"
# the probe's child exactly as preflight starts it (python -S, its import path handed over), timed from a parent
PROBE_AS_STARTED = ("import subprocess, sys; from diag.cuda import probe_argv_env; argv, env = probe_argv_env(); "
                    "sys.exit(subprocess.run(argv, env=env).returncode)")


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


TIMELINE = ("spawn", "child_began", "import_bindings", "cuInit", "devices", "nvml_done", "child_done", "read",
            "needed", "joined", "checks_done", "exit")


def timeline_of(probe: dict, launched: float, ended: float) -> dict[str, float]:
    """One run's stages in s since the command was launched, from probes/cuda.json's epoch stamps
    (parent_at: spawn, read, needed, joined; began_at and timings_s: the child's own steps)."""
    at, began, steps = probe.get("parent_at") or {}, probe.get("began_at"), probe.get("timings_s") or {}
    out: dict[str, float] = {}
    for key in ("spawn", "read", "needed", "joined", "checks_done"):
        if isinstance(at.get(key), (int, float)):
            out[key] = at[key] - launched
    if isinstance(began, (int, float)):
        out["child_began"] = began - launched
        for key, value in steps.items():
            out["child_done" if key == "nvml" else key] = began + value - launched
        if steps and "child_done" not in out:  # an early end (no driver, no device): its last step
            out["child_done"] = began + max(steps.values()) - launched
    out["exit"] = ended - launched
    return out


def time_timeline(cmd: list[str], out_dir: str, runs: int) -> dict:
    """The CUDA case again, each run with a run directory of its own, read back for the stages."""
    env = _env()
    lines: dict[str, list[float]] = {}
    early, statuses, sources = set(), set(), set()
    for i in range(runs + 1):
        where = os.path.join(out_dir, f"timeline{i}")
        launched = time.time()
        subprocess.run(cmd + ["--out", where], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        ended = time.time()
        if i == 0:
            continue  # warm, not counted
        found = [os.path.join(where, d, "probes", "cuda.json") for d in sorted(os.listdir(where))] if os.path.isdir(where) else []
        try:
            with open(found[0]) as fh:
                probe = json.load(fh)
        except (IndexError, OSError, ValueError):
            continue
        statuses.add(str(probe.get("status")))
        try:  # where cotenants took the GPU's processes from: NVML in the probe, or nvidia-smi after it
            with open(os.path.join(os.path.dirname(os.path.dirname(found[0])), "result.json")) as fh:
                checks = json.load(fh).get("checks") or []
            ev = next((c.get("evidence") or {} for c in checks if c.get("id") == "cotenants"), {})
            sources.add(f"{ev.get('gpu_processes_source')}" + (f" ({ev['gpu_processes_error']})"
                                                                 if ev.get("gpu_processes_error") else ""))
        except (OSError, ValueError, AttributeError):
            sources.add("result.json unreadable")
        early.add((probe.get("parent_at") or {}).get("early"))
        for key, value in timeline_of(probe, launched, ended).items():
            lines.setdefault(key, []).append(value)
    med = {k: round(statistics.median(lines[k]), 4) for k in TIMELINE if k in lines}
    return {"runs": runs, "statuses": sorted(statuses), "early_start": sorted(map(str, early)),
            "cotenants_gpu_processes_source": sorted(sources),
            "stages_median_s_since_launch": med}


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


def stages_text(name: str, r: dict) -> str:
    """The stages as a timeline, and the spans a reader wants: what the parent did before the child
    was spawned, the child's start-up, its steps, how long the parent waited, and what came after."""
    st = r["stages_median_s_since_launch"]
    text = [f"{name} (median of {r['runs']} runs; status {','.join(r['statuses'])}; started early: "
            f"{','.join(r['early_start'])}; cotenants' GPU processes from: "
            f"{'; '.join(r.get('cotenants_gpu_processes_source') or ['-'])}), s since launch:",
            "  " + ", ".join(f"{k} {v:.3f}" for k, v in st.items())]

    def span(a: str, b: str) -> str:
        return f"{st[b] - st[a]:.3f}" if a in st and b in st else "-"

    text.append(f"  spans: launch->spawn {st.get('spawn', float('nan')):.3f}, child start-up {span('spawn', 'child_began')}, "
                f"child steps {span('child_began', 'child_done')}, child exit->read {span('child_done', 'read')}, "
                f"parent waited {span('needed', 'joined')}, checks after the wait {span('joined', 'checks_done')}, "
                f"result, rendering, writes and exit {span('checks_done', 'exit')}")
    return "\n".join(text)


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
        bare = [py, "-m", "repro.cli", "preflight", "--size", opts.size, "--ranks", opts.ranks]
        plan = bare + ["--out", tmp]
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
            cases["probe child as preflight starts it (-S)"] = [py, "-c", PROBE_AS_STARTED]
            if shutil.which("nvidia-smi"):  # what cotenants runs when no NVML result came (also under --no-cuda)
                cases["nvidia-smi --query-compute-apps (cotenants without NVML)"] = SMI_QUERY
        if opts.cuda and opts.floor:  # a --cuda-timeout keeps the child from starting before click: what that saves
            cases["preflight (CUDA probe started late)"] = plan + ["--cuda-timeout", "15"]
        for name, cmd in cases.items():
            r = time_cmd(cmd, opts.runs, keep_stdout=name.startswith("probe child"))
            if "stdout" in r:
                r.update(probe_steps(r.pop("stdout")))
            report[name] = r
        if opts.cuda:
            report["preflight (CUDA probe): stages"] = time_timeline(bare, tmp, opts.runs)
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
        if "stages_median_s_since_launch" in r:
            print(stages_text(name, r))
            continue
        line = (f"{name:42s} median {r['median_s']:.3f} s  min {r['min_s']:.3f}  max {r['max_s']:.3f}  "
                f"cpu {r['cpu_median_s']:.3f} s  ({r['runs']} runs)")
        if "steps_median_s" in r:
            line += f"\n{'':42s} status {','.join(r['statuses'])}; steps (s since the probe began): " + \
                ", ".join(f"{k} {v:.3f}" for k, v in r["steps_median_s"].items())
        print(line)


if __name__ == "__main__":
    main()

#!/usr/bin/env bash
# Preflight's speed on the GPU machine, about a minute (under 200 s): 11 fresh processes per case of
# bench/preflight_speed.py: --no-cuda, with the CUDA probe, the same with the probe started late
# (--cuda-timeout keeps it from starting before click), and the floors under the probe (an
# interpreter alone, with and without site; a child that imports cuda.bindings and calls cuInit,
# with site and with -I -S; the probe's own child, alone and as preflight starts it, with the median
# of its steps). Then the stages of a preflight with the probe, in s since launch, from the epoch
# stamps in each run's probes/cuda.json: when the child was spawned, when it began, its steps
# (import, cuInit, devices, NVML's thread beside cuInit), when the parent read it, when the first
# check needed it, when it had it, the last check, the command's end.
# Also the image's setuptools (gpu_setup.sh) and whether the offline editable install worked.
# Writes $OUT/setuptools.txt, $OUT/install.log, $OUT/preflight_speed.json, $OUT/preflight_speed.txt.
# Changes nothing on the node; its runs go to a temporary directory the benchmark removes.
set -u
source "$(dirname "$0")/gpu_setup.sh"
[ "$INSTALLED" = 1 ] && echo "editable install: ok" \
    || echo "editable install: FAILED (install.log); the benchmark runs from the source tree"
echo "cpus $(nproc)"; nvidia-smi --query-gpu=name,driver_version,persistence_mode --format=csv,noheader 2>&1 | head -2
python3 -c 'import cuda.bindings as b; print("cuda-bindings", b.__version__)' 2>&1 | tail -1
timeout 200 python3 bench/preflight_speed.py --runs 11 --cuda --floor --json > "$OUT/preflight_speed.json"
echo "bench rc=$?"
python3 - "$OUT/preflight_speed.json" <<'PY' | tee "$OUT/preflight_speed.txt"
import json, sys
sys.path.insert(0, "bench")
from preflight_speed import stages_text
r = json.load(open(sys.argv[1]))
for name, v in r.items():
    if name == "environment":
        print("environment:", v)
    elif "stages_median_s_since_launch" in v:
        print(stages_text(name, v))
    else:
        print(f"{name:42s} median {v['median_s']:.3f} s  min {v['min_s']:.3f}  max {v['max_s']:.3f}  cpu {v['cpu_median_s']:.3f} s")
        if "steps_median_s" in v:
            print(" " * 42, "status", v.get("statuses"), "steps (s since the probe began)", v["steps_median_s"])
wall = r.get("preflight (CUDA probe)", {}).get("median_s")
floor = r.get("floor: import cuda.bindings + cuInit", {}).get("median_s")
if wall and floor:
    print(f"goal: with the probe {wall:.3f} s against 0.35 s; {wall - floor:+.3f} s from the floor {floor:.3f} s (goal +0.05)")
PY
# where --no-cuda's time goes on this node: the slowest imports, and the top of a profile
echo "== --no-cuda: slowest imports (self+cumulative us)"
python3 -X importtime -m repro.cli preflight --no-cuda >/dev/null 2>"$OUT/importtime.txt"
sort -t'|' -k2 -n -r "$OUT/importtime.txt" | head -15 | tee -a "$OUT/preflight_speed.txt"
echo "== --no-cuda: profile (cumulative)"
python3 -m cProfile -s cumulative -m repro.cli preflight --no-cuda 2>&1 | grep -A30 "Ordered by" | tee -a "$OUT/preflight_speed.txt"

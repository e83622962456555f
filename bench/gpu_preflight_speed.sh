#!/usr/bin/env bash
# Preflight's speed on the GPU machine, about a minute: 11 fresh processes per case of
# bench/preflight_speed.py (--no-cuda, with the CUDA probe, and the floors under the probe: an
# interpreter alone, a child that imports cuda.bindings and calls cuInit, the probe's own child
# with its steps). Writes $OUT/preflight_speed.json and $OUT/preflight_speed.txt; prints both
# summaries. Changes nothing on the node; its runs go to a temporary directory it removes.
set -u
source "$(dirname "$0")/gpu_setup.sh"
nproc; nvidia-smi --query-gpu=name,driver_version,persistence_mode --format=csv,noheader 2>&1 | head -2
timeout 100 python3 bench/preflight_speed.py --runs 11 --cuda --floor --json > "$OUT/preflight_speed.json"
echo "bench rc=$?"
python3 - "$OUT/preflight_speed.json" <<'PY' | tee "$OUT/preflight_speed.txt"
import json, sys
r = json.load(open(sys.argv[1]))
for name, v in r.items():
    if name == "environment":
        print("environment:", v); continue
    print(f"{name:42s} median {v['median_s']:.3f} s  min {v['min_s']:.3f}  max {v['max_s']:.3f}  cpu {v['cpu_median_s']:.3f} s")
    if "steps_median_s" in v:
        print(" " * 42, "status", v.get("statuses"), "steps", v["steps_median_s"])
PY

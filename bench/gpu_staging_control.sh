#!/usr/bin/env bash
# The staging measurement with its control arm on the GPU machine, every case the measurement
# names, all with --json, each run directory kept. Expected ~4 minutes on the H200 (16 cores):
# a repeat with all three sides is ~15 s (context ~0.5 s, 2 pageable bursts of 3 GiB at ~7.4 GB/s,
# 2 cudaHostAlloc'd bursts, 2 memcpy bursts, a settled reading after each), --hold 10 adds 10 s.
# Each case runs under its own cap (SIGINT: the command kills its child and exits) and is skipped
# when less than its cap is left before 440 s, so the whole stays under 8 minutes (with the install).
# Writes: $OUT/report-staging.txt (per case: command, rc, seconds, the rendered result) and
# $OUT/staging-runs.tgz (cases/<name>.json, .err and the run directories with every raw repeat).
set -u
source "$(dirname "$0")/gpu_setup.sh"
R=/tmp/s8; rm -rf $R; mkdir -p $R/cases
START=$(date +%s)
BUDGET=440
case_() {
  local name=$1 cap=$2; shift 2
  local left=$(( BUDGET - ($(date +%s) - START) ))
  echo; echo "=== $name: hostpin repro staging $* (cap ${cap}s, ${left}s left)"
  if (( left < cap )); then echo "SKIPPED: not enough time left"; return; fi
  local t0=$(date +%s)
  timeout -s INT -k 15 "$cap" $HP repro staging --out $R/cases/$name "$@" --json >"$R/cases/$name.json" 2>"$R/cases/$name.err"
  local rc=$?
  echo "rc=$rc seconds=$(( $(date +%s) - t0 ))"
  python3 - "$R/cases/$name.json" <<'EOF' || tail -5 "$R/cases/$name.err"
import json, sys
sys.path.insert(0, ".")
from repro.render import render_staging
r = json.load(open(sys.argv[1]))
print(render_staging(r))
MiB = 1 << 20
for side, f in (r.get("sides") or {}).items():
    attr = ", ".join(f"{k} {v / MiB:+.1f}" for k, v in f["attribution"].items() if v is not None)
    print(f"  {side}: retained {f['retained_bytes'] / MiB:+.2f} MiB range {[round(x / MiB, 2) for x in f['retained_range_bytes']]}"
          f" noise {f['noise_bytes'] / MiB:.2f} beyond control {f['beyond_control_bytes'] and round(f['beyond_control_bytes'] / MiB, 2)}"
          f" uncorrected {f['uncorrected_bytes'] / MiB:+.1f} GB/s {f['throughput_gb_s']}; where (MiB): {attr}")
print("  reserve:", r.get("reserve_bytes"), "| figures:", json.dumps({k: v for k, v in (r.get("figures") or {}).items()
                                                                   if k in ("reset_left_bytes", "exit_left_bytes", "hold_returned_bytes", "steps_settled", "seen")}))
EOF
}
{
  date; nvidia-smi -L; uname -r; nproc
  case_ defaults 170
  case_ control 60 --sides control
  case_ threads1 100 --threads 1 --repeat 2
  case_ threads64 100 --threads 64 --repeat 2
  case_ both 110 --direction both --repeat 2
  case_ hold10 130 --hold 10 --repeat 2
  echo; echo "total $(( $(date +%s) - START )) s"
} 2>&1 | tee "$OUT/report-staging.txt"
tar czf "$OUT/staging-runs.tgz" -C $R .
ls -la "$OUT"

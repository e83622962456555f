#!/usr/bin/env bash
# Preflight and snapshot with the CUDA probe on the GPU machine: install, snapshot (fixture), preflight with the CUDA probe, speed.
set -u
source "$(dirname "$0")/gpu_setup.sh"
{
  $HP --version
  nvidia-smi -L; uname -r; free -g
  echo "== snapshot"; $HP snapshot --out /tmp/snaps; echo "rc=$?"
  SNAP=$(ls -d /tmp/snaps/*/ | head -1)
  echo "== preflight live 2 x 47.2GiB register"; $HP preflight --size 47.2GiB --ranks 2 --out /tmp/pf; echo "rc=$?"
  echo "== preflight live hostalloc"; $HP preflight --size 47.2GiB --ranks 2 --method hostalloc --out /tmp/pf; echo "rc=$?"
  echo "== preflight live 600GiB (per-call limit)"; $HP preflight --size 600GiB --out /tmp/pf | head -4; echo "rc=$?"
  echo "== preflight --root snapshot"; $HP preflight --root "$SNAP" --size 47.2GiB --ranks 2 --out /tmp/pf; echo "rc=$?"
  echo "== bench"; python3 bench/preflight_speed.py --runs 11 --cuda
} >"$OUT/report.txt" 2>&1
$HP preflight --size 47.2GiB --ranks 2 --json --out /tmp/pf >"$OUT/preflight.json" 2>"$OUT/preflight.stderr"
tar czf "$OUT/snapshot.tgz" -C /tmp/snaps .
tar czf "$OUT/preflight-runs.tgz" -C /tmp/pf .
cat "$OUT/report.txt"

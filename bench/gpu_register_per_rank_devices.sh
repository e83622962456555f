#!/usr/bin/env bash
# repro register's per-rank devices on a one-GPU node (H200): which device each rank's child opens,
# and the answer for a device the node does not have. Runs, in order (all --method register, 4 GiB
# per rank, --json, each under `timeout`):
#   1. the devices this node shows (nvidia-smi -L, read-only; cudaGetDeviceCount) and preflight
#      --ranks 2's NUMA check (the rank -> GPU placement it judges);
#   2. --ranks 2 --devices 0,0: expect exit 0, completed, ranks[].device == [0, 0];
#   3. --ranks 2 (the default, rank i -> GPU i wrapping round): expect exit 0, ranks[].device == [0, 0];
#   4. --ranks 2 --devices 0,1 (out of range here): expect exit 1, outcome failed, the verdict
#      "rank 1 was given CUDA device 1, and this node shows 1 CUDA device (0); ... (cudaSetDevice:
#      cudaErrorInvalidDevice (101))", no Traceback on stderr;
#   5. the same two through PyTorch (--allocator torch --method hostalloc, 256 MiB per rank):
#      --devices 0,1 out of range, and the default; torch.cuda.set_device is new in the child;
#   6. `repro cleanup --dry-run`: nothing left by these runs.
# Writes $OUT/gpu_register_per_rank_devices.log and $OUT/runs.tgz (the run directories); prints a
# summary (one line per case: rc, outcome, each rank's device, pin seconds, PASS/FAIL of the
# expectation). Under 420 s; changes no GPU setting; the run directories live in a mktemp
# directory removed on every exit (repro register removes what each run set up itself).
set -u
source "$(dirname "$0")/gpu_setup.sh"
LOG="$OUT/gpu_register_per_rank_devices.log"
RUNS=$(mktemp -d /tmp/hostpin-devices.XXXXXX)
trap 'tar czf "$OUT/runs.tgz" -C "$RUNS" . 2>/dev/null; rm -rf "$RUNS"' EXIT
SUMMARY="$RUNS/summary.txt"; : > "$SUMMARY"

case_run() { # name, expected rc, expected devices ("0,0" or "-"), verdict needle ("-": none), args...
  local name=$1 want_rc=$2 want_dev=$3 needle=$4; shift 4
  echo "== $name: repro register $*"
  local t0=$(date +%s.%N)
  timeout 150 $HP repro register --json --out "$RUNS/$name" --ignore-leftovers "$@" >"$RUNS/$name.json" 2>"$RUNS/$name.err"
  local rc=$?
  local wall=$(python3 -c "import time; print(f'{time.time() - $t0:.1f}')")
  cat "$RUNS/$name.err"
  python3 - "$RUNS/$name.json" "$RUNS/$name.err" "$name" "$rc" "$want_rc" "$want_dev" "$needle" "$wall" >>"$SUMMARY" <<'PY'
import json, sys
path, err, name, rc, want_rc, want_dev, needle, wall = sys.argv[1:]
try:
    r = json.load(open(path))
except Exception as exc:
    r = {"outcome": f"no JSON ({exc})"}
devs = [rk.get("device") for rk in r.get("ranks", [])]
secs = [rk.get("seconds") for rk in r.get("ranks", [])]
ok = int(rc) == int(want_rc) and "Traceback" not in open(err).read()
if want_dev != "-":
    ok = ok and devs == [int(d) for d in want_dev.split(",")]
if needle != "-":
    ok = ok and needle in str(r.get("verdict"))
cleanup_ok = all(s.get("ok") for s in r.get("cleanup", []))
print(f"{'PASS' if ok and cleanup_ok else 'FAIL'} {name}: rc={rc} (want {want_rc}) outcome={r.get('outcome')} "
      f"devices={devs} rank_pin_s={secs} rate_gib_s={r.get('rate_gib_s')} cleanup_ok={cleanup_ok} wall={wall}s")
print(f"     verdict: {r.get('verdict')}")
PY
  tail -2 "$SUMMARY"
}

{
  date -u; uname -r; nproc; free -g
  echo "== 1. the node's devices"
  nvidia-smi -L 2>&1
  timeout 60 python3 -c "
from cuda.bindings import runtime
err, n = runtime.cudaGetDeviceCount(); print('cudaGetDeviceCount:', err, n)" 2>&1
  timeout 60 $HP preflight --size 4GiB --ranks 2 --json >"$RUNS/preflight.json" 2>"$RUNS/preflight.err"
  echo "preflight rc=$?"
  python3 - "$RUNS/preflight.json" <<'PY' | tee -a "$SUMMARY"
import json, sys
try:
    r = json.load(open(sys.argv[1]))
    numa = next(c for c in r["checks"] if c["id"] == "numa")
    print(f"INFO preflight --ranks 2: numa {numa['status']}: {numa['summary']}; ranks_per_node "
          f"{numa.get('evidence', {}).get('ranks_per_node')}")
except Exception as exc:
    print("INFO preflight: no numa check read:", exc)
PY
  case_run devices00 0 0,0 - --size 4GiB --method register --ranks 2 --devices 0,0
  case_run default 0 0,0 - --size 4GiB --method register --ranks 2
  case_run devices01 1 - "rank 1 was given CUDA device 1, and this node shows 1 CUDA device (0)" \
      --size 4GiB --method register --ranks 2 --devices 0,1
  case_run torch01 1 - "rank 1 was given CUDA device 1" \
      --size 256MiB --allocator torch --method hostalloc --ranks 2 --devices 0,1
  case_run torchdefault 0 0,0 - --size 256MiB --allocator torch --method hostalloc --ranks 2
  echo "== 6. leftovers"
  timeout 60 $HP repro cleanup --dry-run --json >"$RUNS/cleanup.json" 2>&1
  python3 - "$RUNS/cleanup.json" <<'PY' | tee -a "$SUMMARY"
import json, sys
try:
    r = json.load(open(sys.argv[1]))
    dead = [x for x in r["found"] if not x.get("alive")]
    print(f"{'PASS' if not dead else 'FAIL'} leftovers: {len(dead)} left by dead runs {[x.get('description') for x in dead]}")
except Exception as exc:
    print("FAIL leftovers: cannot read repro cleanup --dry-run:", exc)
PY
  echo; echo "== summary"; cat "$SUMMARY"
} 2>&1 | tee "$LOG"

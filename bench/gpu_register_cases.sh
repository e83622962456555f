#!/usr/bin/env bash
# repro register on the GPU machine: 47 GiB by each method, the matrix, ranks, failures, swap-bound. Usage: bench/gpu_register_cases.sh A|B
#   A: snapshot fixture, 47 GiB x {register, hostalloc, mlock}, --matrix 16GiB, --ranks 2, failure cases
#   B: the swap-bound registration, unthrottled and throttled to 16MB/s (bounded by --deadline)
set -u
source "$(dirname "$0")/gpu_setup.sh"
RUNS=/tmp/runs; mkdir -p $RUNS
# a disk file system for swap files and table files (not tmpfs/overlay)
SWAPDIR=/var/tmp
for d in /var/tmp /root /tmp /; do t=$(stat -f -c %T "$d" 2>/dev/null); case "$t" in ext2/ext3|ext4|xfs) SWAPDIR=$d; break;; esac; done
step() { echo; echo "=== $*"; }
jrun() { # name, args...: run with --json into $RUNS/name.json, print the verdict line
  local name=$1; shift
  $HP repro register --json --out $RUNS "$@" >"$RUNS/$name.json" 2>"$RUNS/$name.err"; echo "rc=$?"
  python3 - "$RUNS/$name.json" <<'PY'
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except Exception as e:
    print("no JSON:", e); sys.exit()
keys = ("outcome", "bound", "seconds", "rate_gib_s", "clean_rate_gib_s", "first_bound_at_s", "eta_error",
        "pinned_pages", "expected_pages", "swapped_out_bytes", "swapin_pages_per_s")
print({k: r.get(k) for k in keys})
print("verdict:", r.get("verdict"))
for rk in r.get("ranks", []):
    print("  rank", rk.get("rank"), rk.get("outcome"), rk.get("seconds"), rk.get("rate_gib_s"), "prefault", rk.get("prefault"), "unpin", rk.get("unpin_s"), rk.get("error"))
print("  watchdog", r.get("watchdog"), "notes", r.get("notes"), "cleanup ok", all(s["ok"] for s in r.get("cleanup", [])))
PY
}
{
  date; uname -r; nproc; free -g; df -hT / /var/tmp /tmp | cat; echo "swapdir=$SWAPDIR"; cat /proc/swaps
  cat /sys/fs/cgroup/cgroup.controllers /sys/fs/cgroup/cgroup.subtree_control 2>&1
  if [ "${1:-A}" = A ]; then
    step snapshot; $HP snapshot --out /tmp/snaps; tar czf "$OUT/snapshot.tgz" -C /tmp/snaps .
    step "47GiB register thp prefault"; jrun reg47 --size 47GiB --thp --prefault --method register
    step "47GiB hostalloc"; jrun ha47 --size 47GiB --thp --prefault --method hostalloc
    step "47GiB mlock thp prefault"; jrun ml47 --size 47GiB --thp --prefault --method mlock
    step "ranks 2 x 47GiB register thp"; jrun ranks2 --size 47GiB --ranks 2 --thp --prefault
    step "47GiB register thp NO prefault"; jrun reg47np --size 47GiB --thp --no-prefault
    step "failure: MAP_SHARED writable file, default flags"; jrun fileshared --size 2GiB --source file:$SWAPDIR/hostpin-table.bin --map shared
    step "same, readonly flags"; jrun filero --size 2GiB --source file:$SWAPDIR/hostpin-table.bin --map shared --register-flags readonly
    step "MAP_PRIVATE file, default"; jrun filepriv --size 2GiB --source file:$SWAPDIR/hostpin-table.bin --map private
    rm -f $SWAPDIR/hostpin-table.bin
    step "register twice"; jrun twice --size 64MiB --register-twice
    step "matrix 16GiB"; $HP repro register --matrix --size 16GiB --out $RUNS; echo "rc=$?"
  fi
  if [ "${1:-A}" = C ] || [ "${1:-A}" = BC ]; then
    step "47GiB register thp prefault"; jrun reg47 --size 47GiB --thp --prefault --method register
    step "47GiB hostalloc"; jrun ha47 --size 47GiB --method hostalloc
    step "ranks 2 x 47GiB register thp"; jrun ranks2 --size 47GiB --ranks 2 --thp --prefault
    step "watchdog cost"; python3 bench/watchdog_cost.py --threads 40
  fi
  if [ "${1:-A}" = D ]; then
    step "ranks 2 x 47GiB register thp"; jrun ranks2 --size 47GiB --ranks 2 --thp --prefault
    step "47GiB hostalloc"; jrun ha47 --size 47GiB --method hostalloc
    step "watchdog cost"; python3 bench/watchdog_cost.py --threads 40
    step "swap-bound 32GiB, 12GiB swapped, unthrottled"; jrun swap32 --size 32GiB --thp --make-swap 24GiB --swap-out 12GiB --swap-dir $SWAPDIR --deadline 240
    step "swap-bound 32GiB, 12GiB swapped, 16MB/s"; jrun swap32t --size 32GiB --thp --make-swap 24GiB --swap-out 12GiB --swap-in-rate 16MB/s --swap-dir $SWAPDIR --deadline 60
    python3 -c "import json; r=json.load(open('$RUNS/swap32t.json')); print('stopped:', r.get('stopped'))"
  fi
  if [ "${1:-A}" = B ] || [ "${1:-A}" = BC ]; then
    step "swap-bound 32GiB, 12GiB swapped, unthrottled"; jrun swap32 --size 32GiB --thp --make-swap 24GiB --swap-out 12GiB --swap-dir $SWAPDIR --deadline 240
    step "swap-bound 32GiB, 12GiB swapped, 16MB/s"; jrun swap32t --size 32GiB --thp --make-swap 24GiB --swap-out 12GiB --swap-in-rate 16MB/s --swap-dir $SWAPDIR --deadline 150
  fi
  echo; echo "left: swaps:"; cat /proc/swaps; ls /sys/fs/cgroup | grep hostpin; ls $SWAPDIR | grep hostpin
} 2>&1 | tee "$OUT/report-${1:-A}.txt"
tar czf "$OUT/runs-${1:-A}.tgz" -C $RUNS .

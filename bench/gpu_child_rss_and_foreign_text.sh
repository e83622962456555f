#!/usr/bin/env bash
# On the GPU machine (one H200, cgroup v2), about 3 minutes:
#   1  the peak RSS (VmHWM) of one repro pinning child beside its region, per method (mlock, register,
#      hostalloc) at 256 MiB: repro's headroom check counts CHILD_RSS_BYTES (16 MiB, measured for mlock
#      on the CI machine) per rank; a CUDA child with its context may need more
#   2  --swap-dir refusals and the fd-based swapon on this kernel (6.18): a nobody-owned directory is
#      refused (exit 2), a root-only one works and leaves nothing behind
#   3  preflight --format line on a tree whose kernel release carries escape sequences (no ESC byte out)
# Writes $OUT/child_rss.txt, $OUT/swapdir.txt, $OUT/foreign.txt; prints a summary. Removes what it made.
set -u
pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HOSTPIN_CONFIG=none
HP="python3 -m repro.cli"
W=$(mktemp -d /var/tmp/hostpin-bench-XXXXXX)
SD=/var/tmp/hostpin-bench-shared-$$
cleanup() {
  $HP repro cleanup --json >/dev/null 2>&1
  rm -rf "$W" "$SD"
}
trap cleanup EXIT INT TERM

# 1: peak RSS of the pinning child, sampled every 50 ms while it runs
for m in mlock register hostalloc; do
  timeout 120 $HP repro register --method $m --size 256MiB --no-calibrate --ignore-leftovers --out "$W/runs" \
    >"$W/$m.out" 2>&1 & P=$!
  peak=0
  while kill -0 $P 2>/dev/null; do
    for c in $(pgrep -f "repro.pinner" 2>/dev/null); do
      h=$(awk '/^VmHWM:/ {print $2}' /proc/$c/status 2>/dev/null); r=$(awk '/^VmRSS:/ {print $2}' /proc/$c/status 2>/dev/null)
      [ -n "$h" ] && [ "$h" -gt "$peak" ] && peak=$h
    done
    sleep 0.05
  done
  wait $P; rc=$?
  echo "CHILD_RSS method=$m rc=$rc peak_vmhwm_kib=$peak (region 262144 KiB; beyond it $((peak - 262144)) KiB)"
done > "$OUT/child_rss.txt" 2>&1

# 2: swap directories
{
  mkdir -p "$SD"; chown nobody "$SD" 2>/dev/null || chown 65534 "$SD"; chmod 755 "$SD"
  $HP repro register --method mlock --size 16MiB --make-swap 64MiB --swap-dir "$SD" --no-calibrate \
    --ignore-leftovers --out "$W/runs" >/dev/null 2>"$W/sd.err"; echo "SWAPDIR nobody-owned rc=$? ($(tail -c 160 "$W/sd.err"))"
  echo "SWAPDIR files left by root in it: $(find "$SD" -user root | wc -l)"
  mkdir -p "$W/rootonly"; chmod 700 "$W/rootonly"
  $HP repro register --method mlock --size 16MiB --make-swap 64MiB --swap-dir "$W/rootonly" --no-calibrate \
    --ignore-leftovers --out "$W/runs" --json >"$W/ro.json" 2>"$W/ro.err"; echo "SWAPDIR root-only rc=$?"
  python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print('SWAPDIR swap_file', r.get('swap_file'), 'cleanup ok', all(s['ok'] for s in r.get('cleanup', [])))" "$W/ro.json" 2>&1
  echo "SWAPDIR left: files $(ls "$W/rootonly" | wc -l), active swaps named hostpin $(grep -c hostpin-swap /proc/swaps)"
} > "$OUT/swapdir.txt" 2>&1

# 3: a kernel release with escapes, through the gate's line and the table
{
  $HP snapshot --no-cuda --out "$W/snap" >/dev/null 2>&1
  T=$(ls -d "$W"/snap/*/root | head -1)
  printf '6.18\033]0;PWNED\007\033[2J\rhostpin preflight: PASS (spoofed)\nFAKE\n' > "$T/proc/sys/kernel/osrelease"
  $HP preflight --root "$T" --no-cuda --size 1GiB --out "$W/runs" --format line > "$W/line.txt" 2>&1
  $HP preflight --root "$T" --no-cuda --size 1GiB --out "$W/runs" > "$W/table.txt" 2>&1
  echo "FOREIGN line: $(cat -v "$W/line.txt" | head -1 | cut -c1-150)"
  echo "FOREIGN ESC bytes in line+table output: $(cat "$W/line.txt" "$W/table.txt" | tr -cd '\033' | wc -c) (want 0)"
} > "$OUT/foreign.txt" 2>&1

echo "== summary"; cat "$OUT/child_rss.txt" "$OUT/swapdir.txt" "$OUT/foreign.txt" | cut -c1-240

#!/usr/bin/env bash
# --trace on the GPU machine (H200, driver 580.159.04, kernel 6.18, cgroup v2), under 420 s:
#   A  a swapped cudaHostRegister: 2 GiB, 1 GiB of it pushed into swap, swap reads at 48 MB/s
#   B  a file-backed cudaHostRegister: a 1 GiB file, page cache dropped, reads at 64 MB/s
#   C  a prefaulted 47 GiB cudaHostRegister with --trace (the budget: the driver's time)
#   D  the cost of tracing on C: 5 runs without and 5 with --trace, alternated (pin seconds)
# CASES="A C" runs only those. Each case prints its time budget; the last lines are one "CASE X: ..." summary each.
# Writes $OUT/trace-budget.txt (everything), $OUT/runs-trace.tgz (the runs, raw traces left out
# above 4 MiB), $OUT/install.log. Everything made (swap file, cgroups, throttles, the data file,
# tracefs instances) is removed by hostpin or by the trap below on every path.
set -u
source "$(dirname "$0")/gpu_setup.sh"
R=/tmp/rtrace; rm -rf $R; mkdir -p $R
DATA=/var/tmp/hostpin-trace-budget.bin
cleanup() { rm -f "$DATA"; $HP repro cleanup >/dev/null 2>&1; }
trap cleanup EXIT INT TERM
SUMMARY=$R/summary.txt; : > $SUMMARY
want() { case " ${CASES:-A B C D} " in *" $1 "*) return 0;; esac; return 1; }  # CASES="A C": only those

budget() {  # $1 case, $2 result json, $3 rc
  python3 - "$1" "$2" "$3" "$SUMMARY" <<'EOF'
import json, sys
case, path, rc, summary = sys.argv[1:]
try:
    r = json.load(open(path))
except Exception as exc:
    line = f"CASE {case}: rc={rc}, no JSON ({exc})"
else:
    b = r.get("time_budget") or {}
    c = b.get("causes") or {}
    io = b.get("io") or {}
    t = r.get("trace") or {}
    lat = (io.get("sleep_latency") or {}).get("p50_ms")
    line = (f"CASE {case}: rc={rc} outcome={r.get('outcome')} pin={r.get('seconds')} s bound={r.get('bound')} "
            f"budget: " + ", ".join(f"{k} {v:.2f}" for k, v in c.items() if v) +
            f" explained={b.get('explained')} requests={io.get('requests')} bytes={io.get('bytes')} "
            f"basis={io.get('basis')} devices={list(io.get('devices') or {})} sleep_p50_ms={lat} "
            f"dropped={b.get('dropped')} by_instance={t.get('dropped_by_instance')} lost_lines={t.get('lost_lines_events')} events={t.get('events')} trace_bytes={t.get('raw_bytes')} "
            f"buffers={t.get('buffer_bytes')} xid_event={'nvidia/nvidia_dev_xid' in (t.get('events_enabled') or [])} "
            f"xids={t.get('xids')} notes={r.get('notes')}")
    print(json.dumps(b, indent=1)[:3000])
    print("verdict:", r.get("verdict"))
print(line)
open(summary, "a").write(line + "\n")
EOF
}

{
  date; uname -r; python3 --version; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1
  ls /sys/kernel/tracing/events/nvidia 2>&1 | head -5

  if want A; then
  echo; echo "== A: swapped register, 2 GiB, 1 GiB in swap, 48 MB/s"
  timeout 150 $HP repro register --trace --json --out $R/runs --method register --size 2GiB --swap-out 1GiB \
      --swap-in-rate 48MB/s --make-swap 4GiB --no-calibrate > $R/A.json 2> $R/A.err
  budget A $R/A.json $?; tail -3 $R/A.err

  fi

  if want B; then
  echo; echo "== B: file-backed register, 1 GiB file, 64 MB/s"
  python3 -c "
import os
with open('$DATA', 'wb') as fh:
    for _ in range(1024): fh.write(os.urandom(1 << 20))
"
  timeout 120 $HP repro register --trace --json --out $R/runs --method register --size 1GiB --source file:$DATA \
      --no-prefault --read-rate 64MB/s --no-calibrate > $R/B.json 2> $R/B.err
  budget B $R/B.json $?; tail -3 $R/B.err; rm -f $DATA

  fi

  if want C; then
  echo; echo "== C: prefaulted 47 GiB register, --trace"
  timeout 120 $HP repro register --trace --json --out $R/runs --method register --size 47GiB --thp \
      --no-calibrate > $R/C.json 2> $R/C.err
  budget C $R/C.json $?; tail -3 $R/C.err

  fi

  if want D; then
  echo; echo "== D: 47 GiB prefaulted register, 5 runs without and 5 with --trace (alternated)"
  for i in 1 2 3 4 5; do
    order="plain trace"; [ $((i % 2)) = 0 ] && order="trace plain"
    for arm in $order; do
      flag=; [ $arm = trace ] && flag=--trace
      timeout 60 $HP repro register $flag --json --out $R/runs-d --method register --size 47GiB --thp \
          --no-calibrate > $R/D-$arm-$i.json 2>/dev/null
      echo "D run $i $arm rc=$?"
    done
  done
  python3 - $R $SUMMARY <<'EOF'
import glob, json, statistics, sys
R, summary = sys.argv[1:]
arms = {}
for arm in ("plain", "trace"):
    xs, cpu = [], []
    for p in sorted(glob.glob(f"{R}/D-{arm}-*.json")):
        try:
            r = json.load(open(p))
        except Exception:
            continue
        if r.get("seconds"):
            xs.append(r["seconds"])
            cpu.append((r.get("watchdog") or {}).get("watchdog_cpu_pct_of_core"))
    arms[arm] = xs
    print(arm, "pin seconds", xs, "hostpin cpu % of a core", cpu)
p, t = arms["plain"], arms["trace"]
line = (f"CASE D: 47 GiB register pin seconds without --trace {p} (median {statistics.median(p):.3f}), with "
        f"{t} (median {statistics.median(t):.3f}); slower by "
        f"{100 * (statistics.median(t) - statistics.median(p)) / statistics.median(p):+.1f}%") if p and t \
    else f"CASE D: not enough runs: without {p}, with {t}"
print(line)
open(summary, "a").write(line + "\n")
EOF
  fi

  echo; echo "== leftovers after everything (want none)"
  ls /sys/kernel/tracing/instances 2>&1; $HP repro cleanup --dry-run 2>&1 | tail -3
} 2>&1 | tee $OUT/trace-budget.txt

# case A's raw trace compressed on its own (it tells which ring lost events: trace.dropped_by_instance)
a_dir=$(python3 -c "import json; print(json.load(open('$R/A.json')).get('run_dir') or '')" 2>/dev/null)
[ -n "$a_dir" ] && [ -d "$a_dir/trace" ] && tar czf $OUT/trace-A-raw.tgz -C "$a_dir" trace 2>/dev/null
# raw traces above 4 MiB stay out of the archive (8 files of 16 MiB come back at most)
(cd /tmp && tar czf $OUT/runs-trace.tgz --exclude='*/runs-d/*/trace/*' \
    $(find rtrace -path '*/trace/*.txt' -size +4M -printf "--exclude=%p ") rtrace 2>/dev/null)
echo; echo "== summary"; cat $SUMMARY

#!/usr/bin/env bash
# The fleet gate on the GPU machine, about a minute: the gate with the CUDA probe, as a node runs it.
#   A  the site file (deploy/hostpin.toml) + --format npd, 5 times: line, exit code, wall time
#      (node-problem-detector and slurmd time these out)
#   B  a command-line override of the file (--method hostalloc), --format line
#   C  --json: the recorded config and the CUDA facts (cuda-bindings vs driver versions)
#   D  the DaemonSet's command once (deploy/kubernetes/hostpin-daemonset.yaml), then the NPD relay
#   E  deploy/slurm/hostpin-gate as health check and as prolog, without Slurm (scontrol absent)
#   F  hostpin compare of the runs above: the fleet summary on real GPU runs
# Writes $OUT/fleet-gate.txt (everything printed) and $OUT/fleet-gate-runs.tar.gz (result.json and
# manifest.json of every run, the status file and the textfile). Each case runs on its own.
set -u
source "$(dirname "$0")/gpu_setup.sh"
W=/tmp/hp12; rm -rf "$W"; mkdir -p "$W/runs"
printf '#!/bin/sh\nexec python3 -m repro.cli "$@"\n' > "$W/hostpin"; chmod 755 "$W/hostpin"
export HOSTPIN_CONFIG=none
SITE=$PWD/deploy/hostpin.toml
{
  echo "== A: site file, --format npd, with the CUDA probe (5 runs)"
  for i in 1 2 3 4 5; do
    t0=$(date +%s.%N)
    line=$($HP preflight --config $SITE --format npd --out "$W/runs" 2>"$W/a-$i.err"); rc=$?
    t1=$(date +%s.%N)
    echo "run $i: exit $rc, $(echo "$t1 - $t0" | bc) s: $line"
  done
  tail -3 "$W/a-1.err"

  echo "== B: --method hostalloc over the file, --format line"
  $HP preflight --config $SITE --method hostalloc --format line --out "$W/runs"; echo "exit $?"

  echo "== C: --json, config and CUDA facts"
  $HP preflight --config $SITE --json --out "$W/runs" > "$W/c.json"; echo "exit $?"
  python3 - "$W/c.json" <<'EOF'
import json, sys, pathlib
r = json.load(open(sys.argv[1]))
print("status:", r["status"], "|", r["verdict"])
print("config:", r["config"]["path"], r["config"]["sha256"][:12],
      {k: v for k, v in r["config"]["settings"].items() if v["from"] != "default"})
probe = pathlib.Path(r["run_dir"]) / "probes" / "cuda.json"
if probe.exists():
    p = json.loads(probe.read_text())
    print("cuda:", {k: p.get(k) for k in ("status", "message", "driver_version", "bindings_version",
                                            "bindings_cuda_version", "duration_s")})
else:
    print("cuda: no probes/cuda.json in", r["run_dir"])
EOF

  echo "== D: the DaemonSet's command once, then the NPD relay"
  python3 - > "$W/loop.sh" <<'EOF'
import re
text = open("deploy/kubernetes/hostpin-daemonset.yaml").read()
body = text.split("          args:\n            - |\n", 1)[1].split("          volumeMounts:", 1)[0]
print("\n".join(line[14:] for line in body.splitlines()))
EOF
  awk '/hostpin.toml: \|/{f=1; next} /^---/{f=0} f{sub(/^    /, ""); print}' deploy/kubernetes/hostpin-daemonset.yaml > "$W/site-cm.toml"
  HOSTPIN="$W/hostpin" HOSTPIN_CONFIG="$W/site-cm.toml" HOSTPIN_ONCE=1 HOSTPIN_RUNS="$W/ds-runs" \
    HOSTPIN_STATUS="$W/npd-status" HOSTPIN_TEXTFILE="$W/textfile/hostpin.prom" timeout 120 sh "$W/loop.sh"
  echo "loop exit $?; status file: $(cat "$W/npd-status" 2>/dev/null)"
  deploy/kubernetes/hostpin-npd-status "$W/npd-status" 900; echo "relay exit $?"
  grep -E "^hostpin_(preflight_status|headroom_bytes|preflight_duration_seconds)" "$W/textfile/hostpin.prom"

  echo "== E: the Slurm gate without Slurm (scontrol absent: it says what it would do)"
  for mode in healthcheck prolog; do
    HOSTPIN="$W/hostpin" HOSTPIN_CONFIG=$SITE HOSTPIN_STATE_DIR="$W/gate" SCONTROL=/nonexistent SINFO=/nonexistent \
      SLURMD_NODENAME=gpu-test timeout 120 deploy/slurm/hostpin-gate $mode; echo "$mode exit $?"
  done

  echo "== F: hostpin compare of these runs (fleet summary past 6)"
  $HP compare "$W/runs" "$W/ds-runs" "$W/gate/hostpin-runs" | head -40; echo "exit ${PIPESTATUS[0]}"
} 2>&1 | tee "$OUT/fleet-gate.txt"
(cd "$W" && find . \( -name result.json -o -name manifest.json -o -name npd-status -o -name hostpin.prom \) -print0 \
   | tar --null -czf "$OUT/fleet-gate-runs.tar.gz" -T -) || echo "could not pack the runs"

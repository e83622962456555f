#!/usr/bin/env bash
# The --python check after the third attack (H200, torch 2.11): `import torch` runs under
# RLIMIT_FSIZE 1 MiB with its output in files (repro/register.py check_torch), and a line that is
# no version is refused. Runs, in order:
#   1. check_torch(python3): the version it reads and how long the import took (expect 2.11.x, no error);
#   2. check_torch of a script that prints 200 MB then a version: refused, hostpin's peak RSS (expect < 100 MB);
#   3. repro register --allocator torch --method hostalloc --size 256MiB, and --method pin_memory --size 256MiB:
#      outcome completed, exit 0 (the child still imports torch and pins under the same interpreter);
#   4. preflight --allocator torch with PYTORCH_CUDA_ALLOC_CONF carrying a LF: the verdict stays one line.
# Writes $OUT/gpu_torch_python_check_bounded.log; prints a summary. Under 300 s; leaves nothing behind
# (the runs are under $OUT/runs, the scratch script under a mktemp directory removed on exit).
set -u
source "$(dirname "$0")/gpu_setup.sh"
LOG="$OUT/gpu_torch_python_check_bounded.log"
SCRATCH=$(mktemp -d /tmp/hostpin-pycheck.XXXXXX)
trap 'rm -rf "$SCRATCH"' EXIT
printf '#!/bin/sh\nhead -c 200000000 /dev/zero | tr "\\0" x\necho\necho 2.11.0\n' > "$SCRATCH/bomb"
chmod 755 "$SCRATCH/bomb"
{
echo "== 1. check_torch(python3)"
timeout 150 python3 - <<'EOF'
import time, repro.register as r
t = time.monotonic()
try:
    print("version", r.check_torch("python3"), f"in {time.monotonic() - t:.1f} s")
except r.ReproError as e:
    print("ERROR", e)
EOF
echo "== 2. check_torch(a script printing 200 MB)"
timeout 60 python3 - "$SCRATCH/bomb" <<'EOF'
import resource, sys, repro.register as r
try:
    print("version", r.check_torch(sys.argv[1]), "(expected a refusal)")
except r.ReproError as e:
    print("refused:", str(e)[:160])
print("peak RSS MB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)
EOF
for m in hostalloc pin_memory; do
  echo "== 3. repro register --allocator torch --method $m --size 256MiB"
  timeout 150 $HP repro register --allocator torch --method $m --size 256MiB --python "$(command -v python3)" \
      --out "$OUT/runs" --json > "$SCRATCH/r.json" 2> "$SCRATCH/r.err"
  echo "exit $?"
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('outcome', d.get('outcome'), '| torch', (d.get('options') or {}).get('torch_version'), '|', (d.get('verdict') or '')[:160])" "$SCRATCH/r.json" 2>&1
  tail -c 300 "$SCRATCH/r.err"
done
echo "== 4. preflight with a LF in PYTORCH_CUDA_ALLOC_CONF"
PYTORCH_CUDA_ALLOC_CONF=$'expandable_segments:True\nFAKE:PASS' timeout 120 $HP preflight --size 1GiB \
    --allocator torch --out "$OUT/runs" > "$SCRATCH/p.txt" 2>&1
echo "exit $? lines starting FAKE: $(grep -c '^FAKE' "$SCRATCH/p.txt")  (expect 0)"
} 2>&1 | tee "$LOG"
echo "== summary"
grep -E "^(version|refused|peak RSS|exit|outcome|ERROR)" "$LOG"

#!/usr/bin/env bash
# User files and leftovers on the GPU machine (H200, driver 580.159.04, kernel 6.18, cgroup v2), ~3-4 minutes:
#   A  an existing data file is registered read-only (cudaHostRegisterReadOnly) and never written
#   B  a writable registration of an existing file is refused up front (exit 2)
#   C  catalog 9 still reproduces with a file the run creates (cudaErrorInvalidValue), removed after
#   D  a SIGKILLed swap-bound run on cgroup v2: leftovers found, warned, refused beside, removed;
#      the killed run bundled and reported as partial
#   E  the regression tests of these cases on python 3.12 and cgroup v2 (hypothesis absent there: skipped)
# Writes $OUT/file-safety.txt (everything), $OUT/runs-file-safety.tgz, $OUT/pytest-file-safety.txt, $OUT/install.log.
# Each case prints one "CASE X: ..." summary line; one failing case does not stop the others.
set -u
source "$(dirname "$0")/gpu_setup.sh"
R=/tmp/r11; rm -rf $R; mkdir -p $R
DATA=/var/tmp/hostpin-file-safety-table.bin
summary() { echo "CASE $1: $2"; }

{
  date; uname -r; python3 --version; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1
  cat /sys/fs/cgroup/cgroup.subtree_control 2>&1

  echo; echo "== A: existing 2 GiB file, --map shared, default flags (must become readonly)"
  python3 -c "
import sys
block = bytes(range(256)) * 4096
with open('$DATA', 'wb') as fh:
    for _ in range(2048): fh.write(block)
"
  before=$(sha256sum $DATA | cut -d' ' -f1); mt_before=$(stat -c %Y $DATA)
  $HP repro register --size 2GiB --source file:$DATA --map shared --json --out $R/A > $R/A.json 2> $R/A.err
  rc=$?
  after=$(sha256sum $DATA | cut -d' ' -f1); mt_after=$(stat -c %Y $DATA)
  python3 - "$R/A.json" "$rc" "$before" "$after" "$mt_before" "$mt_after" <<'EOF'
import json, sys
path, rc, b, a, mb, ma = sys.argv[1:]
try:
    r = json.load(open(path))
except Exception as exc:
    print(f"CASE A: no JSON ({exc}); rc={rc}"); sys.exit()
print(f"CASE A: rc={rc} outcome={r.get('outcome')} flags={r['options']['register_flags']} "
      f"seconds={r.get('seconds')} file unchanged={a == b and mb == ma} verdict={r.get('verdict')}")
EOF
  cat $R/A.err | tail -3

  echo; echo "== A2: same file, --map private"
  $HP repro register --size 2GiB --source file:$DATA --map private --json --out $R/A > $R/A2.json 2>>$R/A.err
  rc=$?; after2=$(sha256sum $DATA | cut -d' ' -f1)
  python3 -c "
import json,sys; r=json.load(open('$R/A2.json'))
print('CASE A2: rc=$rc outcome', r.get('outcome'), 'flags', r['options']['register_flags'], 'file unchanged', '$after2'=='$before', '|', r.get('verdict'))
" 2>&1 || summary A2 "no JSON, rc=$rc"

  echo; echo "== B: existing file with --register-flags portable (refused, exit 2)"
  $HP repro register --size 2GiB --source file:$DATA --register-flags portable --out $R/B 2>&1 | tail -2
  rc=${PIPESTATUS[0]}; summary B "rc=$rc (want 2); file unchanged: $([ "$(sha256sum $DATA | cut -d' ' -f1)" = "$before" ] && echo yes || echo NO)"
  rm -f $DATA

  echo; echo "== C: catalog 9 with a file the run creates (MAP_SHARED, default flags)"
  NEW=/var/tmp/hostpin-file-safety-new.bin; rm -f $NEW
  $HP repro register --size 1GiB --source file:$NEW --map shared --json --out $R/C > $R/C.json 2>&1
  rc=$?
  python3 -c "
import json; r=json.load(open('$R/C.json'))
e=(r.get('ranks') or [{}])[0].get('error') or {}
print('CASE C: rc=$rc outcome', r.get('outcome'), 'error', e.get('name'), 'catalog', e.get('catalog'))
" 2>&1 || summary C "no JSON, rc=$rc"
  summary C2 "the run's file removed afterwards: $([ -e $NEW ] && echo NO || echo yes)"

  echo; echo "== D: SIGKILL of a swap-bound run's parent on cgroup v2"
  $HP repro register --size 256MiB --method mlock --thp --make-swap 1GiB --swap-out 192MiB --swap-in-rate 2MB/s \
      --deadline 120 --json --out $R/D > $R/D.json 2>$R/D.err &
  parent=$!
  for _ in $(seq 1 600); do
    ev=$(ls $R/D/*/events.jsonl 2>/dev/null | head -1)
    [ -n "$ev" ] && grep -q pin_start "$ev" && break
    sleep 0.1
  done
  if [ -z "${ev:-}" ] || ! grep -q pin_start "$ev"; then
    kill -9 $parent 2>/dev/null; summary D "the run never reached its pin: $(tail -2 $R/D.err)"
  else
  sleep 2; kill -9 $parent; wait $parent 2>/dev/null; sleep 2
  echo "left after the kill:"; cat /proc/swaps; ls -d /sys/fs/cgroup/hostpin-* 2>&1; cat /sys/fs/cgroup/hostpin-*/io.max 2>&1
  $HP repro cleanup --dry-run --json > $R/D-dry.json; echo "dry-run rc=$?"
  python3 -c "
import json; r=json.load(open('$R/D-dry.json'))
rows=[x for x in r['found'] if x['pid']==$parent]
print('CASE D1: dry-run found', sorted(x['kind'] for x in rows), 'owner dead', all(not x['alive'] for x in rows),
      'throttles', [x['detail'].get('throttles') for x in rows if x['kind']=='cgroup'])
"
  $HP preflight --size 1GiB --method mlock --no-cuda --sample 0 --json --out $R/D-pf > $R/D-pf.json
  python3 -c "
import json; r=json.load(open('$R/D-pf.json')); c=next(c for c in r['checks'] if c['id']=='leftovers')
print('CASE D2: preflight leftovers', c['status'], '|', c['summary'][:200], '|', c['remedy'])
"
  $HP repro register --size 64MiB --method mlock --json --out $R/D-refused > $R/D-refused.json; rc=$?
  python3 -c "
import json; r=json.load(open('$R/D-refused.json')); print('CASE D3: rc=$rc outcome', r['outcome'], (r.get('refusal') or {}).get('check'))
"
  run=$(dirname "$ev")
  $HP bundle "$run" -o $R/D-killed.tar.gz --json > $R/D-bundle.json; rc=$?
  python3 -c "
import json; r=json.load(open('$R/D-bundle.json')); print('CASE D4: bundle rc=$rc partial', r.get('partial'), 'killed_at', r.get('killed_at'), 'unrecorded', r.get('unrecorded'))
" 2>&1 || cat $R/D-bundle.json
  $HP report $R/D-killed.tar.gz --format text > $R/D-report.txt 2>&1; rc=$?
  summary D5 "report rc=$rc; $(head -3 $R/D-report.txt | tr '\n' ' ' | cut -c1-200); kernel stack: $(grep -c -i 'kernel stack' $R/D-report.txt)"
  $HP repro cleanup --json > $R/D-clean.json; rc=$?
  python3 -c "
import json; r=json.load(open('$R/D-clean.json'))
print('CASE D6: cleanup rc=$rc', r['verdict'])
"
  fi
  summary D7 "left now: swaps=$(tail -n +2 /proc/swaps | grep -c hostpin) cgroups=$(ls -d /sys/fs/cgroup/hostpin-* 2>/dev/null | wc -l) files=$(ls /var/tmp | grep -c hostpin-swap) subtree_control=$(cat /sys/fs/cgroup/cgroup.subtree_control)"

  echo; echo "== E: regression tests (python 3.12, cgroup v2)"
  timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_hostile.py tests/test_leftovers.py \
      tests/test_properties.py -rfs > "$OUT/pytest-file-safety.txt" 2>&1
  summary E "pytest rc=$?: $(tail -1 "$OUT/pytest-file-safety.txt")"

  echo; $HP repro cleanup | head -5   # whatever happened above, nothing of a dead run stays
  echo "left:"; cat /proc/swaps; ls -d /sys/fs/cgroup/hostpin-* 2>/dev/null; ls /var/tmp /dev/shm | grep hostpin
} 2>&1 | tee "$OUT/file-safety.txt"
tar czf "$OUT/runs-file-safety.tgz" -C $R . 2>/dev/null

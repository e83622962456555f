#!/usr/bin/env bash
# repro register's typed result (schema hostpin.repro-register 2) on the paths only a GPU takes:
# cudaHostRegister and cudaHostAlloc, 2 ranks, chunks, a CUDA error (a writable MAP_SHARED file,
# catalog 9; a double registration, 712), a deadline kill, --trace, --matrix, PyTorch's pin_memory.
# For each: the JSON on stdout reads back into ReproRegisterResult with nothing left over, writes
# back identically, equals the run's result.json, has every field schema 2 requires (validated
# whole where jsonschema is installed), and `hostpin report` renders it (exit 0).
# Small sizes: about 2-4 min in all (under 420 s). Usage: bench/gpu_repro_register_typed_results.sh
# (MATRIX_SIZE=64MiB for a check on a machine without a GPU, where the CUDA cases are unevaluated)
set -u
pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "editable install failed: running from the tree"
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
HP="python3 -m repro.cli"
RUNS=$(mktemp -d /tmp/hostpin-typed-runs.XXXXXX)
DIR=/var/tmp
for d in /var/tmp /root /tmp; do t=$(stat -f -c %T "$d" 2>/dev/null); case "$t" in ext2/ext3|ext4|xfs) DIR=$d; break;; esac; done
TABLE=$DIR/hostpin-typed-table-$$.bin   # the run's own file (it does not exist): created and removed by the run
cleanup() { rm -f "$TABLE"; rm -rf "$RUNS"; }
trap cleanup EXIT
trap 'exit 130' INT TERM
START=$(date +%s)

case_() { # name, args...: the JSON on stdout, stderr and the exit code kept under $RUNS/name.*
  local name=$1; shift
  if [ $(( $(date +%s) - START )) -gt 330 ]; then echo "$name: skipped (time)"; echo skipped >"$RUNS/$name.rc"; return; fi
  echo "=== $name: repro register $*"
  timeout 120 $HP repro register --json --out "$RUNS/runs" "$@" >"$RUNS/$name.json" 2>"$RUNS/$name.err"
  echo $? >"$RUNS/$name.rc"
  tail -n 2 "$RUNS/$name.err"
}

{
  date -u; uname -r; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -1
  case_ register4    --size 4GiB --thp --prefault --method register
  case_ hostalloc4   --size 4GiB --method hostalloc
  case_ ranks2       --size 2GiB --ranks 2 --thp --prefault --method register
  case_ chunks       --size 4GiB --chunk 1GiB --method register
  case_ fileshared   --size 1GiB --source "file:$TABLE" --map shared --method register
  case_ twice        --size 64MiB --register-twice --method register
  case_ deadline     --size 32GiB --no-thp --no-prefault --method register --deadline 1.5 --no-calibrate
  case_ trace        --size 1GiB --method register --trace --no-calibrate
  if python3 -c "import torch" 2>/dev/null; then
    case_ torch_pin_memory --size 2GiB --allocator torch --method pin_memory --no-calibrate
  fi
  echo "=== matrix: repro register --matrix --size ${MATRIX_SIZE:-1GiB}"
  timeout 150 $HP repro register --matrix --size "${MATRIX_SIZE:-1GiB}" --json --out "$RUNS/runs" >"$RUNS/matrix.json" 2>"$RUNS/matrix.err"
  echo "matrix rc=$?"
  echo
  echo "=== summary (typed: loads into ReproRegisterResult, nothing in extra, writes back identically, = result.json;"
  echo "    schema: every field schema 2 requires, whole validation where jsonschema is installed; report: its exit code)"
  python3 - "$RUNS" <<'PY'
import json, subprocess, sys
from pathlib import Path
from diag.reproresult import ReproRegisterResult
from diag.results import load_result, result_dict
runs = Path(sys.argv[1])
schema = json.loads(Path("diag/schemas/hostpin.repro-register.schema.json").read_text())
required = schema["$defs"]["result"]["allOf"][0]["then"]["required"]
try:
    import jsonschema
    validator = jsonschema.Draft202012Validator(schema)
except ImportError:
    validator = None
rows, bad = [], 0
for rc_file in sorted(runs.glob("*.rc")):
    name, rc = rc_file.stem, rc_file.read_text().strip()
    if rc == "skipped":
        rows.append((name, "skipped", "", "", "", "", "", ""))
        continue
    text = (runs / f"{name}.json").read_text()
    try:
        data = json.loads(text)
    except ValueError:
        rows.append((name, rc, "no JSON", "", "", "", "", (runs / f"{name}.err").read_text()[-200:].replace("\n", " ")))
        bad += 1
        continue
    problems = []
    try:
        r = load_result(data)
        if not isinstance(r, ReproRegisterResult):
            problems.append(f"loaded as {type(r).__name__}")
        else:
            if r.extra:
                problems.append(f"extra {sorted(r.extra)}")
            if result_dict(r) != data:
                problems.append("does not write back identically")
            if r.upgraded_from is not None:
                problems.append(f"upgraded_from {r.upgraded_from}")
    except ValueError as exc:
        problems.append(f"damaged: {exc}")
        r = None
    missing = [k for k in required if k not in data]
    if missing:
        problems.append(f"missing {missing}")
    if validator is not None:
        problems += [f"schema: {'/'.join(map(str, e.absolute_path))}: {e.message[:120]}" for e in validator.iter_errors(data)][:3]
    run_dir = Path(data.get("run_dir") or "/nonexistent")
    try:
        if json.loads((run_dir / "result.json").read_text()) != data:
            problems.append("result.json differs from stdout")
    except (OSError, ValueError) as exc:
        problems.append(f"result.json: {exc}")
    rep = subprocess.run([sys.executable, "-m", "repro.cli", "report", str(run_dir), "--no-picture"],
                         capture_output=True, text=True, timeout=60)
    if rep.returncode != 0:
        problems.append(f"report rc {rep.returncode}: {rep.stderr.strip()[-200:]}")
    ranks = ",".join(f"{rk.outcome}" + (f"/{rk.error.name}/cat{rk.error.catalog}" if rk.error else "") for rk in r.ranks) if r else ""
    bad += bool(problems)
    rows.append((name, rc, data.get("outcome"), data.get("exit_code"), ranks,
                 "stopped" if data.get("stopped") else "", "ok" if not problems else "PROBLEM", "; ".join(problems)[:300]))
print(f"{'case':18} {'rc':>3} {'outcome':12} {'exit':>4} {'ranks':40} {'':8} typed+schema+report")
for row in rows:
    print(f"{row[0]:18} {row[1]:>3} {str(row[2]):12} {str(row[3]):>4} {row[4][:40]:40} {row[5]:8} {row[6]} {row[7]}")
try:
    m = json.loads((runs / "matrix.json").read_text())
    print("matrix:", m.get("outcome"), "exit", m.get("exit_code"), "rows",
          [(x["case"], x["outcome"], round(x["seconds"], 2) if x.get("seconds") else None) for x in m.get("rows", [])])
except (OSError, ValueError) as exc:
    print("matrix: no JSON:", exc)
    bad += 1
print(f"jsonschema {'used' if validator else 'not installed: required fields only'}; {bad} case(s) with problems")
PY
  echo "left behind: swaps:"; tail -n +2 /proc/swaps; ls /sys/fs/cgroup | grep hostpin; ls "$DIR" | grep hostpin-typed
  echo "took $(( $(date +%s) - START )) s"
} 2>&1 | tee "$OUT/typed-results.txt"
# the JSONs and stderr of each case (the run directories stay out: timelines are large)
tar czf "$OUT/typed-results-json.tgz" -C "$RUNS" --exclude runs . 2>/dev/null

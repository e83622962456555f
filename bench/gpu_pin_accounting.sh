#!/usr/bin/env bash
# What the catalog constants rest on, on the GPU machine (driver memory per pinned page, cgroup charging, co-tenants, swap-in rate; one H200, open driver, cgroup v2, root), in one go, about 3-4 minutes.
# Every case is independent: one failing does not stop the rest; a short summary per case goes to
# stdout (and summary.txt). Files under $OUT (7 at most, each well under 16 MiB):
#   install.log           pip install -e . (from gpu_setup.sh)
#   summary.txt           everything printed below
#   measure.json          case 1: VmallocUsed per page and cgroup charging, both methods, with controls
#   snapshot.tar.gz       case 2: a fresh `hostpin snapshot` of the node (a new test fixture)
#   preflight.json        case 3: preflight of the README's plan (2 x 47.2 GiB), register and hostalloc
#   cotenants.json        case 4: preflight while another process holds 8 GiB of cudaHostAlloc (NVML path)
#   swapin.json           case 5: swap-in rate of this node's disk for a pin (mlock), with its kind
set -u
source "$(dirname "$0")/gpu_setup.sh"
R=/tmp/runs-i9; rm -rf "$R"; mkdir -p "$R"
case_() { echo; echo "== $*"; }
{
  echo "host: $(uname -r), $(nproc) CPUs, $(awk '/MemTotal/ {print $2/1048576 " GiB"}' /proc/meminfo)"
  head -1 /proc/driver/nvidia/version 2>/dev/null
  python3 -c "import cuda.bindings as b; print('cuda-bindings', b.__version__)" 2>&1
  python3 -c "import cuda.bindings.nvml" 2>/dev/null && echo "cuda.bindings.nvml: present" || echo "cuda.bindings.nvml: absent"

  case_ "1. driver memory per page and cgroup charging (fresh child cgroup per arm; controls: context, anon)"
  timeout 360 python3 bench/gpu_driver_overhead_per_page.py --out "$OUT/measure.json" --repeat 3 || echo "case 1 failed rc=$?"

  case_ "2. hostpin snapshot of this node"
  if timeout 120 $HP snapshot --out "$R/snap" >"$R/snap.txt" 2>&1; then
    cat "$R/snap.txt"
    d=$(ls -d "$R"/snap/*snapshot* | head -1)
    tar -C "$(dirname "$d")" -czf "$OUT/snapshot.tar.gz" "$(basename "$d")" && ls -l "$OUT/snapshot.tar.gz"
    echo "page size recorded: $(python3 -c "import json,sys; print(json.load(open('$d/probes/node.json'))['page_size'])")"
  else
    echo "case 2 failed"; tail -5 "$R/snap.txt"
  fi

  case_ "3. preflight of the README's plan: 2 x 47.2 GiB (register), then hostalloc, then 2 x 60 GiB"
  {
    echo "["
    timeout 60 $HP preflight --size 47.2GiB --ranks 2 --json --out "$R/pf"; echo ","
    timeout 60 $HP preflight --size 47.2GiB --ranks 2 --method hostalloc --json --out "$R/pf"; echo ","
    timeout 60 $HP preflight --size 60GiB --ranks 2 --json --out "$R/pf"
    echo "]"
  } >"$OUT/preflight.json" 2>"$R/pf.err"
  python3 - "$OUT/preflight.json" <<'EOF' || { echo "case 3: could not read the results"; tail -5 "$R/pf.err"; }
import json, sys
for r in json.load(open(sys.argv[1])):
    print(f"{r['status'].upper()} exit {r['exit_code']}: {r['verdict'][:200]}")
    print(f"   binding {r.get('binding')} {r.get('binding_bytes')} need {r.get('need_bytes')} page {r.get('page_size')}"
          f" predicted {r.get('catalog_predicted')} errors {r.get('errors')}")
    for c in r["checks"]:
        if c["status"] != "pass":
            print(f"   {c['status']:5s} {c['id']}: {c['summary'][:160]}")
EOF
  $HP preflight --size 47.2GiB --ranks 2 --out "$R/pf" 2>&1 | head -25

  case_ "4. co-tenants: preflight while another process holds 8 GiB of cudaHostAlloc"
  python3 - >"$R/holder.log" 2>&1 <<'EOF' &
from cuda.bindings import runtime as rt
import ctypes, time
rt.cudaSetDevice(0); rt.cudaFree(0)
err, ptr = rt.cudaHostAlloc(8 << 30, 0)
ctypes.memset(int(ptr), 1, 8 << 30)
print("holding", flush=True)
time.sleep(40)
rt.cudaFreeHost(ptr)
EOF
  holder=$!
  for i in $(seq 1 60); do grep -q holding "$R/holder.log" 2>/dev/null && break; sleep 0.5; done
  echo "holder pid $holder: $(cat "$R/holder.log")"
  timeout 60 $HP preflight --size 16GiB --method hostalloc --json --out "$R/pf" >"$OUT/cotenants.json" 2>"$R/co.err"
  python3 - "$OUT/cotenants.json" "$holder" <<'EOF' || echo "case 4: could not read the result"
import json, sys
r = json.load(open(sys.argv[1]))
c = next(c for c in r["checks"] if c["id"] == "cotenants")
print(f"{c['status']}: {c['summary'][:300]}")
print("source:", c["evidence"].get("gpu_processes_source"), "error:", c["evidence"].get("gpu_processes_error"))
print("holder listed:", any(p.get("pid") == int(sys.argv[2]) for p in c["evidence"].get("gpu_processes") or []))
print("pins outstanding:", c["evidence"].get("pins_outstanding_bytes"))
EOF
  kill "$holder" 2>/dev/null; wait "$holder" 2>/dev/null

  case_ "5. swap-in rate of this node's disk for a pin (mlock, 1 GiB of a 2 GiB region swapped out)"
  python3 -c "
import os; from diag.swap import classify_block_device
st = os.stat('/var/tmp'); print('disk under /var/tmp:', classify_block_device(os.major(st.st_dev), os.minor(st.st_dev)))
print('vm.page-cluster', open('/proc/sys/vm/page-cluster').read().strip())"
  timeout 240 $HP repro register --method mlock --size 2GiB --swap-out 1GiB --make-swap 2GiB --json --out "$R/sw" \
      >"$OUT/swapin.json" 2>"$R/sw.err"
  python3 -c "
import json; r = json.load(open('$OUT/swapin.json'))
print(r.get('outcome'), 'swap-in', round(r.get('swapin_pages_per_s') or 0), 'pages/s;', (r.get('verdict') or '')[:200])" \
      || { echo "case 5 failed"; tail -5 "$R/sw.err"; }

  case_ "left behind (should be empty)"
  grep -v '^Filename' /proc/swaps; ls /sys/fs/cgroup | grep hostpin; ls /var/tmp | grep hostpin
  echo "done"
} 2>&1 | tee "$OUT/summary.txt"

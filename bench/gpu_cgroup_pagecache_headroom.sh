#!/usr/bin/env bash
# The headroom of a memory cgroup full of page cache, judged by the kernel (cgroup v2, H200):
# a cgroup with memory.max=32G holds ~24 GiB of clean page cache read twice (active list, a file on
# the real disk); preflight --method hostalloc --cgroup DIR judges 2 x 10 GiB (PASS expected) and
# 2 x 20 GiB (FAIL expected); then the same sizes really go through cudaHostAlloc in two children
# moved into that cgroup (tests/pin_target.py --method hostalloc), recording memory.events oom_kill
# and memory.stat file/active_file/inactive_file/shmem before and after. Prints a table: plan,
# verdict, what the kernel did, agree. Under 420 s; removes the file and the cgroup on every path.
#
# Sizes can be changed for a smaller machine (and the script checked on a CPU-only one with
# METHOD=mlock): LIMIT=32G CACHE_GIB=24 PASS_GIB=10 FAIL_GIB=20 RANKS=2 METHOD=hostalloc.
set -u
source "$(dirname "$0")/gpu_setup.sh"
export LIMIT=${LIMIT:-32G} CACHE_GIB=${CACHE_GIB:-24} PASS_GIB=${PASS_GIB:-10} FAIL_GIB=${FAIL_GIB:-20}
export RANKS=${RANKS:-2} METHOD=${METHOD:-hostalloc} DIR=${DIR:-/var/tmp}
LOG="$OUT/gpu_cgroup_pagecache_headroom.log"
timeout 400 python3 - "$OUT" <<'EOF' 2>&1 | tee "$LOG"
import json, os, re, signal, subprocess, sys, time
from pathlib import Path

OUT = Path(sys.argv[1])
G = 1 << 30
UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
LIMIT = int(os.environ["LIMIT"][:-1]) * UNITS[os.environ["LIMIT"][-1]] if os.environ["LIMIT"][-1] in UNITS \
    else int(os.environ["LIMIT"])
CACHE = int(float(os.environ["CACHE_GIB"]) * G)
PASS_SIZE, FAIL_SIZE = int(float(os.environ["PASS_GIB"]) * G), int(float(os.environ["FAIL_GIB"]) * G)
RANKS, METHOD, DIR = int(os.environ["RANKS"]), os.environ["METHOD"], Path(os.environ["DIR"])
MIB = 1 << 20
t_start = time.monotonic()
made = {"file": None, "cgroup": None, "children": []}


def log(*a):
    print(f"[{time.monotonic() - t_start:6.1f}s]", *a, flush=True)


def mounts():
    out = {}
    for line in open("/proc/self/mountinfo"):
        left, _, right = line.partition(" - ")
        f, r = left.split(), right.split()
        if r and r[0] == "cgroup2":
            out["v2"] = f[4]
        elif r and r[0] == "cgroup" and "memory" in r[-1].split(","):
            out["v1"] = f[4]
    return out


def stat(cg: Path) -> dict:
    s = {}
    for line in (cg / "memory.stat").read_text().splitlines():
        k, _, v = line.partition(" ")
        if v.strip().isdigit():
            s[k] = int(v)
    if V == 1:
        return {"file": s.get("total_cache"), "active_file": s["total_active_file"],
                "inactive_file": s["total_inactive_file"], "shmem": s.get("total_shmem"), "anon": s["total_rss"],
                "dirty": s["total_dirty"]}
    return {k: s.get(k) for k in ("file", "active_file", "inactive_file", "shmem", "anon", "file_dirty")}


def oom_kills(cg: Path) -> int:
    name = "memory.events" if V == 2 else "memory.oom_control"
    for line in (cg / name).read_text().splitlines():
        if line.startswith("oom_kill "):
            return int(line.split()[1])
    return -1


def usage(cg: Path) -> int:
    return int((cg / ("memory.current" if V == 2 else "memory.usage_in_bytes")).read_text())


def gib(x):
    return "?" if x is None else f"{x / G:.2f} GiB"


def cleanup():
    for p in made["children"]:
        if p.poll() is None:
            p.kill()
            p.wait()
    if made["file"] is not None:
        Path(made["file"]).unlink(missing_ok=True)
    cg = made["cgroup"]
    if cg is not None and cg.exists():
        for _ in range(50):
            for pid in (cg / "cgroup.procs").read_text().split():
                try:
                    (cg.parent / "cgroup.procs").write_text(pid)
                except OSError:
                    pass
            try:
                cg.rmdir()
                break
            except OSError:
                time.sleep(0.1)
    if made.get("enabled") is not None:
        try:
            made["enabled"].write_text("-memory")
        except OSError as exc:
            log(f"could not disable the memory controller again: {exc.strerror}")
    left = [x for x in (made["file"], made["cgroup"]) if x is not None and Path(x).exists()]
    log("cleanup:", "nothing left" if not left else f"LEFT {left}")


signal.signal(signal.SIGTERM, lambda *a: sys.exit(143))
rows, stats = [], {}
try:
    m = mounts()
    V = 2 if "v2" in m and "v1" not in m else 1
    top = Path(m["v2"] if V == 2 else m["v1"])
    cg = top / f"hostpin-pagecache-{os.getpid()}"
    if V == 2 and "memory" not in (top / "cgroup.subtree_control").read_text().split():
        (top / "cgroup.subtree_control").write_text("+memory")
        made["enabled"] = top / "cgroup.subtree_control"  # given back at the end
    cg.mkdir()
    made["cgroup"] = cg
    (cg / ("memory.max" if V == 2 else "memory.limit_in_bytes")).write_text(str(LIMIT))
    if V == 2 and (cg / "memory.swap.max").exists():
        log("memory.swap.max", (cg / "memory.swap.max").read_text().strip(), "SwapTotal",
            [ln for ln in open("/proc/meminfo") if ln.startswith("SwapTotal")][0].split()[1], "kB")
    fs = subprocess.run(["df", "-T", str(DIR)], capture_output=True, text=True).stdout.splitlines()[-1]
    log(f"cgroup v{V} {cg}, limit {gib(LIMIT)}; cache file on {fs}")
    st = os.statvfs(DIR)
    if st.f_bavail * st.f_frsize < CACHE + 4 * G:
        sys.exit(f"{DIR} has {st.f_bavail * st.f_frsize / G:.1f} GiB free, the cache file needs {gib(CACHE)} + 4 GiB")
    path = DIR / f"hostpin-pagecache-{os.getpid()}.bin"
    made["file"] = path
    block = os.urandom(64 * MIB)
    t0 = time.monotonic()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    for _ in range(G // len(block)):  # 1 GiB first, written through to the disk: its rate sets the sizes
        os.write(fd, block)
    os.fsync(fd)
    rate = G / (time.monotonic() - t0)
    budget = float(os.environ.get("WRITE_BUDGET_S", "70"))  # the file is written, then read twice, twice
    scale = min(1.0, rate * budget / CACHE)
    if scale < 1.0:  # a slow disk: every size shrinks in proportion, so the case stays the same case
        r64 = lambda x: max(64 * MIB, int(x * scale) // (64 * MIB) * (64 * MIB))
        CACHE, PASS_SIZE, FAIL_SIZE = r64(CACHE), r64(PASS_SIZE), r64(FAIL_SIZE)
        LIMIT = -(-int(LIMIT * scale) // (64 * MIB)) * (64 * MIB)  # rounded up: the cache stays under it
        (cg / ("memory.max" if V == 2 else "memory.limit_in_bytes")).write_text(str(LIMIT))
        log(f"disk writes {rate / MIB:.0f} MiB/s: sizes scaled by {scale:.2f} to fit {budget:.0f} s: limit "
            f"{gib(LIMIT)}, cache {gib(CACHE)}, plans {RANKS} x {gib(PASS_SIZE)} and {RANKS} x {gib(FAIL_SIZE)}")
    for _ in range(max(0, CACHE - G) // len(block)):
        os.write(fd, block)
    os.ftruncate(fd, CACHE)
    os.fsync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    log(f"wrote {gib(CACHE)} in {time.monotonic() - t0:.1f} s ({rate / MIB:.0f} MiB/s for the first GiB) and "
        "dropped it from the cache")
    t0 = time.monotonic()
    subprocess.run(["sh", "-c", f"echo 0 > {cg}/cgroup.procs && cat {path} > /dev/null && cat {path} > /dev/null"],
                   check=True, timeout=200)
    stats["after reading twice"] = stat(cg)
    u, st0 = usage(cg), stats["after reading twice"]
    stats["rules"] = {"usage": u, "old_headroom": LIMIT - (u - st0["inactive_file"]),
                      "new_headroom": LIMIT - (u - st0["active_file"] - st0["inactive_file"])}
    log(f"read twice inside the cgroup in {time.monotonic() - t0:.1f} s: usage {gib(usage(cg))}",
        stats["after reading twice"])

    def preflight(size):
        r = subprocess.run([sys.executable, "-m", "repro.cli", "preflight", "--no-cuda", "--json", "--sample", "0",
                            "--method", METHOD, "--size", f"{size // MIB}MiB", "--ranks", str(RANKS),
                            "--cgroup", str(cg), "--out", "/tmp/hostpin-pagecache-runs"],
                           capture_output=True, text=True, timeout=120)
        data = json.loads(r.stdout)
        (OUT / f"preflight-{size // MIB}mib.json").write_text(r.stdout)
        head = next(c for c in data["checks"] if c["id"] == "headroom")
        log(f"preflight {RANKS} x {gib(size)}: exit {r.returncode}, headroom {head['status']}: {head['summary']}")
        return head

    def pin(size):
        """RANKS children in the cgroup pin `size` each, at once; what the kernel did."""
        before, s0 = oom_kills(cg), stat(cg)
        procs = [subprocess.Popen([sys.executable, "tests/pin_target.py", "--size", f"{size // MIB}MiB", "--method",
                                   METHOD, "--join", str(cg / "cgroup.procs")], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(RANKS)]
        made["children"] += procs
        ready = [p.stdout.readline().startswith("paged") for p in procs]
        t0 = time.monotonic()
        for p, ok in zip(procs, ready):
            if ok:
                try:
                    p.stdin.write("go\n")
                    p.stdin.flush()
                except BrokenPipeError:
                    pass
        pinned = [ok and p.stdout.readline().startswith("pinned") for p, ok in zip(procs, ready)]
        seconds = time.monotonic() - t0
        peak = usage(cg)
        s1 = stat(cg)
        for p in procs:
            try:
                p.stdin.write("quit\n")
                p.stdin.flush()
            except (BrokenPipeError, ValueError):
                pass
        rcs = [p.wait(timeout=120) for p in procs]
        errs = [p.stderr.read()[-200:].strip() for p in procs]
        kills = oom_kills(cg) - before
        return {"pinned": sum(pinned), "ranks": RANKS, "rcs": rcs, "oom_kill": kills, "seconds": round(seconds, 1),
                "usage_at_pin": peak, "before": s0, "pinned_stat": s1, "errors": [e for e in errs if e]}

    for label, size, want in (("pass plan", PASS_SIZE, "pass"), ("fail plan", FAIL_SIZE, "fail")):
        if label == "fail plan":  # the cache back as it was: read it twice again
            subprocess.run(["sh", "-c", f"echo 0 > {cg}/cgroup.procs && cat {path} > /dev/null && "
                                        f"cat {path} > /dev/null"], check=True, timeout=200)
        head = preflight(size)
        got = pin(size)
        stats[label] = got
        did = (f"{got['pinned']}/{RANKS} pinned in {got['seconds']} s, oom_kill +{got['oom_kill']}, file "
               f"{gib(got['before']['file'])} -> {gib(got['pinned_stat']['file'])}, active_file "
               f"{gib(got['before']['active_file'])} -> {gib(got['pinned_stat']['active_file'])}, shmem "
               f"{gib(got['pinned_stat']['shmem'])}")
        log(label, did, got["errors"] or "")
        kernel_ok = got["pinned"] == RANKS and got["oom_kill"] == 0
        agree = (head["status"] in ("pass", "warn")) == kernel_ok
        rows.append((f"{RANKS} x {gib(size)} {METHOD}", head["status"].upper(), did, "yes" if agree else "NO"))
finally:
    cleanup()
    (OUT / "stats.json").write_text(json.dumps(stats, indent=1, default=str))
    print("\n== summary: page cache in a memory cgroup, preflight against the kernel")
    w = max([len(r[0]) for r in rows] + [4])
    print(f"{'plan':<{w}}  verdict  agree  what the kernel did")
    for plan, verdict, did, agree in rows:
        print(f"{plan:<{w}}  {verdict:<7}  {agree:<5}  {did}")
    if "rules" in stats:
        r = stats["rules"]
        print(f"cgroup limit {gib(LIMIT)}, usage {gib(r['usage'])} after reading {gib(CACHE)} twice: headroom by "
              f"limit - (usage - inactive_file) {gib(r['old_headroom'])}, by limit - (usage - file LRU) "
              f"{gib(r['new_headroom'])}")
    print(f"total {time.monotonic() - t_start:.0f} s")
EOF
rc=${PIPESTATUS[0]}
echo "rc=$rc"
# whatever a killed run may have left (only this script's own names)
for d in /sys/fs/cgroup/hostpin-pagecache-* /sys/fs/cgroup/memory/hostpin-pagecache-*; do
  [ -d "$d" ] && { for p in $(cat "$d/cgroup.procs" 2>/dev/null); do kill -9 "$p" 2>/dev/null; done; sleep 1; rmdir "$d"; }
done
rm -f "$DIR"/hostpin-pagecache-*.bin
rm -rf /tmp/hostpin-pagecache-runs
grep -A10 "== summary" "$LOG" > "$OUT/summary.txt"
ls -la "$OUT"
true

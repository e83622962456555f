"""Driver of bench/gpu_torch_pinned_rounding.sh (GPU machine, cgroup v2, root, torch in python3).

Each case: a fresh cgroup under /sys/fs/cgroup with memory.max chosen from hostpin's own figures
(between the raw-CUDA need and the PyTorch need, or above both), memory.swap.max 0 (the pinned pages
cannot swap; anonymous ones must not hide an overflow in swap); `hostpin preflight --allocator cuda`
and `--allocator torch` against it; then N real torch ranks inside it (bench/gpu_torch_rank.py:
torch.empty(n, dtype=torch.uint8, pin_memory=True), nothing else), holding at once; memory.events
oom_kill and memory.peak after. Then `hostpin repro register --allocator torch --method pin_memory`
of a 16 GiB region with 2 GiB of it in swap. Everything it creates is removed on every exit path.
Prints one table; writes $OUT/torch-rounding.json.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

GiB, MiB = 1 << 30, 1 << 20
CG = Path("/sys/fs/cgroup")
OUT = Path(os.environ.get("OUT", "/tmp/out"))
WORK = Path("/tmp/hptorch")
RUNS = WORK / "runs"
HERE = Path(__file__).resolve().parent
T0 = time.monotonic()
BUDGET_S = 390.0
made: list[Path] = []


def log(*a) -> None:
    print(f"[{time.monotonic() - T0:6.1f}s]", *a, flush=True)


def sh(*argv: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout,
                              env=dict(os.environ, **(env or {})))
    except subprocess.TimeoutExpired as exc:
        return subprocess.CompletedProcess(argv, 124, exc.stdout or "", f"timeout after {timeout} s")


def hostpin(*args: str, env: dict | None = None, timeout: float = 120) -> tuple[int, dict | None, str]:
    r = sh(sys.executable, "-m", "repro.cli", *args, env=env, timeout=timeout)
    try:
        return r.returncode, json.loads(r.stdout), r.stderr[-2000:]
    except ValueError:
        return r.returncode, None, (r.stdout[-1000:] + r.stderr[-2000:])


def cg_read(d: Path, name: str) -> str:
    try:
        return (d / name).read_text()
    except OSError:
        return ""


def events(d: Path) -> dict:
    out = {}
    for line in cg_read(d, "memory.events").splitlines():
        k, _, v = line.partition(" ")
        out[k] = int(v or 0)
    return out


def make_cgroup(name: str, limit: int | None) -> Path:
    d = CG / f"hp-torch-{os.getpid()}-{name}"
    d.mkdir()
    made.append(d)
    if limit is not None:
        (d / "memory.max").write_text(str(limit))
    if (d / "memory.swap.max").exists():
        (d / "memory.swap.max").write_text("0")
    return d


def remove_cgroup(d: Path) -> None:
    if not d.exists():
        return
    if (d / "cgroup.kill").exists():
        try:
            (d / "cgroup.kill").write_text("1")
        except OSError:
            pass
    for _ in range(100):
        if not cg_read(d, "cgroup.procs").strip():
            break
        time.sleep(0.1)
    try:
        d.rmdir()
    except OSError as exc:
        log(f"could not remove {d}: {exc}")
    if d in made:
        made.remove(d)


def cleanup(*_a) -> None:
    for d in list(made):
        remove_cgroup(d)


def run_ranks(d: Path, nbytes: int, ranks: int, env: dict, hold: float = 4.0, timeout: float = 90) -> list[dict]:
    rank = str(HERE / "gpu_torch_rank.py")
    procs = [subprocess.Popen(["sh", "-c", f'echo $$ > "{d}/cgroup.procs" && exec "$0" "$@"', sys.executable, rank,
                               str(nbytes), str(hold)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=dict(os.environ, **env)) for _ in range(ranks)]
    out = []
    for p in procs:
        try:
            so, se = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            so, se = p.communicate()
        line = next((json.loads(x) for x in so.splitlines() if x.startswith("{")), None)
        out.append({"rc": p.returncode, "result": line, "stderr": se.strip().splitlines()[-1:] if se.strip() else []})
    return out


def need(pinned_per_rank: int, ranks: int, reserve: int) -> int:
    from diag.checks.memory import CGROUP_BYTES_PER_PAGE
    return pinned_per_rank * ranks + -(-pinned_per_rank // 4096) * ranks * CGROUP_BYTES_PER_PAGE + reserve * ranks


def main() -> int:
    from diag import torchalloc
    from diag.units import format_bytes, parse_size
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(130))
    RUNS.mkdir(parents=True, exist_ok=True)
    report: dict = {"cases": [], "facts": {}}
    ctl = cg_read(CG, "cgroup.subtree_control")
    if "memory" not in ctl.split():
        (CG / "cgroup.subtree_control").write_text("+memory")
        report["facts"]["enabled_memory_controller"] = True
    ver = sh(sys.executable, "-c", "import torch; print(torch.__version__)").stdout.strip()
    report["facts"].update(torch=ver, kernel=os.uname().release,
                           meminfo={l.split(":")[0]: l.split(":")[1].strip() for l in open("/proc/meminfo")
                                    if l.split(":")[0] in ("MemTotal", "MemAvailable", "SwapTotal", "SwapFree")})
    log("torch", ver, report["facts"]["meminfo"])

    # what one rank costs the cgroup without its table: python, torch, the CUDA context
    d = make_cgroup("overhead", None)
    ranks = run_ranks(d, 0, 1, {}, hold=0.5)
    peak = int(cg_read(d, "memory.peak") or 0)
    remove_cgroup(d)
    reserve = -(-int(peak * 1.1) // (64 * MiB)) * 64 * MiB
    report["facts"].update(rank_overhead_peak_bytes=peak, reserve_bytes=reserve, overhead_rank=ranks)
    log(f"one rank without a table: memory.peak {format_bytes(peak)} -> --reserve {format_bytes(reserve)}")

    reg = "pinned_use_cuda_host_register:True,pinned_num_register_threads:8"
    cases = [  # name, size, ranks, limit (between | both), allocator settings (env)
        ("4.1G x2 between", "4.1GiB", 2, "between", {}),
        ("4.1G x3 between", "4.1GiB", 3, "between", {}),
        ("7.5G x2 between", "7.5GiB", 2, "between", {}),
        ("7.5G x3 between", "7.5GiB", 3, "between", {}),
        ("4.1G x2 both fit", "4.1GiB", 2, "both", {}),
        ("register 4.1G x2 between", "4.1GiB", 2, "between", {"PYTORCH_CUDA_ALLOC_CONF": reg}),
        ("register 4.1G x1 both fit", "4.1GiB", 1, "both", {"PYTORCH_CUDA_ALLOC_CONF": reg}),
        ("PYTORCH_ALLOC_CONF register 4.1G x1", "4.1GiB", 1, "both", {"PYTORCH_ALLOC_CONF": reg}),
        ("round threshold 1024 4.1G x1", "4.1GiB", 1, "both",
         {"PYTORCH_CUDA_ALLOC_CONF": "pinned_max_round_threshold_mb:1024"}),
    ]
    for name, size_text, n, kind, env in cases:
        if time.monotonic() - T0 > BUDGET_S - 150:
            report["cases"].append({"case": name, "skipped": "out of time"})
            log("skipped (time):", name)
            continue
        size = parse_size(size_text)
        req = torchalloc.plan_request(size, version=ver, confs=torchalloc.conf_from_env(env))
        raw_need, torch_need = need(size, n, reserve), need(req.request_bytes, n, reserve)
        limit = (raw_need + torch_need) // 2 if kind == "between" else torch_need + GiB
        limit = limit // MiB * MiB
        d = make_cgroup(name.split()[0].lower() + str(len(report["cases"])), limit)
        common = ("preflight", "--cgroup", str(d), "--size", size_text, "--ranks", str(n), "--reserve",
                  f"{reserve}B", "--margin", "64MiB", "--no-cuda", "--sample", "0", "--json", "--out", str(RUNS))
        raw_method = "register" if req.method == "register" else "hostalloc"
        rc_c, cuda, err_c = hostpin(*common, "--allocator", "cuda", "--method", raw_method, env=env)
        rc_t, tor, err_t = hostpin(*common, "--allocator", "torch", env=env)
        ranks = run_ranks(d, size, n, env)
        ev, peak = events(d), int(cg_read(d, "memory.peak") or 0)
        remove_cgroup(d)
        failed = sum(1 for r in ranks if r["rc"] != 0)
        t_status = (tor or {}).get("status", f"rc {rc_t}")
        happened_fail = ev.get("oom_kill", 0) > 0 or failed > 0
        row = {"case": name, "limit_bytes": limit, "size_bytes": size, "ranks": n, "env": env,
               "cuda_plan": (cuda or {}).get("status", f"rc {rc_c}: {err_c[-300:]}"),
               "cuda_need_bytes": (cuda or {}).get("need_bytes"),
               "torch_plan": t_status, "torch_need_bytes": (tor or {}).get("need_bytes"),
               "torch_binding_bytes": (tor or {}).get("binding_bytes"),
               "torch_margin_bytes": ((tor or {}).get("binding_bytes") or 0) - ((tor or {}).get("need_bytes") or 0),
               "torch_verdict": (tor or {}).get("verdict", err_t[-500:]),
               "oom_kill": ev.get("oom_kill", 0), "memory_peak_bytes": peak, "ranks_failed": failed,
               "rank_results": ranks, "predicted_request_bytes": req.request_bytes, "predicted_method": req.method,
               "agree": (t_status == "fail") == happened_fail,
               # the rounding as measured: the largest growth of one rank's RssShmem + RssAnon
               "grew_per_rank_bytes": max((sum((r["result"] or {}).get("grew", {}).get(k, 0) for k in ("RssShmem", "RssAnon"))
                                           for r in ranks), default=0)}
        report["cases"].append(row)
        log(f"{name}: limit {format_bytes(limit)}; cuda {row['cuda_plan']} need {format_bytes(row['cuda_need_bytes'] or 0)};"
            f" torch {t_status} need {format_bytes(row['torch_need_bytes'] or 0)}; oom_kill {row['oom_kill']}, peak "
            f"{format_bytes(peak)}, failed ranks {failed}; agree {row['agree']}")
        for r in ranks:
            g = (r["result"] or {}).get("grew", {})
            log(f"   rank rc {r['rc']}: RssShmem +{format_bytes(g.get('RssShmem', 0))} RssAnon "
                f"+{format_bytes(g.get('RssAnon', 0))} pins +{(r['result'] or {}).get('pins_outstanding_delta_pages')}"
                f" pages; host_stats {(r['result'] or {}).get('host_stats')}; {(r['result'] or {}).get('alloc_s')} s "
                f"{r['stderr']}")

    # Tensor.pin_memory() of a 16 GiB region with 2 GiB of it in swap, through hostpin's reproducer
    left = BUDGET_S - (time.monotonic() - T0)
    if left > 90:
        swapdir = next((p for p in ("/var/tmp", "/root", "/tmp", "/") if sh("stat", "-f", "-c", "%T", p).stdout.strip()
                        in ("ext2/ext3", "ext4", "xfs")), "/var/tmp")
        deadline = int(min(160, left - 30))
        rc, res, err = hostpin("repro", "register", "--allocator", "torch", "--method", "pin_memory", "--size", "16GiB",
                               "--make-swap", "4GiB", "--swap-out", "2GiB", "--swap-dir", swapdir, "--deadline",
                               str(deadline), "--stall-after", "60", "--json", "--out", str(RUNS), timeout=deadline + 60)
        res = res or {}
        report["pin_memory_swap"] = {"rc": rc, "outcome": res.get("outcome"), "bound": res.get("bound"),
                                     "seconds": res.get("seconds"), "verdict": res.get("verdict") or err[-800:],
                                     "torch": res.get("torch"), "run_dir": res.get("run_dir"),
                                     "notes": res.get("notes")}
        log("pin_memory of 16 GiB, 2 GiB swapped:", json.dumps(report["pin_memory_swap"])[:1500])
    else:
        report["pin_memory_swap"] = {"skipped": f"out of time ({left:.0f} s left)"}

    (OUT / "torch-rounding.json").write_text(json.dumps(report, indent=2, default=str))
    from tabulate import tabulate
    rows = [[c["case"], f"{format_bytes(c['predicted_request_bytes'])} / {format_bytes(c['grew_per_rank_bytes'])}",
             format_bytes(c["limit_bytes"]), f"{c['cuda_plan']} / {c['torch_plan']}",
             c["torch_need_bytes"], f"{c['torch_margin_bytes']:+,}", c["oom_kill"], format_bytes(c["memory_peak_bytes"]),
             f"{c['ranks'] - c['ranks_failed']}/{c['ranks']}", "yes" if c["agree"] else "NO"]
            for c in report["cases"] if "skipped" not in c]
    print()
    print(tabulate(rows, headers=["case", "rank: planned / grew", "memory.max", "plan cuda / torch", "torch need_bytes", "torch margin B",
                                  "oom_kill", "memory.peak", "ranks done", "agree"]))
    p = report["pin_memory_swap"]
    print(f"\nTensor.pin_memory() 16 GiB, 2 GiB in swap: {p.get('outcome')} bound={p.get('bound')} "
          f"{p.get('seconds')} s: {str(p.get('verdict'))[:400]}")
    print(f"rank overhead (no table): {format_bytes(report['facts']['rank_overhead_peak_bytes'])}; torch {ver}; "
          f"total {time.monotonic() - T0:.0f} s")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    finally:
        cleanup()

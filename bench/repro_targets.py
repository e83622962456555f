"""The reproducer's speed targets, measured with real runs of `hostpin repro register`.

    python bench/repro_targets.py [--size 256MiB --swap-out 192MiB --rate 16MB/s] [--prefault-size 8GiB]

Runs the swap-bound scenario (mlock, or --method register on a GPU node) and a THP prefault,
and prints: seconds from pin start until the bound was named (target <= 5 s), the ETA given at
20% against the real end (target within 25%), the watchdog's CPU share of one core (target
< 5%), and the prefault rate (target >= 8 GiB/s for 47 GiB on the GPU machine). Needs root
(swap file, cgroups).
"""
import argparse
import json
import subprocess
import sys
import tempfile


def run(args):
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run([sys.executable, "-m", "repro.cli", "repro", "register", "--json", "--out", tmp, *args],
                              capture_output=True, text=True)
        if not proc.stdout.strip().startswith("{"):
            sys.exit(f"run failed: {proc.stderr.strip()}")
        return json.loads(proc.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--method", default="mlock")
    ap.add_argument("--size", default="256MiB")
    ap.add_argument("--swap-out", default="192MiB")
    ap.add_argument("--rate", default="16MB/s")
    ap.add_argument("--make-swap", default="1GiB")
    ap.add_argument("--prefault-size", default="4GiB")
    o = ap.parse_args()
    r = run(["--method", o.method, "--size", o.size, "--thp", "--make-swap", o.make_swap, "--swap-out", o.swap_out,
             "--swap-in-rate", o.rate, "--deadline", "600"])
    p = run(["--method", "mlock", "--size", o.prefault_size, "--thp", "--prefault"])
    pf = p["ranks"][0]["prefault"]
    rows = [
        ("swap-bound run", f"{r['outcome']}, bound {r['bound']}, {r['seconds']:.1f} s, "
                           f"swap-in {r.get('swapin_pages_per_s', 0):,.0f} pages/s"),
        ("bound named after (target <= 5 s)", f"{r['first_bound_at_s']} s"),
        ("ETA at 20% vs actual (target within 25%)", f"{100 * r['eta_error']:+.1f}%" if r.get("eta_error") is not None else "n/a"),
        ("watchdog CPU (target < 5% of a core)", f"{r['watchdog']['watchdog_cpu_pct_of_core']:.2f}%"),
        (f"prefault of {o.prefault_size} THP", f"{pf['rate_gib_s']:.2f} GiB/s with {pf['threads']} threads ({pf['method']})"),
    ]
    for k, v in rows:
        print(f"{k:44s} {v}")


if __name__ == "__main__":
    main()

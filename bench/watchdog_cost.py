"""CPU cost of the watchdog's sampling, per tick, against a real child with many threads.

    python bench/watchdog_cost.py [--threads 40] [--ticks 200]

A child with N sleeping threads and one spinning is sampled like a pinning child; prints the
mean CPU seconds per tick and what that is as a share of one core at the default 0.5 s interval.
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from diag.evidence import RunDir  # noqa: E402
from repro.watchdog import Child, Watchdog  # noqa: E402

CHILD = """
import threading, time
stop = threading.Event()
for _ in range({n}):
    threading.Thread(target=stop.wait, daemon=True).start()
def spin():
    while True:
        pass
threading.Thread(target=spin, daemon=True).start()
time.sleep(600)
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=40)
    ap.add_argument("--ticks", type=int, default=200)
    ap.add_argument("--interval", type=float, default=0.5)
    o = ap.parse_args()
    proc = subprocess.Popen([sys.executable, "-c", CHILD.format(n=o.threads)], stdin=subprocess.PIPE)
    time.sleep(1)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            run = RunDir(os.path.join(tmp, "r"), "bench", durable=True)
            r, w = os.pipe()
            child = Child(0, proc, r, "child.log")
            wd = Watchdog(run, "", [child], "register", 1 << 20, interval=o.interval)
            wd.phase = "pin"
            wd.start_pin()
            t0 = os.times()
            for _ in range(o.ticks):
                wd.tick()
            t1 = os.times()
            per_tick = ((t1.user - t0.user) + (t1.system - t0.system)) / o.ticks
            print(f"{o.threads + 2} threads in the child: {per_tick * 1000:.2f} ms CPU per tick = "
                  f"{100 * per_tick / o.interval:.2f}% of one core at a {o.interval} s interval")
    finally:
        proc.kill()
        proc.wait()


if __name__ == "__main__":
    main()

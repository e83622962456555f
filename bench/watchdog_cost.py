"""CPU cost of watching, per tick, against real ranks with many threads that pin.

    python bench/watchdog_cost.py [--ranks 4] [--threads 40] [--ticks 120] [--interval 0.5]

Starts --ranks child processes, each with --threads sleeping threads (a CUDA runtime has a
dozen helpers, a serving process more) and one thread that mlocks and munlocks a 64 MiB
region in a loop (inside get_user_pages most of the time, so it is seen in a pin phase).
Then it measures the CPU time of both watchers for --ticks samples each:

  repro's supervisor   repro.supervisor.Supervisor.tick(): the children's samples, the pin's
                       tracker, the timeline line (as `hostpin repro register --ranks N`)
  hostpin watch        diag.watch's sampler, phase book and timeline writer over the ranks'
                       pids (as `hostpin watch -- CMD` with N rank processes)

and prints CPU per tick and the share of one core at the interval. Target: < 5% at 0.5 s.
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from diag.evidence import RunDir  # noqa: E402
from diag.watch.attach import region_wants  # noqa: E402
from diag.watch.book import PhaseBook  # noqa: E402
from diag.watch.sampler import Sampler  # noqa: E402
from diag.watch.timeline import TimelineWriter  # noqa: E402
from repro.children import Child  # noqa: E402
from repro.supervisor import Supervisor  # noqa: E402

RANK = """
import ctypes, mmap, threading, time
libc = ctypes.CDLL(None)
stop = threading.Event()
for _ in range({n}):
    threading.Thread(target=stop.wait, daemon=True).start()
size = 64 << 20
buf = mmap.mmap(-1, size)
addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
def pin():
    while True:
        libc.mlock(ctypes.c_void_p(addr), ctypes.c_size_t(size))
        libc.munlock(ctypes.c_void_p(addr), ctypes.c_size_t(size))
threading.Thread(target=pin, daemon=True).start()
time.sleep(600)
"""


def cpu() -> float:
    t = os.times()
    return t.user + t.system


def measure(label: str, tick, ticks: int, interval: float, ranks: int) -> None:
    c0, w0 = cpu(), time.monotonic()
    for _ in range(ticks):
        tick()
    per_tick = (cpu() - c0) / ticks
    wall = (time.monotonic() - w0) / ticks
    print(f"{label:20s} {ranks} ranks: {per_tick * 1000:6.2f} ms CPU per tick ({wall * 1000:.1f} ms wall) = "
          f"{100 * per_tick / interval:5.2f}% of one core at a {interval} s interval")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--threads", type=int, default=40)
    ap.add_argument("--ticks", type=int, default=120)
    ap.add_argument("--interval", type=float, default=0.5)
    o = ap.parse_args()
    procs = [subprocess.Popen([sys.executable, "-c", RANK.format(n=o.threads)], stdin=subprocess.PIPE)
             for _ in range(o.ranks)]
    time.sleep(1.5)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            run = RunDir(os.path.join(tmp, "repro"), "bench", durable=True)
            children = []
            for rank, proc in enumerate(procs):
                r, w = os.pipe()
                os.close(w)
                os.set_blocking(r, False)
                children.append(Child(rank, proc, r, f"child-{rank}.log"))
            sup = Supervisor(run, "", children, "register", o.ranks * (64 << 20), interval=o.interval)
            sup.start_pin()
            measure("repro's supervisor", sup.tick, o.ticks, o.interval, o.ranks)
            sup.finish()

            run = RunDir(os.path.join(tmp, "watch"), "bench", durable=True)
            sampler, book, writer = Sampler(), PhaseBook(), TimelineWriter(run)
            pids = [p.pid for p in procs]

            ticks = [0]

            def watch_tick():  # at the interval's clock: smaps is read by time (diag.watch.smaps)
                ticks[0] += 1
                s = sampler.sample(ticks[0] * o.interval, pids, book.active_tids(), region_wants(book, None))
                book.update(s)
                s["progress"] = book.progress() or {"phase": "run"}
                writer.write(s, keep={t for tids in book.active_tids().values() for t in tids})

            measure("hostpin watch", watch_tick, o.ticks, o.interval, o.ranks)
            writer.close()
            seen = sorted({(ph.pid, ph.kind) for ph, _ in list(book.open.values()) + book.closed})
            print(f"pin phases noticed: {len(book.closed) + len(book.open)} in {len(seen)} (pid, kind) pairs")
    finally:
        for p in procs:
            p.kill()
            p.wait()


if __name__ == "__main__":
    main()

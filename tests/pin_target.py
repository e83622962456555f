"""A process hostpin did not start: it maps a region, puts part of it in swap, and pins it when told.

    python tests/pin_target.py --size 256MiB [--swap-out 192MiB] [--source anon|file:PATH]
                               [--method mlock|mlockall|populate|register|hostalloc]
                               [--join CGROUP_PROCS ...] [--thp] [--exit-code N] [--then-read SIZE]
                               [--keep-swapped SIZE] [--guard]

It uses nothing of hostpin (ctypes and, for register/hostalloc, cuda.bindings), so
`hostpin watch` meets it as it would meet a launcher. Lines on stdout, commands on stdin:

    paged <VmSwap bytes>   the region is mapped, touched, and --swap-out of it MADV_PAGEOUT'ed
    go                     (stdin) pin it now: mlock, mlockall, madvise(MADV_POPULATE_READ) (a call
                           whose length a watcher does not read), cudaHostRegister, or
                           cudaHostAlloc(--size)
    pinned <seconds>       the pin returned
    read <seconds>         (--then-read) a second region of SIZE, put in swap with the first,
                           read back one byte a page in user space after the pin: the load
                           around a pin (Tensor.pin_memory()'s copy), in the process's own faults
    (--keep-swapped SIZE)  a third region put into swap with the others and never read: memory of
                           the process that no phase reads (torch's and CUDA's own, on the H200)
    (--guard)              each region is a VMA of its own: a PROT_NONE page after it keeps the
                           kernel from merging adjacent mappings (smaps tells VMAs apart, not pages)
    quit                   (stdin) unpin and exit with --exit-code

--join writes this process's pid into each cgroup.procs file before anything is allocated,
so the caller can limit, reclaim and throttle it (tests and bench/gpu_watch_attach.sh do).
"""
from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import os
import sys
import time

PROT_RW, MAP_PRIVATE, MAP_ANON = 0x3, 0x02, 0x20
MADV_HUGEPAGE, MADV_PAGEOUT, MADV_POPULATE_READ, MADV_POPULATE_WRITE = 14, 21, 22, 23
UNITS = {"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "": 1}

libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
libc.mlock.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
MCL_CURRENT = 1


def size(text: str) -> int:
    low = text.lower()
    for unit in ("kib", "mib", "gib"):
        if low.endswith(unit):
            return int(float(low[:-3]) * UNITS[unit])
    return int(low)


def check(ret, what):
    if ret == -1 or ret is None:
        err = ctypes.get_errno()
        sys.exit(f"{what}: {os.strerror(err)}")
    return ret


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def guarded(addr: int, length: int, guard: bool) -> None:
    if guard:  # the page after the region: PROT_NONE, another VMA that the neighbours cannot merge across
        check(libc.mprotect(addr + length, 4096, 0), "mprotect(PROT_NONE)")


def swapped(length: int, guard: bool = False) -> int:
    """A second region, touched, then put into swap."""
    addr = libc.mmap(None, length + (4096 if guard else 0), PROT_RW, MAP_PRIVATE | MAP_ANON, -1, 0)
    if addr in (None, ctypes.c_void_p(-1).value):
        sys.exit(f"mmap: {os.strerror(ctypes.get_errno())}")
    guarded(addr, length, guard)
    check(libc.madvise(addr, length, MADV_POPULATE_WRITE), "madvise(POPULATE_WRITE)")
    view = (ctypes.c_char * length).from_address(addr)
    for off in range(0, length, 4096):
        view[off] = b"\x5a"
    check(libc.madvise(addr, length, MADV_PAGEOUT), "madvise(PAGEOUT)")
    return addr


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", type=size, required=True)
    ap.add_argument("--swap-out", type=size, default=0)
    ap.add_argument("--source", default="anon")
    ap.add_argument("--method", choices=["mlock", "mlockall", "populate", "register", "hostalloc"], default="mlock")
    ap.add_argument("--join", action="append", default=[])
    ap.add_argument("--thp", action="store_true")
    ap.add_argument("--exit-code", type=int, default=0)
    ap.add_argument("--then-read", type=size, default=0)
    ap.add_argument("--keep-swapped", type=size, default=0)
    ap.add_argument("--guard", action="store_true")
    o = ap.parse_args()
    for procs in o.join:
        with open(procs, "w") as fh:
            fh.write("0")
    cuda = None
    if o.method in ("register", "hostalloc"):
        from cuda.bindings import runtime as cuda
        assert cuda.cudaFree(0)[0] == cuda.cudaError_t.cudaSuccess, "no CUDA context"
    addr = None
    if o.method != "hostalloc":
        fd = -1
        flags = MAP_PRIVATE
        if o.source.startswith("file:"):
            fd = os.open(o.source[5:], os.O_RDONLY)
        else:
            flags |= MAP_ANON
        addr = libc.mmap(None, o.size + (4096 if o.guard else 0), PROT_RW, flags, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            sys.exit(f"mmap: {os.strerror(ctypes.get_errno())}")
        guarded(addr, o.size, o.guard)
        if o.thp:
            check(libc.madvise(addr, o.size, MADV_HUGEPAGE), "madvise(HUGEPAGE)")
        if o.source == "anon":
            check(libc.madvise(addr, o.size, MADV_POPULATE_WRITE), "madvise(POPULATE_WRITE)")
            view = (ctypes.c_char * o.size).from_address(addr)
            for off in range(0, o.size, 4096):  # a non-zero byte per page: zero pages skip swap since 6.12
                view[off] = b"\x5a"
        if o.swap_out:
            check(libc.madvise(addr, o.swap_out, MADV_PAGEOUT), "madvise(PAGEOUT)")
    other = swapped(o.then_read, o.guard) if o.then_read else None
    kept = swapped(o.keep_swapped, o.guard) if o.keep_swapped else None  # noqa: F841 - mapped until the exit
    swap = 0
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmSwap:"):
                swap = int(line.split()[1]) * 1024
    say(f"paged {swap}")
    if sys.stdin.readline().strip() != "go":
        return 1
    t0 = time.monotonic()
    if o.method == "mlock":
        check(libc.mlock(addr, o.size), "mlock")
    elif o.method == "mlockall":  # no length in the call: a watcher cannot read the size from it
        check(libc.mlockall(MCL_CURRENT), "mlockall")
    elif o.method == "populate":  # faults the region in through get_user_pages; its length is not read
        check(libc.madvise(addr, o.size, MADV_POPULATE_READ), "madvise(POPULATE_READ)")
    elif o.method == "register":
        err, = cuda.cudaHostRegister(addr, o.size, 0)
        assert err == cuda.cudaError_t.cudaSuccess, err
    else:
        err, ptr = cuda.cudaHostAlloc(o.size, 0)
        assert err == cuda.cudaError_t.cudaSuccess, err
    say(f"pinned {time.monotonic() - t0:.3f}")
    if other is not None:
        t1 = time.monotonic()
        view = (ctypes.c_char * o.then_read).from_address(other)
        total = sum(view[off][0] for off in range(0, o.then_read, 4096))  # one fault a page, from swap
        say(f"read {time.monotonic() - t1:.3f} {total}")
    sys.stdin.readline()
    if o.method == "register":
        cuda.cudaHostUnregister(addr)
    elif o.method == "hostalloc":
        cuda.cudaFreeHost(ptr)
    return o.exit_code


if __name__ == "__main__":
    sys.exit(main())

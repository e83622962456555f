"""/proc/swaps (devices and files, sizes in bytes), what backs each of them, and how fast a pin
gets swapped pages back from each kind of device.

A pin faults swapped pages back one at a time (do_swap_page under pin_user_pages), with the
swap readahead of 2^vm.page-cluster pages per read on block devices; zram and zswap
decompress one page per fault. So the cost of pinning a region that is partly in swap is set
by what the device can deliver, not by how much is being read at the moment.

>>> parse_swaps("Filename Type Size Used Priority\\n/swapfile file 1024 512 -2\\n")[0].used_bytes
524288
>>> media_from_name("/dev/zram0"), media_from_name("/dev/nvme0n1p3"), media_from_name("/dev/vda2")
('zram', 'nvme', 'virtual')
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .parsing import ParsedList, to_int
from .rootfs import Root

__all__ = ["SwapDevice", "parse_swaps", "read_swaps", "media_from_name", "classify_block_device",
           "classify_swap_device", "SWAPIN_PAGES_PER_S", "RATE_PAGE_BYTES", "SwapRate", "swapin_rate", "read_zswap_enabled"]


@dataclass
class SwapDevice:
    name: str
    kind: str  # 'partition' or 'file'
    size_bytes: int
    used_bytes: int
    priority: int


def parse_swaps(text: str) -> ParsedList:
    """Swap areas; a line with a damaged number is named in `.bad` and left out."""
    out = ParsedList()
    for line in text.splitlines()[1:]:
        parts = line.split()
        if not parts:
            continue
        numbers = [to_int(x) for x in parts[2:5]] if len(parts) >= 5 else []
        if len(numbers) != 3 or any(n is None for n in numbers) or numbers[0] < 0 or numbers[1] < 0:
            out.bad.append(line.strip()[:80])
            continue
        # a name with spaces is printed with \040; keep it as the kernel wrote it
        out.append(SwapDevice(parts[0], parts[1], numbers[0] * 1024, numbers[1] * 1024, numbers[2]))
    return out


def read_swaps(root: Root) -> ParsedList | None:
    text = root.read_text("proc/swaps")
    return parse_swaps(text) if text is not None else None


def read_zswap_enabled(root: Root) -> bool | None:
    """zswap keeps compressed swapped pages in RAM in front of every swap device (CONFIG_ZSWAP)."""
    text = root.read_text("sys/module/zswap/parameters/enabled")
    if text is None:
        return None
    return text.strip() in ("Y", "1")


# Swap-in pages per second a pin gets, per kind of device, at vm.page-cluster 3 (8 pages per
# read). Where each figure came from; 'estimate' marks what we could not measure ourselves.
RATE_PAGE_BYTES = 4096  # the pages SWAPIN_PAGES_PER_S counts: every rate there was measured on 4 KiB-page nodes
SWAPIN_PAGES_PER_S: dict[str, tuple[float, str]] = {
    "zram": (444_794.0, "measured: zram0 (lzo-rle) on the CI VM, 2 cores, kernel 6.18, bench/swapin_rates.py, "
                        "median of 3 (439,633..511,262)"),
    "virtual": (68_947.0, "measured: a swap file on the CI VM's virtio disk (vda), bench/swapin_rates.py, median "
                          "of 3 (66,175..86,527); the H200 VM's virtio disk gave 108,323 (h200-repro-swap32)"),
    "nvme": (108_323.0, "estimate: NVMe itself not measured by us; taken from the H200 VM's virtio disk "
                        "(h200-repro-swap32: 3,146,134 pages swapped in during a 28 s pin)"),
    "ssd": (40_000.0, "estimate: a SATA SSD, not measured by us"),
    "rotational": (2_800.0, "estimate: the swap-in rate the paper's node showed (device not stated), "
                            "not measured by us"),
    "zswap": (444_794.0, "estimate: zswap decompresses in RAM like zram; the zram figure measured on the CI VM"),
}


def media_from_name(name: str) -> str | None:
    """What a block device's name says it is, when it says (zram, nvme, virtio/xen disks)."""
    base = os.path.basename(name)
    if base.startswith("zram"):
        return "zram"
    if base.startswith("nvme"):
        return "nvme"
    if base.startswith(("vd", "xvd")):
        return "virtual"  # virtio/xen disks: the rotational flag says nothing about what is behind them
    return None


def classify_block_device(major: int, minor: int, sys_root: str = "/sys") -> dict:
    """{'name', 'media', 'rotational'} of the whole disk holding major:minor (live only)."""
    dev = Path(sys_root) / "dev" / "block" / f"{major}:{minor}"
    try:
        real = dev.resolve(strict=True)
    except OSError:
        return {"name": f"{major}:{minor}", "media": "unknown", "rotational": None}
    disk = real.parent if (real / "partition").exists() else real
    try:
        rotational = to_int((disk / "queue" / "rotational").read_text())
    except OSError:
        rotational = None
    media = media_from_name(disk.name)
    if media is None:
        media = {1: "rotational", 0: "ssd"}.get(rotational, "unknown")
    return {"name": disk.name, "media": media, "rotational": rotational}


def classify_swap_device(device: SwapDevice) -> dict:
    """Live: what backs a swap area (the disk under a swap file, or the partition's disk)."""
    name = device.name.replace("\\040", " ")
    try:
        st = os.stat(name)
    except OSError:
        return {"name": name, "media": media_from_name(name) or "unknown", "rotational": None, "disk": None}
    import stat as _stat
    dev = st.st_rdev if _stat.S_ISBLK(st.st_mode) else st.st_dev
    info = classify_block_device(os.major(dev), os.minor(dev))
    return {"name": name, "media": info["media"], "rotational": info["rotational"], "disk": info["name"]}


@dataclass
class SwapRate:
    pages_per_s: float
    media: str
    source: str           # where the default came from
    estimate: bool        # True when not measured by us
    page_cluster: int | None


def swapin_rate(media: str, page_cluster: int | None) -> SwapRate:
    """The default rate for a kind of device; block devices scale with the readahead window
    (2^page-cluster pages per read, measured at 3), zram and zswap do not read ahead."""
    key = media if media in SWAPIN_PAGES_PER_S else "rotational"  # unknown: assume the slowest kind
    rate, source = SWAPIN_PAGES_PER_S[key]
    if key != media:
        source = f"what backs the swap is not known ({media}): the rotational default is assumed; " + source
    if key not in ("zram", "zswap") and page_cluster is not None and 0 <= page_cluster <= 10 and page_cluster != 3:
        rate = rate * (1 << page_cluster) / 8
        # linear in the window: conservative below 3 (the CI VM's disk lost 5.5x, not 8x, at page-cluster 0)
        source += f"; scaled by 2^{page_cluster}/8 for vm.page-cluster={page_cluster}"
    return SwapRate(pages_per_s=rate, media=media, source=source, estimate="estimate" in source,
                    page_cluster=page_cluster)

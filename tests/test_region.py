"""The child's regions, in this process: real mappings of the kinds the reproducer offers."""
from __future__ import annotations

import os

from repro.region import map_region, mlock_range, munlock_range, prefault


def test_a_new_table_file_read_only_is_created_and_removed(tmp_path):
    path = tmp_path / "table.bin"
    region = map_region(8 << 20, f"file:{path}", "shared", writable=False)
    assert path.stat().st_size == 8 << 20
    result = prefault(region, threads=2)
    assert result["seconds"] >= 0
    region.close()
    assert not path.exists()  # this run created it


def test_the_users_table_file_is_kept(tmp_path):
    path = tmp_path / "table.bin"
    path.write_bytes(b"\x01" * (4 << 20))
    region = map_region(4 << 20, f"file:{path}", "private", writable=True)
    prefault(region, threads=1)
    region.close()
    assert path.read_bytes()[:1] == b"\x01"  # a private mapping never writes back


def test_prefault_makes_every_page_resident_and_non_zero():
    region = map_region(64 << 20, "anon", "private", writable=True, thp=False)
    try:
        rss_before = _rss()
        prefault(region, threads=2)
        assert _rss() - rss_before >= 60 << 20
        import ctypes
        view = (ctypes.c_char * region.size).from_address(region.addr)
        assert all(view[i] == b"\x5a" for i in range(0, region.size, 1 << 20))  # no zero page left behind
        mlock_range(region.addr, region.size)
        munlock_range(region.addr, region.size)
    finally:
        region.close()


def _rss() -> int:
    with open(f"/proc/{os.getpid()}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0

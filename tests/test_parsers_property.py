"""Every /proc and /sys parser is total: any text gives a result, never an exception, and a damaged
value is None and named as bad, never a silent 0 or 'unlimited'. Property tests over arbitrary text,
over the real captured files with one token damaged, and round trips of well-formed text.
Bounded: a few hundred examples per parser, no deadline (the suite stays within seconds)."""
from __future__ import annotations

import re
import string

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from diag import buddyinfo, cgroup, gpuprocs, kernel, limits, meminfo, nvidia, process, psi, swap, thp, vmstat, zoneinfo
from diag.parsing import to_float, to_int

from conftest import CI_SNAPSHOT, GPU_SNAPSHOT

FAST = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SNAP = GPU_SNAPSHOT / "root"

# text that looks like /proc: lines of words, numbers and the odd punctuation, and anything at all
proc_alphabet = string.ascii_letters + string.digits + " \t:_()[]=,.-+/\n"
proc_text = st.one_of(st.text(alphabet=proc_alphabet, max_size=400), st.text(max_size=200))
LINE_BREAKS = "\r\n\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
damage = st.one_of(st.sampled_from(["n/a", "", "-", "1e9", "0x10", "NaN", "inf", "１２", "12kB", "99999999999999999999x",
                                    "-5", " "]), st.text(alphabet=string.printable, max_size=8)).filter(
    lambda t: not any(c in LINE_BREAKS for c in t))  # a token, not new lines


def _damage_line(text: str, index: int, token: str) -> tuple[str, str]:
    """Replace the last number on one line that has a number; (new text, the line's key)."""
    lines = text.splitlines()
    numbered = [i for i, l in enumerate(lines) if re.search(r"\d+\s*(kB)?\s*$", l)]
    i = numbered[index % len(numbered)]
    lines[i] = re.sub(r"(\d+)(\s*(kB)?\s*)$", lambda m: token + m.group(2), lines[i])
    return "\n".join(lines) + "\n", lines[i]


@FAST
@given(proc_text)
@example("MemTotal: kB\n")
@example(":\n: 5\n")
def test_meminfo_is_total(text):
    m = meminfo.parse_meminfo(text)
    for value in m.raw.values():
        assert isinstance(value, int)


@FAST
@given(st.dictionaries(st.from_regex(r"[A-Za-z][A-Za-z_()]{0,15}", fullmatch=True), st.integers(0, 2**50),
                       min_size=1, max_size=20), st.booleans())
def test_meminfo_round_trip(values, with_unit):
    text = "".join(f"{k}: {v}{' kB' if with_unit else ''}\n" for k, v in values.items())
    m = meminfo.parse_meminfo(text)
    assert m.raw == {k: v * (1024 if with_unit else 1) for k, v in values.items()} and not m.bad


@FAST
@given(st.integers(0, 10_000), damage)
@example(0, "n/a")
@example(3, "0 ")  # found by Hypothesis: '0  kB' is still a value
@example(0, "１２")  # and non-ASCII digits are not
def test_meminfo_damaged_field_is_none_and_named(index, token):
    text, line = _damage_line((SNAP / "proc/meminfo").read_text(), index, token)
    m = meminfo.parse_meminfo(text)
    key = line.split(":")[0]
    # an oracle, not the parser; a negative figure is damage (no kernel prints one: psutil's -1 kB case)
    well_formed = re.fullmatch(r"[^:]+:[ \t]*[+]?[0-9]+([ \t]+kB)?[ \t]*", line)
    if not well_formed:
        if key in meminfo._FIELDS.values():
            attr = next(a for a, k in meminfo._FIELDS.items() if k == key)
            assert getattr(m, attr) is None and key in m.missing
        assert any(b.startswith(key.strip()) for b in m.bad), (line, m.bad)
    else:
        assert not m.bad


@FAST
@given(proc_text)
@example("pswpin\n")
def test_vmstat_is_total(text):
    v = vmstat.parse_vmstat(text)
    assert all(isinstance(x, int) for x in v.values())


@FAST
@given(st.dictionaries(st.from_regex(r"[a-z_]{1,20}", fullmatch=True), st.integers(-(2**40), 2**62), max_size=30))
def test_vmstat_round_trip(values):
    v = vmstat.parse_vmstat("".join(f"{k} {n}\n" for k, n in values.items()))
    assert dict(v) == values and not v.bad


@FAST
@given(proc_text)
@example("Node x, zone Normal\n")
@example("Node 0, zone\n  pages free 5\n")
def test_zoneinfo_is_total(text):
    for z in zoneinfo.parse_zoneinfo(text):
        assert all(isinstance(x, int) for x in z.fields.values())
        z.managed_bytes  # noqa: B018 - computing it must not fail


@FAST
@given(st.integers(0, 10_000), damage)
@example(2, "n/a")
@example(0, "")  # found by Hypothesis: a field left without its value was dropped silently
@example(0, "0\t0")  # and one with two values
def test_zoneinfo_damaged_value_is_named(index, token):
    text, line = _damage_line((SNAP / "proc/zoneinfo").read_text(), index, token)
    zones = zoneinfo.parse_zoneinfo(text)
    # per-CPU pagesets and the zone's tail (node_unreclaimable, start_pfn) are not this parser's:
    # issue 8's per-CPU reader reads them
    tail = ("cpu:", "count:", "high:", "batch:", "high_min:", "high_max:", "vm stats", "node_unreclaimable:",
            "start_pfn:")
    if to_int(token) is None and not line.strip().startswith(tail):
        assert zones.bad or any(z.bad for z in zones), line


@FAST
@given(proc_text)
@example("Node 0, zone Normal 1 -1 2\n")
def test_buddyinfo_is_total(text):
    for z in buddyinfo.parse_buddyinfo(text):
        assert all(isinstance(c, int) and c >= 0 for c in z.counts)
        assert 0 <= buddyinfo.unusable_free_index(z.counts, 9) <= 1
        index = buddyinfo.fragmentation_index(z.counts, 9)
        assert index is None or -1 <= index <= 1


@FAST
@given(st.lists(st.integers(0, 10**6), min_size=1, max_size=14), st.integers(0, 13))
def test_buddyinfo_round_trip_and_indices(counts, order):
    z = buddyinfo.parse_buddyinfo("Node 0, zone   Normal " + " ".join(map(str, counts)) + "\n")
    assert z[0].counts == counts and not z.bad
    free = sum(c << o for o, c in enumerate(counts))
    huge = buddyinfo.free_bytes_at_or_above(counts, order) // 4096
    assert huge <= free
    if free:
        assert buddyinfo.unusable_free_index(counts, order) == (free - huge) * 1000 // free / 1000


@FAST
@given(proc_text)
def test_pagetypeinfo_is_total(text):
    out = buddyinfo.parse_pagetypeinfo(text)
    assert all(all(isinstance(c, int) for c in v) for v in out["free"].values())


@FAST
@given(proc_text)
@example("some avg10=nan avg60=1 total=2\n")
@example("some avg10=-1\n")
def test_psi_is_total(text):
    p = psi.parse_psi(text)
    for row in p.values():
        assert all(v is None or (isinstance(v, (int, float)) and v >= 0) for v in row.values())


@FAST
@given(st.floats(0, 100, allow_nan=False), st.floats(0, 100, allow_nan=False), st.integers(0, 2**60))
def test_psi_round_trip(avg10, avg60, total):
    p = psi.parse_psi(f"some avg10={avg10:.2f} avg60={avg60:.2f} avg300=0.00 total={total}\n"
                      "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
    assert p["some"]["avg10"] == float(f"{avg10:.2f}") and p["some"]["total_us"] == total and not p.bad


@FAST
@given(st.text(max_size=60))
@example("6.11")
@example("６.１１.０")
def test_release_and_cmdline_are_total(text):
    rel = kernel.parse_release(text)
    assert rel is None or (len(rel) == 3 and all(isinstance(x, int) for x in rel))
    assert isinstance(kernel.parse_cmdline(text), dict)
    assert kernel.release_from_version(text) is None or isinstance(kernel.release_from_version(text), str)


@FAST
@given(st.text(max_size=80))
@example("[always] [never]")
@example("always [madvise never")
@example("[[]")  # found by Hypothesis: a bracket inside the selection
def test_thp_selected_is_total(text):
    value = thp.parse_selected(text)
    assert value is None or (value and "[" not in value and "]" not in value)


@FAST
@given(st.lists(st.sampled_from(["always", "madvise", "never", "defer", "defer+madvise"]), min_size=2, max_size=5,
                unique=True), st.data())
def test_thp_selected_round_trip(choices, data):
    chosen = data.draw(st.sampled_from(choices))
    text = " ".join(f"[{c}]" if c == chosen else c for c in choices)
    assert thp.parse_selected(text) == chosen


@FAST
@given(proc_text)
@example("Limit\nMax locked memory  lots  unlimited  bytes\n")
def test_limits_never_read_damage_as_unlimited(text):
    for name, (soft, hard) in limits.parse_limits(text).items():
        assert soft is None or isinstance(soft, int)
    for line in text.splitlines()[1:]:
        m = re.match(r"(Max [a-z ]+?)\s{2,}(\S+)\s+(\S+)", line)
        if m and m.group(2) != "unlimited" and to_int(m.group(2)) is None:
            assert m.group(1) not in limits.parse_limits(text) or limits.parse_limits(text)[m.group(1)][0] is not None


@FAST
@given(proc_text)
@example("Filename Type Size Used Priority\n/swap file x 0 -2\n")
def test_swaps_are_total(text):
    for d in swap.parse_swaps(text):
        assert d.size_bytes >= 0 and d.used_bytes >= 0


@FAST
@given(st.lists(st.tuples(st.from_regex(r"/[a-z0-9_/]{1,20}", fullmatch=True), st.integers(0, 2**40),
                          st.integers(0, 2**40), st.integers(-100, 100)), max_size=5))
def test_swaps_round_trip(rows):
    text = "Filename\tType\tSize\tUsed\tPriority\n" + "".join(f"{n}\tfile\t{s}\t{u}\t{p}\n" for n, s, u, p in rows)
    parsed = swap.parse_swaps(text)
    assert [(d.name, d.size_bytes, d.used_bytes, d.priority) for d in parsed] == [
        (n, s * 1024, u * 1024, p) for n, s, u, p in rows]


@FAST
@given(proc_text)
@example("x:memory:/a\n")
def test_cgroup_files_are_total(text):
    for hid, controllers, path in cgroup.parse_proc_cgroup(text):
        assert isinstance(hid, int) and path.startswith("/")
    for m in cgroup.parse_mountinfo(text):
        assert {"root", "mount_point", "fstype", "super_options"} <= set(m)
    assert all(isinstance(v, int) for v in cgroup.parse_kv(text).values())


@FAST
@given(proc_text)
@example("Threads:\tmany\nVmRSS:\t 12 MB\n")
def test_process_status_is_total(text):
    st_ = process.parse_status(text)
    assert st_.threads is None or isinstance(st_.threads, int)
    for attr in ("vm_rss_bytes", "vm_swap_bytes", "vm_lck_bytes", "vm_pin_bytes", "rss_shmem_bytes"):
        v = getattr(st_, attr)
        assert v is None or (isinstance(v, int) and v >= 0)
    assert isinstance(process.parse_stack(text), list)


@FAST
@given(proc_text)
def test_nvidia_files_are_total(text):
    v = nvidia.parse_version(text)
    assert v.version is None or all(isinstance(x, int) for x in v.version)
    assert isinstance(nvidia.parse_colon_kv(text), dict)


@FAST
@given(proc_text)
@example("4242, python3, lots MiB\n")
def test_compute_apps_are_total(text):
    for row in gpuprocs.parse_compute_apps(text):
        assert isinstance(row["pid"], int)
        assert row["used_gpu_memory_bytes"] is None or row["used_gpu_memory_bytes"] >= 0


@FAST
@given(st.text(max_size=20))
@example("1e3")
@example("nan")
def test_numbers(text):
    i = to_int(text)
    assert i is None or str(i) == text.strip().lstrip("+").lstrip("0") or i == 0 or text.strip().startswith(("+", "-", "0"))
    f = to_float(text)
    assert f is None or f == f


def test_the_captured_files_parse_without_damage():
    """Control: the real files have nothing bad in them, so a `bad` list above is the damage's doing."""
    for root in (SNAP, CI_SNAPSHOT / "root"):
        assert not meminfo.parse_meminfo((root / "proc/meminfo").read_text()).bad
        assert not vmstat.parse_vmstat((root / "proc/vmstat").read_text()).bad
        zones = zoneinfo.parse_zoneinfo((root / "proc/zoneinfo").read_text())
        assert not zones.bad and not any(z.bad for z in zones)
        assert not buddyinfo.parse_buddyinfo((root / "proc/buddyinfo").read_text()).bad
        assert not buddyinfo.parse_pagetypeinfo((root / "proc/pagetypeinfo").read_text())["bad"]
        assert not psi.parse_psi((root / "proc/pressure/memory").read_text()).bad
        assert not limits.parse_limits((root / "proc/self/limits").read_text()).bad
        assert not process.parse_status((root / "proc/self/status").read_text()).bad
        assert not cgroup.parse_proc_cgroup((root / "proc/self/cgroup").read_text()).bad
        assert not cgroup.parse_mountinfo((root / "proc/self/mountinfo").read_text()).bad

"""Property-based tests (Hypothesis) for what hostpin reads from people: sizes and rates on the
command line, manifest and result files of runs, and bundles. The property each time: the
answer is right, or the input is refused with hostpin's own error (exit 3 / 2 at the command
line), never anything else, and nothing outside the run is read or written.

Bounded for CI: a fixed number of examples per target, derandomized (the same examples every
run: CI stays reproducible); HYPOTHESIS_PROFILE=explore runs ten times as many, randomized.
Inputs that once broke a property are kept as @example cases.
(The /proc and /sys parsers' own properties are issue 9's tests.)"""
from __future__ import annotations

import io
import json
import os
import shutil
import stat
import tarfile
import tempfile
from fractions import Fraction
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, example, given, settings, strategies as st  # noqa: E402

from diag.runs import RunError, open_run_path  # noqa: E402
from diag import units  # noqa: E402
from diag.units import SizeError, parse_rate, parse_size  # noqa: E402

from conftest import FIXTURES  # noqa: E402
from test_hostile import hp  # noqa: E402

settings.register_profile("ci", derandomize=True, database=None, deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
settings.register_profile("explore", parent=settings.get_profile("ci"), derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
SCALE = 10 if os.environ.get("HYPOTHESIS_PROFILE") == "explore" else 1
MAX_SIZE = getattr(units, "MAX_SIZE", 1 << 60)  # 1 EiB

UNITS = {"": 1, "b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
         "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
unit_spellings = st.sampled_from(sorted(UNITS)).flatmap(
    lambda u: st.tuples(st.just(u), st.sampled_from(sorted({u, u.upper(), u.capitalize(), u[:-2].upper() + "iB"
                                                            if u.endswith("ib") else u.upper()}))))
hostile_text = st.one_of(
    st.text(max_size=40),
    st.text(alphabet="0123456789.eE+-_ /kKmMgGtTiIbBpagesP٣²", max_size=40),
    st.integers(min_value=0, max_value=10**400).map(str),
    st.tuples(st.integers(1, 9), st.integers(20, 330), st.sampled_from(["", ".5", ".0001"]),
              st.sampled_from(["", "GiB", "TB", "pages"])).map(lambda t: str(t[0]) * t[1] + t[2] + t[3]),
)


# -- sizes and rates ---------------------------------------------------------------------------------
@settings(max_examples=300 * SCALE)
@given(hostile_text)
@example("9" * 312 + "GiB")          # case 13: float('inf') then int() once raised OverflowError
@example("٣GiB")                     # a non-ASCII digit: \d matched it
@example("1" * 5000)                 # int() of over 4300 digits raises ValueError on 3.11
def test_parse_size_is_total(text):
    try:
        value = parse_size(text)
    except SizeError as exc:
        assert len(str(exc)) < 300  # the message names the value, cut short
        return
    assert isinstance(value, int) and 1 <= value <= MAX_SIZE


@settings(max_examples=300 * SCALE)
@given(st.integers(min_value=0, max_value=10**14), st.integers(min_value=0, max_value=99_999), unit_spellings,
       st.sampled_from(["", " "]))
@example(47, 2, ("gib", "GiB"), "")
def test_parse_size_is_exact(whole, frac, unit, space):
    key, spelled = unit
    number = f"{whole}.{frac}" if frac and key not in ("", "b") else str(whole)
    expected = round(Fraction(number) * UNITS[key])
    text = f"{number}{space}{spelled}"
    if expected < 1:
        with pytest.raises(SizeError, match="positive"):
            parse_size(text)
    elif expected > MAX_SIZE:
        with pytest.raises(SizeError, match="too large"):
            parse_size(text)
    else:
        assert parse_size(text) == expected


@settings(max_examples=300 * SCALE)
@given(st.one_of(hostile_text, hostile_text.map(lambda t: t + "/s"), hostile_text.map(lambda t: t + "pages/s")))
@example("9" * 5000 + "pages/s")
@example("²pages/s")                 # str.isdigit() is true for '²', int() refused it
def test_parse_rate_is_total(text):
    try:
        value = parse_rate(text)
    except SizeError:
        return
    assert isinstance(value, int) and 1 <= value <= MAX_SIZE


@settings(max_examples=200 * SCALE)
@given(st.integers(min_value=1, max_value=2**40), unit_spellings)
def test_parse_rate_is_exact(n, unit):
    key, spelled = unit
    assert parse_rate(f"{n}pages/s") == n * 4096
    expected = n * UNITS[key]
    if expected <= MAX_SIZE:
        assert parse_rate(f"{n}{spelled}/s") == expected


# -- manifest and result loading ---------------------------------------------------------------------
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-2**70, max_value=2**70) |
    st.floats(allow_nan=True, allow_infinity=True) |
    st.sampled_from(["../../../etc/passwd", "/etc/passwd", "root/../../x", ".", "", "result.json", "a\x00b",
                     "manifest.json", "root/proc/meminfo", "x" * 300, "ü/../ü"]) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=12)


def _mutate(doc, path, value):
    """doc with the value at path (a list of keys/indexes, the last one set) replaced."""
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(doc, dict):
        return {**doc, head: _mutate(doc.get(head), rest, value)}
    if isinstance(doc, list) and doc:
        i = head % len(doc) if isinstance(head, int) else 0
        return doc[:i] + [_mutate(doc[i], rest, value)] + doc[i + 1:]
    return value


MANIFEST_KEYS = ["entries", "argv", "command", "host", "complete", "partial", "pid", "started", "finished"]
ENTRY_KEYS = ["path", "kind", "size", "sha256", "skipped", "source", "reason", "open", "target", "started"]
manifest_paths = st.one_of(
    st.tuples(st.sampled_from(MANIFEST_KEYS)).map(list),
    st.tuples(st.just("entries"), st.integers(0, 50), st.sampled_from(ENTRY_KEYS)).map(list),
    st.tuples(st.just("entries"), st.integers(0, 50)).map(list),
    st.just([]),
)


def _fresh(name: str) -> tuple[Path, tempfile.TemporaryDirectory]:
    tmp = tempfile.TemporaryDirectory(prefix="hostpin-prop-")
    run = Path(tmp.name) / "run"
    shutil.copytree(FIXTURES / name, run)
    return run, tmp


def _opens_or_refuses(path) -> None:
    try:
        run = open_run_path(path)
    except RunError as exc:
        assert "\n" not in str(exc).strip()
        return
    try:
        assert isinstance(run.manifest["entries"], list) and isinstance(run.result, dict)
    finally:
        run.close()


@settings(max_examples=100 * SCALE)
@given(manifest_paths, json_values)
@example(["entries", 0, "path"], "result.jsonX/../../../../etc/shadow")  # case 2: a path that walks out
@example(["entries", 0, "path"], "/etc/shadow")
@example(["entries"], {"a": 1})
@example(["entries", 0, "size"], "12")
@example(["argv"], 7)
def test_manifest_loading_opens_or_refuses(path, value):
    run, tmp = _fresh("ci-repro-swap-mlock")
    with tmp:
        doc = json.loads((run / "manifest.json").read_text())
        (run / "manifest.json").write_text(json.dumps(_mutate(doc, path, value)))
        _opens_or_refuses(run)


@settings(max_examples=100 * SCALE)
@given(st.lists(st.one_of(json_values.map(json.dumps), st.text(max_size=30)), max_size=8), st.booleans())
@example(['{"run": {"command": 5}}'], False)
@example(['{"path": "x", "kind": "file", "size": 1, "sha256": null}', "{"], True)
def test_journal_loading_opens_or_refuses(lines, cut):
    run, tmp = _fresh("ci-repro-swap-mlock")
    with tmp:
        (run / "manifest.json").unlink()
        text = "\n".join(lines) + ("" if cut else "\n")
        (run / "manifest.jsonl").write_text(text)
        _opens_or_refuses(run)


RESULT_KEYS = ["command", "outcome", "verdict", "status", "rate_gib_s", "seconds", "ranks", "options", "stopped",
               "watchdog", "notes", "swapped_out_bytes", "facts", "checks", "plan", "pinned_pages", "rows", "summary",
               "cuda", "files"]


@settings(max_examples=80 * SCALE)
@given(st.sampled_from(["ci-repro-swap-mlock", "ci-preflight"]),
       st.one_of(st.tuples(st.sampled_from(RESULT_KEYS)).map(list),
                 st.tuples(st.sampled_from(["ranks", "checks", "options", "stopped", "facts"]), st.integers(0, 3),
                           st.text(max_size=8)).map(list), st.just([])),
       json_values)
@example("ci-repro-swap-mlock", ["rate_gib_s"], "fast")
@example("ci-preflight", ["checks", 0, "status"], None)
def test_report_of_any_result_is_rendered_or_refused_in_one_line(name, path, value):
    """result.json rewritten (its manifest entry too, so the run still verifies): `report`
    renders it or says in one line it could not evaluate it (exit 3)."""
    import hashlib
    run, tmp = _fresh(name)
    with tmp:
        doc = json.loads((run / "result.json").read_text())
        data = json.dumps(_mutate(doc, path, value)).encode()
        (run / "result.json").write_bytes(data)
        manifest = json.loads((run / "manifest.json").read_text())
        for e in manifest["entries"]:
            if e["path"] == "result.json":
                e.update(size=len(data), sha256=hashlib.sha256(data).hexdigest())
        (run / "manifest.json").write_text(json.dumps(manifest))
        r = hp("report", str(run), "--format", "text", "--no-picture")
        assert r.code in (0, 3), r.err
        assert "Traceback" not in r.err
        if r.code == 3:
            assert len(r.err.strip().splitlines()) == 1


# -- bundles ---------------------------------------------------------------------------------------
NAMES = ["run/manifest.json", "run/result.json", "run/root/proc/meminfo", "run/x", "run", "run/", ".", "./",
         "./run/x", "..", "../x", "run/../../x", "/tmp/hostpin-prop-outside", "run//y", "other/z", "run/a/../../b",
         "run/" + "d/" * 40 + "deep", "run/ü", "run/x/..", "run/\\..\\x"]
TYPES = [tarfile.REGTYPE, tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.FIFOTYPE, tarfile.CHRTYPE,
         tarfile.GNUTYPE_SPARSE, tarfile.CONTTYPE]
members = st.lists(st.tuples(st.sampled_from(NAMES), st.sampled_from(TYPES), st.binary(max_size=64),
                             st.sampled_from(["/etc/passwd", "../../x", "run/x", "/tmp"])), max_size=8)
damage = st.one_of(st.none(), st.tuples(st.just("cut"), st.floats(0, 1)),
                   st.tuples(st.just("flip"), st.floats(0, 1)))


def _tar_bytes(spec, base: bytes | None) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        if base is not None:
            with tarfile.open(fileobj=io.BytesIO(base)) as good:
                for m in good:
                    tar.addfile(m, good.extractfile(m) if m.isfile() else None)
        for name, kind, data, target in spec:
            info = tarfile.TarInfo(name)
            info.type = kind
            if kind in (tarfile.SYMTYPE, tarfile.LNKTYPE):
                info.linkname = target
            if kind in (tarfile.REGTYPE, tarfile.GNUTYPE_SPARSE, tarfile.CONTTYPE):
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                tar.addfile(info)
    return buf.getvalue()


_GOOD: dict[str, bytes] = {}


def _good_bundle() -> bytes:
    if "b" not in _GOOD:
        from diag.bundle import make_bundle
        with tempfile.TemporaryDirectory() as tmp:
            run = Path(tmp) / "run"
            shutil.copytree(FIXTURES / "ci-repro-swap-mlock", run)
            make_bundle(run, Path(tmp) / "b.tar.gz")
            _GOOD["b"] = (Path(tmp) / "b.tar.gz").read_bytes()
    return _GOOD["b"]


@settings(max_examples=120 * SCALE)
@given(members, st.booleans(), damage)
@example([(".", tarfile.DIRTYPE, b"", "")], True, None)               # case 13: a member named '.'
@example([("run/x", tarfile.SYMTYPE, b"", "/etc/passwd")], True, None)
@example([], True, ("cut", 0.5))                                      # case 8: truncated
@example([], True, ("flip", 0.5))                                     # case 8: corrupt middle
def test_bundle_reading_opens_or_refuses_and_never_leaves_its_directory(spec, with_good, harm):
    import gzip
    data = _tar_bytes(spec, gzip.decompress(_good_bundle()) if with_good else None)
    if harm is not None:
        kind, where = harm
        k = int(where * (len(data) - 1))
        data = data[:k] if kind == "cut" else data[:k] + bytes([data[k] ^ 0x5A]) + data[k + 1:]
    with tempfile.TemporaryDirectory(prefix="hostpin-prop-") as tmp:
        tmp = Path(tmp)
        (tmp / "unpack").mkdir()
        (tmp / "b.tar.gz").write_bytes(data)
        old = os.environ.get("TMPDIR")
        os.environ["TMPDIR"] = str(tmp / "unpack")
        tempfile.tempdir = None
        try:
            try:
                run = open_run_path(tmp / "b.tar.gz")
            except RunError as exc:
                assert "\n" not in str(exc).strip()
                run = None
            if run is not None:
                try:
                    assert tmp / "unpack" in run.path.parents
                    for p in run.path.rglob("*"):
                        mode = p.lstat().st_mode
                        assert stat.S_ISREG(mode) or stat.S_ISDIR(mode), p
                finally:
                    run.close()
            assert list((tmp / "unpack").iterdir()) == []          # nothing left unpacked
            assert sorted(p.name for p in tmp.iterdir()) == ["b.tar.gz", "unpack"]  # nothing beside it
            assert not Path("/tmp/hostpin-prop-outside").exists()
        finally:
            if old is None:
                os.environ.pop("TMPDIR", None)
            else:
                os.environ["TMPDIR"] = old
            tempfile.tempdir = None

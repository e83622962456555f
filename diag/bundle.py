"""`hostpin bundle`: one .tar.gz of a run to attach to a bug report.

Before packing, every file's size and sha256 are checked against the manifest; a file that
changed, is missing, is not in the manifest, or is a symbolic link stops the bundle (links are
never followed, nothing outside the run directory is read: diag.confined). A run that was
killed before it finished (no manifest.json, only its journal) is bundled as *partial*: the
entries its journal has are verified, the files it wrote but did not get to record (the
timeline it was appending to, a child's log) are packed with their size and sha256 taken
now and marked `recorded: false`, and the bundle's manifest says `partial: true` and when the
run last wrote anything (`killed_at`).

With redact=True, host names, IP and MAC addresses (colon and dash forms, BOOTIF=01-...),
user names, serial numbers, UUIDs, Kubernetes pod UIDs, container IDs and machine IDs are
replaced by tokens, the same value by the same token everywhere (file contents, file names,
every string of the manifest), and redactions.json in the bundle lists each token, its kind
and where it occurs (never the original). A redacted bundle carries a manifest of its own contents.

The bundle is written to a temporary file next to its destination and renamed over it, 0600.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import io
import json
import os
import re
import stat
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

from .confined import DEFAULT_LIMITS, Dir, Limits, PathRefused, open_dir, output_fd
from .evidence import ADDED, ManifestError, load_manifest, unrecorded_files, verify_manifest

__all__ = ["BundleError", "BundleMissing", "BundleOutputError", "make_bundle", "Redactor", "last_write"]


class BundleError(RuntimeError):
    """The run cannot be bundled (exit 3): damaged, unverifiable, or holding a link."""


class BundleMissing(BundleError):
    """The run directory named does not exist (exit 2)."""


class BundleOutputError(BundleError):
    """The bundle could not be written where asked (exit 3)."""


_HEX = "0-9A-Fa-f"
_PNG = b"\x89PNG\r\n\x1a\n"


class Redactor:
    """Finds identifiers in text and replaces each distinct value with a stable token."""

    # (kind, regex): group 1 when the regex has one, else the whole match
    PATTERNS = [
        # Kubernetes pod UIDs, in cgroup paths as pod<uid> (cgroupfs) or pod<uid with _> (systemd)
        ("POD", re.compile(rf"(?<![A-Za-z0-9])pod([{_HEX}]{{8}}[-_][{_HEX}]{{4}}[-_][{_HEX}]{{4}}[-_][{_HEX}]{{4}}"
                           rf"[-_][{_HEX}]{{12}})(?![{_HEX}])")),
        # container IDs: 64 hex after docker-, cri-containerd-, crio-, a '/' or containerd://
        ("CONTAINER", re.compile(rf"(?:(?<=[/-])|(?<=://))([0-9a-f]{{64}})(?![{_HEX}])")),
        # colon form: 6 octets (Ethernet), 8 (an EUI-64 GUID) up to 20 (an IPoIB hardware address);
        # 'eth0:52:54:...' (an interface name glued on) still counts, a longer hex run does not
        ("MAC", re.compile(rf"(?<![{_HEX}])(?<![{_HEX}]{{2}}:)[{_HEX}]{{2}}(?::[{_HEX}]{{2}}){{5,19}}"
                           rf"(?![{_HEX}])(?!:[{_HEX}])")),
        # an InfiniBand GUID as /sys/class/infiniband/*/node_guid writes it: 0c42:a103:007d:a2b6
        ("GUID", re.compile(rf"(?<![\w:])[{_HEX}]{{4}}(?::[{_HEX}]{{4}}){{3}}(?![\w:])")),
        # dash form, and PXE's BOOTIF=01-aa-bb-cc-dd-ee-ff (hardware type 01, then the address)
        ("MAC", re.compile(rf"(?<![{_HEX}:-])[{_HEX}]{{2}}(?:-[{_HEX}]{{2}}){{5,6}}(?![{_HEX}:-])")),
        ("UUID", re.compile(rf"(?<![{_HEX}])[{_HEX}]{{8}}-[{_HEX}]{{4}}-[{_HEX}]{{4}}-[{_HEX}]{{4}}-[{_HEX}]{{12}}"
                            rf"(?![{_HEX}])")),
        # /etc/machine-id and the like: 32 hex digits on their own
        ("MACHINE-ID", re.compile(rf"(?<![{_HEX}])(?:[0-9a-f]{{32}}|[0-9A-F]{{32}})(?![{_HEX}])")),
        # EC2-style names that spell the address: ip-10-1-2-3.ec2.internal, ip-10-1-2-3.eu-west-1.compute.internal
        ("HOST", re.compile(r"(?<![\w.-])ip-(?:\d{1,3}-){3}\d{1,3}(?:\.[A-Za-z0-9-]+)*(?![\w-])")),
        ("IP", re.compile(r"(?<![\w.])(?:(?:25[0-5]|2[0-4]\d|1?\d?\d)\.){3}(?:25[0-5]|2[0-4]\d|1?\d?\d)(?![\w.])")),
        # IPv6: the full form, or a compressed one with a group on each side of '::' (not '0::/'
        # of /proc/self/cgroup)
        ("IP", re.compile(r"(?<![\w:])(?:[0-9A-Fa-f]{1,4}:){7}[0-9A-Fa-f]{1,4}(?![\w:])"
                          r"|(?<![\w:])(?:[0-9A-Fa-f]{1,4}:){1,6}:[0-9A-Fa-f]{1,4}(?::[0-9A-Fa-f]{1,4})*(?![\w:])")),
    ]
    # identifiers that follow a label: (kind, regex with one group)
    LABELLED = [
        ("SERIAL", re.compile(r"(?im)^\s*(?:Serial Number|Chassis Serial Number|Board Serial|GPU PDI|Module Id)\s*:\s*"
                              r"(?!N/A)(\S+)\s*$")),
        ("USER", re.compile(r"\(([A-Za-z_][\w.-]{0,31})@[\w.-]*\)")),          # (builder@host) in /proc/version
        ("USER", re.compile(r"/home/([A-Za-z_][\w.-]{0,31})")),
        ("USER", re.compile(r"(?m)\bUSER=([A-Za-z_][\w.-]{0,31})")),
        ("HOST", re.compile(r"\([A-Za-z_][\w.-]{0,31}@([A-Za-z][\w.-]*)\)")),  # (builder@host)
        ("HOST", re.compile(r"(?m)^Linux (\S+) \d\S* #")),                        # uname -a
        ("HOST", re.compile(r"(?<![\w.])(?:hostname|fqdn|nodename)=([A-Za-z0-9][\w.-]*)")),  # cmdline, env
    ]
    KEEP = {"127.0.0.1", "0.0.0.0", "::", "::1", "255.255.255.255", "root", "00000000-0000-0000-0000-000000000000",
            "ff:ff:ff:ff:ff:ff", "00:00:00:00:00:00", "ff-ff-ff-ff-ff-ff", "00-00-00-00-00-00", "0" * 32}
    # where a host name lives; a short plain word (a host called 'vm' or 'gpu') is replaced only
    # there, so that '/proc/zoneinfo: vm stats threshold' is not mangled
    HOST_FILES = ("manifest.json", "result.json", "commands/uname.txt", "commands/dmesg.txt",
                  "root/proc/sys/kernel/hostname", "(directory name)", "redactions.json")
    # what may stand just before a value for it to be replaced: 'pod' glues onto a pod UID
    _BEFORE = {"POD": r"(?:(?<=pod)|(?<![A-Za-z0-9]))"}

    def __init__(self, hostnames: list[str] = ()):
        self.tokens: dict[str, str] = {}      # value -> token
        self.kinds: dict[str, str] = {}       # token -> kind
        self.counts: dict[str, int] = {}
        self.where: dict[str, set[str]] = {}
        self.node_names: set[str] = set()  # the node's own names: replaced in every file
        for h in hostnames:
            if h and len(h) >= 2:
                self._token("HOST", h)
                self.node_names.add(h)

    def _token(self, kind: str, value: str, aliases: tuple[str, ...] = ()) -> str:
        token = next((self.tokens[v] for v in (value, *aliases) if v in self.tokens), None)
        if token is None:
            n = sum(1 for k in self.kinds.values() if k == kind) + 1
            token = f"REDACTED-{kind}-{n}"
            self.kinds[token] = kind
        for v in (value, *aliases):
            self.tokens.setdefault(v, token)
        return token

    def learn(self, text: str) -> None:
        for kind, rx in self.LABELLED + self.PATTERNS:
            for m in rx.finditer(text):
                value = m.group(1) if rx.groups else m.group(0)
                if value in self.KEEP or value in self.tokens or len(value) < 2 or (kind == "IP" and _looks_like_version(value)):
                    continue
                if kind == "POD":  # the same UID spelled with '-' and with '_'
                    self._token(kind, value, (value.replace("_", "-"), value.replace("-", "_")))
                else:
                    self._token(kind, value)

    @staticmethod
    def _distinctive(value: str) -> bool:
        return len(value) >= 6 or any(c.isdigit() or c in "-." for c in value)

    def apply(self, text: str, where: str) -> str:
        # longest first, and only as a whole word: host 'vm' must not eat 'vmstat'
        for value, token in sorted(self.tokens.items(), key=lambda kv: -len(kv[0])):
            kind = self.kinds[token]
            before, after = self._BEFORE.get(kind, r"(?<![A-Za-z0-9])"), r"(?![A-Za-z0-9])"
            if kind == "HOST" and not self._distinctive(value) and where not in self.HOST_FILES:
                # a short plain name of this node ('alpha' in root=nfs:alpha:/export) still goes, as a
                # word of its own (not a path component or part of a name); under 4 letters ('vm',
                # 'gpu') it would eat kernel words, so it is left to the files where names live
                if value not in self.node_names or len(value) < 4:
                    continue
                before, after = r"(?<![\w/.-])", r"(?![\w/-])(?!\.\w)"
            # host names are case-insensitive (DNS): GPU-NODE-17 and Gpu-Node-17.cluster are the node too
            rx = re.compile(before + re.escape(value) + after, re.IGNORECASE if kind == "HOST" else 0)
            text, n = rx.subn(token, text)
            if n:
                self.counts[token] = self.counts.get(token, 0) + n
                self.where.setdefault(token, set()).add(where)
        return text

    def apply_all(self, value: Any, where: str) -> Any:
        """Every string inside a JSON value (the manifest's paths, sources, reasons, targets)."""
        if isinstance(value, str):
            return self.apply(value, where)
        if isinstance(value, list):
            return [self.apply_all(v, where) for v in value]
        if isinstance(value, dict):  # keys too: {"10.20.30.40": ...} is as telling as a value
            return {(self.apply(k, where) if isinstance(k, str) else k): (v if k == "sha256" else self.apply_all(v, where))
                    for k, v in value.items()}
        return value

    def listing(self) -> list[dict[str, Any]]:
        return [{"token": token, "kind": kind, "occurrences": self.counts.get(token, 0),
                 "files": sorted(self.where.get(token, ()))}
                for token, kind in sorted(self.kinds.items(), key=lambda kv: (kv[1], int(kv[0].rsplit("-", 1)[1])))]


def _looks_like_version(text: str) -> bool:
    # '580.159.04.1'-like dotted numbers with a part over 255 are not addresses; the IP regex
    # already rejects those, this keeps e.g. a 4-part driver build number safe
    return text.count(".") == 3 and any(len(p) > 3 for p in text.split("."))


def _iso(ts: float) -> str:
    return _dt.datetime.fromtimestamp(ts, _dt.timezone.utc).isoformat(timespec="milliseconds")


def last_write(d: Dir, manifest: dict[str, Any]) -> str | None:
    """When a run last wrote anything (its newest file, files added after it excepted)."""
    added = {e["path"] for e in manifest["entries"] if e.get("added_after_run")} | {ADDED}
    times = [st.st_mtime for rel, st in d.walk() if stat.S_ISREG(st.st_mode) and rel not in added]
    return _iso(max(times)) if times else None


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def make_bundle(run_dir: Path | str, out_file: Path | str | None = None, redact: bool = False,
                limits: Limits = DEFAULT_LIMITS) -> dict[str, Any]:
    run_dir = Path(run_dir)
    if not os.path.lexists(run_dir):
        raise BundleMissing(f"{run_dir} does not exist; give a run directory (hostpin-runs/...)")
    try:
        d = open_dir(run_dir, limits, follow_last=False)
    except PathRefused as exc:
        raise BundleError(f"refusing to bundle: {exc}") from None
    except OSError as exc:
        raise BundleError(f"{run_dir} could not be read: {exc.strerror}") from None
    try:
        return _make(d, run_dir, out_file, redact)
    except ManifestError as exc:
        raise BundleError(f"{run_dir} could not be read: {exc}") from None
    except PathRefused as exc:
        raise BundleError(f"refusing to bundle: {exc}") from None
    finally:
        d.close()


def _make(d: Dir, run_dir: Path, out_file, redact: bool) -> dict[str, Any]:
    manifest = load_manifest(d)
    partial = not manifest.get("complete", True) or bool(manifest.get("partial"))
    problems = verify_manifest(d, manifest)
    if problems:
        raise BundleError("the run does not match its manifest, so it cannot be vouched for: " + "; ".join(problems[:10]))
    # verifying read every file once, under the limit; packing reads each again: the limit is on the
    # run's size, so the second reading starts from zero (it counted every byte twice)
    d.bytes_read = 0
    for rel, st in d.walk():
        if stat.S_ISLNK(st.st_mode):
            raise BundleError(f"refusing to bundle: {rel} is a symbolic link (a bundle never follows links)")
        if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
            raise BundleError(f"refusing to bundle: {rel} is not a regular file")
    on_disk = {rel for rel, st in d.walk() if stat.S_ISREG(st.st_mode)}
    unlisted = [rel for rel, _ in unrecorded_files(d, manifest)]
    if unlisted and not partial:
        raise BundleError("files not in the manifest cannot be vouched for: " + ", ".join(unlisted[:10])
                          + " (a finished run records every file hostpin writes, so these were put there later; "
                          "hostpin report registers its own)")
    latest: dict[str, dict] = {}
    for e in manifest["entries"]:
        latest[e["path"]] = e
    contents: dict[str, bytes] = {}
    entries: list[dict[str, Any]] = []
    for rel, e in latest.items():
        if e.get("skipped") or e.get("kind") == "dir":
            entries.append(e)
            continue
        if rel not in on_disk:
            continue
        data = d.read_bytes(rel)
        if not e.get("open") and (len(data) != e["size"] or _sha(data) != e["sha256"]):
            raise BundleError(f"{rel} changed while it was being bundled; try again")
        contents[rel] = data
        if e.get("open"):  # a stream the killed run was still appending to
            e = dict(e, size=len(data), sha256=_sha(data), open=False, recorded=False,
                     reason="the run was killed while writing it: size and sha256 taken when bundled")
        entries.append(e)
    for rel in unlisted:  # partial only
        data = d.read_bytes(rel)
        contents[rel] = data
        entries.append({"path": rel, "kind": "unrecorded", "size": len(data), "sha256": _sha(data), "skipped": False,
                        "recorded": False, "reason": "written by the run, which was killed before it recorded it; "
                                                     "size and sha256 taken when bundled"})
    name = run_dir.resolve().name if run_dir.name in ("", ".", "..") else run_dir.name
    extra: dict[str, Any] = {}
    if partial:
        extra = {"complete": False, "partial": True, "killed_at": manifest.get("killed_at") or last_write(d, manifest),
                 "unrecorded": sorted(unlisted + [e["path"] for e in entries if e.get("recorded") is False
                                                  and e["path"] not in unlisted]),
                 "bundled": _iso(time.time())}
    redactor = None
    if redact:
        redactor, name, contents, entries, manifest = _redact(d, name, manifest, contents, entries)
        new_manifest = dict(manifest, **redactor.apply_all(extra, "manifest.json"), entries=entries, redacted=True)
        new_manifest.pop("journal_cut", None)
        contents["redactions.json"] = (json.dumps({"note": "each token stands for one original value, the same "
                                                   "value everywhere; the originals are not in this bundle",
                                                   "tokens": redactor.listing()}, indent=1) + "\n").encode()
        new_manifest["entries"].append({"path": "redactions.json", "kind": "redactions",
                                        "size": len(contents["redactions.json"]),
                                        "sha256": _sha(contents["redactions.json"]), "skipped": False})
        contents["manifest.json"] = json.dumps(new_manifest, indent=1, sort_keys=True).encode()
    elif partial:
        new_manifest = dict(manifest, **extra, entries=entries)
        new_manifest.pop("journal_cut", None)
        contents["manifest.json"] = json.dumps(new_manifest, indent=1, sort_keys=True).encode()
        contents["manifest.jsonl"] = d.read_bytes("manifest.jsonl")  # the journal itself, as it was
    else:
        for rel in ("manifest.json", "manifest.jsonl", ADDED):
            if rel in on_disk:
                contents[rel] = d.read_bytes(rel)
    out = Path(out_file) if out_file else Path(f"{name}.tar.gz")
    size, streamed = _write_tar(out, name, contents)
    return {"bundle": str(out), "streamed": streamed, "files": len(contents), "bytes": size, "verified": True,
            "partial": partial, "killed_at": extra.get("killed_at"),
            "stopped": manifest.get("stopped") if partial and isinstance(manifest.get("stopped"), dict) else None, "unrecorded": extra.get("unrecorded", []),
            "redacted": redact, "redactions": redactor.listing() if redactor else None}


def _redact(d: Dir, name: str, manifest: dict, contents: dict[str, bytes], entries: list[dict]):
    hosts = [manifest.get("host") or ""]
    if "root/proc/sys/kernel/hostname" in contents:
        hosts.append(contents["root/proc/sys/kernel/hostname"].decode("utf-8", "replace").strip())
    domain = contents.get("root/proc/sys/kernel/domainname", b"").decode("utf-8", "replace").strip()
    domains = [domain] if domain and domain != "(none)" and len(domain) >= 4 else []  # the FQDN often ends in it
    redactor = Redactor([h.split(".")[0] for h in hosts if h] + [h for h in hosts if h] + domains)
    # every file is redacted as text, whatever its encoding: bytes that are not UTF-8 decode to
    # lone surrogates (surrogateescape), which no pattern matches and which encode back to the
    # same bytes, so one bad byte no longer exempts a whole file. A picture (PNG) cannot be
    # rewritten without breaking it and may carry a verdict naming the node: it is left out.
    texts: dict[str, str] = {}
    omitted: set[str] = set()
    # a report hostpin rendered from the run is a view of it, whose table cells name the node in
    # forms no pattern can tell from words ("| host | vm |"): it is left out, `report` remakes it
    reports = {e.get("path") for e in entries if e.get("kind") == "report"}
    for rel, data in contents.items():
        if data.startswith(_PNG) or rel in reports:
            omitted.add(rel)
            continue
        texts[rel] = data.decode("utf-8", "surrogateescape")
        redactor.learn(texts[rel])
    redactor.learn(json.dumps(manifest, sort_keys=True))
    redactor.learn(name)
    out: dict[str, bytes] = {}
    renamed: dict[str, str] = {}
    for rel in texts:
        new_rel = redactor.apply(rel, "(file name)")
        renamed[rel] = new_rel
        out[new_rel] = redactor.apply(texts[rel], rel).encode("utf-8", "surrogateescape")
    new_entries = []
    for e in entries:
        e2 = redactor.apply_all(e, "manifest.json")
        e2["path"] = renamed.get(e["path"], e2["path"])
        if e["path"] in renamed:
            data = out[renamed[e["path"]]]
            e2.update(size=len(data), sha256=_sha(data), redacted=True)
        elif e["path"] in omitted:
            e2.update(skipped=True, size=0, sha256=None, redacted=True,
                      reason="left out of a redacted bundle: " + (
                          "a report names the node; hostpin report remakes it from the redacted run"
                          if e["path"] in reports else "a picture cannot be redacted"))
        new_entries.append(e2)
    new_name = redactor.apply(name, "(directory name)")
    top = {k: v for k, v in manifest.items() if k != "entries"}
    new_manifest = dict(redactor.apply_all(top, "manifest.json"), entries=[])
    return redactor, new_name, out, new_entries, new_manifest


class _Counted:
    """A binary file that counts what goes through it (a pipe cannot say its size afterwards)."""

    def __init__(self, fh):
        self.fh, self.n = fh, 0

    def write(self, data) -> int:
        self.fh.write(data)
        self.n += len(data)
        return len(data)

    def flush(self) -> None:
        self.fh.flush()


def _tar_into(fh, name: str, contents: dict[str, bytes]) -> int:
    counted = _Counted(fh)
    with tarfile.open(fileobj=counted, mode="w:gz") as tar:
        now = int(time.time())
        for rel, data in sorted(contents.items()):
            info = tarfile.TarInfo(f"{name}/{rel}")
            info.size = len(data)
            info.mtime = now
            info.mode = 0o600
            tar.addfile(info, io.BytesIO(data))
    fh.flush()
    return counted.n


def _write_tar(out: Path, name: str, contents: dict[str, bytes]) -> tuple[int, bool]:
    """Written next to out under a temporary name, fsynced, renamed over it (0600), or through a
    pipe or terminal (`-o -`, /dev/stdout). Only a regular file is ever replaced: a link, a device
    such as /dev/full, a directory or a pipe nobody reads is refused, never turned into a file."""
    parent = out.parent if str(out.parent) else Path(".")
    try:
        fd = output_fd(out)
    except PathRefused as exc:
        raise BundleOutputError(f"cannot write the bundle {out}: {exc}") from None
    except OSError as exc:
        raise BundleOutputError(f"cannot write the bundle {out}: {exc.strerror}") from None
    if fd is not None:
        try:
            with os.fdopen(fd, "wb") as fh:
                return _tar_into(fh, name, contents), True
        except OSError as exc:
            raise BundleOutputError(f"cannot write the bundle {out}: {exc.strerror}") from None
    if os.path.islink(out):
        raise BundleOutputError(f"cannot write the bundle {out}: a symbolic link (to {os.readlink(out)!r}): never "
                                "followed nor replaced; give the file itself, or remove the link")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=parent)
    except OSError as exc:
        raise BundleOutputError(f"cannot write the bundle {out}: {exc.strerror} ({parent})") from None
    try:
        with os.fdopen(fd, "wb") as fh:
            size = _tar_into(fh, name, contents)
            os.fsync(fh.fileno())
        os.replace(tmp, out)
        return size, False
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise BundleOutputError(f"cannot write the bundle {out}: {exc.strerror}") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise

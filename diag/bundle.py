"""`hostpin bundle`: one .tar.gz of a run to attach to a bug report.

Before packing, every file's size and sha256 are checked against the manifest; a file that
changed, is missing, is not in the manifest, or is a symbolic link stops the bundle (links are
never followed, nothing outside the run directory is read). With redact=True, host names, IP
and MAC addresses, user names, serial numbers and UUIDs are replaced by tokens, the same value
by the same token everywhere, and redactions.json in the bundle lists each token, its kind and
where it occurs (never the original). A redacted bundle carries a manifest of its own contents.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import re
import tarfile
import time
from pathlib import Path
from typing import Any

from .evidence import load_manifest, verify_manifest

__all__ = ["BundleError", "make_bundle", "Redactor"]

_MANIFESTS = {"manifest.json", "manifest.jsonl"}


class BundleError(RuntimeError):
    pass


class Redactor:
    """Finds identifiers in text and replaces each distinct value with a stable token."""

    PATTERNS = [
        ("MAC", re.compile(r"(?<![0-9A-Fa-f:])[0-9A-Fa-f]{2}(?::[0-9A-Fa-f]{2}){5}(?![0-9A-Fa-f:])")),
        ("UUID", re.compile(r"(?<![0-9A-Fa-f])[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}"
                            r"(?![0-9A-Fa-f])")),
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
    ]
    KEEP = {"127.0.0.1", "0.0.0.0", "::", "::1", "255.255.255.255", "root", "00000000-0000-0000-0000-000000000000",
            "ff:ff:ff:ff:ff:ff", "00:00:00:00:00:00"}
    # where a host name lives; a short plain word (a host called 'vm' or 'gpu') is replaced only
    # there, so that '/proc/zoneinfo: vm stats threshold' is not mangled
    HOST_FILES = ("manifest.json", "result.json", "commands/uname.txt", "commands/dmesg.txt",
                  "root/proc/sys/kernel/hostname", "(directory name)", "redactions.json")

    def __init__(self, hostnames: list[str] = ()):
        self.tokens: dict[tuple[str, str], str] = {}
        self.counts: dict[str, int] = {}
        self.where: dict[str, set[str]] = {}
        for h in hostnames:
            if h and len(h) >= 2:
                self._token("HOST", h)

    def _token(self, kind: str, value: str) -> str:
        key = (kind, value)
        if key not in self.tokens:
            n = sum(1 for k in self.tokens if k[0] == kind) + 1
            self.tokens[key] = f"REDACTED-{kind}-{n}"
        return self.tokens[key]

    def learn(self, text: str) -> None:
        for kind, rx in self.PATTERNS:
            for m in rx.finditer(text):
                if m.group(0) not in self.KEEP and not _looks_like_version(m.group(0)):
                    self._token(kind, m.group(0))
        for kind, rx in self.LABELLED:
            for m in rx.finditer(text):
                value = m.group(1)
                if value not in self.KEEP and len(value) >= 2:
                    self._token(kind, value)

    @staticmethod
    def _distinctive(value: str) -> bool:
        return len(value) >= 6 or any(c.isdigit() or c in "-." for c in value)

    def apply(self, text: str, where: str) -> str:
        # longest first, and only as a whole word: host 'vm' must not eat 'vmstat'
        for (kind, value), token in sorted(self.tokens.items(), key=lambda kv: -len(kv[0][1])):
            if kind == "HOST" and not self._distinctive(value) and where not in self.HOST_FILES:
                continue
            rx = re.compile(r"(?<![A-Za-z0-9])" + re.escape(value) + r"(?![A-Za-z0-9])")
            text, n = rx.subn(token, text)
            if n:
                self.counts[token] = self.counts.get(token, 0) + n
                self.where.setdefault(token, set()).add(where)
        return text

    def listing(self) -> list[dict[str, Any]]:
        return [{"token": token, "kind": kind, "occurrences": self.counts.get(token, 0),
                 "files": sorted(self.where.get(token, ()))} for (kind, _), token in
                sorted(self.tokens.items(), key=lambda kv: kv[1])]


def _looks_like_version(text: str) -> bool:
    # '580.159.04.1'-like dotted numbers with a part over 255 are not addresses; the IP regex
    # already rejects those, this keeps e.g. a 4-part driver build number safe
    return text.count(".") == 3 and any(len(p) > 3 for p in text.split("."))


def _walk(run_dir: Path) -> list[str]:
    out = []
    for dirpath, dirnames, filenames in os.walk(run_dir, followlinks=False):
        for name in dirnames + filenames:
            full = Path(dirpath) / name
            rel = str(full.relative_to(run_dir))
            if full.is_symlink():
                raise BundleError(f"refusing to bundle: {rel} is a symbolic link (a bundle never follows links)")
            if not (full.is_dir() or full.is_file()):
                raise BundleError(f"refusing to bundle: {rel} is not a regular file")
            if full.is_file():
                out.append(rel)
    return sorted(out)


def make_bundle(run_dir: Path | str, out_file: Path | str | None = None, redact: bool = False) -> dict[str, Any]:
    run_dir = Path(run_dir)
    if not run_dir.is_dir() or not (run_dir / "manifest.json").exists():
        raise BundleError(f"{run_dir} is not a finished run directory (no manifest.json)")
    if run_dir.is_symlink():
        raise BundleError(f"refusing to bundle: {run_dir} is a symbolic link")
    problems = verify_manifest(run_dir)
    if problems:
        raise BundleError("the run does not match its manifest, so it cannot be vouched for: " + "; ".join(problems[:10]))
    manifest = load_manifest(run_dir)
    listed = {e["path"] for e in manifest["entries"] if not e.get("skipped")}
    files = _walk(run_dir)
    unlisted = [f for f in files if f not in listed and f not in _MANIFESTS]
    if unlisted:
        raise BundleError("files not in the manifest cannot be verified: " + ", ".join(unlisted[:10])
                          + " (remove them, or add a report with `hostpin report`, which registers its files)")
    name = run_dir.name
    redactor = None
    contents: dict[str, bytes] = {rel: (run_dir / rel).read_bytes() for rel in files if rel not in _MANIFESTS}
    if redact:
        hosts = [manifest.get("host") or ""]
        hostname_file = run_dir / "root/proc/sys/kernel/hostname"
        if hostname_file.exists():
            hosts.append(hostname_file.read_text().strip())
        redactor = Redactor([h.split(".")[0] for h in hosts if h] + [h for h in hosts if h])
        texts = {}
        for rel, data in contents.items():
            try:
                texts[rel] = data.decode("utf-8")
            except UnicodeDecodeError:
                continue
            redactor.learn(texts[rel])
        redactor.learn(json.dumps(manifest.get("argv", [])))
        for rel, text in texts.items():
            contents[rel] = redactor.apply(text, rel).encode()
        name = redactor.apply(name, "(directory name)")
        entries = []
        by_path = {e["path"]: e for e in manifest["entries"]}
        for rel, data in sorted(contents.items()):
            e = dict(by_path.get(rel, {"path": rel, "kind": "file"}))
            e.update(size=len(data), sha256=hashlib.sha256(data).hexdigest(), redacted=rel in texts)
            if e.get("source"):
                e["source"] = redactor.apply(e["source"], "manifest.json")
            entries.append(e)
        entries += [e for e in manifest["entries"] if e.get("skipped")]
        new_manifest = dict(manifest, entries=entries, redacted=True,
                            host=redactor.apply(manifest.get("host") or "", "manifest.json"),
                            argv=[redactor.apply(a, "manifest.json") for a in manifest.get("argv", [])])
        contents["redactions.json"] = (json.dumps({"note": "each token stands for one original value, the same "
                                                   "value everywhere; the originals are not in this bundle",
                                                   "tokens": redactor.listing()}, indent=1) + "\n").encode()
        new_manifest["entries"].append({"path": "redactions.json", "kind": "redactions", "size": len(contents["redactions.json"]),
                                        "sha256": hashlib.sha256(contents["redactions.json"]).hexdigest(),
                                        "skipped": False})
        contents["manifest.json"] = json.dumps(new_manifest, indent=1, sort_keys=True).encode()
    else:
        for rel in _MANIFESTS:
            if (run_dir / rel).exists():
                contents[rel] = (run_dir / rel).read_bytes()
    out = Path(out_file) if out_file else Path(f"{name}.tar.gz")
    with tarfile.open(out, "w:gz") as tar:
        for rel, data in sorted(contents.items()):
            info = tarfile.TarInfo(f"{name}/{rel}")
            info.size = len(data)
            info.mtime = int(time.time())
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    return {"bundle": str(out), "files": len(contents), "bytes": out.stat().st_size, "verified": True,
            "redacted": redact, "redactions": redactor.listing() if redactor else None}

"""Opening a finished run for reading: a run directory or a bundle (.tar.gz) made by `hostpin bundle`.

A bundle is unpacked into a temporary directory after every member is checked (regular files
and directories only, no absolute paths, nothing outside the run), then its manifest is
verified like a directory's.
"""
from __future__ import annotations

import json
import shutil
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .evidence import load_manifest, verify_manifest
from .facts import node_facts
from .rootfs import Root

__all__ = ["Run", "open_run_path", "RunError"]


class RunError(RuntimeError):
    pass


@dataclass
class Run:
    path: Path                      # the run directory (unpacked, for a bundle)
    source: str                     # what the user named
    manifest: dict[str, Any]
    result: dict[str, Any]
    problems: list[str] = field(default_factory=list)  # manifest verification
    _tmp: str | None = None
    _facts: dict[str, Any] | None = None

    @property
    def command(self) -> str:
        return self.result.get("command") or self.manifest.get("command") or "unknown"

    @property
    def status(self) -> str:
        return str(self.result.get("status") or self.result.get("outcome") or "unknown")

    def facts(self) -> dict[str, Any]:
        """The facts the run recorded, completed from its root/ tree (read once)."""
        if self._facts is not None:
            return self._facts
        facts = dict(self.result.get("facts") or {})
        root = self.path / "root"
        if root.is_dir():
            fresh = node_facts(Root(root))
            for key, value in fresh.items():
                if facts.get(key) is None:
                    facts[key] = value
        if not facts.get("host"):
            facts["host"] = self.manifest.get("host")
        self._facts = facts
        return facts

    def read_jsonl(self, rel: str) -> list[dict]:
        path = self.path / rel
        if not path.is_file():
            return []
        out = []
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                break  # a killed run's last line may be cut
        return out

    def close(self) -> None:
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None


def _safe_extract(bundle: Path, dest: Path) -> Path:
    with tarfile.open(bundle, "r:gz") as tar:
        members = tar.getmembers()
        tops = set()
        for m in members:
            name = Path(m.name)
            if name.is_absolute() or ".." in name.parts:
                raise RunError(f"{bundle}: member {m.name!r} points outside the bundle; refusing it")
            if not (m.isfile() or m.isdir()):
                raise RunError(f"{bundle}: member {m.name!r} is not a regular file or directory; refusing it")
            tops.add(name.parts[0])
        if len(tops) != 1:
            raise RunError(f"{bundle}: expected one run directory inside, found {sorted(tops)}")
        for m in members:
            tar.extract(m, dest, set_attrs=False)
    return dest / tops.pop()


def open_run_path(path: Path | str) -> Run:
    p = Path(path)
    tmp = None
    if p.is_file():
        if not tarfile.is_tarfile(p):
            raise RunError(f"{p} is neither a run directory nor a hostpin bundle (.tar.gz)")
        tmp = tempfile.mkdtemp(prefix="hostpin-bundle-")
        try:
            p = _safe_extract(Path(path), Path(tmp))
        except (RunError, tarfile.TarError) as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            raise RunError(str(exc)) from None
    elif not p.is_dir():
        raise RunError(f"{p} does not exist; give a run directory (hostpin-runs/...) or a bundle")
    if not (p / "manifest.json").exists() and not (p / "manifest.jsonl").exists():
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
        raise RunError(f"{p} has no manifest: not a hostpin run directory")
    manifest = load_manifest(p)
    result = {}
    if (p / "result.json").exists():
        try:
            result = json.loads((p / "result.json").read_text())
        except json.JSONDecodeError:
            result = {}
    return Run(path=p, source=str(path), manifest=manifest, result=result, problems=verify_manifest(p), _tmp=tmp)

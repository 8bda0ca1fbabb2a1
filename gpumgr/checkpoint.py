"""The ledger on disk.

Versioned JSON with a SHA-256 checksum, written atomically: temp file (mode 0600) + fsync, the current file
hard-linked to `<name>.prev` (the previous generation), rename over the current file, fsync of the directory.
At every instant a complete current file exists. Loading a truncated, corrupted or future-version file raises
a clear error for that file and falls back to the previous generation; with both bad it raises, never yielding
an empty ledger silently.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpumgr.allocator import Ledger, LedgerError

FORMAT = "gpumgr-checkpoint"
VERSION = 1
FILE_NAME = "gpumgr_checkpoint.json"


class CheckpointError(Exception):
    """A checkpoint file cannot be used; the message names the file and the reason."""


def checksum(body: dict[str, Any]) -> str:
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    return "sha256:" + hashlib.sha256(canonical).hexdigest()


def encode(ledger: Ledger, generation: int, node: str = "") -> bytes:
    body = {
        "format": FORMAT,
        "version": VERSION,
        "generation": generation,
        "node": node,
        "written_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "ledger": ledger.to_json(),
    }
    return (json.dumps({**body, "checksum": checksum(body)}, sort_keys=True, separators=(",", ":")) + "\n").encode()


def decode(data: bytes, source: str) -> Snapshot:
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{source}: not valid JSON (truncated or corrupted?): {e}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise CheckpointError(f"{source}: not a gpumgr checkpoint (format field missing or wrong)")
    version = doc.get("version")
    if not isinstance(version, int):
        raise CheckpointError(f"{source}: version field missing")
    if version > VERSION:
        raise CheckpointError(
            f"{source}: written by a newer gpumgr (format version {version}, this one reads up to {VERSION})"
        )
    claimed = doc.pop("checksum", None)
    if claimed != checksum(doc):
        raise CheckpointError(f"{source}: checksum mismatch (file was modified or damaged)")
    try:
        ledger = Ledger.from_json(doc["ledger"])
    except (KeyError, LedgerError) as e:
        raise CheckpointError(f"{source}: inconsistent ledger: {e}") from None
    return Snapshot(ledger=ledger, generation=int(doc.get("generation", 0)), node=str(doc.get("node", "")),
                    written_at=str(doc.get("written_at", "")), path=source)


class CheckpointStore:
    """One checkpoint file (and its previous generation) in a directory."""

    def __init__(self, directory: Path | str, name: str = FILE_NAME):
        self.dir = Path(directory)
        self.path = self.dir / name
        self.prev = self.dir / (name + ".prev")
        self.generation = 0

    def save(self, ledger: Ledger, node: str = "") -> int:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.generation += 1
        data = encode(ledger, self.generation, node)
        tmp = self.dir / f".{self.path.name}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        if self.path.exists():
            link = self.dir / f".{self.prev.name}.{os.getpid()}.tmp"
            link.unlink(missing_ok=True)
            os.link(self.path, link)
            os.replace(link, self.prev)
        os.replace(tmp, self.path)
        dfd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
        return self.generation

    def load(self) -> LoadResult:
        """The newest usable generation. No files at all: an empty result (a first start)."""
        problems: list[str] = []
        for path in (self.path, self.prev):
            if not path.exists():
                continue
            try:
                snap = decode(path.read_bytes(), str(path))
            except (CheckpointError, OSError) as e:
                problems.append(str(e))
                continue
            self.generation = max(self.generation, snap.generation)
            return LoadResult(snapshot=snap, problems=problems)
        if problems:
            raise CheckpointError("no usable checkpoint: " + "; ".join(problems))
        return LoadResult(snapshot=None, problems=[])


@dataclass(frozen=True)
class Snapshot:
    ledger: Ledger
    generation: int
    node: str
    written_at: str
    path: str


@dataclass(frozen=True)
class LoadResult:
    snapshot: Snapshot | None  # None: no checkpoint existed
    problems: list[str] = field(default_factory=list)  # files skipped, with reasons

    @property
    def fell_back(self) -> bool:
        return bool(self.problems) and self.snapshot is not None

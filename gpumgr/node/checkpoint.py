"""The ledger on disk.

Versioned JSON with a SHA-256 checksum, written atomically: temp file (mode 0600) + fsync, the current file
hard-linked to `<name>.prev` (the previous generation), rename over the current file, fsync of the directory.
At every instant a complete current file exists. Loading a truncated, corrupted, future-version, malformed or
another node's file raises a clear error for that file and falls back to the previous generation; with both bad
it raises, never yielding an empty ledger silently. `decode` is the one validation: the agent's load and
`gpumgr checkpoint verify` both go through `CheckpointStore.examine`, so they always agree. After a load that
skipped an unusable current file, the next save does not turn that file into `.prev`: the good previous
generation stays until a good current one replaces it. After loading a version 1 file, the first save writes the
new generation to both files: a `.prev` of version 1 would be what an older gpumgr falls back to (it refuses
version 2), bringing back whatever that first write released.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

from gpumgr.allocator import Ledger, LedgerError
from gpumgr.files.write import write_new
from gpumgr.vdevice.layout import BadName, check_key

FORMAT = "gpumgr-checkpoint"
VERSION = 2  # 2: typed allocation records; 1 (a map of string labels, `meta`) is still read
FILE_NAME = "gpumgr_checkpoint.json"
MAX_BYTES = 64 << 20  # a ledger of 1024 cards and 100000 allocations is far below this
MAX_DEPTH = 16  # what gpumgr writes is 5 deep (document, ledger, allocations, allocation, holder or ids)
MAX_CARDS = 1024
MAX_ALLOCATIONS = 100_000
MAX_GENERATION = 2**62
_DOCUMENT_FIELDS = frozenset({"format", "version", "generation", "node", "written_at", "ledger"})


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
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
    digest = "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()
    # the file is the canonical JSON of the whole document: "checksum" sorts before every other key, so it is the
    # body's canonical text with the checksum put first (one encoding of the ledger, not two)
    return ('{"checksum":' + json.dumps(digest) + "," + canonical[1:] + "\n").encode()


def decode(data: bytes, source: str, expected_node: str | None = None) -> Snapshot:
    """The snapshot in `data`, checked with every rule the agent relies on, or CheckpointError naming `source`.

    Whatever the bytes are, the only exception is CheckpointError: size and nesting are bounded before parsing,
    every field is type-checked, and the ledger's own rules (`Ledger.from_json`) decide consistency.
    """
    if len(data) > MAX_BYTES:
        raise CheckpointError(f"{source}: larger than {MAX_BYTES} bytes: not a checkpoint gpumgr wrote")
    depth = _json_depth(data)
    if depth > MAX_DEPTH:
        raise CheckpointError(f"{source}: JSON nested more than {MAX_DEPTH} levels deep: not a gpumgr checkpoint")
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise CheckpointError(f"{source}: not valid JSON (truncated or corrupted?): {_clip(str(e))}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise CheckpointError(f"{source}: not a gpumgr checkpoint (format field missing or wrong)")
    version = doc.get("version")
    if not _is_int(version):
        raise CheckpointError(f"{source}: version field missing or not a whole number")
    if version > VERSION or version < 1:
        raise CheckpointError(
            f"{source}: written by a newer gpumgr (format version {_clip(str(version))}, this one reads up to "
            f"{VERSION})" if version > VERSION else f"{source}: format version {version} does not exist"
        )
    claimed = doc.pop("checksum", None)
    try:
        good = claimed == checksum(doc)
    except (ValueError, TypeError, RecursionError):
        good = False
    if not good:
        raise CheckpointError(f"{source}: checksum mismatch (file was modified or damaged)")
    unknown = sorted(str(k) for k in doc if k not in _DOCUMENT_FIELDS)
    if unknown:
        raise CheckpointError(f"{source}: unknown field {_clip(repr(unknown[0]), 80)} (written by another program?)")
    generation, node, written = doc.get("generation", 0), doc.get("node", ""), doc.get("written_at", "")
    if not _is_int(generation) or not 0 <= generation <= MAX_GENERATION:
        raise CheckpointError(f"{source}: generation must be a whole number 0..{MAX_GENERATION}, "
                              f"got {_clip(repr(generation))}")
    if not isinstance(node, str) or len(node) > 253:
        raise CheckpointError(f"{source}: node must be a node name, got {_clip(repr(node))}")
    if not isinstance(written, str) or len(written) > 64:
        raise CheckpointError(f"{source}: written_at must be a timestamp, got {_clip(repr(written))}")
    if expected_node is not None and node and node != expected_node:
        raise CheckpointError(f"{source}: written for node {node}, this is node {expected_node} (a checkpoint "
                              "directory copied or shared between nodes?)")
    problem = _ledger_problem(doc.get("ledger"))
    if problem:
        raise CheckpointError(f"{source}: inconsistent ledger: {problem}")
    try:
        ledger = Ledger.from_json(doc["ledger"], legacy=version < 2)
    except LedgerError as e:
        raise CheckpointError(f"{source}: inconsistent ledger: {_clip(str(e), 300)}") from None
    except Exception as e:  # noqa: BLE001 - a pure function of a hostile document: any failure is a bad file
        raise CheckpointError(f"{source}: inconsistent ledger: {type(e).__name__}: {_clip(str(e))}") from None
    return Snapshot(ledger=ledger, generation=generation, node=node, written_at=written, path=source,
                    version=version)


def _is_int(v: object) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


def _clip(text: str, width: int = 120) -> str:
    return text if len(text) <= width else text[:width] + "..."


_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def _json_depth(data: bytes) -> int:
    """The deepest nesting of arrays and objects in `data` (strings skipped), stopping once past MAX_DEPTH."""
    brackets = _STRING.sub(b"", data).translate(None, _NOT_BRACKETS)
    depth = deepest = 0
    for b in brackets:
        depth += 1 if b in b"[{" else -1
        if depth > deepest:
            deepest = depth
            if deepest > MAX_DEPTH:
                break
    return deepest


def agent_key_problem(key: str) -> str | None:
    """Why the agent could not hold an allocation under `key`, or None: its keys name vDevice directories
    (`a` + 24 hex digits) or DRA claims (`dra/<claim uid>/<n>`)."""
    if _CLAIM_KEY.match(key):
        return None
    try:
        check_key(key)
    except BadName:
        return f"allocation key {_clip(repr(key), 80)} is not one the agent makes (a + 24 hex digits, or dra/<uid>/<n>)"
    return None


_CLAIM_KEY = re.compile(r"^dra/[0-9a-zA-Z][0-9a-zA-Z-]{0,62}/[0-9]{1,4}\Z")


def _ledger_problem(led: object) -> str | None:
    """Type and bound checks of the ledger document (shape only; `Ledger.from_json` type-checks each allocation's
    fields, version 1 labels included, and checks consistency)."""
    if not isinstance(led, dict):
        return "ledger must be an object"
    cards, allocs = led.get("cards"), led.get("allocations")
    if not isinstance(cards, list) or not 0 < len(cards) <= MAX_CARDS:
        return f"cards must be a list of 1..{MAX_CARDS} cards"
    for i, c in enumerate(cards):
        if not isinstance(c, dict) or not _is_int(c.get("index")) or not _is_int(c.get("memory_mib")) \
                or c["memory_mib"] <= 0:
            return f"cards[{i}] must be {{index: N, memory_mib: N > 0}}"
    if not isinstance(allocs, list) or len(allocs) > MAX_ALLOCATIONS:
        return f"allocations must be a list of at most {MAX_ALLOCATIONS}"
    for i, a in enumerate(allocs):
        if not isinstance(a, dict):
            return f"allocations[{i}] must be an object"
        key = a.get("key")
        if not isinstance(key, str):
            return f"allocations[{i}].key must be text"
        why = agent_key_problem(key)
        if why:
            return f"allocations[{i}]: {why}"
        acards = a.get("cards")
        if not isinstance(acards, list) or not 0 < len(acards) <= MAX_CARDS or not all(_is_int(x) for x in acards):
            return f"allocations[{i}].cards must be a list of card indices"
        for f in ("cores", "memory_mib"):
            if not _is_int(a.get(f, 0)) or not 0 <= a.get(f, 0) < 1 << 40:
                return f"allocations[{i}].{f} must be a whole number >= 0"
        if not isinstance(a.get("reserve", True), bool):
            return f"allocations[{i}].reserve must be true or false"
    return None


class CheckpointStore:
    """One checkpoint file (and its previous generation) in a directory."""

    def __init__(self, directory: Path | str, name: str = FILE_NAME):
        self.dir = Path(directory)
        self.path = self.dir / name
        self.prev = self.dir / (name + ".prev")
        self.generation = 0
        self._current_unusable = False  # load() skipped the current file: keep `.prev` (the good one) at next save
        self._older_format = False  # load() used an older format version: the next save replaces both files

    def save(self, ledger: Ledger, node: str = "") -> int:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.generation += 1
        data = encode(ledger, self.generation, node)
        tmp = self._write_temp(self.path, data)
        if self._older_format:  # its own copy, not a link: damage to one file must leave the other
            os.replace(self._write_temp(self.prev, data), self.prev)
        elif self.path.exists() and not self._current_unusable:
            link = self.dir / f".{self.prev.name}.{os.getpid()}.tmp"
            link.unlink(missing_ok=True)
            os.link(self.path, link)
            os.replace(link, self.prev)
        os.replace(tmp, self.path)
        self._current_unusable = self._older_format = False
        dfd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
        return self.generation

    def _write_temp(self, target: Path, data: bytes) -> Path:
        tmp = self.dir / f".{target.name}.{os.getpid()}.tmp"
        write_new(tmp, data, 0o600, fsync=True)
        return tmp

    def examine(self, expected_node: str | None = None) -> list[Generation]:
        """Both generations, newest first, each checked exactly as `load` checks it (absent files left out)."""
        out: list[Generation] = []
        for path in (self.path, self.prev):
            try:
                with path.open("rb") as f:
                    data = f.read(MAX_BYTES + 1)
            except FileNotFoundError:
                continue
            except OSError as e:
                out.append(Generation(path=str(path), snapshot=None,
                                      problem=f"{path}: cannot read: {e.strerror or e}"))
                continue
            try:
                out.append(Generation(path=str(path), snapshot=decode(data, str(path), expected_node), problem=None))
            except CheckpointError as e:
                out.append(Generation(path=str(path), snapshot=None, problem=str(e)))
        return out

    def load(self, expected_node: str | None = None) -> LoadResult:
        """The newest usable generation. No files at all: an empty result (a first start). `expected_node`: refuse
        a generation written for another node."""
        problems: list[str] = []
        gens = self.examine(expected_node)
        self._current_unusable = any(g.path == str(self.path) and g.snapshot is None for g in gens)
        for gen in gens:
            if gen.snapshot is None:
                problems.append(gen.problem or gen.path)
                continue
            self.generation = max(self.generation, gen.snapshot.generation)
            self._older_format = gen.snapshot.version < VERSION
            return LoadResult(snapshot=gen.snapshot, problems=problems)
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
    version: int = VERSION  # the format version the file was in


@dataclass(frozen=True)
class LoadResult:
    snapshot: Snapshot | None  # None: no checkpoint existed
    problems: list[str] = field(default_factory=list)  # files skipped, with reasons

    @property
    def fell_back(self) -> bool:
        return bool(self.problems) and self.snapshot is not None


@dataclass(frozen=True)
class Generation:
    """One checkpoint file as `load` sees it: a snapshot, or the problem that makes it unusable."""

    path: str
    snapshot: Snapshot | None
    problem: str | None

"""GreptimeDB's procedure loader, ported to Python to read stores both ways in tests.

A line-by-line port of `common_procedure/src/store.rs` (`ProcedureStore::load_messages`,
`ParsedKey::parse_str`, serde's reading of `ProcedureMessage`), with the `context` field
current GreptimeDB adds to its messages, and of what a GreptimeDB manager's start does with
what it loaded (`LocalManager::recover`: resubmit the roots, delete every finished
procedure). It sees only `procedure/`: `history/` and `requests/` are procstore's.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_U32_MAX = 2**32 - 1


@dataclass(frozen=True)
class GreptimeMessage:
    """`ProcedureMessage` as serde reads it: unknown fields are ignored, `error` and
    `context` default to None."""

    type_name: str
    data: str
    parent_id: str | None
    step: int
    error: str | None = None
    context: Any = None

    def encode(self) -> bytes:
        """What serde_json writes: the fields in declaration order, `error` and `context` left
        out when None."""
        fields: dict[str, Any] = {
            "type_name": self.type_name,
            "data": self.data,
            "parent_id": self.parent_id,
            "step": self.step,
        }
        if self.error is not None:
            fields["error"] = self.error
        if self.context is not None:
            fields["context"] = self.context
        return json.dumps(fields, separators=(",", ":"), ensure_ascii=False).encode()


@dataclass
class GreptimeMessages:
    """`ProcedureMessages`: what `load_messages` returns."""

    messages: dict[str, GreptimeMessage] = field(default_factory=dict)
    rollback_messages: dict[str, GreptimeMessage] = field(default_factory=dict)
    finished_ids: list[str] = field(default_factory=list)


@dataclass
class GreptimeStart:
    """What a GreptimeDB manager's start does with a store."""

    resumed: set[str]
    """Roots resubmitted to run on (their children are loaded by their parents)."""
    rolled_back: set[str]
    """Roots resubmitted to run their rollback."""
    deleted: set[str]
    """Finished procedures whose keys it deletes."""


def parse_key(prefix: str, key: str) -> tuple[str, int, str] | None:
    """`ParsedKey::parse_str`: read from the right; `(procedure_id, step, key_type)`."""
    if not key.startswith(prefix):
        return None
    parts = key[len(prefix) :].split("/")
    if len(parts) < 2:
        return None
    name, id_text = parts[-1], parts[-2]
    try:
        procedure_id = str(uuid.UUID(id_text))
    except ValueError:
        return None
    name_parts = name.split(".")
    if len(name_parts) < 2 or name_parts[1] not in ("step", "commit", "rollback"):
        return None
    step_text = name_parts[0].removeprefix("+")
    if not step_text or not step_text.isascii() or not step_text.isdigit() or int(step_text) > _U32_MAX:
        return None
    return procedure_id, int(step_text), name_parts[1]


def decode(value: bytes) -> GreptimeMessage | None:
    """`serde_json::from_slice::<ProcedureMessage>`; None where serde would fail."""
    try:
        fields = json.loads(value)
    except ValueError:
        return None
    if not isinstance(fields, dict):
        return None
    type_name, data, parent, step = (fields.get(k) for k in ("type_name", "data", "parent_id", "step"))
    error, context = fields.get("error"), fields.get("context")
    if not isinstance(type_name, str) or not isinstance(data, str) or not isinstance(error, str | None):
        return None
    if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step <= _U32_MAX:
        return None
    if parent is not None:
        try:
            parent = str(uuid.UUID(parent))
        except (ValueError, TypeError, AttributeError):
            return None
    return GreptimeMessage(type_name, data, parent, step, error, context)


def load_messages(listing: Iterable[tuple[str, bytes]], proc_path: str = "procedure/") -> GreptimeMessages:
    """`load_messages` over `(key, value)` pairs in listing order: per procedure, the first
    key listed at its highest step decides."""
    latest: dict[str, tuple[int, str, bytes]] = {}
    for key, value in listing:
        parsed = parse_key(proc_path, key)
        if parsed is None:
            continue
        procedure_id, step, key_type = parsed
        if procedure_id not in latest or latest[procedure_id][0] < step:
            latest[procedure_id] = (step, key_type, value)
    out = GreptimeMessages()
    for procedure_id, (_, key_type, value) in latest.items():
        if key_type == "commit":
            out.finished_ids.append(procedure_id)
            continue
        message = decode(value)
        if message is None:
            continue  # logged and skipped
        target = out.messages if key_type == "step" else out.rollback_messages
        target[procedure_id] = message
    return out


def read_directory(root: Path, proc_path: str = "procedure/") -> GreptimeMessages:
    """`load_messages` over a local store (an object store lists keys sorted)."""
    files = sorted(p for p in (root / proc_path).rglob("*") if p.is_file())
    return load_messages(((p.relative_to(root).as_posix(), p.read_bytes()) for p in files), proc_path)


def start(loaded: GreptimeMessages) -> GreptimeStart:
    """`LocalManager::recover`: roots resubmitted (rolling back ones to roll back), every
    finished procedure deleted, children left to their parents."""
    return GreptimeStart(
        resumed={pid for pid, m in loaded.messages.items() if m.parent_id is None},
        rolled_back={pid for pid, m in loaded.rollback_messages.items() if m.parent_id is None},
        deleted=set(loaded.finished_ids),
    )


def write_directory(root: Path, keys: dict[str, bytes]) -> None:
    """Write keys to a local store as GreptimeDB's object-store backend would (a file each)."""
    for key, value in keys.items():
        path = root / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(value)

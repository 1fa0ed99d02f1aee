"""A hostile store: every nasty value and key name a writer of the bucket can choose, for
checking that a view or tool of a store (procstore's own, or yours) treats them as text.

Anyone who can write the bucket writes any value and any key name. `write_hostile_store`
writes, under `procedure/` and `history/`, procedures and history records whose type names,
errors, data, ids and parent ids carry script, URL schemes, HTML, rich markup, terminal
escapes, a non-UTF-8 key name, a large array and a parent cycle. A safe view shows each
as text, runs none, links none, and never fails on any.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from procstore.ids import ProcedureId
from procstore.store.history import HISTORY_PATH
from procstore.store.keys import parent_folder
from procstore.store.state_store import StateStore

SCRIPT_URL = "javascript:alert(document.domain)"
"""Runs script when clicked, if it ever became an `href`."""

HOSTILE_TEXTS: tuple[str, ...] = (
    SCRIPT_URL,
    "https:evil.example",
    "<script>alert(document.domain)</script>",
    '"><img src=x onerror=alert(document.domain)>',
    "[/oops]",
    "[link=https://evil.example]click me[/link]",
    "[bold red]not bold[/]",
    "\x1b]0;pwned window title\x07",
    "\x1b[2J\x1b[Hscreen cleared",
    "\x1b]8;;https://evil.example\x1b\\a hyperlink\x1b]8;;\x1b\\",
    "\x9b31mC1 CSI\x9b0m",
    "line\roverwritten",
    "bell\x07 backspace\x08 nul\x00 del\x7f",
    "\u202eright-to-left override",
)
"""Values every field of a stored procedure gets, one procedure each."""

NON_UTF8_KEY = "procedure/bad\udcff.txt"
"""A key whose name is not UTF-8 (the byte 0xff), as a local file `procedure/bad\\xff.txt`
lists: Python names it with a lone surrogate. Stores that need UTF-8 names refuse it."""

LARGE_ARRAY_LENGTH = 100_000
"""Elements of the JSON array one procedure's data holds (amplification)."""

ABOVE_MAX_STEP = "4294967296.commit"
"""A key name at a step no procedure can write, beside a hostile procedure's keys: it is no
procedure key, so nothing may take that procedure for finished."""


@dataclass(frozen=True, slots=True)
class HostileStore:
    """What `write_hostile_store` wrote."""

    procedures: list[ProcedureId] = field(default_factory=list)
    """One per hostile text (in `HOSTILE_TEXTS` order), then the large one, then the cycle."""
    large: ProcedureId | None = None
    cycle: tuple[ProcedureId, ProcedureId] | None = None
    history_ids: list[str] = field(default_factory=list)
    """The ids of the history records (hostile texts themselves, not procedure ids)."""
    keys_refused: list[str] = field(default_factory=list)
    """Key names the store would not take (a non-UTF-8 name on S3 or GCS)."""


def _message(type_name: str, data: str, parent_id: str | None, step: int, error: str | None = None) -> bytes:
    value: dict[str, object] = {"type_name": type_name, "data": data, "parent_id": parent_id, "step": step}
    if error is not None:
        value["error"] = error
    return json.dumps(value).encode()


async def write_hostile_store(store: StateStore, parent_path: str = "") -> HostileStore:
    """Write the hostile values and key names into `store` (under `parent_path`), beside
    whatever it holds; returns what was written. Nothing written is runnable: the type names
    have no loader, so a manager's recovery reports them and leaves them alone."""
    parent_path = parent_folder(parent_path)  # the managers' folder, `/` or not
    root = f"{parent_path}procedure/"
    ids: list[ProcedureId] = []
    for n, text in enumerate(HOSTILE_TEXTS):
        pid = ProcedureId.random()
        ids.append(pid)
        data = json.dumps({"value": text, text: [text, {"nested": text}]})
        await store.put(f"{root}{pid}/0000000000.step", _message(text, data, None, 0))
        if n == 0:
            await store.put(f"{root}{pid}/{ABOVE_MAX_STEP}", b"")
        # Half of them failed, so that their error is shown too.
        if n % 2:
            await store.put(f"{root}{pid}/0000000001.rollback", _message(text, data, None, 1, error=text))
    large = ProcedureId.random()
    big = json.dumps({"items": list(range(LARGE_ARRAY_LENGTH)), "text": "x" * 200_000})
    await store.put(f"{root}{large}/0000000000.step", _message("hostile::Large", big, None, 0))
    a, b = ProcedureId.random(), ProcedureId.random()
    await store.put(f"{root}{a}/0000000000.step", _message("hostile::CycleA", "{}", str(b), 0))
    await store.put(f"{root}{b}/0000000000.step", _message("hostile::CycleB", "{}", str(a), 0))
    # A child whose parent id is script: unreadable (not an id), shown with its reason.
    await store.put(f"{root}{ProcedureId.random()}/0000000000.step", _message("hostile::Child", "{}", SCRIPT_URL, 0))
    # Key names hold no `/` (a local store would make it a folder).
    history_ids = [SCRIPT_URL, "https:evil.example", "[red]markup[", "\x1b]0;pwned\x07"]
    for n, hid in enumerate(history_ids):
        record = {
            "id": hid,
            "type_name": HOSTILE_TEXTS[n + 4],
            "parent_id": SCRIPT_URL,
            "outcome": "failed",
            "error": HOSTILE_TEXTS[-n - 1],
            "ended_at": "2026-01-01T00:00:00.000+00:00",
            "started_at": HOSTILE_TEXTS[n],
        }
        await store.put(f"{parent_path}{HISTORY_PATH}{1767225600000 + n:013d}-{hid}.json", json.dumps(record).encode())
    refused: list[str] = []
    for key in (f"{root}notes\x1b]0;pwned\x07[red].txt", f"{parent_path}{NON_UTF8_KEY}"):
        try:
            await store.put(key, b"not a procedure key")
        except Exception:  # which error a store raises for a name it refuses varies
            refused.append(key)
    return HostileStore([*ids, large, a, b], large, (a, b), history_ids, refused)


async def write_parent_cycle(store: StateStore, length: int, parent_path: str = "") -> list[ProcedureId]:
    """One parent cycle of `length` unfinished procedures (each the child of the next, the
    last of the first), for checking that a view or a recovery over it stays linear in
    `length`: one hostile write per procedure. Returns the ids in the cycle's order."""
    ids = [ProcedureId.random() for _ in range(length)]
    await _write_links(store, ids, [*ids[1:], ids[0]], "hostile::Cycle", parent_path)
    return ids


async def write_parent_chain(store: StateStore, length: int, parent_path: str = "") -> list[ProcedureId]:
    """A chain of `length` unfinished procedures, each the child of the next, the last a
    root: as deep as a store can make a tree. Returns the ids, deepest first."""
    ids = [ProcedureId.random() for _ in range(length)]
    await _write_links(store, ids, [*ids[1:], None], "hostile::Chain", parent_path)
    return ids


async def write_many_commits(store: StateStore, count: int, parent_path: str = "") -> ProcedureId:
    """One unfinished procedure whose folder also holds `count` `.commit` keys at steps
    above its own (which its next run would never write): a procedure's page and history
    stay linear in its keys. Returns its id."""
    pid = ProcedureId.random()
    parent_path = parent_folder(parent_path)  # the managers' folder, `/` or not
    root = f"{parent_path}procedure/{pid}/"
    await store.put(f"{root}0000000000.step", _message("hostile::ManyCommits", "{}", None, 0))
    for step in range(1, count + 1):
        await store.put(f"{root}{step:010d}.commit", b"")
    return pid


async def _write_links(
    store: StateStore, ids: list[ProcedureId], parents: list[ProcedureId | None], type_name: str, parent_path: str
) -> None:
    parent_path = parent_folder(parent_path)  # the managers' folder, `/` or not
    for pid, parent in zip(ids, parents, strict=True):
        value = _message(type_name, "{}", None if parent is None else str(parent), 0)
        await store.put(f"{parent_path}procedure/{pid}/0000000000.step", value)

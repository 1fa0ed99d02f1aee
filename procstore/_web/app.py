"""`procstore serve`: a read-only web view of a store, on Starlette.

Pages are rendered on the server from the same reads as the CLI (`read_inventory`,
`read_history`, the lease, the history records of `procstore.store.history`), so the web
view and `procstore ls/show/lease` never disagree.
A small static script (`static/live.js`, served by the app) fetches each page again and
swaps in its main part: no build step, nothing fetched from the network. Every value from
the store is escaped (Jinja2 autoescape; the script writes `textContent` only), links are
built only from canonical ids (`links`), and every answer carries a strict
Content-Security-Policy (`headers`): ids, types, data and key names are adversarial.
Nothing here writes to the store.
"""

from __future__ import annotations

import asyncio
import collections
import errno
import heapq
import itertools
import json
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import msgspec
from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response, StreamingResponse
from starlette.routing import Route

from procstore._cli.history import record_json
from procstore._cli.listing import row_json
from procstore._cli.output import SHORT_ID, iso_time, table_time
from procstore._cli.show import data_fields, field_changes, names_cut, status_json
from procstore._client.client import Client
from procstore._client.inventory import (
    ENDINGS,
    Inventory,
    StoredProcedure,
    endings,
    read_history,
    read_inventory,
    read_outcomes,
)
from procstore._client.leader import lease_state, read_lease
from procstore._client.status import ProcedureStatus
from procstore._client.words import STATUS_WORDS, StatusWord, status_word
from procstore._runtime.lease import LEASE_KEY, LeaseRecord
from procstore._text import bounded, json_inert, terminal_text, valid_unicode
from procstore._web.actions import ACTIONS, Actions
from procstore._web.headers import SecurityHeaders
from procstore._web.links import procedure_link
from procstore.errors import StoreError
from procstore.ids import ProcedureId
from procstore.store import open_state_store
from procstore.store.activity import RETRIES_KEPT
from procstore.store.folder import StoredStatus
from procstore.store.history import HistoryRecord, HistoryStore
from procstore.store.keys import KeyType, ParsedKey
from procstore.store.message import ProcedureMessage
from procstore.store.procedure_store import ProcedureStore

_TEMPLATES = Environment(
    loader=FileSystemLoader(Path(__file__).parent / "templates"),
    autoescape=select_autoescape(["html"]),
    trim_blocks=True,
    lstrip_blocks=True,
    # Every value a page shows is cut to `TEXT_LIMIT` characters: a stored value may be huge
    # (the JSON twin of each page has them whole). Its control characters and bidirectional
    # overrides are shown escaped, as the terminal shows them: U+202E would show the rest of
    # a line reversed, so a stored error could pass for another.
    finalize=lambda value: (
        bounded(terminal_text(value, keep_newlines=True))
        if isinstance(value, str) and not isinstance(value, Markup)
        else value
    ),
)
_TEMPLATES.filters["procedure_link"] = procedure_link
_TEMPLATES.globals["tree_shown"] = 200  # ancestors and descendants a page lists (a chain may be thousands)
_STATIC_DIR = Path(__file__).parent / "static"
_STATIC_TYPES = {"live.js": "text/javascript; charset=utf-8", "style.css": "text/css; charset=utf-8"}
UNREADABLE_HINT = (
    "recovery skips it and leaves its keys untouched: restore a good value, or delete the procedure "
    "(`procstore delete`), then restart the managers"
)


def create_app(
    url: str,
    storage_options: dict[str, Any] | None = None,
    parent_path: str = "",
    refresh: float = 2.0,
    allowed_hosts: Sequence[str] | None = None,
    actions: bool = False,
) -> Starlette:
    """The web view of the store at `url`: `/` (list, counts, lease), `/p/{id}` (one
    procedure, or the history record of one whose keys are gone), `/history` (the newest
    history records), and their JSON twins `/api/procedures`, `/api/procedures/{id}` and
    `/api/history`.

    With `allowed_hosts`, a request whose `Host` header names another host gets 400: a
    server on a loopback address must not answer a page of another site that a DNS
    rebinding pointed at it.

    With `actions`, a procedure's page has cancel, fail, resume and rewind buttons, posted to
    `/p/{id}/action` with this server's token and done through `procstore.Client` (see
    `procstore._web.actions`); without, that path answers 403 and the page has none.

    The store is opened when the app starts and closed when it stops; a store that cannot be
    read answers 503 with the reason, page by page (it may come back).
    """
    state: dict[str, Any] = {}

    @asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        state_store = open_state_store(url, storage_options or {})
        state["store"] = ProcedureStore(state_store, parent_path)
        state["client"] = Client(state_store, parent_path=parent_path)  # leaves the store to this app
        state["actions"] = Actions(state["client"]) if actions else None
        try:
            yield
        finally:
            await state_store.close()

    async def index(request: Request) -> Response:
        return await _page(request, "index.html", lambda: _overview(state["store"], request, whole=False), refresh, "")

    async def procedure(request: Request) -> Response:
        pid = request.path_params["procedure_id"]
        actions = state["actions"]
        token = None if actions is None else actions.token
        said = None if actions is None else actions.said(request.query_params.get("said"))
        read = lambda: _procedure(state["store"], pid, whole=False, client=state["client"])  # noqa: E731
        return await _page(request, "procedure.html", read, refresh, "../", token=token, said=said)

    async def act(request: Request) -> Response:
        if state["actions"] is None:
            return Response(
                "refused: actions are off on this server (procstore serve enables them on a loopback address, "
                "or with --allow-actions)",
                403,
            )
        answer: Response = await state["actions"].perform(request)
        return answer

    async def api_index(request: Request) -> Response:
        return await _json(lambda: _overview(state["store"], request, whole=True))

    async def api_procedure(request: Request) -> Response:
        pid = request.path_params["procedure_id"]
        return await _json(lambda: _procedure(state["store"], pid, whole=True, client=state["client"]))

    async def history(request: Request) -> Response:
        return await _page(request, "history.html", lambda: _history(state["store"]), refresh, "")

    async def api_history(request: Request) -> Response:
        return await _json(lambda: _history(state["store"]))

    routes = [
        Route("/", index),
        Route("/p/{procedure_id}", procedure),
        Route("/p/{procedure_id}/action", act, methods=["POST"]),
        Route("/api/procedures", api_index),
        Route("/api/procedures/{procedure_id}", api_procedure),
        Route("/history", history),
        Route("/api/history", api_history),
        Route("/static/{name}", static),
    ]
    # Outermost first: the headers go on every answer, the Host check's 400 too.
    middleware = [Middleware(SecurityHeaders)]
    if allowed_hosts is not None:
        middleware.append(Middleware(TrustedHostMiddleware, allowed_hosts=allowed_hosts))
    return Starlette(routes=routes, lifespan=lifespan, middleware=middleware)


def short_ids(ids: Sequence[ProcedureId]) -> dict[ProcedureId, str]:
    """Each id cut to its own shortest prefix (at least `SHORT_ID` characters) that no other
    id shares: `/p/{prefix}` finds it, and ids that share a long prefix do not lengthen the
    others (the CLI's table cuts all to one length, for its columns)."""
    texts = sorted(str(i) for i in ids)
    length = dict.fromkeys(texts, SHORT_ID)
    for a, b in itertools.pairwise(texts):
        common = next((n for n, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        length[a], length[b] = max(length[a], common + 1), max(length[b], common + 1)
    return {i: str(i)[: length[str(i)]] for i in ids}


class NotFound(Exception):
    pass


async def static(request: Request) -> Response:
    """The page's script and style sheet: files of the app, never anything from the store."""
    name = request.path_params["name"]
    if name not in _STATIC_TYPES:
        return Response("not found", status_code=404, media_type="text/plain")
    return Response((_STATIC_DIR / name).read_bytes(), media_type=_STATIC_TYPES[name])


async def _page(
    request: Request,
    template: str,
    read: Any,
    refresh: float,
    root: str,
    token: str | None = None,
    said: dict[str, str] | None = None,
) -> Response:
    """`root`: the path from this page back to the app's root (its own links start there);
    `token`: the actions' form token, for a page with actions; `said`: what the action that
    led here did."""
    try:
        data = await read()
        status = 200
    except NotFound as e:
        data, status = {"error": str(e)}, 404
    except StoreError as e:
        data, status = {"error": f"the store cannot be read: {e}"}, 503
    render = _TEMPLATES.get_template(template).render
    html = await asyncio.to_thread(render, data=data, refresh=refresh, root=root, token=token, said=said)
    return HTMLResponse(valid_unicode(html), status_code=status)


_JSON_PIECE = 1 << 20
"""Bytes of JSON the twin sends at a time (about: a value is never split)."""


def _json_pieces(content: Any) -> list[bytes]:
    """JSON of any stored text, in pieces of about `_JSON_PIECE` bytes: a lone surrogate (a
    name that is not UTF-8) is escaped, and so is what a terminal obeys (`json_inert`: DEL,
    C1, the bidirectional overrides; JSON escapes C0 itself), for a twin read with `curl`.

    Encoded value by value, not in one call: a thread that runs one C call over megabytes
    holds the GIL, and so the event loop, that long."""
    encoder = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    pieces: list[bytes] = []
    pending: list[bytes] = []
    size = 0
    for text in encoder.iterencode(content):
        pending.append(json_inert(valid_unicode(text)).encode())
        size += len(pending[-1])
        if size >= _JSON_PIECE:
            pieces.append(b"".join(pending))
            pending, size = [], 0
    pieces.append(b"".join(pending))
    return pieces


async def _json(read: Any) -> Response:
    try:
        content, status = await read(), 200
    except NotFound as e:
        content, status = {"error": str(e)}, 404
    except StoreError as e:
        content, status = {"error": f"the store cannot be read: {e}"}, 503
    # Off the event loop: a twin holds every value whole, megabytes of them.
    pieces = await asyncio.to_thread(_json_pieces, content)
    return StreamingResponse(_sent(pieces), status_code=status, media_type="application/json")


async def _sent(pieces: list[bytes]) -> AsyncIterator[bytes]:
    """The body a piece at a time: one write of megabytes would hold the event loop too."""
    for piece in pieces:
        yield piece


def _row(p: StoredProcedure, inventory: Inventory, ids: dict[ProcedureId, str], now: float) -> dict[str, Any]:
    row = row_json(p, inventory)
    row["short"] = ids[p.procedure_id]
    row["parent_short"] = None if p.parent_id is None else ids.get(p.parent_id, str(p.parent_id)[:8])
    # An orphan's parent has no page: linked, it would be a 404.
    row["parent_stored"] = p.parent_id is not None and p.parent_id in inventory.procedures
    row["age"] = table_time(p.modified, "relative", now)
    row["started"] = iso_time(p.first_written)
    end = p.modified if p.is_finished else now
    # max: the store's clock may run ahead of this one (a just-written key "in the future").
    row["duration"] = _duration(max(0.0, end - p.first_written)) if p.first_written is not None and end else None
    row["hint"] = UNREADABLE_HINT if p.status is StoredStatus.UNREADABLE else None
    return row


OVERVIEW_SHOWN = 100
"""Procedures a page of the overview lists (it pages through the rest; its JSON twin lists
them all): one hostile key per procedure must not make a page of megabytes, fetched again
at every refresh, and only the rows shown are rendered."""


class Filters(msgspec.Struct, frozen=True):
    """The overview's search: a status, a type, text in the id or the type, and a page."""

    status: str | None = None
    type: str | None = None
    q: str | None = None
    page: int = 1

    @classmethod
    def of(cls, request: Request) -> Filters:
        asked = request.query_params
        page = asked.get("page") or "1"
        return cls(
            asked.get("status") or None,
            asked.get("type") or None,
            (asked.get("q") or "").strip().lower()[:200] or None,
            int(page) if page.isascii() and page.isdigit() and len(page) <= 6 and int(page) > 0 else 1,
        )

    def admits(self, p: StoredProcedure, word: StatusWord) -> bool:
        if self.status is not None and word != self.status:
            return False
        if self.type is not None and p.type_name != self.type:
            return False
        return self.q is None or str(p.procedure_id).startswith(self.q) or self.q in (p.type_name or "").lower()


async def _overview(store: ProcedureStore, request: Request, *, whole: bool) -> dict[str, Any]:
    inventory = await read_inventory(store)
    await read_outcomes(store, inventory)  # the words of `ls`: `rolled back`, `cancelled`
    now = time.time()
    lease = await _lease(store, now)
    shown = None if whole else OVERVIEW_SHOWN
    # Off the event loop: on a large store this takes a while, and other pages go on meanwhile.
    return await asyncio.to_thread(_overview_of, store, inventory, Filters.of(request), lease, now, shown)


def _overview_of(
    store: ProcedureStore,
    inventory: Inventory,
    filters: Filters,
    lease: dict[str, Any] | None,
    now: float,
    shown: int | None,
) -> dict[str, Any]:
    counts = dict.fromkeys(STATUS_WORDS, 0)
    for p in inventory.procedures.values():
        counts[inventory.word(p)] += 1
    chosen = sorted(
        (p for p in inventory.procedures.values() if filters.admits(p, inventory.word(p))),
        key=lambda p: (p.modified or 0.0, str(p.procedure_id)),
    )
    pages = max(1, -(-len(chosen) // shown)) if shown else 1
    page = min(filters.page, pages)
    rows = chosen if shown is None else chosen[(page - 1) * shown : page * shown]
    ids = short_ids(list(inventory.procedures))  # unique in the whole store: what `procstore show` takes
    return {
        "store": f"{store.store.url}{store.proc_path}",
        "counts": counts,
        "total": len(inventory.procedures),
        **_types(inventory, filters, shown),
        "filters": msgspec.to_builtins(filters),
        "matching": len(chosen),
        "page": page,
        "pages": pages,
        "procedures": [_row(p, inventory, ids, now) for p in rows],
        "not_shown": 0 if shown is None else max(0, len(chosen) - page * shown),
        "other_keys": inventory.other_keys[:20],
        "unlisted": sorted(inventory.unlisted.items())[:20],
        "lease": lease,
        "read_at": iso_time(now),
    }


TYPES_SHOWN = 100
"""Types the overview's type filter offers, the most common first (its JSON twin lists them
all): one hostile key per type, each of a type of its own, must not make the page long."""


def _types(inventory: Inventory, filters: Filters, shown: int | None) -> dict[str, Any]:
    """The types to filter by, sorted (`TYPES_SHOWN` of them on a page: the most common,
    and the one chosen), and how many others there are."""
    counts = collections.Counter(p.type_name for p in inventory.procedures.values() if p.type_name)
    if shown is None:
        return {"types": sorted(counts), "types_not_shown": 0}
    common = {t for t, _ in heapq.nsmallest(TYPES_SHOWN, counts.items(), key=lambda tn: (-tn[1], tn[0]))}
    if filters.type is not None and filters.type in counts:
        common.add(filters.type)
    return {"types": sorted(common), "types_not_shown": len(counts) - len(common)}


async def _lease(store: ProcedureStore, now: float) -> dict[str, Any] | None:
    try:
        key, raw, modified = await read_lease(store)
    except StoreError as e:
        if not _about_the_key(e):
            raise  # the store itself (a page answers 503)
        # Its key alone (a folder there, say): the procedures read fine, and are shown.
        return {"key": f"{store.parent_path}{LEASE_KEY}", "problem": f"cannot be read: {e}"}
    if raw is None:
        return None
    age = None if modified is None else max(0.0, now - modified)
    try:
        record = LeaseRecord.decode(raw)
    except ValueError as e:
        return {"key": key, "problem": f"unreadable: {e}; the managers take it for a lease nobody holds"}
    state, said = lease_state(record, age)
    return {"key": key, "holder": record.holder, "epoch": record.epoch, "state": state, "said": said,
            "renewed": table_time(modified, "relative", now)}  # fmt: skip


def _about_the_key(error: StoreError) -> bool:
    """Whether a read failed for what is at the key (a folder, a link looping to itself, a
    file that is not a regular one), not for the store."""
    cause = error.__cause__
    return isinstance(cause, IsADirectoryError | NotADirectoryError) or (
        type(cause) is OSError and cause.errno in (errno.ELOOP, errno.EINVAL)
    )


async def _procedure(store: ProcedureStore, text: str, *, whole: bool, client: Client) -> dict[str, Any]:
    inventory = await read_inventory(store)
    await read_outcomes(store, inventory)
    matches = [pid for pid in inventory.procedures if str(pid).startswith(text.lower())] if len(text) >= 4 else []
    if not matches:
        return await _ended(store, text, {str(pid) for pid in inventory.procedures})
    if len(matches) != 1:
        raise NotFound(f"{text!r} is ambiguous")
    p = inventory.procedures[matches[0]]
    history = await read_history(store, p.procedure_id)
    page = await asyncio.to_thread(_procedure_of, store, inventory, p, history, whole)
    status = await client.get(p.procedure_id)
    record = await HistoryStore(store.store, store.parent_path).find(str(p.procedure_id))
    page["status"] = status_json(status)
    page["duration"] = _duration(status.duration)
    page["input"] = history[0][2].data if history and history[0][2] is not None else None
    page["output"] = None if record is None or record.run != status.run else record.output
    page["timeline"] = _timeline(page["steps"], status)
    page["actions"] = list(ACTIONS)
    return page


def _duration(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    seconds = max(0.0, seconds)
    minutes, rest = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{rest:02d}s" if hours else f"{minutes}m{rest:02d}s" if minutes else f"{seconds:.1f}s"


def _timeline(steps: list[dict[str, Any]], status: ProcedureStatus) -> list[dict[str, Any]]:
    """What happened, oldest first: each stored key, and each retry the manager published."""
    events = [{"at": s["written"] or "", "what": f"step {s['step']} {s['kind']} stored"} for s in steps]
    if status.activity is not None:
        events += [
            {"at": r.at, "what": f"attempt {r.attempt} failed, retried: {r.error}"}
            for r in status.activity.retries[-RETRIES_KEPT:]
        ]
    return sorted(events, key=lambda e: e["at"])


PAGE_FIELD_TEXT = 300_000
"""Characters of field names and values a procedure's page shows over all its steps; the
steps after are listed without their fields (the JSON twin has them). Each value is cut,
but a few kilobytes stored can name 200 fields by a long path at every step."""


def _procedure_of(
    store: ProcedureStore,
    inventory: Inventory,
    p: StoredProcedure,
    history: list[tuple[ParsedKey, float | None, ProcedureMessage | None, str | None]],
    whole: bool,
) -> dict[str, Any]:
    now = time.time()
    budget = PAGE_FIELD_TEXT
    ids = short_ids(list(inventory.procedures))
    ancestors = list(reversed(inventory.ancestors(p)))
    steps: list[dict[str, Any]] = []
    previous: dict[str, Any] | None = None
    for (key, modified, message, problem), ended in zip(history, endings(history), strict=True):
        step: dict[str, Any] = {
            "key": str(key),
            "step": key.step,
            "kind": key.key_type.value,
            "written": iso_time(modified),
            "problem": problem,
            "error": None,
            "fields": [],
            "ended": None if ended is None else {"status": status_word(ended), "text": ENDINGS[ended]},
        }
        if problem is not None:
            step["hint"] = UNREADABLE_HINT
        if message is not None and key.key_type is not KeyType.COMMIT:
            step["error"] = message.error
            fields = data_fields(message, whole=whole)
            if fields is None:
                step["raw"] = message.data
            else:
                rows = field_changes(fields, previous, whole=whole)
                previous = fields
                size = sum(len(n) + len(v) for _, n, v in rows)
                if whole or size <= budget:
                    budget -= size
                    step["fields"] = [{"mark": m, "name": n, "value": v} for m, n, v in rows]
                else:
                    budget = 0
                    step["fields_not_shown"] = len(rows)
                if whole and names_cut(fields):
                    step["raw"] = message.data  # the twin has every value whole: as stored
        steps.append(step)
    return {
        "store": f"{store.store.url}{store.proc_path}",
        "procedure": _row(p, inventory, ids, now),
        "ancestors": [_row(a, inventory, ids, now) for a in ancestors],
        "descendants": [_row(d, inventory, ids, now) for d in reversed(inventory.descendants(p.procedure_id))],
        "steps": steps,
        "read_at": iso_time(now),
    }


HISTORY_SHOWN = 200
"""The newest history records `/history` reads (each refresh reads them again)."""


def _history_row(record: HistoryRecord, short: dict[str, str], now: float) -> dict[str, Any]:
    row = record_json(record)  # as `procstore history -o json`: output nested, times in one form
    row["short"] = short.get(record.id, record.id)
    try:
        row["age"] = table_time(datetime.fromisoformat(record.ended_at).timestamp(), "relative", now)
    except ValueError:
        row["age"] = record.ended_at
    return row


async def _history(store: ProcedureStore) -> dict[str, Any]:
    """The newest `HISTORY_SHOWN` records (managers with `history=`), newest first."""
    history = HistoryStore(store.store, store.parent_path)
    keys = await history.keys()
    records = list(reversed(await history.read(keys[-HISTORY_SHOWN:])))
    parsed = [pid for r in records if (pid := ProcedureId.parse_canonical(r.id)) is not None]
    short = {str(pid): text for pid, text in short_ids(parsed).items()}
    now = time.time()
    return {
        "store": f"{store.store.url}{history.prefix}",
        "total": len(keys),
        "outcomes": dict(sorted(collections.Counter(r.outcome for r in records).items())),
        "records": [_history_row(r, short, now) for r in records],
        "read_at": iso_time(now),
    }


async def _ended(store: ProcedureStore, text: str, stored: set[str]) -> dict[str, Any]:
    """`/p/{id}` of a procedure whose keys are gone: its newest history record, as
    `procstore show` prints it (its parent linked if it has a page: `stored` or recorded)."""
    history = HistoryStore(store.store, store.parent_path)
    ids = await history.recorded_ids() if len(text) >= 4 else set()
    matches = sorted(i for i in ids if i.startswith(text.lower()))
    if len(matches) != 1:
        found = f"{text!r} is ambiguous" if matches else f"no procedure {text!r} in this store or its history"
        raise NotFound(found)
    record = await history.find(matches[0])
    if record is None:
        raise NotFound(f"the history record of {matches[0]} cannot be read (see the server's log)")
    row = _history_row(record, {}, time.time())
    row["parent_known"] = record.parent_id is not None and (record.parent_id in stored or record.parent_id in ids)
    return {"store": f"{store.store.url}{store.proc_path}", "ended": row, "read_at": iso_time(time.time())}

"""The web view's operator actions: cancel, fail, resume and rewind, through `procstore.Client`.

Writing to the store from a web page is a door: a page of another site must not be able to
make the operator's browser press the button (cross-site request forgery), and a page served
to a network must not let anyone who can reach it steer the control plane. So:

- actions exist only when `procstore serve` enables them: on a loopback address by default,
  on any other address only with `--allow-actions`;
- every form carries this server's token (random, made at start, never in a URL or the
  store) and a POST without it is refused with 403; the Host check and the headers of
  `procstore._web.headers` (no framing, `form-action 'self'`) stand as well;
- the action is the `Client`'s, with its checks and refusals; its answer, or the refusal, is
  the page the operator sees next.
"""

from __future__ import annotations

import collections
import secrets
from typing import Any
from urllib.parse import parse_qs, urlencode

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from procstore._client.client import Client
from procstore.errors import InvalidProcedureId, ProcedureError

ACTIONS = ("cancel", "fail", "resume", "rewind")
REASON_LIMIT = 2000
"""Characters of a reason a form may send (the store keeps what it is given)."""


class Actions:
    """The actions of one app: its token, and what each does."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.token = secrets.token_urlsafe(32)
        self._said: collections.OrderedDict[str, dict[str, str]] = collections.OrderedDict()
        """What the last actions did, by a random key the redirect names: a link cannot make
        the page claim an action nobody took (the text is never in the URL)."""

    def said(self, key: str | None) -> dict[str, str] | None:
        """`{"done": ...}` or `{"refused": ...}` of the action `key` names, else None."""
        return None if key is None else self._said.get(key)

    async def perform(self, request: Request) -> Response:
        """POST `/p/{id}/action`: check the token, then act through the Client; the answer
        goes back to the procedure's page (303), with what happened in its query."""
        form = await _form(request)
        if form is None:
            return Response("refused: a form of this server's page is sent url-encoded, and small", 400)
        sent = form.get("token")
        if not isinstance(sent, str) or not secrets.compare_digest(sent, self.token):
            return Response("refused: this form is not from this server (a missing or stale token)", 403)
        pid = request.path_params["procedure_id"]
        action, reason, to_step = form.get("action"), form.get("reason") or None, form.get("to_step")
        try:
            said = {"done": await self._act(pid, action, reason, to_step)}
        except (ProcedureError, ValueError, TypeError, InvalidProcedureId) as e:
            said = {"refused": str(e)}
        key = secrets.token_urlsafe(12)
        self._said[key] = said
        while len(self._said) > SAID_KEPT:
            self._said.popitem(last=False)
        return RedirectResponse(f"../{pid}?{urlencode({'said': key})}", status_code=303)

    async def _act(self, pid: str, action: Any, reason: Any, to_step: Any) -> str:
        if action not in ACTIONS:
            raise ValueError(f"no such action: {str(action)[:40]!r}")
        if reason is not None and (not isinstance(reason, str) or len(reason) > REASON_LIMIT):
            raise ValueError(f"a reason is text of at most {REASON_LIMIT} characters")
        if action == "cancel":
            await self.client.cancel(pid, reason)
        elif action == "fail":
            await self.client.fail(pid, reason)
        elif action == "resume":
            await self.client.resume(pid, reason)
        else:
            if not isinstance(to_step, str) or not to_step.isdigit():
                raise ValueError("rewind needs the step to run from (a number)")
            await self.client.rewind(pid, int(to_step), reason)
        return f"{action} stored: the manager running it acts on it within its request_poll_interval"


SAID_KEPT = 100
"""Answers of recent actions kept for the page their redirect leads to."""

FORM_LIMIT = 16 * 1024
"""Bytes of a posted form read at the most: a reason, a step, the token."""


async def _form(request: Request) -> dict[str, str] | None:
    """The fields of the page's form (`application/x-www-form-urlencoded`, what a browser
    sends for it); None for any other body, or one above `FORM_LIMIT`."""
    if request.headers.get("content-type", "").split(";")[0].strip() != "application/x-www-form-urlencoded":
        return None
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > FORM_LIMIT:
            return None
    try:
        return {k: v[0] for k, v in parse_qs(body.decode(), keep_blank_values=True).items()}
    except UnicodeDecodeError:
        return None

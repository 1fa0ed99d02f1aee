"""A moto S3 server that records every write and can fail a share of the requests.

Run it as its own process (`python -m procstore.testing.s3_server --port 5555 --record
writes.jsonl --fault-rate 0.1`), so that managers in other processes reach it over HTTP
the way they reach S3. It writes one JSON line per request that changes the bucket:

    {"t": 1.5, "method": "PUT", "key": "cp/procedure/…/0000000002.step", "status": 200,
     "client": "w1", "if_none_match": "*", "if_match": null, "fault": null, "size": 120}

(`client` is what follows `procstore-client/` in the User-Agent: give each manager one
with `config_kwargs={"user_agent_extra": "procstore-client/w1"}`; a batch delete has one
line per key.) A test reads the record to prove what reached the store: which writes
created a key, which were refused, in which order.

Faults, on `--fault-rate` of all requests, chosen at random (seeded by `--seed`):
`slowdown` (503 SlowDown, nothing done), `reset-before` (the connection is reset before
the request is handled), `reset-after` and `timeout-after` (handled, then the answer is
lost: the connection is reset, or held past the client's read timeout). The last two are
the lost answers a create-only write must recognise by reading back.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import unquote

Environ = dict[str, Any]
StartResponse = Callable[..., Any]
WsgiApp = Callable[[Environ, StartResponse], Iterable[bytes]]

FAULTS = ("slowdown", "reset-before", "reset-after", "timeout-after")
_CLIENT = re.compile(r"procstore-client/(\S+)")
_DELETE_KEY = re.compile(rb"<Key>(.*?)</Key>", re.DOTALL)
_DELETE_OBJECT = re.compile(rb"<Object>\s*<Key>(.*?)</Key>.*?</Object>", re.DOTALL)
_SLOWDOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message></Error>"
)


class RecordingFaultyApp:
    """WSGI middleware around moto's app: records writes, injects faults."""

    def __init__(
        self,
        app: WsgiApp,
        record_path: str | None,
        fault_rate: float,
        seed: int,
        hold_seconds: float,
        delete_errors: int = 0,
    ) -> None:
        self.app = app
        self.delete_errors = delete_errors
        """How many DeleteObjects requests (the first ones) keep their first key and report it
        under `Errors` with a 200, as S3 does when it fails one key of a batch."""
        self.fault_rate = fault_rate
        self.hold_seconds = hold_seconds
        self._random = random.Random(seed)
        self._lock = threading.Lock()
        self._record = open(record_path, "a", buffering=1) if record_path else None  # noqa: SIM115
        self._started = time.monotonic()

    def _fault(self) -> str | None:
        with self._lock:
            if self.fault_rate and self._random.random() < self.fault_rate:
                return self._random.choice(FAULTS)
        return None

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        method = environ["REQUEST_METHOD"]
        path = unquote(environ.get("PATH_INFO", ""))
        query = environ.get("QUERY_STRING", "")
        creating_bucket = method == "PUT" and path.rstrip("/").count("/") == 1
        fault = None if creating_bucket else self._fault()
        if fault == "slowdown":
            self._drain(environ)
            self._log(environ, method, path, 503, fault, 0)
            start_response("503 Slow Down", [("Content-Type", "application/xml")])
            return [_SLOWDOWN]
        if fault == "reset-before":
            self._drain(environ)
            self._log(environ, method, path, 0, fault, 0)
            _reset(environ)
            return []
        body = self._drain(environ)
        kept = self._keep_one_key(body) if method == "POST" and "delete" in query else None
        if kept is not None:
            body = body.replace(kept[1], b"", 1)
            for header in [h for h in environ if h.startswith(("HTTP_CONTENT_MD5", "HTTP_X_AMZ_CHECKSUM"))]:
                del environ[header]
        environ["wsgi.input"] = _Body(body)
        environ["CONTENT_LENGTH"] = str(len(body))
        captured: dict[str, Any] = {}

        def capture(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Callable[[bytes], Any]:
            captured["status"], captured["headers"] = status, headers
            return lambda _data: None

        chunks = b"".join(self.app(environ, capture))
        status = int(captured["status"].split()[0])
        if kept is not None:
            error = (
                b"<Error><Key>" + kept[0] + b"</Key><Code>InternalError</Code>"
                b"<Message>We encountered an internal error. Please try again.</Message></Error>"
            )
            chunks = chunks.replace(b"</DeleteResult>", error + b"</DeleteResult>")
            captured["headers"] = [(k, v) for k, v in captured["headers"] if k.lower() != "content-length"]
        if method == "POST" and "delete" in query:
            for key in _DELETE_KEY.findall(body):
                self._log(environ, "DELETE", f"{path.rstrip('/')}/{key.decode()}", status, fault, 0)
        else:
            self._log(environ, method, path, status, fault, len(body))
        if fault == "reset-after":
            _reset(environ)
            return []
        if fault == "timeout-after":
            time.sleep(self.hold_seconds)
            _reset(environ)
            return []
        start_response(captured["status"], captured["headers"])
        return [chunks]

    def _keep_one_key(self, body: bytes) -> tuple[bytes, bytes] | None:
        """For an injected per-key delete error: the first key and its `<Object>` element."""
        with self._lock:
            if self.delete_errors <= 0:
                return None
            match = _DELETE_OBJECT.search(body)
            if match is None:
                return None
            self.delete_errors -= 1
        return match.group(1), match.group(0)

    @staticmethod
    def _drain(environ: Environ) -> bytes:
        length = int(environ.get("CONTENT_LENGTH") or 0)
        data: bytes = environ["wsgi.input"].read(length) if length else b""
        return data

    def _log(self, environ: Environ, method: str, path: str, status: int, fault: str | None, size: int) -> None:
        if self._record is None or method not in ("PUT", "DELETE", "POST"):
            return
        match = _CLIENT.search(environ.get("HTTP_USER_AGENT", ""))
        line = {
            "t": round(time.monotonic() - self._started, 6),
            "wall": time.time(),
            "method": method,
            "key": path.lstrip("/"),
            "status": status,
            "client": match.group(1) if match else None,
            "if_none_match": environ.get("HTTP_IF_NONE_MATCH"),
            "if_match": environ.get("HTTP_IF_MATCH"),
            "fault": fault,
            "size": size,
        }
        text = json.dumps(line) + "\n"
        with self._lock:
            self._record.write(text)


class _Body:
    """A re-readable request body for the wrapped app."""

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._pos = 0

    def read(self, size: int = -1) -> bytes:
        end = len(self._data) if size is None or size < 0 else self._pos + size
        chunk = self._data[self._pos : end]
        self._pos += len(chunk)
        return chunk

    def readline(self, size: int = -1) -> bytes:
        return self.read(size)


def _reset(environ: Environ) -> None:
    """Abort the connection with a TCP reset, as a failing load balancer does."""
    sock: socket.socket | None = environ.get("werkzeug.socket")
    if sock is None:
        raise ConnectionAbortedError("injected reset")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def without_server_header(app: WsgiApp) -> WsgiApp:
    """`app` without its own `Server` header: the HTTP server adds one too, and aiohttp
    refuses a response with two under `python -X dev` ("Duplicate 'Server' header found")."""

    def wrapped(environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        def start(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            kept = [(k, v) for k, v in headers if k.lower() != "server"]
            return start_response(status, kept) if exc_info is None else start_response(status, kept, exc_info)

        return app(environ, start)

    return wrapped


def moto_app() -> WsgiApp:
    """moto's S3 app, without the second `Server` header."""
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app

    return without_server_header(DomainDispatcherApplication(create_backend_app))


def make_app(
    record: str | None = None, fault_rate: float = 0.0, seed: int = 0, hold_seconds: float = 3.0, delete_errors: int = 0
) -> RecordingFaultyApp:
    """moto's S3 app behind the recording, fault-injecting middleware."""
    return RecordingFaultyApp(moto_app(), record, fault_rate, seed, hold_seconds, delete_errors)


class ThreadedServer:
    """moto's S3 app served on 127.0.0.1:`port` in a thread of this process (as moto's
    `ThreadedMotoServer`, without its duplicate `Server` header)."""

    def __init__(self, port: int, app: WsgiApp | None = None) -> None:
        from moto.moto_server.werkzeug_app import MotoRequestHandler
        from werkzeug.serving import make_server

        self.url = f"http://127.0.0.1:{port}"
        self._server = make_server(
            "127.0.0.1", port, app or moto_app(), threaded=True, request_handler=MotoRequestHandler
        )
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True, name="procstore:moto")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._thread.join()
        self._server.server_close()


def serve(port: int, record: str | None, fault_rate: float, seed: int, hold_seconds: float) -> None:
    from moto.moto_server.werkzeug_app import MotoRequestHandler
    from werkzeug.serving import make_server

    app = make_app(record, fault_rate, seed, hold_seconds)
    server = make_server("127.0.0.1", port, app, threaded=True, request_handler=MotoRequestHandler)
    print(f"ready http://127.0.0.1:{port}", flush=True)
    server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--record", help="append one JSON line per write to this file")
    parser.add_argument("--fault-rate", type=float, default=0.0, help="share of requests that fail (0-1)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hold-seconds", type=float, default=3.0, help="how long a timeout-after fault holds")
    args = parser.parse_args(argv)
    serve(args.port, args.record, args.fault_rate, args.seed, args.hold_seconds)


if __name__ == "__main__":
    main()

"""gcp-storage-emulator answering GCS's preconditions: `python -m procstore.testing.gcs_server`.

The emulator as it ships (PyPI `gcp-storage-emulator`) ignores `ifGenerationMatch`, so a
create-only write or a compare-and-swap cannot be tested against it: every write wins.
This module runs the same emulator with its object handlers wrapped to answer as GCS does:

- a write or delete with `ifGenerationMatch=N` is refused with 412 `conditionNotMet`
  unless the object's current generation is N (`0`: unless the object does not exist);
  `ifGenerationNotMatch=N` is refused when it is;
- a media download carries `X-Goog-Generation`, the object's generation, as GCS sends it
  (the emulator sends none), so one GET gives both the bytes and the version to swap on.

The check and the write cannot interleave with another request: the emulator serves one
request at a time. With `--record FILE` every request that changes the bucket is appended
as a JSON line (`{"t", "wall", "method", "key", "status", "if_generation_match", "size"}`,
named as in `procstore.testing.s3_server`'s record), so a test can prove which writes
created a key.

Run it as its own process, the way clients reach GCS:
`python -m procstore.testing.gcs_server --port 4443`, then
`gcsfs.GCSFileSystem(token="anon", endpoint_url="http://127.0.0.1:4443", project="test")`
(with `GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false` set before gcsfs is imported).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from http import HTTPStatus
from typing import Any, TextIO

Handler = Callable[..., Any]

_CONDITION_NOT_MET = {
    "error": {
        "code": 412,
        "message": "At least one of the pre-conditions you specified did not hold.",
        "errors": [{"reason": "conditionNotMet", "message": "Precondition Failed"}],
    }
}


def _first(query: dict[str, list[str]], name: str) -> str | None:
    values = query.get(name)
    return values[0] if values else None


def _object_name(request: Any) -> str | None:
    """The object a request addresses: in the path, the `name` query or an upload's metadata."""
    params = request.params or {}
    if params.get("object_id"):
        return str(params["object_id"])
    name = _first(request.query, "name")
    if name is not None:
        return name
    data = request.data
    if isinstance(data, dict):
        meta = data.get("meta", data)
        if isinstance(meta, dict) and meta.get("name"):
            return str(meta["name"])
    return None


def _current_generation(storage: Any, bucket: str, name: str) -> str:
    from gcp_storage_emulator.exceptions import NotFound

    try:
        return str(storage.get_file_obj(bucket, name)["generation"])
    except NotFound:
        return "0"  # GCS's generation of an object that does not exist


def _precondition_holds(request: Any, storage: Any) -> bool:
    match = _first(request.query, "ifGenerationMatch")
    not_match = _first(request.query, "ifGenerationNotMatch")
    if match is None and not_match is None:
        return True
    name = _object_name(request)
    if name is None:
        return True
    current = _current_generation(storage, request.params["bucket_name"], name)
    return (match is None or match == current) and (not_match is None or not_match != current)


class PreconditionHandlers:
    """Wraps the emulator's object handlers with GCS's precondition checks (and a record)."""

    def __init__(self, record: TextIO | None) -> None:
        self.record = record
        self.started = time.monotonic()

    def checked(self, handler: Handler) -> Handler:
        """`handler`, refusing with 412 a request whose precondition does not hold."""

        def check_then_handle(request: Any, response: Any, storage: Any, *args: Any, **kwargs: Any) -> Any:
            if request.method in ("POST", "PUT") and request.data is None:
                # Reading the body (even to refuse it: closing a socket with unread data sends
                # a TCP reset) gives None for an empty one, on which the emulator's media
                # upload fails; GCS stores an empty object.
                request._data = b""
            result = None
            if _precondition_holds(request, storage):
                result = handler(request, response, storage, *args, **kwargs)
            else:
                response.status = HTTPStatus.PRECONDITION_FAILED
                response.json(_CONDITION_NOT_MET)
            self._log(request, response)
            return result

        return check_then_handle

    @staticmethod
    def with_generation(handler: Handler) -> Handler:
        """`handler` (a download), adding the `X-Goog-Generation` header GCS sends."""

        def download(request: Any, response: Any, storage: Any, *args: Any, **kwargs: Any) -> Any:
            result = handler(request, response, storage, *args, **kwargs)
            if response.status in (HTTPStatus.OK, HTTPStatus.PARTIAL_CONTENT):
                name = _object_name(request)
                if name is not None:
                    response["X-Goog-Generation"] = _current_generation(storage, request.params["bucket_name"], name)
            return result

        return download

    def _log(self, request: Any, response: Any) -> None:
        if self.record is None:
            return
        data = request.data if request.method in ("POST", "PUT") else None
        size = len(data) if isinstance(data, bytes | str) else len((data or {}).get("content", b""))
        line = {
            "t": round(time.monotonic() - self.started, 6),
            "wall": time.time(),
            "method": request.method,
            "key": f"{request.params.get('bucket_name')}/{_object_name(request)}",
            "status": int(response.status),
            "if_generation_match": _first(request.query, "ifGenerationMatch"),
            "size": size,
        }
        self.record.write(json.dumps(line) + "\n")


def install(record: TextIO | None = None) -> None:
    """Wrap the emulator's handlers in this process (before its server starts)."""
    from gcp_storage_emulator import server
    from gcp_storage_emulator.handlers import objects

    wrap = PreconditionHandlers(record)
    writes = {objects.insert, objects.xml_upload, objects.delete}
    downloads = {objects.download}
    for _, handlers in server.HANDLERS:
        for method, handler in list(handlers.items()):
            if handler in writes:
                handlers[method] = wrap.checked(handler)
            elif handler in downloads:
                handlers[method] = wrap.with_generation(handler)
    # The router falls back to `objects.insert` for uploads posted without /upload, and the
    # JSON API's `get` with `alt=media` calls `objects.download` itself.
    objects.insert = wrap.checked(objects.insert)
    objects.download = wrap.with_generation(objects.download)


def serve(host: str, port: int, record_path: str | None) -> None:
    import http.server

    from gcp_storage_emulator.server import create_server

    # The emulator serves one request at a time; with Python's default listen backlog (5),
    # a burst of connections from several managers has SYNs dropped, each retried a second
    # later: long enough to cost a leader its lease.
    http.server.HTTPServer.request_queue_size = 256
    record = open(record_path, "a", buffering=1) if record_path else None  # noqa: SIM115 - open for the process's life
    install(record)
    server = create_server(host, port, in_memory=True)
    server.start()
    print(f"ready http://{host}:{port}", flush=True)
    try:
        while True:
            time.sleep(3600)
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--record", help="append one JSON line per request that changes the bucket")
    args = parser.parse_args(argv)
    serve(args.host, args.port, args.record)


if __name__ == "__main__":
    main()

"""Values exactly as GreptimeDB writes them, for stores prepared outside procstore."""

from __future__ import annotations

import json


def greptime_step(type_name: str, data: str, step: int, parent: str | None = None, error: str | None = None) -> bytes:
    """A message exactly as GreptimeDB's serde_json writes it."""
    parent_json = "null" if parent is None else f'"{parent}"'
    error_json = "" if error is None else f',"error":{json.dumps(error)}'
    return (
        f'{{"type_name":"{type_name}","data":{json.dumps(data)},"parent_id":{parent_json},"step":{step}{error_json}}}'
    ).encode()

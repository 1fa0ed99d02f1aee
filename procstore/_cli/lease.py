"""`procstore lease`: which manager leads the store, as the stored lease says."""

from __future__ import annotations

import time
from typing import Any

import click

from procstore._cli.common import (
    CommandError,
    ExitCode,
    closing,
    open_existing_store,
    run_command,
    store_options,
)
from procstore._cli.output import chosen_format, emit, iso_time, output_options, stored, table_time
from procstore._client.leader import lease_state, read_lease
from procstore._runtime.lease import LeaseRecord


@click.command("lease")
@store_options
@output_options
@run_command
async def lease(
    url: str, storage_options: tuple[str, ...], parent_path: str, output: str | None, as_json: bool
) -> None:
    """Who leads the managers of this store: holder, epoch, TTL and the last renewal.

    Only managers started with `lease=` keep a lease. The age of the last renewal compares
    the store's clock (the object's modification time) with this machine's, so clock skew
    shows in it; the managers themselves never compare two machines' clocks.
    """
    store = await open_existing_store(url, storage_options, parent_path)
    key, raw, modified = await closing(store, read_lease(store))
    where = f"{store.store.url}{key}"
    if raw is None:
        raise CommandError(
            f"no lease at {where}: the managers of this store run without `lease=`, or none has started yet",
            ExitCode.NOT_FOUND,
        )
    try:
        record = LeaseRecord.decode(raw)
    except ValueError as e:
        raise CommandError(
            f"{where} is unreadable: {e}. Most likely a write cut off by a killed manager: the managers take it "
            "for a lease nobody holds, and one of them takes it over once it has stayed so for a TTL",
            ExitCode.UNREADABLE,
        ) from e
    age = None if modified is None else max(0.0, time.time() - modified)
    document: dict[str, Any] = {
        "key": key,
        "holder": record.holder,
        "epoch": record.epoch,
        "renewal": record.renewal,
        "ttl": record.ttl,
        "released": record.released,
        "modified": iso_time(modified),
        "state": lease_state(record, age)[0],
    }
    lines = [
        f"lease    {where}",
        f"holder   {stored(record.holder)}",
        f"epoch    {record.epoch} (leaderships so far), renewal {record.renewal}",
        f"ttl      {record.ttl:g} s",
        f"written  {iso_time(modified) or '-'} ({table_time(modified, 'relative', time.time())})",
        f"state    {lease_state(record, age)[1]}",
    ]
    emit(chosen_format(storage_options, output, as_json), document, lambda: lines)

"""`procstore signal`: send a signal to a procedure, from any process (see `procstore.store.signals`)."""

from __future__ import annotations

import json

import click

from procstore._cli.common import (
    CommandError,
    ExitCode,
    open_existing_store,
    resolve_id,
    run_command,
    storable_text,
    store_options,
)
from procstore._cli.listing import load_inventory
from procstore._cli.output import error_console, output_console
from procstore.errors import ProcedureError
from procstore.ids import ProcedureId
from procstore.store.signals import send_signal


def _payload(_ctx: click.Context, _param: click.Parameter, text: str | None) -> object:
    # The standard library's parser, not orjson's: orjson reads an integer beyond 64 bits as
    # a float (rounded, stored changed without a word); read exactly, such an integer is
    # refused as the Python API refuses it, and so are NaN and Infinity, which JSON has not.
    if text is None:
        return None
    try:
        return json.loads(text, parse_constant=_not_json)
    except (ValueError, RecursionError) as e:  # nested too deep for the parser: RecursionError
        raise click.BadParameter(f"not JSON ({e})") from None


def _not_json(constant: str) -> object:
    raise ValueError(f"{constant} is no JSON value")


@click.command()
@store_options
@click.argument("procedure_id")
@click.argument("name", callback=storable_text)
@click.option("--payload", default=None, callback=_payload, metavar="JSON", help="The signal's payload (JSON).")
@run_command
async def signal(
    url: str, storage_options: tuple[str, ...], parent_path: str, procedure_id: str, name: str, payload: object
) -> None:
    """Send the signal NAME to an unfinished procedure (its id, or a unique prefix of it).

    Stored create-only under `requests/signals/ID/`: the manager running the procedure finds
    it at its next look at `requests/` (a second or so), and a procedure waiting for NAME
    (`Status.wait_for_signal`) sees PAYLOAD in `ctx.signals` at its next step; one not waiting
    yet receives it when it does. Refused for a procedure that has ended or is not stored.
    """
    store = await open_existing_store(url, storage_options, parent_path)
    try:
        pid = ProcedureId.parse_canonical(procedure_id.lower())
        if pid is None:  # a prefix, as `ls` shows ids
            inventory = await load_inventory(store, error_console())
            pid = resolve_id(inventory.procedures, procedure_id, inventory.unlisted_ids)
        key = await send_signal(store, pid, name, payload)
    except ProcedureError as e:
        raise CommandError(str(e), ExitCode.REFUSED) from e
    except TypeError as e:
        raise CommandError(str(e), ExitCode.USAGE) from e
    finally:
        await store.store.close()
    output_console().print(f"wrote {key}: the manager running {pid} delivers it to the procedure's wait for {name!r}")

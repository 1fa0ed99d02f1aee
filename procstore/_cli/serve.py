"""`procstore serve`: the web view of a store (`procstore._web`), on uvicorn."""

from __future__ import annotations

import ipaddress

import click

from procstore._cli.common import (
    CommandError,
    ExitCode,
    open_existing_store,
    parse_storage_options,
    run_command,
    storable_text,
    store_options,
)
from procstore._cli.output import warn


@click.command()
@store_options
@click.option("--host", default="127.0.0.1", show_default=True, callback=storable_text, help="Address to listen on.")
@click.option("--port", type=click.IntRange(0, 65535), default=8600, show_default=True, help="Port to listen on.")
@click.option(
    "--refresh", type=click.FloatRange(0.2), default=2.0, show_default=True, help="Seconds between page updates."
)
@click.option("--read-only", is_flag=True, help="No action buttons, even on a loopback address.")
@click.option(
    "--allow-actions",
    is_flag=True,
    help="Action buttons on a non-loopback address too: anyone who can reach it can steer procedures.",
)
def serve(
    url: str,
    storage_options: tuple[str, ...],
    parent_path: str,
    host: str,
    port: int,
    refresh: float,
    read_only: bool,
    allow_actions: bool,
) -> None:
    """A live web page of the store: counts by status, the procedures with search, filters
    and pages, each one's status, timeline, input and output, tree and decoded steps,
    unreadable values with what to do, the lease, and the history of ended procedures.

    On a loopback address (the default, 127.0.0.1) a procedure's page has cancel, fail,
    resume and rewind buttons, with a reason (done through `procstore.Client`, each form
    carrying this server's token); on any other address only with `--allow-actions`, and
    never with `--read-only`. Needs the `web` extra (`pip install 'procstore[web]'`): the
    page shows everything the store holds, so expose it with care.
    """
    try:
        import uvicorn

        from procstore._web.app import create_app
    except ImportError as e:
        raise CommandError(
            f"procstore serve needs the web extra ({e.name} is missing): pip install 'procstore[web]'",
            ExitCode.USAGE,
        ) from e
    # A bad URL, a missing directory or bucket: the one-line error (exit code 3) of every
    # command, before the server starts. Once it runs, a store that fails answers 503.
    run_command(_check_store)(url, storage_options, parent_path)
    own_hosts = loopback_hosts(host)
    actions = not read_only and (own_hosts is not None or allow_actions)
    app = create_app(url, parse_storage_options(storage_options), parent_path, refresh, own_hosts, actions)
    shown = f"[{host}]" if ":" in host and not host.startswith("[") else host  # an IPv6 address, as URLs write it
    mode = "with actions" if actions else "read-only"
    click.echo(f"serving {url} on http://{shown}:{port}/ ({mode}; Ctrl-C stops)", err=True)
    if own_hosts is None and not actions and not read_only:
        warn(f"no action buttons: {host} is not a loopback address (--allow-actions gives them to whoever reaches it)")
    if own_hosts is None:
        warn(
            f"listening on {host}, not a loopback address: anyone who can reach it reads everything the store "
            "holds, with no login, and any Host header is answered; put it behind a proxy that checks both"
        )
    uvicorn.run(app, host=host, port=port, log_level="warning")


async def _check_store(url: str, storage_options: tuple[str, ...], parent_path: str) -> None:
    store = await open_existing_store(url, storage_options, parent_path)
    await store.store.close()


def loopback_hosts(host: str) -> list[str] | None:
    """The `Host` headers to accept when listening on a loopback address (the names of this
    machine), against DNS rebinding; None (any) when listening elsewhere."""
    name = host.strip("[]")
    try:
        loopback = ipaddress.ip_address(name).is_loopback
    except ValueError:
        loopback = name.lower() == "localhost"
    if not loopback:
        return None
    own = f"[{name}]" if ":" in name else name.lower()
    return sorted({"127.0.0.1", "localhost", "[::1]", own})

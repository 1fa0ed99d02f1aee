"""A TCP proxy on 127.0.0.1 that delays what clients send by a network's latency.

The moto server answers requests one at a time and at once: through it alone, requests that
procstore sends together (a step's write and its look for an operator request) cannot be
seen to overlap, and a request costs what moto's Python costs, not what a round trip to S3
does. Behind this proxy each chunk a client sends reaches the server `delay` after it was
sent (fixed, or drawn from a lognormal clipped to a range), in order per connection; the
answers come back at once. A connection's requests wait their delay concurrently with other
connections', as on S3, so what the rules let procstore overlap shows in the figures.

Run in a process of its own (`moto_behind_proxy` in benchmarks/stores.py starts it), so
that it never competes with the code under measurement for the event loop:

    python -m benchmarks.latency_proxy --port 9001 --to 9000 --fixed-ms 15
    python -m benchmarks.latency_proxy --port 9001 --to 9000 --lognormal-ms 10 40
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Callable

import click

Delay = Callable[[], float]
"""Seconds one chunk waits before it is forwarded."""


def fixed(ms: float) -> Delay:
    return lambda: ms / 1e3


def lognormal(low_ms: float, high_ms: float) -> Delay:
    """Median the geometric mean of the range, 95% of draws inside it; clipped to it."""
    median = math.sqrt(low_ms * high_ms)
    sigma = math.log(high_ms / median) / 1.96
    return lambda: min(high_ms, max(low_ms, random.lognormvariate(math.log(median), sigma))) / 1e3


async def _delayed(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: Delay) -> None:
    """Forward each chunk `delay()` after it arrived, never before the chunk ahead of it."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def forward() -> None:
        due_before = 0.0
        while True:
            arrived, chunk = await queue.get()
            if not chunk:
                break
            due = max(due_before, arrived + delay())
            due_before = due
            if (wait := due - loop.time()) > 0:
                await asyncio.sleep(wait)
            writer.write(chunk)
            await writer.drain()
        writer.close()

    forwarding = asyncio.ensure_future(forward())
    try:
        while chunk := await reader.read(65536):
            queue.put_nowait((loop.time(), chunk))
    except ConnectionError:
        pass
    queue.put_nowait((loop.time(), b""))
    await forwarding


async def _copied(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while chunk := await reader.read(65536):
            writer.write(chunk)
            await writer.drain()
    except ConnectionError:
        pass
    writer.close()


async def serve(port: int, to: int, delay: Delay) -> None:
    async def connection(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        try:
            server_reader, server_writer = await asyncio.open_connection("127.0.0.1", to)
        except OSError:
            client_writer.close()
            return
        await asyncio.gather(
            _delayed(client_reader, server_writer, delay),
            _copied(server_reader, client_writer),
            return_exceptions=True,
        )

    server = await asyncio.start_server(connection, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


@click.command()
@click.option("--port", type=int, required=True, help="Where clients connect (127.0.0.1).")
@click.option("--to", "to", type=int, required=True, help="The server's port on 127.0.0.1.")
@click.option("--fixed-ms", type=float, default=None, help="Delay every chunk by this much.")
@click.option("--lognormal-ms", nargs=2, type=float, default=None, help="Draw each delay in LOW..HIGH.")
def main(port: int, to: int, fixed_ms: float | None, lognormal_ms: tuple[float, float] | None) -> None:
    delay = lognormal(*lognormal_ms) if lognormal_ms else fixed(fixed_ms if fixed_ms is not None else 15.0)
    asyncio.run(serve(port, to, delay))


if __name__ == "__main__":
    main()

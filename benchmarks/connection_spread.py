"""How a server's new connections spread over its HTTP worker processes: open `--connections` at
once (each sends one GET /health/live and stays open), count each worker's with `ss`, close them,
and repeat. A server with `--http-workers N` should not leave a worker idle while another holds
every connection (a load balancer's pool of keep-alive connections arrives as such a burst).

    nerserve serve --models span-conll03 --http-workers 2 --port 8051 &
    python benchmarks/connection_spread.py --port 8051 --connections 16 --rounds 30
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
from collections import Counter
from typing import Annotated

import typer

app = typer.Typer(add_completion=False)


async def _open(port: int) -> asyncio.StreamWriter:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /health/live HTTP/1.1\r\nHost: spread\r\n\r\n")
    await writer.drain()
    await reader.readuntil(b"\r\n\r\n")
    return writer


def connections_by_process(port: int) -> Counter[str]:
    """Established connections to `port`, by the process id that holds each (iproute2's ss)."""
    listed = subprocess.run(
        ["ss", "-tnpH", "state", "established", f"( sport = :{port} )"], capture_output=True, text=True, check=True
    ).stdout
    return Counter(re.findall(r"pid=(\d+)", listed))


async def _rounds(port: int, connections: int, rounds: int) -> list[list[int]]:
    splits = []
    for _ in range(rounds):
        writers = await asyncio.gather(*(_open(port) for _ in range(connections)))
        splits.append(sorted(connections_by_process(port).values(), reverse=True))
        for writer in writers:
            writer.close()
        await asyncio.sleep(0.2)  # closed before the next round opens its own
    return splits


@app.command()
def main(
    port: Annotated[int, typer.Option()] = 8000,
    connections: Annotated[int, typer.Option(min=1)] = 16,
    rounds: Annotated[int, typer.Option(min=1)] = 30,
) -> None:
    splits = asyncio.run(_rounds(port, connections, rounds))
    one_sided = sum(1 for split in splits if split and split[0] == connections)
    print(json.dumps({"connections": connections, "splits": splits, "rounds_all_on_one_worker": one_sided}))


if __name__ == "__main__":
    app()

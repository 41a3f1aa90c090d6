"""Two servers answer the same: the README's examples, error cases and the KServe v2 routes, sent to
both, status and body compared to the byte. For a refactor that must not change behaviour: serve
the commit before on one port and the one after on another, with the same models.

    nerserve serve --models span-conll03,nag-cadec,diffusion-genia,gliner-open --port 8050 &   # before
    nerserve serve --models span-conll03,nag-cadec,diffusion-genia,gliner-open --port 8051 &   # after
    python benchmarks/compare_answers.py --before http://127.0.0.1:8050 --after http://127.0.0.1:8051
"""

from __future__ import annotations

from typing import Annotated, Any

import httpx
import typer

app = typer.Typer(add_completion=False)


def _infer(data: list[Any], shape: int = 1, datatype: str = "BYTES") -> dict[str, Any]:
    return {"inputs": [{"name": "text", "shape": [shape], "datatype": datatype, "data": data}]}


CASES: list[tuple[str, str, Any]] = [
    ("POST", "/extract", {"model": "span-conll03", "texts": ["EU rejects German call to boycott British lamb."]}),
    ("POST", "/extract", {"model": "nag-cadec", "texts": ["All joints and muscles hurt."]}),
    (
        "POST",
        "/extract",
        {
            "model": "diffusion-genia",
            "texts": ["IL-2 gene expression requires NF-kappa B in T cells."],
            "options": {"steps": 2, "proposals": 100},
        },
    ),
    (
        "POST",
        "/extract",
        {"model": "gliner-open", "texts": ["I took ibuprofen for my migraine."], "labels": ["medication", "illness"]},
    ),
    ("POST", "/extract", {"texts": ["Peter Blackburn met Angela Merkel in Berlin on Monday."]}),
    ("POST", "/extract", {"model": "nope", "texts": ["x"]}),
    ("POST", "/extract", {"texts": "not a list"}),
    ("POST", "/extract", {"model": "gliner-open", "texts": ["x"]}),
    ("POST", "/extract", b"{bad json"),
    ("GET", "/nowhere", None),
    ("GET", "/models", None),
    ("GET", "/v2/models/span-conll03", None),
    ("GET", "/v2/models/nope", None),
    ("GET", "/v2/models/nope/ready", None),
    ("POST", "/v2/models/span-conll03/infer", _infer(["EU rejects German call."])),
    ("POST", "/v2/models/span-conll03/infer", _infer(["EU rejects German call."], shape=2)),
    ("POST", "/v2/models/span-conll03/versions/0/infer", _infer(["EU"])),
    ("POST", "/v2/models/span-conll03/infer", _infer([1], datatype="INT8")),
]


def answer(url: str, method: str, path: str, body: Any) -> tuple[int, str]:
    if isinstance(body, bytes):
        sent: dict[str, Any] = {"content": body, "headers": {"content-type": "application/json"}}
    else:
        sent = {"json": body} if body is not None else {}
    response = httpx.request(method, f"{url}{path}", timeout=60, **sent)
    return response.status_code, response.text


@app.command()
def main(
    before: Annotated[str, typer.Option(help="the server of the commit before")],
    after: Annotated[str, typer.Option(help="the server of the commit after")],
) -> None:
    differences = 0
    for method, path, body in CASES:
        old, new = answer(before, method, path, body), answer(after, method, path, body)
        differences += old != new
        typer.echo(f"{'same' if old == new else 'DIFFERENT'} {method} {path} {old[0]} {old[1][:120]}")
        if old != new:
            typer.echo(f"    after: {new[0]} {new[1][:300]}")
    typer.echo(f"{len(CASES)} requests, {differences} different")
    raise typer.Exit(1 if differences else 0)


if __name__ == "__main__":
    app()

"""API keys at the door: before a body is read and before admission counts the request, a missing
or wrong `Authorization: Bearer <key>` on a protected route is answered 401 (JSON, counted in
/metrics as every response is); a right one puts the key's name in the request's scope, where
admission, the fair order and the metrics read it. Health, /info, the docs and (unless configured)
/metrics stay open, for probes and scrapers.

`Door` decides; `KeyAuth` applies it to the ASGI app (wherever the app runs, Ray Serve included),
and the HTTP protocol (service.http_protocol) applies it as soon as a request's headers are parsed,
answering a refusal in the same callback, so that under load a 401 does not wait its turn behind
the answers the event loop is writing."""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from nerserve.service.api.errors import error_body
from nerserve.service.metrics import ResponseRecorder
from nerserve.service.tenants import UNKNOWN, Tenants

PROTECTED = ("/extract", "/models", "/stats", "/v2")
OPEN_UNDER_V2 = ("/v2/health/",)
CHALLENGE = (b"www-authenticate", b'Bearer realm="nerserve"')


def tenant_of(scope: Scope) -> str:
    """The key's name the door put in the scope ("" without keys)."""
    return str(scope.get("state", {}).get("tenant", ""))


def key_name(scope: Scope) -> str | None:
    """The key's name where the door asked for one and let the request through, else None (what
    the per-key metrics count by)."""
    return tenant_of(scope) if "tenant" in scope.get("state", {}) else None


class Door:
    def __init__(self, tenants: Tenants, record: ResponseRecorder, protect_metrics: bool = False) -> None:
        self.tenants = tenants
        self.record = record
        self.protected = PROTECTED + (("/metrics",) if protect_metrics else ())

    def _protects(self, scope: Scope) -> bool:
        # a CORS preflight (OPTIONS) runs nothing and carries no credentials: never refused here
        if not self.tenants.enabled or scope.get("method") == "OPTIONS":
            return False
        path = scope.get("path", "")
        if path.startswith(OPEN_UNDER_V2):
            return False
        return any(path == prefix or path.startswith(prefix + "/") for prefix in self.protected)

    def check(self, scope: Scope) -> str | None:
        """None: let through (with the key's name in the scope where a key was asked for); else
        why it is refused. A request the protocol's door let through is not weighed again."""
        if "tenant" in scope.get("state", {}) or not self._protects(scope):
            return None
        authorization = next((value.decode("latin-1") for name, value in scope["headers"] if name == b"authorization"), None)
        tenant = self.tenants.identify(authorization)
        if tenant is None:
            return "missing API key" if authorization is None else "wrong API key"
        scope.setdefault("state", {})["tenant"] = tenant
        return None

    def refusal(self, why: str, path: str = "") -> bytes:
        """The 401's body for a request to PATH; counted as it is made (every refusal is sent)."""
        self.record("", 401, UNKNOWN, None)
        return error_body("unauthorized", f"{why}: send 'Authorization: Bearer <key>'", "authorization", path)


class KeyAuth:
    def __init__(self, app: ASGIApp, door: Door) -> None:
        self.app = app
        self.door = door

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        why = self.door.check(scope) if scope["type"] == "http" else None
        if why is None:
            await self.app(scope, receive, send)
            return
        body = self.door.refusal(why, scope["path"])
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), CHALLENGE]
        await send({"type": "http.response.start", "status": 401, "headers": headers})
        await send({"type": "http.response.body", "body": body})

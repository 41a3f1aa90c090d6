"""API keys at the door: before a body is read and before admission counts the request, a missing
or wrong `Authorization: Bearer <key>` on a protected route is answered 401 (JSON, counted in
/metrics as every response is); a right one puts the key's name in the request's scope, where
admission, the fair order and the metrics read it. Health, /info, the docs and (unless configured)
/metrics stay open, for probes and scrapers."""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Receive, Scope, Send

from nerserve.service.metrics import Metrics
from nerserve.service.tenants import UNKNOWN, Tenants

PROTECTED = ("/extract", "/models", "/stats", "/v2")
OPEN_UNDER_V2 = ("/v2/health/",)


def tenant_of(scope: Scope) -> str:
    """The key's name the door put in the scope ("" without keys)."""
    return str(scope.get("state", {}).get("tenant", ""))


class KeyAuth:
    def __init__(self, app: ASGIApp, tenants: Tenants, metrics: Metrics, protect_metrics: bool = False) -> None:
        self.app = app
        self.tenants = tenants
        self.metrics = metrics
        self.protected = PROTECTED + (("/metrics",) if protect_metrics else ())

    def _protects(self, path: str) -> bool:
        if path.startswith(OPEN_UNDER_V2):
            return False
        return any(path == prefix or path.startswith(prefix + "/") for prefix in self.protected)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # a CORS preflight (OPTIONS) runs nothing and carries no credentials: never refused here
        if (
            scope["type"] != "http"
            or not self.tenants.enabled
            or scope.get("method") == "OPTIONS"
            or not self._protects(scope.get("path", ""))
        ):
            await self.app(scope, receive, send)
            return
        authorization = next((value.decode("latin-1") for name, value in scope["headers"] if name == b"authorization"), None)
        tenant = self.tenants.identify(authorization)
        if tenant is None:
            await self._refuse(send, "missing API key" if authorization is None else "wrong API key")
            return
        scope.setdefault("state", {})["tenant"] = tenant
        await self.app(scope, receive, send)

    async def _refuse(self, send: Send, why: str) -> None:
        message = f"{why}: send 'Authorization: Bearer <key>'"
        body = json.dumps({"error": {"code": "unauthorized", "message": message, "field": "authorization"}}).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"www-authenticate", b'Bearer realm="nerserve"'),
        ]
        await send({"type": "http.response.start", "status": 401, "headers": headers})
        await send({"type": "http.response.body", "body": body})
        self.metrics.requests.labels("", "401").inc()
        self.metrics.key_requests.labels(UNKNOWN, "401").inc()

"""GET /docs in a real headless browser (Debian's chromium) that may reach 127.0.0.1 and nothing
else: Swagger UI loads from the server itself and renders the API's operations. The screenshot is
written to the test's temporary folder and its path printed (pytest -s, or the -rA report)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.serving import Server

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# CI installs chromium and sets this: the test then fails, not skips, without a browser
REQUIRED = os.environ.get("NERSERVE_BROWSER_TESTS") == "required"
# every host name but 127.0.0.1 fails to resolve: a page that needs a CDN renders nothing
OFFLINE = "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1"


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    instance = Server(models='["span-conll03"]')
    try:
        instance.wait_ready()
        yield instance
    finally:
        instance.stop()


def chromium(url: str, *flags: str) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM
    command = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", OFFLINE, "--virtual-time-budget=15000", *flags, url]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.skipif(not CHROMIUM and not REQUIRED, reason="chromium not installed (apt-get install chromium)")
def test_docs_render_their_operations_with_no_network_but_the_server(server: Server, tmp_path: Path) -> None:
    dom = chromium(f"{server.url}/docs", "--dump-dom").stdout
    # Swagger UI draws one block per operation, summary path in it
    assert 'class="opblock-summary-path"' in dom or "opblock-summary-path" in dom, dom[-2000:]
    for path in ("/extract", "/models", "/health/ready"):
        assert path in dom, path
    shot = tmp_path / "docs.png"
    chromium(f"{server.url}/docs", f"--screenshot={shot}", "--window-size=1280,1600")
    assert shot.is_file() and shot.stat().st_size > 10_000
    print(f"screenshot of /docs: {shot}")

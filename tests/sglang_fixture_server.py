"""FixtureServer: a real aiohttp HTTP server on 127.0.0.1 (port 0) answering SGLang's response shapes.

Each path maps to a list of canned answers (status, body, content type): they are given in order,
the last one repeats, so a bootstrap `/route` can answer 503 twice and then 200. `hits[path]`
counts the requests. The server runs its own event loop in a daemon thread and stops on `close()`
(or at the end of a `with` block); tests never leave it running.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections import defaultdict
from pathlib import Path
from typing import Any

from aiohttp import web

# Not under data/: every file there is read as a deployment or adaptive config by the validate tests.
SGLANG_DATA = Path(__file__).parent / "sglang_http"

Answer = tuple[int, bytes, str]


def fixture(name: str) -> Any:
    return json.loads((SGLANG_DATA / name).read_text(encoding="utf-8"))


def json_answer(doc: Any, status: int = 200) -> Answer:
    return status, json.dumps(doc).encode(), "application/json"


def text_answer(text: str, status: int = 200, content_type: str = "text/plain") -> Answer:
    return status, text.encode(), content_type


class FixtureServer:
    def __init__(self, routes: dict[str, list[Answer]]) -> None:
        self.routes = routes
        self.hits: defaultdict[str, int] = defaultdict(int)
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._runner: web.AppRunner | None = None
        self.port = 0
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("fixture server did not start")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._start())
        self._ready.set()
        self._loop.run_forever()

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_route("GET", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert server is not None
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def _handle(self, request: web.Request) -> web.Response:
        path = request.path
        self.hits[path] += 1
        answers = self.routes.get(path)
        if not answers:
            return web.Response(status=404, text="404: Not Found")
        status, body, ctype = answers[0] if len(answers) == 1 else answers.pop(0)
        return web.Response(status=status, body=body, content_type=ctype.split(";")[0])

    def close(self) -> None:
        async def stop() -> None:
            if self._runner is not None:
                await self._runner.cleanup()

        if self._loop.is_running():
            asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def __enter__(self) -> FixtureServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

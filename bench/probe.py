"""ServerProbe: the bench client's side-channel GETs (`/v1/models`, `/server_info`, `/metrics`).

All best-effort with a short timeout: a server without an endpoint (404), with a non-JSON answer,
or slow to answer yields None and the report says "n/a". `/server_info` falls back to SGLang's
`/get_server_info`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from typing import Any

import aiohttp


@dataclasses.dataclass(frozen=True)
class ServerSnapshot:
    wall_time: float
    server_info: dict[str, Any] | None
    metrics_text: str | None


class ServerProbe:
    def __init__(self, session: aiohttp.ClientSession, url: str, *, timeout_s: float = 5.0) -> None:
        self._session = session
        self._url = url.rstrip("/")
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._info_paths = ["/server_info", "/get_server_info"]

    async def get_text(self, path: str) -> str | None:
        try:
            async with self._session.get(self._url + path, timeout=self._timeout) as resp:
                if resp.status != 200:
                    return None
                return await resp.text(errors="replace")
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError):
            return None

    async def get_json(self, path: str) -> Any:
        text = await self.get_text(path)
        if text is None:
            return None
        try:
            return json.loads(text)
        except ValueError:
            return None

    async def first_model(self) -> str | None:
        data = await self.get_json("/v1/models")
        items = data.get("data") if isinstance(data, dict) else None
        if isinstance(items, list) and items and isinstance(items[0], dict) and isinstance(items[0].get("id"), str):
            return items[0]["id"]
        return None

    async def server_info(self) -> dict[str, Any] | None:
        for path in list(self._info_paths):
            data = await self.get_json(path)
            if isinstance(data, dict):
                self._info_paths = [path]  # remember which one this server has
                return data
        return None

    async def snapshot(self) -> ServerSnapshot:
        info, metrics = await asyncio.gather(self.server_info(), self.get_text("/metrics"))
        return ServerSnapshot(time.time(), info, metrics)

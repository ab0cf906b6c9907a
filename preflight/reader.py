"""ServerReader: the preflight's GETs against one server -- `/server_info`, `/model_info`, bootstrap `/route`.

Every request has a timeout; every failure is a `RuntimeFailure` (exit 3) naming the server, the
URL and what came back (refused connection, HTTP status, HTML or other non-JSON body), never a
traceback. Prefill's bootstrap answers 503 until every prefill rank has registered; `bootstrap_route`
retries it (and a refused connection: the bootstrap server may still be starting) until the
deadline, then says how long it waited and the last answer.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

from specctl.errors import RuntimeFailure, UsageError

# SGLang's "give me prefill's parallel info" query (disaggregation/common/conn.py): all ranks -1.
ROUTE_QUERY = "prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1&target_pp_rank=-1"
MAX_BODY = 16 * 2**20  # a /server_info is a few KB; anything this large is not one
_ROUTE_HINTS = {
    "HTTP": "503 means prefill has not registered all of its ranks yet: wait for prefill to finish loading, "
            "or raise --timeout",
    "connection refused": "nothing listens there: --bootstrap-port must be prefill's "
                          "--disaggregation-bootstrap-port",
    "timed out": "something accepted the connection but sent no HTTP answer: is --bootstrap-port an SGLang "
                 "bootstrap? (today's specctl prefill pairs over ZeroMQ there: leave --bootstrap-port out)",
}
_RETRY_FIRST_S = 0.1
_RETRY_MAX_S = 1.0


@dataclass(frozen=True)
class Answer:
    status: int
    content_type: str
    body: bytes


class Unreachable(Exception):
    """No HTTP answer at all (refused, reset, timed out, not HTTP)."""


def normalise_url(url: str, *, what: str) -> str:
    """`http://host:port` without a trailing slash; `host:port` gets `http://`. UsageError if unusable."""
    text = url.strip().rstrip("/")
    if "://" not in text:
        text = "http://" + text
    parts = urllib.parse.urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"{what}: {url!r} is not an http://HOST:PORT URL",
                         hint=f"e.g. --{what} http://127.0.0.1:30001")
    try:
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        raise UsageError(f"{what}: {url!r} has an invalid port", hint=f"e.g. --{what} http://127.0.0.1:30001") from None
    return text


def http_get(url: str, timeout_s: float) -> Answer:
    """One bounded GET (at most MAX_BODY + 1 bytes read): any HTTP answer, or Unreachable when none came."""
    req = urllib.request.Request(url, headers={"Accept": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:  # noqa: S310 - http(s) only, checked above
            return Answer(resp.status, resp.headers.get("Content-Type", ""), resp.read(MAX_BODY + 1))
    except urllib.error.HTTPError as exc:
        with exc:
            body = exc.read(MAX_BODY + 1) if exc.fp is not None else b""
            return Answer(exc.code, exc.headers.get("Content-Type", "") if exc.headers else "", body)
    except (TimeoutError, urllib.error.URLError, http.client.HTTPException, OSError) as exc:
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        raise Unreachable(_reason(reason)) from None


def get_json(url: str, timeout_s: float) -> tuple[dict[str, Any], int | None]:
    """(JSON object body, status) of one bounded GET: `{}` for a body that is not a JSON object (or is past
    MAX_BODY), `({}, None)` when no HTTP server answered. That includes an answer that is not HTTP: polling a
    port in the ephemeral range before its server binds it, the kernel can pick that same port as the source
    and connect the socket to itself (a TCP self-connect), so the "response" is the request echoed: not up
    yet, not a crash."""
    try:
        answer = http_get(url, timeout_s)
    except Unreachable:
        return {}, None
    if len(answer.body) > MAX_BODY:
        return {}, answer.status
    try:
        body = json.loads(answer.body)
    except (ValueError, UnicodeDecodeError, RecursionError):  # not JSON, or nested past the parser's depth
        return {}, answer.status
    return (body if isinstance(body, dict) else {}), answer.status


def _reason(reason: object) -> str:
    if isinstance(reason, TimeoutError):
        return "timed out"
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused"
    text = str(reason) or type(reason).__name__
    return text


def _snippet(body: bytes) -> str:
    text = body[:120].decode("utf-8", errors="replace").replace("\n", " ").strip()
    return text + ("..." if len(body) > 120 else "")


def _json_object(answer: Answer, *, who: str, url: str) -> dict[str, object]:
    if len(answer.body) > MAX_BODY:
        raise RuntimeFailure(f"{who} {url} answered more than {MAX_BODY // 2**20} MiB: not a server description")
    try:
        doc = json.loads(answer.body)
    except RecursionError:
        raise RuntimeFailure(f"{who} {url} answered JSON nested too deep to be a server description",
                             hint="point the URL at the SGLang (or specctl) server's HTTP port") from None
    except (ValueError, UnicodeDecodeError):
        kind = "HTML" if b"<html" in answer.body[:512].lower() or "html" in answer.content_type else "non-JSON"
        raise RuntimeFailure(
            f"{who} {url} answered {kind} ({answer.content_type or 'no content type'}): {_snippet(answer.body)!r}",
            hint="point the URL at the SGLang (or specctl) server's HTTP port, not a proxy or another service",
        ) from None
    if not isinstance(doc, dict):
        raise RuntimeFailure(f"{who} {url} answered JSON that is not an object: {_snippet(answer.body)!r}")
    return doc


class ServerReader:
    """GETs against one server (`who` is "prefill" or "decode", used in every message)."""

    def __init__(self, who: str, url: str, *, request_timeout_s: float = 5.0) -> None:
        self.who = who
        self.url = normalise_url(url, what=who)
        self.request_timeout_s = request_timeout_s

    @property
    def host(self) -> str:
        return urllib.parse.urlsplit(self.url).hostname or "127.0.0.1"

    def _fetch(self, path: str) -> Answer:
        url = self.url + path
        try:
            return http_get(url, self.request_timeout_s)
        except Unreachable as exc:
            raise RuntimeFailure(f"{self.who} server {self.url} is not reachable: {exc}",
                                 hint=f"is the {self.who} server running and listening on that address?") from None

    def server_info(self) -> dict[str, object]:
        """`/server_info` (SGLang's deprecated `/get_server_info` where the first is missing)."""
        for path in ("/server_info", "/get_server_info"):
            answer = self._fetch(path)
            if answer.status == 404 and path == "/server_info":
                continue
            if answer.status != 200:
                raise RuntimeFailure(f"{self.who} {self.url}{path} answered HTTP {answer.status}: "
                                     f"{_snippet(answer.body)!r}",
                                     hint="wait until the server is up (its /health answers 200), then retry")
            return _json_object(answer, who=self.who, url=self.url + path)
        raise RuntimeFailure(f"{self.who} {self.url} has no /server_info (HTTP 404)",
                             hint="preflight reads SGLang's (or specctl's) /server_info; is this an engine server?")

    def model_info(self) -> dict[str, object] | None:
        """`/model_info`, or None where the server has none (404): today's specctl servers."""
        answer = self._fetch("/model_info")
        if answer.status == 404:
            return None
        if answer.status != 200:
            raise RuntimeFailure(f"{self.who} {self.url}/model_info answered HTTP {answer.status}: "
                                 f"{_snippet(answer.body)!r}")
        return _json_object(answer, who=self.who, url=self.url + "/model_info")

    def bootstrap_route(self, port: int, *, timeout_s: float) -> dict[str, object]:
        """Prefill's bootstrap `GET /route?...=-1`, retried while it answers 503 (not every prefill rank
        registered yet) or refuses the connection, until `timeout_s`; RuntimeFailure after that."""
        url = f"http://{self._bracketed_host()}:{port}/route?{ROUTE_QUERY}"
        deadline = time.monotonic() + timeout_s
        delay = _RETRY_FIRST_S
        last = "no answer"
        attempts = 0
        while True:
            attempts += 1
            left = deadline - time.monotonic()
            try:
                answer = http_get(url, max(0.05, min(self.request_timeout_s, left)))
            except Unreachable as exc:
                last = str(exc)
            else:
                if answer.status == 200:
                    return _json_object(answer, who="prefill bootstrap", url=url)
                if answer.status != 503:
                    raise RuntimeFailure(
                        f"prefill bootstrap {url} answered HTTP {answer.status}: {_snippet(answer.body)!r}",
                        hint="--bootstrap-port must be prefill's --disaggregation-bootstrap-port")
                last = f"HTTP 503 {_snippet(answer.body)!r}"
            if time.monotonic() + delay > deadline:
                raise RuntimeFailure(
                    f"prefill bootstrap {url} did not answer within {timeout_s:g} s "
                    f"({attempts} attempt{'s' if attempts > 1 else ''}; last: {last})",
                    hint=_ROUTE_HINTS.get("HTTP" if last.startswith("HTTP") else last,
                                          "check --bootstrap-port and that prefill is up"))
            time.sleep(delay)
            delay = min(_RETRY_MAX_S, delay * 2)

    def _bracketed_host(self) -> str:
        host = self.host
        return f"[{host}]" if ":" in host else host


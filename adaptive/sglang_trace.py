"""SGLang's per-request speculative statistics, wherever SGLang puts them, as trace request lines.

SGLang 0.5.23 reports a finished request's acceptance under the same keys everywhere (its
`TokenizerManager._calculate_spec_decoding_metrics`): `spec_verify_ct`, `spec_num_correct_drafts`,
`spec_accept_length`, `spec_num_proposed_drafts` (= verify count x the launch-time draft length, so it gives
that length back), `spec_correct_drafts_histogram`. They sit in

- `meta_info` of native `/generate` (`from_meta_info`);
- `sglext.spec_tokens_details` of the OpenAI API when the request sets `return_spec_tokens_details: true`
  (`from_sglext`: a dict, or a list of them for n > 1; streaming sends it on a chunk with no choices);
- the `--export-metrics-to-file` file: one JSON line per request, `{"request_parameters": "...", **meta_info}`;
- `--log-requests` output: `--log-requests-format json` lines `{"event": "request.finished", "rid", "out":
  {"meta_info": ...}}`, and the text format's `Finish: obj=..., out={...}` lines (`out` a Python repr, read
  with `ast.literal_eval`, which evaluates literals only);
- a DSPARK dump (`SGLANG_DSPARK_DEBUG_DUMP=reqs`): `/server_info`'s `internal_states[].dspark_info_record`,
  `{"gamma", "records": [{"bs", "reqs": [{"rid", "verify_len", "correct_drafts", ...}]}]}`: one verify per
  record, exact; `verify_len` counts the verified positions, the drafts plus the bonus position.

specctl's own servers answer with the same keys in the same places (engine/serve/spec_stats.py), plus
`spec_accept_lengths` (the verifies in order), kept as the request line's `accepted`.

`read_sglang_output(path)` reads any of those files into trace lines; `concurrency(spans)` estimates the batch
each request decoded in (the time-weighted mean number of requests decoding during its own decode). Torch-free.
"""

from __future__ import annotations

import ast
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specctl.adaptive.trace import HISTOGRAM_KEY, RequestRecord, TraceRecord, histogram_of
from specctl.errors import UsageError
from specctl.schemas.server_info import find_key

MAX_FILE_BYTES = 1 << 30
MAX_LINE = 1 << 22


@dataclass(frozen=True)
class SpecStats:
    """One request's speculative statistics: verify count, histogram, the order where known, and the
    launch-time draft length where the numbers give it (`spec_num_proposed_drafts / spec_verify_ct`)."""

    verify_ct: int
    histogram: tuple[int, ...]
    accepted: tuple[int, ...] | None = None
    launch_steps: int | None = None


def _count(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def from_meta_info(meta: object) -> SpecStats | None:
    """SpecStats from a `meta_info` or a `spec_tokens_details` (same keys); None without a usable histogram."""
    if not isinstance(meta, dict):
        return None
    hist = meta.get(HISTOGRAM_KEY)
    order = meta.get("spec_accept_lengths")
    accepted = None
    if isinstance(order, list) and order and all(_count(a) is not None for a in order):
        accepted = tuple(int(a) for a in order)
    if not (isinstance(hist, list) and hist and all(_count(n) is not None for n in hist)):
        if accepted is None:
            return None
        hist = list(histogram_of(accepted))
    h = tuple(int(n) for n in hist)
    while len(h) > 1 and h[-1] == 0:
        h = h[:-1]
    verify_ct = _count(meta.get("spec_verify_ct"))
    if verify_ct is None or verify_ct != sum(h):
        verify_ct = sum(h)
    if accepted is not None and histogram_of(accepted) != h:
        accepted = None  # disagreeing extras: trust SGLang's keys
    proposed = _count(meta.get("spec_num_proposed_drafts"))
    launch = proposed // verify_ct if proposed and verify_ct and proposed % verify_ct == 0 else None
    return SpecStats(verify_ct, h, accepted, launch or None) if verify_ct else None


def from_sglext(obj: object) -> list[SpecStats]:
    """Every choice's SpecStats from an OpenAI response or chunk carrying `sglext.spec_tokens_details`."""
    ext = obj.get("sglext") if isinstance(obj, dict) else None
    details = ext.get("spec_tokens_details") if isinstance(ext, dict) else None
    items = details if isinstance(details, list) else [details]
    return [s for s in (from_meta_info(d) for d in items) if s is not None]


def concurrency(spans: Sequence[tuple[float, float] | None]) -> list[int | None]:
    """Per span (a request's decode: first token to end), the time-weighted mean number of spans open during
    it, itself included, rounded (at least 1); None for a request without a span."""
    real = [s for s in spans if s is not None and s[1] >= s[0]]
    out: list[int | None] = []
    for span in spans:
        if span is None or span[1] < span[0]:
            out.append(None)
            continue
        a, b = span
        if b - a <= 0:
            out.append(1)
            continue
        overlap = sum(max(0.0, min(b, e) - max(a, s)) for s, e in real)
        out.append(max(1, round(overlap / (b - a))))
    return out


def request_line(request: str, stats: SpecStats, *, steps: int | None, batch_size: int | None, run: str | None,
                 source: str, adaptive: bool | None = None, line: int = 0,
                 span: tuple[float, float] | None = None, ttft_s: float | None = None) -> RequestRecord:
    """A trace request line; `steps` (the launch-time draft length) defaults to what the stats give, else to
    the largest accepted count (a lower bound: the trace then bounds tune below the real launch steps)."""
    k = steps or stats.launch_steps or max(1, len(stats.histogram) - 1)
    decode_s = round(span[1] - span[0], 6) if span is not None and span[1] >= span[0] else None
    return RequestRecord(line, request, max(k, len(stats.histogram) - 1), stats.verify_ct, stats.histogram,
                         batch_size or 1, stats.accepted, run, adaptive, source, decode_s,
                         round(ttft_s, 6) if ttft_s is not None and ttft_s >= 0 else None)


# ---- files -----------------------------------------------------------------------------------------------


def _meta_of(obj: dict[str, Any]) -> tuple[str | None, dict[str, Any] | None, str]:
    """(request id, meta_info, source kind) of one JSON line SGLang wrote, or (None, None, "") if not one."""
    if obj.get("event") == "request.finished":
        out = obj.get("out")
        meta = out.get("meta_info") if isinstance(out, dict) else None
        rid = obj.get("rid") if isinstance(obj.get("rid"), str) else None
        if isinstance(meta, dict):
            return rid or _str(meta.get("id")), meta, "log_requests"
    if "request_parameters" in obj or HISTOGRAM_KEY in obj or "spec_verify_ct" in obj:
        return _str(obj.get("id")), obj, "metrics_file"
    if isinstance(obj.get("meta_info"), dict):
        return _str(obj["meta_info"].get("id")), obj["meta_info"], "meta_info"
    if isinstance(obj.get("sglext"), dict):
        return _str(obj.get("id")), None, "sglext"
    return None, None, ""


def _str(v: object) -> str | None:
    return str(v) if isinstance(v, (str, int)) and not isinstance(v, bool) else None


def _text_finish(line: str) -> dict[str, Any] | None:
    """The `out` dict of a text-format `--log-requests` "Finish:" line, or None."""
    if "Finish: obj=" not in line:
        return None
    at = line.rfind(", out={")
    if at < 0:
        return None
    try:
        out = ast.literal_eval(line[at + len(", out="):].strip())
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    return out if isinstance(out, dict) else None


def _span(meta: dict[str, Any]) -> tuple[float, float] | None:
    """A request's decode span in Unix seconds from SGLang's request times (`--enable-metrics`)."""
    t0, ftl, t1 = meta.get("request_received_ts"), meta.get("first_token_latency"), meta.get("request_finished_ts")
    if t1 is None and isinstance(t0, (int, float)) and isinstance(meta.get("e2e_latency"), (int, float)):
        t1 = t0 + meta["e2e_latency"]
    nums = [x for x in (t0, ftl, t1) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)]
    if len(nums) != 3:
        return None
    assert isinstance(t0, (int, float)) and isinstance(ftl, (int, float)) and isinstance(t1, (int, float))
    return (float(t0) + float(ftl), float(t1))


def _ttft(meta: dict[str, Any]) -> float | None:
    v = meta.get("first_token_latency")
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def dspark_records(dump: object, *, run: str = "dspark") -> list[TraceRecord] | None:
    """Verify records from a DSPARK dump (a `dspark_info_record`, or a `/server_info` holding one), or None."""
    found: list[dict[str, Any]] = []
    if isinstance(dump, dict) and isinstance(dump.get("records"), list) and "gamma" in dump:
        found.append(dump)
    states = dump.get("internal_states") if isinstance(dump, dict) else None
    for st in states if isinstance(states, list) else []:
        rec = st.get("dspark_info_record") if isinstance(st, dict) else None
        if isinstance(rec, dict) and isinstance(rec.get("records"), list):
            found.append(rec)
    if not found:
        return None
    ids: dict[str, int] = {}
    out: list[TraceRecord] = []
    for n, block in enumerate(found):
        for i, step in enumerate(block["records"]):
            reqs = step.get("reqs") if isinstance(step, dict) else None
            if not isinstance(reqs, list) or not reqs:
                continue
            acc, drafted, rids = [], [], []
            for r in reqs:
                vl, cd = _count(r.get("verify_len")) if isinstance(r, dict) else None, \
                    _count(r.get("correct_drafts")) if isinstance(r, dict) else None
                if vl is None or cd is None or vl < 1:
                    raise UsageError(f"DSPARK record {i}: each req needs verify_len >= 1 and correct_drafts >= 0",
                                     hint="pass the dump of SGLANG_DSPARK_DEBUG_DUMP=reqs as /server_info gives it")
                rid = _str(r.get("rid")) or f"pool{r.get('req_pool_index')}"
                drafted.append(vl - 1)
                acc.append(min(cd, vl - 1))
                rids.append(ids.setdefault(rid, len(ids)))
            bs = _count(step.get("bs"))
            out.append(TraceRecord(line=i + 1, batch_size=bs if bs and bs >= len(acc) else len(acc),
                                   accepted=tuple(acc), steps=max(drafted), drafted=tuple(drafted), rids=tuple(rids),
                                   run=f"{run}{n}" if len(found) > 1 else run))
    return out


def read_sglang_output(path: str | Path, *, steps: int | None = None, batch_size: int | None = None,
                       run: str | None = None) -> tuple[list[RequestRecord], list[TraceRecord], int]:
    """Request lines (and DSPARK verify records) from a file SGLang wrote (module docstring), plus how many
    lines held no speculative statistics (a log's other lines, requests that never verified). `batch_size`
    overrides the concurrency estimated from the request times (1 where the file has none)."""
    name = str(path)
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise UsageError(f"{name}: cannot read: {exc.strerror or exc}") from None
    if len(data) > MAX_FILE_BYTES:
        raise UsageError(f"{name}: larger than {MAX_FILE_BYTES >> 20} MiB", hint="split the file by hour")
    text = data.decode("utf-8", errors="replace")
    try:
        whole = json.loads(text)
    except ValueError:
        whole = None
    if whole is not None:
        verifies = dspark_records(whole, run=run or "dspark")
        if verifies is not None:
            if not verifies:
                raise UsageError(f"{name}: the DSPARK dump holds no per-request records",
                                 hint="enable them with SGLANG_DSPARK_DEBUG_DUMP=reqs")
            return [], verifies, 0
    rows: list[tuple[int, str, SpecStats, tuple[float, float] | None, str, dict[str, Any]]] = []
    skipped = 0
    for lineno, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if line.startswith("data:"):  # a saved SSE stream: its chunks
            line = line[len("data:"):].strip()
        if not line or line == "[DONE]" or len(line) > MAX_LINE:
            skipped += len(line) > MAX_LINE
            continue
        rid: str | None = None
        meta: dict[str, Any] | None = None
        kind = ""
        obj: Any = None
        if line.startswith("{"):
            try:
                obj = json.loads(line)
            except ValueError:
                obj = None
        if isinstance(obj, dict):
            rid, meta, kind = _meta_of(obj)
            if kind == "sglext":
                found = from_sglext(obj)
                for j, st in enumerate(found):
                    rows.append((lineno, str(rid or lineno) + (f"/{j}" if len(found) > 1 else ""), st, None, "sglext",
                                 {}))
                continue
        else:
            out = _text_finish(line)
            meta = out.get("meta_info") if out is not None else None
            meta = meta if isinstance(meta, dict) else None
            rid, kind = (_str(meta.get("id")) if meta else None), "log_requests"
        stats = from_meta_info(meta) if meta is not None else None
        if stats is None or meta is None:
            skipped += 1
            continue
        rows.append((lineno, rid or str(lineno), stats, _span(meta), kind, meta))
    if not rows:
        raise UsageError(f"{name}: no request with speculative statistics ({HISTOGRAM_KEY}) found",
                         hint="point it at SGLang's --export-metrics-to-file file (in --export-metrics-to-file-dir), "
                              "--log-requests output, or a DSPARK dump; the server must run speculative decoding")
    widths = concurrency([r[3] for r in rows])
    reqs = [request_line(rid, st, steps=steps, batch_size=batch_size or w, run=run, source=kind, line=lineno,
                         span=span, ttft_s=_ttft(meta))
            for (lineno, rid, st, span, kind, meta), w in zip(rows, widths, strict=True)]
    return reqs, [], skipped


# ---- bench ------------------------------------------------------------------------------------------------


def bench_request_lines(results: Sequence[Any], server_info: object, run: str, *, steps: int | None = None
                        ) -> list[RequestRecord]:
    """Request lines of one bench sweep point's finished requests (`RequestResult`s): the statistics from
    `sglext.spec_tokens_details`, the order from specctl's `usage.accept_lengths` where it agrees with them,
    the launch steps from `steps` (a launched engine's --trace-steps), else `/server_info`'s
    `speculative_num_steps`, else the statistics; the batch from the requests' overlap as the client saw it,
    their decode time (first token to last) and time to first token as the client measured them."""

    launch = steps or find_key(server_info, ("speculative_num_steps",))
    launch = launch if isinstance(launch, int) and not isinstance(launch, bool) and launch > 0 else None
    # engines told to draft K every step (--trace-steps) ran no adaptive policy, whatever they are configured with
    adaptive = False if steps else find_key(server_info, ("speculative_adaptive",))
    rows: list[tuple[Any, SpecStats]] = []
    for r in results:
        if not r.ok or r.index < 0:
            continue
        stats = from_meta_info(r.spec_details)
        order = (r.usage or {}).get("accept_lengths")
        if isinstance(order, list):
            with_order = from_meta_info({"spec_accept_lengths": order})
            if stats is None:
                stats = with_order
            elif with_order is not None and with_order.histogram == stats.histogram:
                stats = SpecStats(stats.verify_ct, stats.histogram, with_order.accepted, stats.launch_steps)
        if stats is not None:
            rows.append((r, stats))
    spans = [(r.first_token, r.end) if r.first_token is not None and r.end is not None else None for r, _ in rows]
    widths = concurrency(spans)
    return [request_line(r.response_id or f"{run}-{r.index}", st, steps=launch, batch_size=w, run=run,
                         source="sglext" if r.spec_details is not None else "usage",
                         adaptive=adaptive if isinstance(adaptive, bool) else None, span=span,
                         ttft_s=r.ttft)
            for (r, st), w, span in zip(rows, widths, spans, strict=True)]


def append_lines(path: str | Path, lines: Sequence[RequestRecord | TraceRecord]) -> None:
    """Append trace lines to `path` (one `write`, so a concurrent writer's lines stay whole)."""
    text = "".join(json.dumps(x.to_json(), separators=(",", ":")) + "\n" for x in lines)
    try:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(text)
    except OSError as exc:
        raise UsageError(f"cannot write the trace {path}: {exc.strerror or exc}") from None

"""OpenAI request bodies -> a typed, validated generation request, or a `RequestError` naming the field.

Contract:
- `parse_json_body(raw)` accepts only a JSON object: no `NaN`/`Infinity` (not JSON), at most
  `MAX_JSON_DEPTH` levels of nesting, integers within 64 bits, strings that are valid Unicode (no lone
  surrogates, which cannot be encoded as UTF-8). Anything else is a 400 naming the top-level field.
- `parse_completion(body, model)` / `parse_chat(body, model)` check every field the front understands,
  with OpenAI's ranges (temperature 0-2, penalties -2..2, top_p (0, 1], logprobs 0-5 / top_logprobs
  0-20, logit_bias -100..100 on token ids of the vocabulary), prompt token ids inside the vocabulary,
  chat content parts of type `text` only, the context length, and on a role with a generation limit
  (`ModelInfo.max_new_tokens`: the disaggregated roles, schemas/budget.py) `max_tokens` within it. A field
  the engine cannot honour (`best_of` != 1, `suffix`, `tools`, a `response_format` other than text, echo with logprobs,
  logprobs / penalties / logit_bias on a role that cannot apply them) is refused with a
  400 naming it, never silently ignored. An unknown `model` is a 404 `model_not_found`; SGLang's default
  name `"default"` (what SGLang's own clients send) is the served model, as SGLang's servers treat it. Fields this
  front does not know (vendor extensions such as the router's `bootstrap_*`) are left alone.
- Every error is `RequestError(message, param=..., status=..., code=...)` with `code` a string, which
  the HTTP layer turns into OpenAI's `{"error": {"message", "type", "param", "code"}}`.

Nothing here touches an engine: the served model is described by `ModelInfo` (name, context length,
vocabulary size, `encode`), so the rules are testable without one.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Protocol

from specctl.engine.sampling_params import SamplingParams
from specctl.errors import InvalidInput
from specctl.schemas.sglang.router import DEFAULT_MODEL_NAME  # what SGLang's clients send when naming no model

# The largest request body the engines read (413 beyond it); the router of `up` refuses the same bodies itself.
MAX_REQUEST_BYTES = 1 << 20  # a 1 MiB JSON body is far beyond any prompt the builtin models can take
MAX_JSON_DEPTH = 32  # OpenAI bodies nest 4-5 levels (messages -> parts -> fields); 32 leaves room for extras
MIN_INT, MAX_INT = -(1 << 63), (1 << 64) - 1  # what torch seeds and any C integer can hold
MAX_TOP_K = 1 << 31
MAX_STOP = 16
MAX_COMPLETION_LOGPROBS = 5  # OpenAI's limits
MAX_TOP_LOGPROBS = 20
MAX_LOGIT_BIAS = 300
DEFAULT_MAX_TOKENS = 128
CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")


class RequestError(Exception):
    """A client error: becomes a 4xx JSON body naming the offending parameter."""

    def __init__(self, message: str, *, param: str | None = None, status: int = 400,
                 code: str = "invalid_value") -> None:
        super().__init__(message)
        self.param = param
        self.status = status
        self.code = code


class ModelInfo(Protocol):
    """What request validation needs to know about the served model."""

    model_name: str
    max_context: int
    supports_logprobs: bool  # the engine reports each token's log-prob (engine/logprobs.py)
    supports_logit_processors: bool  # the engine applies penalties and logit_bias (engine/penalties.py)
    max_new_tokens: int | None  # the most tokens one request may generate here (None: the context bounds it)

    def encode(self, text: str) -> list[int]: ...


# JSON ---------------------------------------------------------------------------------------------
def parse_json_body(raw: bytes) -> dict[str, Any]:
    """The request body as a dict, with the bounds of the module docstring."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RequestError(f"request body is not UTF-8 (byte {exc.start})", code="invalid_json") from None
    try:
        # NaN / Infinity (not JSON, but Python's parser takes them) and 1e999 become non-finite floats,
        # refused below with the field's name.
        body = json.loads(text)
    except RecursionError:
        raise RequestError(f"request body nests deeper than {MAX_JSON_DEPTH} levels", code="invalid_json") from None
    except ValueError as exc:  # JSONDecodeError, and ints of more than 4300 digits
        raise RequestError(f"request body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise RequestError("request body must be a JSON object", code="invalid_json")
    for key, value in body.items():
        _check_tree(key, value)
    return body


def _check_tree(key: str, value: Any) -> None:
    """Depth, integer range and encodable strings of one top-level field, iteratively (no recursion)."""
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:
        raise RequestError("a field name holds a lone UTF-16 surrogate, which is not valid Unicode") from None
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise RequestError(f"{key} nests deeper than {MAX_JSON_DEPTH} levels", param=key)
        if isinstance(item, str):
            _check_string(item, key)
        elif isinstance(item, bool):
            continue
        elif isinstance(item, float):
            if not math.isfinite(item):
                raise RequestError(f"{key} holds {item}: NaN and infinities are not JSON numbers; send a finite "
                                   "number", param=key)
        elif isinstance(item, int):
            if not MIN_INT <= item <= MAX_INT:
                raise RequestError(f"{key} holds an integer outside the 64-bit range", param=key)
        elif isinstance(item, dict):
            for k, v in item.items():
                _check_string(k, key)
                stack.append((v, depth + 1))
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)


def _check_string(text: str, param: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise RequestError(f"{param} holds a lone UTF-16 surrogate (e.g. \\ud800), which is not valid Unicode",
                           param=param) from None


# typed fields -------------------------------------------------------------------------------------
def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _integer(body: dict[str, Any], name: str, default: int | None, *, lo: int, hi: int) -> int | None:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # 16.0 is an integer to JSON
    if not _is_int(value):
        raise RequestError(f"{name} must be an integer, got {type(value).__name__}", param=name, code="invalid_type")
    if not lo <= value <= hi:
        raise RequestError(f"{name}={value} is out of range [{lo}, {hi}]", param=name)
    return int(value)


def _number(body: dict[str, Any], name: str, default: float, *, lo: float, hi: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RequestError(f"{name} must be a number, got {type(value).__name__}", param=name, code="invalid_type")
    value = float(value)
    if not math.isfinite(value) or not lo <= value <= hi:
        raise RequestError(f"{name}={value} is out of range [{lo:g}, {hi:g}]", param=name)
    return value


def _boolean(body: dict[str, Any], name: str, default: bool = False, *, where: str = "") -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise RequestError(f"{where}{name} must be a boolean (true or false)", param=where + name,
                           code="invalid_type")
    return value


def _refuse(name: str, why: str) -> RequestError:
    return RequestError(f"{name} is not supported by this server: {why}", param=name, code="unsupported_parameter")


# the request ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GenerationRequest:
    """One validated /v1/completions or /v1/chat/completions request."""

    chat: bool
    prompt_ids: list[int]
    prompt_text: str | None  # the prompt as text (echo), None for token-id prompts
    params: SamplingParams
    model: str
    route: PdRoute | None = None  # sglang-router's disaggregation fields (`pd_route(extra)`), set by the server
    stream: bool = False
    include_usage: bool = False
    return_token_ids: bool = False
    echo: bool = False
    logprobs: int | None = None  # top alternatives per token (0: the chosen token only); None: not asked
    extra: dict[str, Any] = field(default_factory=dict)  # fields this front does not interpret


KNOWN_FIELDS = frozenset({
    "model", "prompt", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "n",
    "seed", "stop", "ignore_eos", "stream", "stream_options", "return_token_ids", "echo", "logprobs",
    "top_logprobs", "presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias", "best_of",
    "suffix", "tools", "tool_choice", "functions", "function_call", "response_format", "user",
})


def _model(body: dict[str, Any], info: ModelInfo) -> str:
    model = body.get("model")
    if model is None or model == "":
        return info.model_name
    if not isinstance(model, str):
        raise RequestError("model must be a string", param="model", code="invalid_type")
    if model == DEFAULT_MODEL_NAME:  # SGLang's clients name no model in particular; SGLang serves them
        return info.model_name
    if model != info.model_name:
        raise RequestError(f"the model {model!r} does not exist; this server serves {info.model_name!r} "
                           "(see GET /v1/models)", param="model", status=404, code="model_not_found")
    return model


def _unsupported(body: dict[str, Any], *, chat: bool) -> None:
    """Refuse what the engine cannot honour, naming the field (OpenAI parameters are never ignored)."""
    best_of = body.get("best_of")
    if best_of is not None and best_of != 1:
        if not _is_int(best_of):
            raise RequestError("best_of must be an integer", param="best_of", code="invalid_type")
        raise _refuse("best_of", "only best_of=1 (one candidate per request)")
    suffix = body.get("suffix")
    if suffix not in (None, ""):
        raise _refuse("suffix", "the builtin models have no fill-in-the-middle mode")
    for name in ("tools", "functions"):
        if body.get(name) not in (None, []):
            raise _refuse(name, "tool calling needs a chat template with tool support")
    for name in ("tool_choice", "function_call"):
        if body.get(name) not in (None, "none"):
            raise _refuse(name, "tool calling needs a chat template with tool support")
    fmt = body.get("response_format")
    if fmt is not None:
        if not isinstance(fmt, dict) or not isinstance(fmt.get("type"), str):
            raise RequestError('response_format must be an object like {"type": "text"}', param="response_format",
                               code="invalid_type")
        if fmt["type"] != "text":
            raise _refuse("response_format", f"type {fmt['type']!r}: only plain text output (no constrained decoding)")
    if _number(body, "repetition_penalty", 1.0, lo=0.0, hi=2.0) != 1.0:
        raise _refuse("repetition_penalty", "use OpenAI's presence_penalty / frequency_penalty")


def _logprobs(body: dict[str, Any], *, chat: bool) -> int | None:
    """How many top alternatives to report per token (0: only the chosen token), None: no log-probs.
    Chat: `logprobs: true` + `top_logprobs` 0-20; completions: `logprobs` 0-5."""
    if chat:
        wanted = _boolean(body, "logprobs")
        top = _integer(body, "top_logprobs", None, lo=0, hi=MAX_TOP_LOGPROBS)
        if top and not wanted:
            raise RequestError("top_logprobs needs logprobs: true", param="top_logprobs")
        return (top or 0) if wanted else None
    count = _integer(body, "logprobs", None, lo=0, hi=MAX_COMPLETION_LOGPROBS)
    if count is not None and _boolean(body, "echo"):
        raise _refuse("echo", "echo with logprobs needs the prompt's log-probs, which are not computed; "
                              "drop one of them")
    return count


def _logit_processors(body: dict[str, Any], info: ModelInfo, vocab_size: int | None) -> dict[str, Any]:
    """presence/frequency penalties (-2..2) and logit_bias ({"token id": -100..100}, at most 300 entries)."""
    out: dict[str, Any] = {}
    for name in ("presence_penalty", "frequency_penalty"):
        value = _number(body, name, 0.0, lo=-2.0, hi=2.0)
        if value:
            out[name] = value
    bias = body.get("logit_bias")
    if bias is not None:
        if not isinstance(bias, dict):
            raise RequestError('logit_bias must be an object mapping token ids to biases, e.g. {"50256": -100}',
                               param="logit_bias", code="invalid_type")
        if len(bias) > MAX_LOGIT_BIAS:
            raise RequestError(f"logit_bias holds {len(bias)} entries; at most {MAX_LOGIT_BIAS}", param="logit_bias")
        pairs = []
        for key, value in bias.items():
            if not (key.isascii() and key.isdigit() and len(key) < 12) or (
                    vocab_size is not None and int(key) >= vocab_size):
                bound = f" in [0, {vocab_size - 1}]" if vocab_size is not None else ""
                raise RequestError(f"logit_bias key {key[:20]!r} is not a token id{bound}", param="logit_bias")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not -100 <= value <= 100:
                raise RequestError(f"logit_bias[{key}] must be a number in [-100, 100]", param="logit_bias")
            pairs.append((int(key), float(value)))
        if pairs:
            out["logit_bias"] = tuple(pairs)
    if out and not info.supports_logit_processors:
        name = next(iter(out))
        raise _refuse(name, "this role's engine does not apply logit processors (the colocated builtin "
                            "engine does)")
    return out


def _sampling(body: dict[str, Any], *, prompt_len: int, max_context: int,
              max_new_tokens: int | None) -> dict[str, Any]:
    """The sampling fields every route shares, as `SamplingParams` keywords (checked with OpenAI's ranges)."""
    n = _integer(body, "n", 1, lo=1, hi=MAX_INT)
    if n != 1:
        raise RequestError("only n=1 is supported (one completion per request)", param="n")
    room = max_context - prompt_len
    prompt_param = "prompt" if "prompt" in body else "messages"
    if room < 1:
        raise RequestError(f"prompt is {prompt_len} tokens; this model's context is {max_context} tokens",
                           param=prompt_param, code="context_length_exceeded")
    name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _integer(body, name, min(DEFAULT_MAX_TOKENS, room), lo=1, hi=MAX_INT)
    assert max_tokens is not None
    if max_tokens > room:
        raise RequestError(
            f"{name}={max_tokens} plus the {prompt_len}-token prompt exceeds the context of {max_context} tokens",
            param=name, code="context_length_exceeded")
    limit = max_new_tokens
    if limit is not None and max_tokens > limit:
        raise RequestError(f"{name}={max_tokens} is over the {limit} tokens one request may generate on this "
                           "disaggregated deployment (the router's request budget bounds a generation)", param=name)
    stop = body.get("stop")
    if stop is None:
        stop = []
    elif isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop) or len(stop) > MAX_STOP:
        raise RequestError(f"stop must be a non-empty string or a list of up to {MAX_STOP} of them", param="stop")
    top_k = _integer(body, "top_k", 0, lo=-1, hi=MAX_TOP_K)
    top_p = _number(body, "top_p", 1.0, lo=0.0, hi=1.0)
    if top_p <= 0.0:
        raise RequestError("top_p must be in (0, 1]", param="top_p")
    return {
        "max_tokens": max_tokens,
        "temperature": _number(body, "temperature", 1.0, lo=0.0, hi=2.0),
        "top_p": top_p,
        "top_k": max(0, top_k or 0),  # -1 (vLLM, SGLang) and 0 both mean no top-k filter
        "seed": _integer(body, "seed", None, lo=MIN_INT, hi=MAX_INT),
        "stop": tuple(stop),
        "ignore_eos": _boolean(body, "ignore_eos"),
    }


def _params(fields: dict[str, Any]) -> SamplingParams:
    try:
        return SamplingParams(**fields)
    except InvalidInput as exc:  # the checks above are stricter; a gap between the two is still the client's
        raise RequestError(str(exc)) from None


def sampling_params(body: dict[str, Any], *, prompt_len: int, max_context: int,
                    max_new_tokens: int | None = None) -> SamplingParams:
    """OpenAI's sampling fields -> `SamplingParams`, with the front's bounds (for routes that build their own
    prompt, SGLang's /generate; the OpenAI routes go through `parse_completion` / `parse_chat` whole)."""
    return _params(_sampling(body, prompt_len=prompt_len, max_context=max_context, max_new_tokens=max_new_tokens))


# sglang-router's disaggregation fields ---------------------------------------------------------------
BOOTSTRAP_FIELDS = ("bootstrap_host", "bootstrap_port", "bootstrap_room")


@dataclass(frozen=True)
class PdRoute:
    """Where sglang-router sent one disaggregated request: prefill's bootstrap host and port, and the room
    that pairs the request's prefill half with its decode half."""

    host: str
    port: int
    room: int

    def to_json(self) -> dict[str, Any]:
        return {"bootstrap_host": self.host, "bootstrap_port": self.port, "bootstrap_room": self.room}


def pd_route(body: dict[str, Any]) -> PdRoute | None:
    """The PD routing fields of a request (all three, or none), type-checked."""
    present = [k for k in BOOTSTRAP_FIELDS if body.get(k) is not None]
    if not present:
        return None
    if len(present) != len(BOOTSTRAP_FIELDS):
        missing = [k for k in BOOTSTRAP_FIELDS if k not in present]
        raise RequestError(f"{', '.join(missing)} missing: a disaggregated request carries all of "
                           f"{', '.join(BOOTSTRAP_FIELDS)}", param=missing[0])
    host, port, room = body["bootstrap_host"], body["bootstrap_port"], body["bootstrap_room"]
    if not isinstance(host, str) or not host or len(host) > 255:
        raise RequestError("bootstrap_host must be a host name or address", param="bootstrap_host")
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise RequestError("bootstrap_port must be a port number", param="bootstrap_port")
    if isinstance(room, bool) or not isinstance(room, int) or not 0 <= room < 2**64:
        raise RequestError("bootstrap_room must be a non-negative 64-bit integer", param="bootstrap_room")
    return PdRoute(host=host, port=int(port), room=int(room))


def _common(body: dict[str, Any], info: ModelInfo, *, chat: bool, prompt_ids: list[int],
            prompt_text: str | None, vocab_size: int | None) -> GenerationRequest:
    stream = _boolean(body, "stream")
    options = body.get("stream_options")
    include_usage = False
    if options is not None:
        if not isinstance(options, dict):
            raise RequestError("stream_options must be an object", param="stream_options", code="invalid_type")
        if not stream:
            raise RequestError("stream_options is only allowed when stream is true", param="stream_options")
        include_usage = _boolean(options, "include_usage", where="stream_options.")
    echo = False if chat else _boolean(body, "echo")
    logprobs = _logprobs(body, chat=chat)
    fields = _sampling(body, prompt_len=len(prompt_ids), max_context=info.max_context,
                       max_new_tokens=info.max_new_tokens)
    fields.update(_logit_processors(body, info, vocab_size))
    if logprobs is not None:
        if not info.supports_logprobs:
            raise _refuse("logprobs", "this role's engine does not report log-probabilities (the colocated "
                                      "builtin engine does)")
        fields["logprobs"] = logprobs
    return GenerationRequest(
        chat=chat, prompt_ids=prompt_ids, prompt_text=prompt_text, params=_params(fields), model=_model(body, info),
        stream=stream, include_usage=include_usage, return_token_ids=_boolean(body, "return_token_ids"),
        echo=echo, logprobs=logprobs, extra={k: v for k, v in body.items() if k not in KNOWN_FIELDS},
    )


def _check_ids(ids: list[Any], vocab_size: int | None, param: str) -> list[int]:
    for i, t in enumerate(ids):
        if not _is_int(t):
            raise RequestError(f"{param}[{i}] must be a token id (an integer)", param=param, code="invalid_type")
        if t < 0 or (vocab_size is not None and t >= vocab_size):
            bound = f"[0, {vocab_size - 1}]" if vocab_size is not None else ">= 0"
            raise RequestError(f"{param}[{i}]={t} is not a token id of this model (ids are {bound})", param=param)
    return list(ids)


def parse_completion(body: dict[str, Any], info: ModelInfo, *, vocab_size: int | None) -> GenerationRequest:
    """POST /v1/completions."""
    _model(body, info)  # 404 before any other complaint, as OpenAI does
    _unsupported(body, chat=False)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        if not prompt:
            raise RequestError("prompt must not be empty", param="prompt")
        return _common(body, info, chat=False, prompt_ids=info.encode(prompt), prompt_text=prompt,
                       vocab_size=vocab_size)
    if isinstance(prompt, list) and prompt:
        ids = _check_ids(prompt, vocab_size, "prompt")
        return _common(body, info, chat=False, prompt_ids=ids, prompt_text=None, vocab_size=vocab_size)
    if prompt is None:
        raise RequestError("prompt is required", param="prompt", code="missing_required_parameter")
    raise RequestError("prompt must be a non-empty string or a list of token ids (one prompt per request)",
                       param="prompt")


def parse_chat(body: dict[str, Any], info: ModelInfo, *, vocab_size: int | None) -> GenerationRequest:
    """POST /v1/chat/completions."""
    _model(body, info)
    _unsupported(body, chat=True)
    prompt = chat_prompt(body.get("messages"))
    return _common(body, info, chat=True, prompt_ids=info.encode(prompt), prompt_text=prompt, vocab_size=vocab_size)


def chat_prompt(messages: Any) -> str:
    """The documented chat template: `<|ROLE|>\\nCONTENT\\n` per message, then `<|assistant|>\\n`."""
    if messages is None:
        raise RequestError("messages is required", param="messages", code="missing_required_parameter")
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages must be a non-empty list of {role, content} objects", param="messages")
    parts = []
    for i, msg in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise RequestError(f"{where} must be an object with 'role' and 'content'", param=where,
                               code="invalid_type")
        role = msg.get("role")
        if not isinstance(role, str) or role not in CHAT_ROLES:
            raise RequestError(f"{where}.role must be one of {', '.join(CHAT_ROLES)}", param=f"{where}.role")
        parts.append(f"<|{role}|>\n{_content(msg.get('content'), where)}\n")
    parts.append("<|assistant|>\n")
    return "".join(parts)


def _content(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise RequestError(f"{where}.content must be a string or a list of content parts",
                           param=f"{where}.content", code="invalid_type")
    texts = []
    for j, part in enumerate(content):
        at = f"{where}.content[{j}]"
        if not isinstance(part, dict):
            raise RequestError(f"{at} must be an object like {{\"type\": \"text\", \"text\": \"...\"}}",
                               param=at, code="invalid_type")
        kind = part.get("type")
        if kind != "text":
            raise RequestError(f"{at}.type {kind!r} is not supported: this model reads text parts only",
                               param=f"{at}.type")
        text = part.get("text")
        if not isinstance(text, str):
            raise RequestError(f"{at}.text must be a string", param=f"{at}.text", code="invalid_type")
        texts.append(text)
    return "".join(texts)

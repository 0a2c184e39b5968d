"""Lesson 10: the OpenAI request bodies, checked, and the response bodies.

Every check raises :class:`APIError` with the HTTP status, a message that names the parameter,
and the parameter's name, which the API turns into OpenAI's error body::

    {"error": {"message": "...", "type": "invalid_request_error", "param": "top_p", "code": null}}

Parameters the engine does not implement are refused (400), never silently ignored: a client
that asks for ``logprobs`` and gets none has been lied to. Several answers (``n``, a batch of
prompts) are several engine requests (:meth:`ParsedRequest.calls`).
"""

from __future__ import annotations

__lesson__ = 10

import math
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from minisgl.sampling_params import MAX_INT64, MIN_INT64, MIN_TOP_P
from minisgl.utils import is_int, is_number

# Every parameter is implemented or refused with a 400 that names it; none is accepted and ignored.
# What each endpoint implements (besides the parameters of UNSUPPORTED at their "not used" value):
SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "max_tokens", "seed", "stop", "stop_token_ids", "ignore_eos")
KNOWN_FIELDS = {
    "chat": {"model", "messages", "max_completion_tokens", "n", "stream", "stream_options", *SAMPLING_FIELDS},
    "completion": {"model", "prompt", "n", "stream", "stream_options", *SAMPLING_FIELDS},
    "generate": {"text", "input_ids", "sampling_params", "stream"},
    "generate.sampling_params": {"max_new_tokens", *SAMPLING_FIELDS},
    "stream_options": {"include_usage"},
    "tokenize": {"model", "prompt", "messages", "add_special_tokens", "add_generation_prompt"},
    "detokenize": {"model", "tokens"},
}

# Parameters we refuse, with the value that means "not used" (sent by some clients anyway).
UNSUPPORTED = {
    "best_of": (None, 1),
    "logprobs": (None, False),
    "top_logprobs": (None, 0),
    "echo": (None, False),
    "suffix": (None, ""),
    "tools": (None, []),
    "tool_choice": (None, "none"),
    "functions": (None, []),
    "function_call": (None, "none"),
    "logit_bias": (None, {}),
    "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0),
    "response_format": (None, {"type": "text"}),
}
MAX_STOP_STRINGS = 16
# One HTTP request may ask for several answers (``n`` per prompt, several prompts for
# /v1/completions): each is one engine request, and together they may be at most this many.
MAX_CHOICES = 64
ROLES = ("system", "user", "assistant", "developer")


class APIError(Exception):
    """An error the client gets as an OpenAI-style body with ``status``."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class EngineCall:
    """One engine request of an HTTP request: its id, prompt and sampling parameters."""

    rid: str
    prompt: Any  # text, token ids, or chat messages
    params: dict[str, Any]  # SamplingParams fields; max_tokens None = up to the context


@dataclass
class ParsedRequest:
    """A checked request: what to send to the tokenizer, and how to answer.

    It asks for ``n`` answers to each of ``prompts``: :meth:`calls` gives one engine request per
    answer, in the order of the response's ``choices`` (``index = prompt_number * n + j``)."""

    prompts: list[Any]  # each: text, token ids, or chat messages
    params: dict[str, Any]  # SamplingParams fields; max_tokens None = up to the context
    stream: bool = False
    include_usage: bool = False
    n: int = 1
    rid: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: int = field(default_factory=lambda: int(time.time()))

    def calls(self) -> list[EngineCall]:
        """The engine requests. With a ``seed``, answer ``j`` of a prompt samples with
        ``seed + j`` (wrapped into int64), so the ``n`` answers differ and the whole response is
        still reproducible; the single-answer case keeps the seed as given."""
        if len(self.prompts) * self.n == 1:
            return [EngineCall(self.rid, self.prompts[0], self.params)]
        calls = []
        for p, prompt in enumerate(self.prompts):
            for j in range(self.n):
                params = self.params
                if params.get("seed") is not None and j:
                    params = {**params, "seed": (params["seed"] + j - MIN_INT64) % 2**64 + MIN_INT64}
                calls.append(EngineCall(f"{self.rid}-{p * self.n + j}", prompt, params))
        return calls


def _number(body: dict, name: str, default: float, low: float | None = None, high: float | None = None,
            low_open: bool = False) -> float:
    value = body.get(name)
    if value is None:
        return default
    if not is_number(value) or not _finite(value):
        raise APIError(400, f"{name} must be a finite number, got {value!r}", name)
    if low is not None and (value < low or (low_open and value == low)):
        raise APIError(400, f"{name} must be {'>' if low_open else '>='} {low}, got {value}", name)
    if high is not None and value > high:
        raise APIError(400, f"{name} must be <= {high}, got {value}", name)
    return float(value)


def _finite(value: float) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an integer too large for a float (JSON may say 10**400)
        return False


def _integer(body: dict, name: str, low: int, high: int = MAX_INT64) -> int | None:
    """An optional integer in ``[low, high]``. Every integer goes to the engine as an int64
    (msgpack, torch): a larger one is refused here, not left to fail there (2**64 cannot even be
    encoded; a top_k of 2**63 failed a whole batch)."""
    value = body.get(name)
    if value is None:
        return None
    if not is_int(value):
        raise APIError(400, f"{name} must be an integer, got {value!r}", name)
    if not low <= value <= high:
        raise APIError(400, f"{name} must be in [{low}, {high}], got {value}", name)
    return int(value)


def _token_ids(value: Any) -> bool:
    """A list of token ids: non-negative integers that fit an int64 (the vocabulary is checked
    later, by the scheduler)."""
    return isinstance(value, list) and all(is_int(t) and 0 <= t <= MAX_INT64 for t in value)


def refuse_unknown(body: dict, where: str) -> None:
    """A 400 naming every field of ``body`` that ``where`` does not implement (another server's
    extension, a typo, an OpenAI parameter we do not have): accepting it would ignore it."""
    unknown = sorted(k for k in body if k not in KNOWN_FIELDS[where] and k not in UNSUPPORTED)
    if unknown:
        names = ", ".join(repr(k) for k in unknown)
        raise APIError(400, f"unknown parameter{'s' * (len(unknown) > 1)} {names}: this server does not implement "
                            f"{'them' if len(unknown) > 1 else 'it'} (see /openapi.json and the lesson 10 README)",
                       unknown[0], code="unknown_parameter")


def _n(body: dict, num_prompts: int) -> int:
    """``n``, the answers per prompt; all the request's answers together at most MAX_CHOICES."""
    n = _integer(body, "n", 1, MAX_CHOICES)
    n = 1 if n is None else n
    if n * num_prompts > MAX_CHOICES:
        raise APIError(400, f"n={n} answers for each of {num_prompts} prompts is {n * num_prompts}; "
                            f"one request may ask for at most {MAX_CHOICES}", "n")
    return n


def _sampling(body: dict, max_tokens_names: tuple[str, ...]) -> dict[str, Any]:
    for name, unused in UNSUPPORTED.items():
        # (by type too: 0 == False in Python, but logprobs=0 asks for something, logprobs=false does not)
        if name in body and not any(body[name] is u or (type(body[name]) is type(u) and body[name] == u) for u in unused):
            raise APIError(400, f"{name} is not supported by this server", name)
    max_tokens = None
    for name in max_tokens_names:
        value = _integer(body, name, 1)
        if value is not None:
            max_tokens = value
    stop = body.get("stop")
    if stop is None:
        stop = []
    elif isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop) or len(stop) > MAX_STOP_STRINGS:
        raise APIError(400, f"stop must be a non-empty string or a list of at most {MAX_STOP_STRINGS} of them", "stop")
    stop_ids = body.get("stop_token_ids") or []
    if not _token_ids(stop_ids):
        raise APIError(400, "stop_token_ids must be a list of non-negative integer token ids", "stop_token_ids")
    ignore_eos = body.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise APIError(400, f"ignore_eos must be true or false, got {ignore_eos!r}", "ignore_eos")
    top_k = _integer(body, "top_k", -1)
    top_p = _number(body, "top_p", 1.0, low=0.0, high=1.0, low_open=True)
    if top_p < MIN_TOP_P:
        raise APIError(400, f"top_p must be at least {MIN_TOP_P:.3g} (a float32 above 0), got {top_p}", "top_p")
    return {
        "temperature": _number(body, "temperature", 1.0, low=0.0),
        "top_p": top_p,
        "top_k": -1 if top_k is None else top_k,
        "max_tokens": max_tokens,
        "seed": _integer(body, "seed", MIN_INT64),
        "stop": stop,
        "stop_token_ids": [int(t) for t in stop_ids],
        "ignore_eos": ignore_eos,
    }


def _stream(body: dict) -> tuple[bool, bool]:
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise APIError(400, f"stream must be true or false, got {stream!r}", "stream")
    options = body.get("stream_options")
    if options is None:
        return stream, False
    if not stream:
        raise APIError(400, "stream_options is only allowed with stream=true", "stream_options")
    if not isinstance(options, dict) or not isinstance(options.get("include_usage", False), bool):
        raise APIError(400, "stream_options must be an object like {\"include_usage\": true}", "stream_options")
    refuse_unknown(options, "stream_options")
    return stream, bool(options.get("include_usage", False))


def check_model(body: dict, served: str) -> None:
    model = body.get("model")
    if model is not None and model != served:
        raise APIError(404, f"the model {model!r} does not exist; this server serves {served!r}", "model",
                       code="model_not_found", kind="not_found_error")


def parse_chat(body: Any, served: str) -> ParsedRequest:
    """``/v1/chat/completions``."""
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object")
    check_model(body, served)
    refuse_unknown(body, "chat")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise APIError(400, "messages must be a non-empty list of {role, content} objects", "messages")
    chat = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise APIError(400, f"messages[{i}] must be an object with a role in {ROLES}", "messages")
        content = m.get("content")
        if isinstance(content, list):  # content parts: only text ones
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content):
                raise APIError(400, f"messages[{i}].content: only text parts are supported", "messages")
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise APIError(400, f"messages[{i}].content must be a string", "messages")
        chat.append({"role": "system" if m["role"] == "developer" else m["role"], "content": content})
    stream, include_usage = _stream(body)
    params = _sampling(body, ("max_tokens", "max_completion_tokens"))
    return ParsedRequest([chat], params, stream, include_usage, n=_n(body, 1))


def parse_completion(body: Any, served: str) -> ParsedRequest:
    """``/v1/completions``: ``prompt`` is one prompt (a string or a list of token ids) or a batch
    of them (a list of strings, or a list of token-id lists); each gets ``n`` answers."""
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object")
    check_model(body, served)
    refuse_unknown(body, "completion")
    prompt = body.get("prompt")
    if isinstance(prompt, str) or (prompt and _token_ids(prompt)):
        prompts = [prompt]
    elif isinstance(prompt, list) and prompt and (all(isinstance(p, str) for p in prompt)
                                                  or all(isinstance(p, list) for p in prompt)):
        prompts = prompt
    else:
        prompts = []
    if not prompts or not all((isinstance(p, str) and p) or (p and _token_ids(p)) for p in prompts):
        raise APIError(400, "prompt must be a non-empty string, a non-empty list of token ids, or a list of "
                            "either (a batch of prompts)", "prompt")
    if len(prompts) > MAX_CHOICES:
        raise APIError(400, f"{len(prompts)} prompts in one request; at most {MAX_CHOICES}", "prompt")
    params = _sampling(body, ("max_tokens",))
    if params["max_tokens"] is None and "max_tokens" not in body:
        params["max_tokens"] = 16  # OpenAI's default for completions
    stream, include_usage = _stream(body)
    return ParsedRequest(prompts, params, stream, include_usage, n=_n(body, len(prompts)))


def parse_generate(body: Any) -> ParsedRequest:
    """``/generate`` (SGLang's native form): ``text`` or ``input_ids``, ``sampling_params``
    (``max_new_tokens`` for max_tokens), ``stream``."""
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object")
    refuse_unknown(body, "generate")
    prompt = body.get("input_ids", body.get("text"))
    if not ((isinstance(prompt, str) and prompt) or
            (prompt and _token_ids(prompt))):
        raise APIError(400, "give text (a non-empty string) or input_ids (a non-empty list of token ids)", "text")
    sampling = body.get("sampling_params") or {}
    if not isinstance(sampling, dict):
        raise APIError(400, "sampling_params must be an object", "sampling_params")
    refuse_unknown(sampling, "generate.sampling_params")
    sampling = dict(sampling)
    if "max_new_tokens" in sampling:
        sampling["max_tokens"] = sampling.pop("max_new_tokens")
    params = _sampling(sampling, ("max_tokens",))
    if params["max_tokens"] is None:
        params["max_tokens"] = 128
    stream, _ = _stream({"stream": body.get("stream", False)})
    return ParsedRequest([prompt], params, stream)


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


def parse_tokenize(body: Any, served: str) -> Any:
    """``/tokenize`` (as vLLM's and SGLang's): ``prompt`` (a string) or ``messages`` (a chat,
    rendered with the generation prompt, as the chat endpoint renders it). ``add_special_tokens``
    and ``add_generation_prompt`` are accepted only at the value the engine uses (true), so the
    ids are exactly those a completion or chat request would start from."""
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object")
    check_model(body, served)
    refuse_unknown(body, "tokenize")
    for name in ("add_special_tokens", "add_generation_prompt"):
        if body.get(name, True) is not True:
            raise APIError(400, f"{name} must be true (the engine tokenizes that way)", name)
    if ("prompt" in body) == ("messages" in body):
        raise APIError(400, "give either prompt (a string) or messages (a chat)", "prompt")
    if "prompt" in body:
        if not isinstance(body["prompt"], str) or not body["prompt"]:
            raise APIError(400, "prompt must be a non-empty string", "prompt")
        return body["prompt"]
    return parse_chat({"messages": body["messages"]}, served).prompts[0]


def parse_detokenize(body: Any, served: str, vocab_size: int) -> list[int]:
    """``/detokenize``: ``tokens``, a list of token ids of the served model's vocabulary."""
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object")
    check_model(body, served)
    refuse_unknown(body, "detokenize")
    tokens = body.get("tokens")
    if not isinstance(tokens, list) or not _token_ids(tokens):
        raise APIError(400, "tokens must be a list of non-negative integer token ids", "tokens")
    outside = [t for t in tokens if t >= vocab_size]
    if outside:
        raise APIError(400, f"token id {outside[0]} is outside the vocabulary (size {vocab_size})", "tokens")
    return [int(t) for t in tokens]

"""Lesson 10: the request bodies as schemas (pydantic), checked once, and the response bodies.

Each endpoint's body is a pydantic model below. The models are the one description of what the
server accepts: :func:`validate` checks a body against one, ``/openapi.json`` publishes them
(:func:`openapi_components`), and tools that read that document (schemathesis in the tests)
generate requests from it. The models are strict (``"1"`` is not an integer, ``true`` is not
1) and closed (``extra="forbid"``): a field the server does not implement is refused with a 400
that names it, never silently ignored — a client that asks for ``min_p`` and gets plain
sampling has been lied to. Parameters of OpenAI's API that the engine does not have
(:data:`UNSUPPORTED`) are accepted only at their "not used" value.

Every failure becomes :class:`APIError` (status, a message naming the parameter, the
parameter), which the API turns into OpenAI's error body::

    {"error": {"message": "...", "type": "invalid_request_error", "param": "top_p", "code": null}}

Several answers (``n``, a batch of prompts) are several engine requests
(:meth:`ParsedRequest.calls`).

The response bodies have models too (:class:`CompletionResponse`, :class:`ChatResponse`,
:class:`ErrorResponse`, ...): ``/openapi.json`` names them as each operation's 200 and 4xx
bodies. They only describe; the handlers write the bodies, and the tests validate real answers
against them.
"""

from __future__ import annotations

__lesson__ = 10

import time
import uuid
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator
from pydantic.json_schema import models_json_schema

from minisgl.sampling_params import MAX_INT64, MAX_LOGPROBS, MIN_INT64, MIN_TOP_P

MAX_STOP_STRINGS = 16
# One HTTP request may ask for several answers (``n`` per prompt, several prompts for
# /v1/completions): each is one engine request, and together they may be at most this many.
MAX_CHOICES = 64
ROLES = ("system", "user", "assistant", "developer")

# OpenAI parameters the engine does not implement, with the values that mean "not used" (which
# some clients send anyway): any other value is a 400 "... is not supported by this server".
UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "best_of": (None, 1),
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
    "repetition_penalty": (None, 1, 1.0),  # vLLM's and SGLang's extension; vLLM's bench client sends 1.0
}

def _integral(value: Any) -> Any:
    """JSON Schema's ``integer`` includes ``34.0`` (a number with no fractional part): take it
    as 34. ``34.5``, ``"34"`` and ``true`` stay what they are, and are refused."""
    if type(value) is float and value.is_integer() and abs(value) <= 2**63:
        return int(value)
    return value


def _integer(low: int, high: int) -> Any:
    """An integer in ``[low, high]`` (``34.0`` taken as 34, see :func:`_integral`)."""
    return Annotated[int, Field(ge=low, le=high), BeforeValidator(_integral)]


TopK = _integer(-1, MAX_INT64)
Seed = _integer(MIN_INT64, MAX_INT64)
TokenCount = _integer(1, MAX_INT64)
NumAnswers = _integer(1, MAX_CHOICES)
TokenId = _integer(0, MAX_INT64)
LogprobCount = _integer(0, MAX_LOGPROBS)
NonEmptyText = Annotated[str, Field(min_length=1)]
TokenIds = Annotated[list[TokenId], Field(min_length=1)]


class Body(BaseModel):
    """Strict and closed: no coercion ("1" is not 1), no field the server does not implement."""

    model_config = ConfigDict(extra="forbid", strict=True)


class Sampling(Body):
    """The sampling parameters every generating endpoint takes (the engine's ``SamplingParams``;
    ``null`` or absent means its default)."""

    temperature: float | None = Field(None, ge=0, allow_inf_nan=False, description="0 is greedy; default 1")
    top_p: float | None = Field(None, ge=MIN_TOP_P, le=1, allow_inf_nan=False,
                                description="nucleus sampling, in (0, 1] (at least the smallest normal float32)")
    top_k: TopK | None = Field(None, description="-1 or 0: off")
    seed: Seed | None = Field(None, description="any int64: reproducible sampling")
    stop: NonEmptyText | Annotated[list[NonEmptyText], Field(max_length=MAX_STOP_STRINGS)] | None = Field(
        None, description=f"a string or up to {MAX_STOP_STRINGS} strings; not part of the answer")
    stop_token_ids: list[TokenId] | None = None
    ignore_eos: bool | None = None

    def sampling_params(self, max_tokens: int | None, logprobs: int | None = None) -> dict[str, Any]:
        """The engine's ``SamplingParams`` fields (``max_tokens`` None: up to the context;
        ``logprobs`` None: off, else the alternatives to list per token)."""
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return {
            "temperature": 1.0 if self.temperature is None else float(self.temperature),
            "top_p": 1.0 if self.top_p is None else float(self.top_p),
            "top_k": -1 if self.top_k is None else self.top_k,
            "max_tokens": max_tokens,
            "seed": self.seed,
            "stop": stop,
            "stop_token_ids": list(self.stop_token_ids or []),
            "ignore_eos": bool(self.ignore_eos),
            "logprobs": logprobs,
        }


class ResponseFormat(Body):
    type: Literal["text"]


class NotImplementedParams(Body):
    """OpenAI parameters the engine does not have, accepted only at their "not used" value."""

    best_of: Literal[1] | None = None
    echo: Literal[False] | None = None
    suffix: Literal[""] | None = None
    tools: Annotated[list[Any], Field(max_length=0)] | None = None
    tool_choice: Literal["none"] | None = None
    functions: Annotated[list[Any], Field(max_length=0)] | None = None
    function_call: Literal["none"] | None = None
    logit_bias: Annotated[dict[str, Any], Field(max_length=0)] | None = None
    presence_penalty: Annotated[float, Field(ge=0, le=0)] | None = None
    frequency_penalty: Annotated[float, Field(ge=0, le=0)] | None = None
    response_format: ResponseFormat | None = None
    repetition_penalty: Annotated[float, Field(ge=1, le=1)] | None = None

    @model_validator(mode="before")
    @classmethod
    def _only_unused_values(cls, data: Any) -> Any:
        """By type too: ``0 == False`` in Python, but ``logprobs: 0`` asks for something."""
        if isinstance(data, dict):
            for name, unused in UNSUPPORTED.items():
                value = data.get(name)
                if name in data and not any(value is u or (type(value) is type(u) and value == u) for u in unused):
                    raise ValueError(f"{name} is not supported by this server")
        return data


class StreamOptions(Body):
    include_usage: bool | None = None


# The whole-body rules of the request models, in their JSON schema (each model validator below
# checks one): stream_options only with stream=true; top_logprobs above 0 only with logprobs=true.
OPTIONS_NEED_A_STREAM = {
    "if": {"required": ["stream_options"], "properties": {"stream_options": {"type": "object"}}},
    "then": {"required": ["stream"], "properties": {"stream": {"const": True}}}}
TOP_LOGPROBS_NEED_LOGPROBS = {
    "if": {"required": ["top_logprobs"], "properties": {"top_logprobs": {"type": "integer", "minimum": 1}}},
    "then": {"required": ["logprobs"], "properties": {"logprobs": {"const": True}}}}


class Streamed(Body):
    model_config = ConfigDict(json_schema_extra=OPTIONS_NEED_A_STREAM)

    stream: bool | None = None
    stream_options: StreamOptions | None = Field(None, description="only with stream=true")

    @model_validator(mode="after")
    def _options_need_a_stream(self):
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed with stream=true")
        return self


class TextPart(Body):
    type: Literal["text"]
    text: str


class Message(Body):
    role: Literal["system", "user", "assistant", "developer"]
    content: str | list[TextPart] = Field(description="text, or a list of text parts")


class ChatRequest(Sampling, NotImplementedParams, Streamed):
    """``POST /v1/chat/completions``."""

    model_config = ConfigDict(json_schema_extra={"allOf": [OPTIONS_NEED_A_STREAM, TOP_LOGPROBS_NEED_LOGPROBS]})

    model: str | None = None
    messages: Annotated[list[Message], Field(min_length=1)]
    max_tokens: TokenCount | None = None
    max_completion_tokens: TokenCount | None = Field(None, description="the same as max_tokens")
    n: NumAnswers | None = Field(None, description="answers to the conversation")
    logprobs: bool | None = Field(None, description="each answer token's log-probability (of the raw logits)")
    top_logprobs: LogprobCount | None = Field(
        None, description=f"with logprobs=true: also the {MAX_LOGPROBS} or fewer most likely tokens at each step")

    @model_validator(mode="after")
    def _top_needs_logprobs(self):
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs=true")
        return self

    def logprobs_asked(self) -> int | None:
        """``SamplingParams.logprobs``: None (off), or the alternatives to list per token."""
        return (self.top_logprobs or 0) if self.logprobs else None


class CompletionRequest(Sampling, NotImplementedParams, Streamed):
    """``POST /v1/completions``: one prompt (text or token ids) or a batch of them."""

    model: str | None = None
    prompt: (NonEmptyText | TokenIds | Annotated[list[NonEmptyText], Field(min_length=1, max_length=MAX_CHOICES)]
             | Annotated[list[TokenIds], Field(min_length=1, max_length=MAX_CHOICES)])
    max_tokens: TokenCount | None = Field(16, description="default 16 (OpenAI's); null: up to the context")
    n: NumAnswers | None = Field(None, description="answers per prompt")
    logprobs: LogprobCount | None = Field(
        None, description=f"each token's log-probability (of the raw logits) and those of the {MAX_LOGPROBS} or "
                          "fewer most likely tokens at each step")


class GenerateSampling(Sampling):
    """``sampling_params`` of ``/generate`` (SGLang's names: ``max_new_tokens``)."""

    max_new_tokens: TokenCount | None = Field(128, description="default 128; null: up to the context")


def _one_of_field() -> Any:
    """A field of a pair of which a body gives exactly one (the model's ``oneOf`` says so):
    absent by default, never ``null``, so the schema shows no default."""
    return Field(None, json_schema_extra=lambda schema: schema.pop("default", None))


def _exactly_one(body: Body, first: str, second: str, message: str) -> Body:
    """The check behind a ``oneOf`` pair: exactly one of ``first`` and ``second`` given."""
    if (getattr(body, first) is None) == (getattr(body, second) is None):
        raise ValueError(message)
    return body


class NativeUnusedParams(Body):
    """Fields of SGLang's ``/generate`` that its clients send on every request (its
    ``bench_serving`` does), accepted only at their "not used" value."""

    lora_path: None = None
    return_logprob: Literal[False] | None = None
    logprob_start_len: Literal[-1] | None = None
    return_routed_experts: Literal[False] | None = None


class NativeGenerateRequest(NativeUnusedParams):
    """``POST /generate`` (SGLang's native form): ``text`` or ``input_ids``."""

    model_config = ConfigDict(json_schema_extra={"oneOf": [{"required": ["text"]}, {"required": ["input_ids"]}]})

    text: NonEmptyText = _one_of_field()
    input_ids: TokenIds = _one_of_field()
    sampling_params: GenerateSampling | None = None
    stream: bool | None = Field(None, description="each event holds the whole answer so far")

    @model_validator(mode="after")
    def _one_prompt(self):
        return _exactly_one(self, "text", "input_ids",
                            "give text (a non-empty string) or input_ids (a non-empty list of token ids), one of them")


class TokenizeRequest(Body):
    """``POST /tokenize`` (as vLLM's and SGLang's): the ids a completion (``prompt``) or chat
    (``messages``) request starts from. The two options exist only at the engine's value."""

    model_config = ConfigDict(json_schema_extra={"oneOf": [{"required": ["prompt"]}, {"required": ["messages"]}]})

    model: str | None = None
    prompt: NonEmptyText = _one_of_field()
    messages: Annotated[list[Message], Field(min_length=1)] = _one_of_field()
    add_special_tokens: Literal[True] | None = None
    add_generation_prompt: Literal[True] | None = None

    @model_validator(mode="after")
    def _one_prompt(self):
        return _exactly_one(self, "prompt", "messages", "give either prompt (a string) or messages (a chat)")


class DetokenizeRequest(Body):
    """``POST /detokenize``: token ids back to text."""

    model: str | None = None
    tokens: list[TokenId]


REQUEST_MODELS: dict[str, type[Body]] = {
    "/v1/chat/completions": ChatRequest, "/v1/completions": CompletionRequest, "/generate": NativeGenerateRequest,
    "/tokenize": TokenizeRequest, "/detokenize": DetokenizeRequest,
}


# -- response bodies: published in /openapi.json as each operation's responses (never used to
# build or filter a response: the handlers write the bodies, the tests check them against these)


class Reply(BaseModel):
    """A response body: closed, so a field the handlers add must be added here too."""

    model_config = ConfigDict(extra="forbid")


class ErrorDetail(Reply):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(Reply):
    """OpenAI's error body, of every 4xx and 5xx."""

    error: ErrorDetail


class PromptTokensDetails(Reply):
    cached_tokens: int


class Usage(Reply):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class CompletionLogprobs(Reply):
    """The legacy ``logprobs``: per token its text, logprob, likeliest tokens and text offset."""

    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]


class CompletionChoice(Reply):
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: str | None


class CompletionResponse(Reply):
    """``/v1/completions`` without ``stream``."""

    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage


class TopLogprob(Reply):
    token: str
    logprob: float
    bytes: list[int]


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(Reply):
    content: list[TokenLogprob]
    refusal: None


class AssistantMessage(Reply):
    role: Literal["assistant"]
    content: str


class ChatChoice(Reply):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None
    finish_reason: str | None


class ChatResponse(Reply):
    """``/v1/chat/completions`` without ``stream``."""

    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ModelCard(Reply):
    """The served model (``max_model_len`` when the server knows it)."""

    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    max_model_len: int | None = None


class ModelList(Reply):
    object: Literal["list"]
    data: list[ModelCard]


class GenerateMeta(Reply):
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    finish_reason: str | None


class GenerateResponse(Reply):
    """``/generate`` without ``stream`` (SGLang's native answer)."""

    text: str
    output_ids: list[int]
    meta_info: GenerateMeta


class TokenizeResponse(Reply):
    tokens: list[int]
    count: int
    max_model_len: int | None


class DetokenizeResponse(Reply):
    prompt: str


# Which field a whole-body check (a model validator) is about.
_VALIDATOR_PARAM = {NativeGenerateRequest: "text", TokenizeRequest: "prompt"}
_FIELD_HELP = {
    "prompt": "prompt must be a non-empty string, a non-empty list of token ids, or a list of either "
              f"(a batch of at most {MAX_CHOICES} prompts)",
    "messages": f"messages must be a non-empty list of {{role, content}} objects with a role in {ROLES} and text content",
    "stop": f"stop must be a non-empty string or a list of at most {MAX_STOP_STRINGS} of them",
    "stop_token_ids": "stop_token_ids must be a list of non-negative integer token ids",
    "input_ids": "input_ids must be a non-empty list of non-negative integer token ids",
    "tokens": "tokens must be a list of non-negative integer token ids",
    "top_p": f"top_p must be in (0, 1], at least {MIN_TOP_P:.3g} (the smallest float32 above 0)",
}


class APIError(Exception):
    """An error the client gets as an OpenAI-style body with ``status``."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


def _refusal(model: type[Body], error: ValidationError) -> APIError:
    """The 400 for a body that ``model`` refuses: every unknown field named, else the first
    problem, with the parameter it is about."""
    errors = error.errors(include_url=False)
    unknown = sorted({str(e["loc"][-1]) for e in errors if e["type"] == "extra_forbidden"})
    if unknown:
        names = ", ".join(repr(k) for k in unknown)
        return APIError(400, f"unknown parameter{'s' * (len(unknown) > 1)} {names}: this server does not implement "
                             f"{'them' if len(unknown) > 1 else 'it'} (see /openapi.json and the lesson 10 README)",
                        unknown[0], code="unknown_parameter")
    first = errors[0]
    message = first["msg"].removeprefix("Value error, ")
    loc = [p for p in first["loc"] if isinstance(p, str) and not p.startswith(("list[", "function-"))]
    if loc:
        param = loc[0]
    else:  # a whole-body check: its message starts with the field it is about, or the model says
        word = message.split()[0] if message else ""
        param = word if word in model.model_fields else _VALIDATOR_PARAM.get(model)
    if param == "sampling_params" and len(loc) > 1:
        param = loc[1]
    if param in UNSUPPORTED:
        return APIError(400, f"{param} is not supported by this server", param)
    where = ".".join(str(p) for p in first["loc"])
    text = _FIELD_HELP.get(param) or (f"{where}: {message}" if where else message)
    if where and not isinstance(first.get("input"), (dict, list)):
        text += f", got {first.get('input')!r:.80}"
    return APIError(400, text, param)


def validate(model: type[Body], body: Any, served: str | None = None) -> Any:
    """``body`` (parsed JSON) checked against ``model``; an :class:`APIError` if it does not fit.
    With ``served``, a ``model`` field naming another model is a 404 first."""
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object")
    if served is not None:
        check_model(body, served)
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise _refusal(model, exc) from None


def check_model(body: dict, served: str) -> None:
    model = body.get("model")
    if model is not None and model != served:
        raise APIError(404, f"the model {model!r} does not exist; this server serves {served!r}", "model",
                       code="model_not_found", kind="not_found_error")


def openapi_components(served: str | None = None, max_model_len: int | None = None) -> dict[str, Any]:
    """The JSON schemas of every request model, for ``/openapi.json``'s ``components.schemas``
    (each request body refers to ``#/components/schemas/<Model>``). What only the running
    server knows goes in too: ``model`` may only name the ``served`` model, and no token limit
    may exceed ``max_model_len``."""
    _, top = models_json_schema([(m, "validation") for m in REQUEST_MODELS.values()],
                                ref_template="#/components/schemas/{model}")
    schemas = top.get("$defs", {})
    for schema in schemas.values():
        properties = schema.get("properties", {})
        if served is not None and "model" in properties:
            properties["model"] = {"anyOf": [{"type": "string", "enum": [served]}, {"type": "null"}], "default": None}
        for name in ("max_tokens", "max_completion_tokens", "max_new_tokens"):
            if max_model_len is not None and name in properties:
                for option in properties[name].get("anyOf", [properties[name]]):
                    if option.get("type") == "integer":
                        option["maximum"] = max_model_len
    return schemas


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


def _streaming(request: Streamed) -> tuple[bool, bool]:
    options = request.stream_options
    return bool(request.stream), bool(options is not None and options.include_usage)


def _n(n: int | None, num_prompts: int) -> int:
    """``n``, the answers per prompt; all the request's answers together at most MAX_CHOICES."""
    n = 1 if n is None else n
    if n * num_prompts > MAX_CHOICES:
        raise APIError(400, f"n={n} answers for each of {num_prompts} prompts is {n * num_prompts}; "
                            f"one request may ask for at most {MAX_CHOICES}", "n")
    return n


def chat_prompt(messages: list[Message]) -> list[dict[str, str]]:
    """The conversation as the tokenizer's chat template takes it (text parts joined; OpenAI's
    ``developer`` role is the template's ``system``)."""
    return [{"role": "system" if m.role == "developer" else m.role,
             "content": m.content if isinstance(m.content, str) else "".join(p.text for p in m.content)}
            for m in messages]


def parse_chat(body: Any, served: str) -> ParsedRequest:
    """``/v1/chat/completions``."""
    r = validate(ChatRequest, body, served)
    max_tokens = r.max_completion_tokens if r.max_completion_tokens is not None else r.max_tokens
    stream, include_usage = _streaming(r)
    return ParsedRequest([chat_prompt(r.messages)], r.sampling_params(max_tokens, r.logprobs_asked()), stream,
                         include_usage, n=_n(r.n, 1))


def parse_completion(body: Any, served: str) -> ParsedRequest:
    """``/v1/completions``: ``prompt`` is one prompt (a string or a list of token ids) or a batch
    of them (a list of strings, or a list of token-id lists); each gets ``n`` answers."""
    r = validate(CompletionRequest, body, served)
    batch = isinstance(r.prompt, list) and not isinstance(r.prompt[0], int)
    prompts = list(r.prompt) if batch else [r.prompt]
    stream, include_usage = _streaming(r)
    return ParsedRequest(prompts, r.sampling_params(r.max_tokens, r.logprobs), stream, include_usage,
                         n=_n(r.n, len(prompts)))


def parse_generate(body: Any) -> ParsedRequest:
    """``/generate`` (SGLang's native form): ``text`` or ``input_ids``, ``sampling_params``
    (``max_new_tokens`` for max_tokens), ``stream``."""
    r = validate(NativeGenerateRequest, body)
    sampling = r.sampling_params or GenerateSampling()
    prompt = r.input_ids if r.input_ids is not None else r.text
    return ParsedRequest([prompt], sampling.sampling_params(sampling.max_new_tokens), bool(r.stream))


def parse_tokenize(body: Any, served: str) -> Any:
    """``/tokenize``: the prompt to tokenize (text, or a chat as :func:`parse_chat` renders it)."""
    r = validate(TokenizeRequest, body, served)
    return r.prompt if r.prompt is not None else chat_prompt(r.messages)


def parse_detokenize(body: Any, served: str, vocab_size: int) -> list[int]:
    """``/detokenize``: ``tokens``, a list of token ids of the served model's vocabulary."""
    r = validate(DetokenizeRequest, body, served)
    outside = [t for t in r.tokens if t >= vocab_size]
    if outside:
        raise APIError(400, f"token id {outside[0]} is outside the vocabulary (size {vocab_size})", "tokens")
    return list(r.tokens)


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}

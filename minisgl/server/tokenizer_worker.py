"""Lesson 10: the tokenizer worker, between the API server and the scheduler.

Inbound it turns prompts (text, token ids, chat messages) into token ids and checks what only
a tokenizer can check: that the prompt is not empty and that prompt + ``max_tokens`` fits the
context. Outbound it turns each request's token events into text chunks, one per token, holding
back text that may still become a stop string (:class:`~minisgl.detokenizer.TextStream`). When a
stop string appears it ends the request itself: the last chunk says ``finish_reason="stop"``, and
an :class:`AbortRequest` tells the scheduler to free the request's KV.

A request that asked for logprobs gets them named here, the chosen token and its alternatives
alike, each by a name no other token has there (:class:`TokenNames`): the text it adds, a
special token's literal text (``<|im_end|>``), a piece of a character its bytes. They follow
the text, not the tokens: a chunk lists the tokens whose text it completes
(:class:`~minisgl.server.messages.TextChunk`), so the texts the tokens of an answer added always
spell its text, up to a token that runs into a stop string.

It is a process of its own so that tokenizing long prompts never blocks the HTTP event loop nor
the scheduler's loop.
"""

from __future__ import annotations

__lesson__ = 10

import functools
import logging
import os
import re
import signal
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import zmq

from minisgl.detokenizer import REPLACEMENT_CHAR, IncrementalDetokenizer, TextStream
from minisgl.sampling_params import SamplingParams
from minisgl.scheduler.events import SAMPLING_FIELDS, RequestEvent
from minisgl.server.messages import (
    AbortRequest,
    AddRequest,
    ChunkBatch,
    FlushCache,
    FlushResult,
    GenerateRequest,
    Ready,
    Shutdown,
    StepOutput,
    TextChunk,
    TextLogprobs,
    decode,
    encode,
    pack,
    send_ready,
)
from minisgl.tokenizer import encode_prompt, load_tokenizer
from minisgl.utils import set_process_name

logger = logging.getLogger(__name__)


@functools.cache
def byte_level_alphabet() -> dict[str, int]:
    """The byte each character of a byte-level BPE vocabulary (GPT-2's, Qwen's, Llama 3's) stands
    for: the 188 printable bytes (``!``..``~``, ``¡``..``¬``, ``®``..``ÿ``) are written as
    themselves, the 68 others (space, control bytes...) as ``chr(256)``, ``chr(257)``, ... in
    byte order, so that every piece is printable text (``"Ġthe"`` is ``b" the"``)."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    others = [b for b in range(256) if b not in printable]
    return {chr(b): b for b in printable} | {chr(256 + i): b for i, b in enumerate(others)}


def bytes_name(raw: bytes) -> str:
    """``bytes:`` and ``raw``, printable ASCII as itself, every other byte as ``\\xNN``
    (a backslash too): ``bytes: \\xe4`` is the bytes ``b" \\xe4"``. One name per byte string."""
    return "bytes:" + "".join(chr(b) if 0x20 <= b < 0x7F and b != 0x5C else f"\\x{b:02x}" for b in raw)


class TokenNames:
    """The names of tokens in log-probabilities: at each step, one name per token that no other
    token has there, so a client can tell the alternatives apart (in a completion's
    ``top_logprobs`` they are the keys of a dict: two tokens of one name would be one entry).

    A token is named by the text it adds of its own (:meth:`IncrementalDetokenizer.peek`), as
    long as that is some text and whole characters. Otherwise it is named by what it is:

    * a special token (which the text skips) by its literal text, ``"<|im_end|>"``, as vLLM does;
    * a piece of a character (the first byte of "é", or the rest of one that earlier tokens
      began) by its own bytes, ``"bytes:\\xc3"`` (:func:`bytes_name`): as text, every piece
      would read U+FFFD (or ``""``, held back until the character is whole).

    Names are chosen the same way for the chosen token and its alternatives, so the chosen
    token is among its alternatives under the same name. A text names one token only (two
    tokens of a byte-level BPE never add the same whole characters), and no text of a token
    begins with ``bytes:`` (the pre-tokenizer splits letters from ``:``)."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
        self.byte_level = type(decoder).__name__ == "ByteLevel"
        self.fallback = functools.cache(self._fallback)  # a token's name when its text won't do

    def __call__(self, detokenizer: IncrementalDetokenizer, token_ids: Sequence[int]) -> list[str]:
        """The names of ``token_ids`` as the next token after ``detokenizer``'s tokens."""
        return [text if text and REPLACEMENT_CHAR not in text else self.fallback(token)
                for text, token in zip(detokenizer.peek(token_ids), token_ids)]

    def _fallback(self, token: int) -> str:
        literal = self.tokenizer.decode([token], skip_special_tokens=False)
        if literal and REPLACEMENT_CHAR not in literal and not self.tokenizer.decode([token], skip_special_tokens=True):
            return literal  # a special token
        piece = self.tokenizer.convert_ids_to_tokens(token)
        raw = self.own_bytes(piece)
        return piece if raw is None else bytes_name(raw)

    def own_bytes(self, piece: str) -> bytes | None:
        """The bytes of vocabulary piece ``piece``: byte-level BPE's (:func:`byte_level_alphabet`),
        or a SentencePiece byte token's (``<0xE4>``); None for any other piece."""
        byte = re.fullmatch(r"<0x([0-9A-Fa-f]{2})>", piece)
        if byte:
            return bytes([int(byte.group(1), 16)])
        alphabet = byte_level_alphabet()
        if self.byte_level and all(ch in alphabet for ch in piece):
            return bytes(alphabet[ch] for ch in piece)
        return None


@dataclass
class _Live:
    """A request between its GenerateRequest and its last TextChunk.

    ``unshown`` (None unless the request asked for logprobs) holds the log-probabilities of the
    tokens whose text has not all been shown yet, as ``(start, end, entry)``: the token's text is
    ``stream.raw[start:end]``."""

    stream: TextStream
    completion_tokens: int = 0
    unshown: deque[tuple[int, int, TextLogprobs]] | None = None

    def shown_logprobs(self) -> list[TextLogprobs] | None:
        """The entries whose token's text is now shown (``stream.text`` is a prefix of
        ``stream.raw``), taken out. After a stop string, a token whose text begins before it is
        shown too (its text runs into the stop string); the rest never will be, and go."""
        if self.unshown is None:
            return None
        shown, stopped, out = len(self.stream.text), self.stream.stopped, []
        while self.unshown and (self.unshown[0][1] <= shown or (stopped and self.unshown[0][0] < shown)):
            out.append(self.unshown.popleft()[2])
        if stopped:
            self.unshown.clear()
        return out


class TokenizerWorker:
    def __init__(self, tokenizer, max_seq_len: int, to_api: zmq.Socket, to_scheduler: zmq.Socket) -> None:
        self.tokenizer, self.max_seq_len = tokenizer, max_seq_len
        self.names = TokenNames(tokenizer)
        self.to_api, self.to_scheduler = to_api, to_scheduler
        self.live: dict[str, _Live] = {}

    # --- from the API ---------------------------------------------------------------------------
    def on_generate(self, msg: GenerateRequest) -> None:
        try:
            prompt_ids, params = self.prepare(msg)
        except Exception as exc:  # whatever one request does, this process (every request's) lives on
            # A bad value, or the chat template refusing the conversation (a template's
            # raise_exception("roles must alternate") is jinja2's TemplateError): the client's
            # fault, a 400. Anything else is ours: logged, a 500.
            client_fault = isinstance(exc, (ValueError, TypeError)) or type(exc).__module__.startswith("jinja2")
            if not client_fault:
                logger.exception("could not prepare request %s", msg.rid)
            error = str(exc) if isinstance(exc, (ValueError, TypeError)) else f"{type(exc).__name__}: {exc}"
            self.to_api.send(encode(ChunkBatch([pack(TextChunk(msg.rid, "", [], "error", error=error,
                                                               status=400 if client_fault else 500))])))
            return
        self.live[msg.rid] = _Live(TextStream(self.tokenizer, params.get("stop") or ()),
                                   unshown=None if params.get("logprobs") is None else deque())
        self.to_scheduler.send(encode(AddRequest(msg.rid, prompt_ids, params)))

    def prepare(self, msg: GenerateRequest) -> tuple[list[int], dict]:
        """Token ids and complete sampling params, or ValueError saying what is wrong."""
        prompt_ids = encode_prompt(self.tokenizer, msg.prompt) if msg.prompt else []
        if not prompt_ids:
            raise ValueError("the prompt is empty")
        params = {k: v for k, v in msg.params.items() if k in SAMPLING_FIELDS}
        room = self.max_seq_len - len(prompt_ids)
        if params.get("max_tokens") is None:  # "as many as fit"
            if room < 1:
                raise ValueError(f"the prompt has {len(prompt_ids)} tokens; this model's context is "
                                 f"{self.max_seq_len} tokens, so there is no room to generate")
            params["max_tokens"] = room
        elif params["max_tokens"] > room:
            raise ValueError(f"this model's context is {self.max_seq_len} tokens; the prompt has "
                             f"{len(prompt_ids)} and max_tokens asks for {params['max_tokens']} more")
        SamplingParams(**params)  # validates every field (the API did too; this is the last gate)
        return prompt_ids, params

    def on_abort(self, rid: str) -> None:
        if self.live.pop(rid, None) is not None:
            self.to_scheduler.send(encode(AbortRequest(rid)))

    # --- from the scheduler ---------------------------------------------------------------------
    def on_step(self, output: StepOutput) -> None:
        """One scheduler step: the text chunks of every event, sent as one batch."""
        chunks: list[TextChunk] = []
        for fields in output.events:
            self.on_tokens(RequestEvent(*fields), chunks)
        self.to_api.send(encode(ChunkBatch([pack(c) for c in chunks], output.stats)))

    def on_tokens(self, event: RequestEvent, out: list[TextChunk]) -> None:
        """Append the chunks of one request's new tokens (one per token) to ``out``."""
        live = self.live.get(event.rid)
        if live is None:  # aborted meanwhile (client gone, or a stop string): nobody listens
            return
        usage = dict(prompt_tokens=event.prompt_tokens, cached_tokens=event.cached_tokens)
        if event.finish_reason == "error":
            del self.live[event.rid]
            out.append(TextChunk(event.rid, "", [], "error", completion_tokens=live.completion_tokens,
                                 error=event.error, status=event.status, **usage))
            return
        last = len(event.token_ids) - 1
        stream = live.stream
        for i, token in enumerate(event.token_ids):
            live.completion_tokens += 1
            start = len(stream.raw)
            named: tuple[str, float, list[tuple[str, float]]] | None = None
            if live.unshown is not None:  # it and its alternatives, named here (before it is added)
                logprob, top = event.logprobs[i]
                name, *top_names = self.names(stream.detokenizer, [token] + [t for t, _ in top])
                named = (name, logprob, list(zip(top_names, [v for _, v in top])))
            text = stream.add([token])
            finish = None
            if stream.stopped:  # a stop string: this request ends here, whatever follows
                finish = "stop"
                self.on_abort(event.rid)
            elif i == last and event.finish_reason is not None:
                finish = event.finish_reason
                text += stream.finish()
            if named is not None:  # (asked for: the text it added is known only now)
                live.unshown.append((start, len(stream.raw), TextLogprobs(*named, stream.raw[start:])))
            out.append(TextChunk(event.rid, text, [token], finish, completion_tokens=live.completion_tokens,
                                 logprobs=live.shown_logprobs(), **usage))
            if finish is not None:
                self.live.pop(event.rid, None)
                return
        if not event.token_ids and event.finish_reason is not None:  # ended without a new token
            del self.live[event.rid]
            out.append(TextChunk(event.rid, stream.finish(), [], event.finish_reason,
                                 completion_tokens=live.completion_tokens, logprobs=live.shown_logprobs(), **usage))

    def run(self, from_api: zmq.Socket, from_scheduler: zmq.Socket) -> None:
        poller = zmq.Poller()
        poller.register(from_api, zmq.POLLIN)
        poller.register(from_scheduler, zmq.POLLIN)
        parent = os.getppid()
        while os.getppid() == parent:
            for socket, _ in poller.poll(500):
                message = decode(socket.recv())
                if isinstance(message, Shutdown):
                    return
                if isinstance(message, GenerateRequest):
                    self.on_generate(message)
                elif isinstance(message, AbortRequest):
                    self.on_abort(message.rid)
                elif isinstance(message, StepOutput):
                    self.on_step(message)
                elif isinstance(message, FlushCache):  # /flush_cache: nothing to tokenize, passed on
                    self.to_scheduler.send(encode(message))
                elif isinstance(message, FlushResult):
                    self.to_api.send(encode(message))


def wait_for_scheduler(from_scheduler: zmq.Socket, from_api: zmq.Socket) -> dict | None:
    """The scheduler's :class:`Ready` info (its first message), or None if the launcher says
    :class:`Shutdown` first (the scheduler failed to start, or the server is stopping)."""
    poller = zmq.Poller()
    poller.register(from_scheduler, zmq.POLLIN)
    poller.register(from_api, zmq.POLLIN)
    while True:
        events = dict(poller.poll())
        if from_api in events and isinstance(decode(from_api.recv()), Shutdown):
            return None
        if from_scheduler in events:
            message = decode(from_scheduler.recv())
            if isinstance(message, Ready):
                return message.info


def run_tokenizer_worker(model_path: str, addresses: dict[str, str], ready_addr: str) -> None:
    """Entry point of the tokenizer process. ``addresses``: ``from_api`` and ``from_scheduler``
    (bound here), ``to_api`` and ``to_scheduler`` (connected).

    It starts beside the scheduler: it loads the tokenizer while the scheduler loads the model,
    then waits for the scheduler's first message (its context length, which every request is
    checked against) before it says it is ready."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launcher stops us (Ctrl-C reaches the whole group)
    set_process_name("minisgl-tok")  # what ps and top show
    logging.basicConfig(level=logging.INFO, format="%(asctime)s tokenizer %(levelname)s %(message)s")
    context = zmq.Context()
    sockets = {name: context.socket(zmq.PULL if name.startswith("from") else zmq.PUSH) for name in addresses}
    try:
        for name, socket in sockets.items():
            (socket.bind if name.startswith("from") else socket.connect)(addresses[name])
        tokenizer = load_tokenizer(model_path)
        info = wait_for_scheduler(sockets["from_scheduler"], sockets["from_api"])
        if info is None:  # stopped before the scheduler was up
            context.destroy(linger=0)
            return
        worker = TokenizerWorker(tokenizer, info["max_seq_len"], sockets["to_api"], sockets["to_scheduler"])
        send_ready(ready_addr, Ready("tokenizer"))
    except Exception as exc:
        send_ready(ready_addr, Ready("tokenizer", error=f"{type(exc).__name__}: {exc}"))
        raise SystemExit(1) from None
    try:
        worker.run(sockets["from_api"], sockets["from_scheduler"])
    finally:
        for socket in sockets.values():
            socket.close(0)
        context.term()

"""``python -m minisgl --shell``: chat with the model in the terminal.

It starts the whole server (children and HTTP, on a free local port) and talks to it like any
client, over ``/v1/chat/completions`` with ``stream=true``, printing each chunk as it arrives.
The conversation is kept and sent again with every question (the radix cache makes the repeated
prefix cheap: see ``cached`` in the footer). ``/reset`` starts over, ``/exit`` or Ctrl-D quits.
"""

from __future__ import annotations

__lesson__ = 10

import dataclasses
import json
import logging
import sys

import httpx

from minisgl.server.launcher import ServerArgs, serve_in_thread


def stream_chat(client: httpx.Client, url: str, messages: list[dict], headers: dict, out=sys.stdout) -> tuple[str, dict]:
    """Send the conversation, print the answer as it streams; returns (answer, usage)."""
    body = {"messages": messages, "stream": True, "stream_options": {"include_usage": True}, "temperature": 0.7,
            "top_p": 0.9, "max_tokens": 200}
    answer, usage = "", {}
    with client.stream("POST", f"{url}/v1/chat/completions", json=body, headers=headers, timeout=None) as response:
        if response.status_code != 200:
            response.read()
            raise RuntimeError(response.json()["error"]["message"])
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[len("data: "):])
            if "error" in event:
                raise RuntimeError(event["error"]["message"])
            if event.get("usage"):
                usage = event["usage"]
            for choice in event.get("choices", []):
                piece = choice["delta"].get("content") or ""
                answer += piece
                out.write(piece)
                out.flush()
    out.write("\n")
    return answer, usage


def run_shell(args: ServerArgs) -> int:
    args = dataclasses.replace(args, port=0)  # any free port; nobody else needs to find it
    # httpx logs every request at INFO ("HTTP Request: POST ... 200 OK"): in a chat that line
    # would land in the middle of each answer.
    for name in ("httpx", "httpcore"):
        logging.getLogger(name).setLevel(logging.WARNING)
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    print(f"starting minisgl with {args.model_name} ...")
    with serve_in_thread(args) as url, httpx.Client() as client:
        print(f"ready ({url}). Ask anything; /reset forgets the conversation, /exit or Ctrl-D quits.")
        messages: list[dict] = []
        while True:
            try:
                question = input("\nyou> ").strip()
            except (EOFError, KeyboardInterrupt):
                print()
                return 0
            if question in ("/exit", "/quit"):
                return 0
            if question == "/reset":
                messages = []
                print("(conversation cleared)")
                continue
            if not question:
                continue
            messages.append({"role": "user", "content": question})
            sys.stdout.write("model> ")
            try:
                answer, usage = stream_chat(client, url, messages, headers)
            except KeyboardInterrupt:  # stop this answer (the server aborts it), keep the shell
                print("\n(interrupted)")
                messages.pop()
                continue
            except RuntimeError as exc:
                print(f"\n(error: {exc}; /reset if the conversation is too long)")
                messages.pop()
                continue
            messages.append({"role": "assistant", "content": answer})
            if usage:
                print(f"[{usage['prompt_tokens']} prompt tokens, {usage['prompt_tokens_details']['cached_tokens']} "
                      f"cached, {usage['completion_tokens']} generated]")

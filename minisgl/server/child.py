"""``python -m minisgl.server.child ROLE SPEC``: how the launcher starts a child process.

Each child is a fresh interpreter started with ``subprocess``, its arguments given as one JSON
string (``SPEC``) on the command line. Not ``multiprocessing``: its ``spawn`` start method
pickles the process object to the child, which unpickles it, and nothing that crosses a process
boundary here is ever unpickled. A child says it is ready (or why it is not) with one
:class:`~minisgl.server.messages.Ready` message, in msgpack, on the launcher's ``ready`` socket.
"""

from __future__ import annotations

import json
import sys

import zmq

from minisgl.server.messages import Ready, encode


def send_ready(address: str, ready: Ready) -> None:
    """Tell the launcher (listening on ``address``) that this child started, or why it did not."""
    context = zmq.Context.instance()
    socket = context.socket(zmq.PUSH)
    socket.connect(address)
    socket.send(encode(ready))
    socket.close(linger=2000)


def main() -> None:
    role, spec = sys.argv[1], json.loads(sys.argv[2])
    if role == "scheduler":
        from minisgl.server.scheduler_process import run_scheduler

        run_scheduler(**spec)
    elif role == "tokenizer":
        from minisgl.server.tokenizer_worker import run_tokenizer_worker

        run_tokenizer_worker(**spec)
    else:
        raise SystemExit(f"unknown child role {role!r}")


if __name__ == "__main__":
    main()

"""``python -m minisgl.server.child ROLE SPEC``: how the launcher starts a child process.

Each child is a fresh interpreter started with ``subprocess``, its arguments given as one JSON
string (``SPEC``) on the command line. Not ``multiprocessing``: its ``spawn`` start method
pickles the process object to the child, which unpickles it, and nothing that crosses a process
boundary here is ever unpickled. A child says it is ready (or why it is not) with one
:class:`~minisgl.server.messages.Ready` message, in msgpack, on the launcher's ``ready`` socket
(:func:`~minisgl.server.messages.send_ready`).
"""

from __future__ import annotations

__lesson__ = 10

import json
import sys


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

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
import os
import sys

from minisgl.utils import freeze_for_exit


def keep_torch_out() -> None:
    """For the tokenizer worker, before anything imports transformers: this process tokenizes
    and never computes with tensors, but transformers imports torch whenever torch is installed
    (``AutoTokenizer`` alone costs a second of CPU more with it, on every server start). A
    ``None`` in ``sys.modules`` is Python's way to mark a module absent: ``import torch`` fails
    and ``importlib.util.find_spec("torch")`` says there is none, so transformers loads its
    tokenizers without torch (the same tokenizers: lists of ids in, text out).
    ``TRANSFORMERS_NO_ADVISORY_WARNINGS`` keeps its note that "models won't be available" out of
    the server's log. Only in a fresh child: a process that already imported torch keeps it."""
    sys.modules.setdefault("torch", None)  # type: ignore[arg-type]
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")


def main() -> None:
    role, spec = sys.argv[1], json.loads(sys.argv[2])
    if role == "scheduler":
        from minisgl.server.scheduler_process import run_scheduler

        run_scheduler(**spec)
    elif role == "tokenizer":
        keep_torch_out()
        from minisgl.server.tokenizer_worker import run_tokenizer_worker

        run_tokenizer_worker(**spec)
    else:
        raise SystemExit(f"unknown child role {role!r}")
    freeze_for_exit()  # the child stopped cleanly: skip the exit's garbage collection (see there)


if __name__ == "__main__":
    main()

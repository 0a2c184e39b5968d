"""Process helpers for the tests of rank processes (lesson 9)."""

from __future__ import annotations

import os


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` still runs. A process that exited but was not reaped yet (a
    zombie, e.g. a rank whose parent has not waited for it) counts as gone."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:  # no /proc (not Linux): os.kill said it exists
        return True

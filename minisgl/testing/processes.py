"""Process helpers for the tests of rank processes (lesson 9)."""

from __future__ import annotations

__lesson__ = 'tooling'

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


def library_loaded(pid: int, name: str) -> bool:
    """Whether process ``pid`` has a shared library whose path contains ``name`` mapped (e.g.
    ``"libtorch"``, ``"tokenizers"``; ``/proc/<pid>/maps``, Linux)."""
    with open(f"/proc/{pid}/maps") as f:
        return name in f.read()


def child_pids(pid: int) -> list[int]:
    """The live processes whose parent is ``pid`` (read from ``/proc``; Linux)."""
    children = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[-1].split()
            except OSError:
                continue
            if int(fields[1]) == pid and fields[0] != "Z":
                children.append(int(entry))
    return children


def process_name(pid: int) -> str:
    """The process's name as ``ps`` shows it (``/proc/<pid>/comm``; the server's processes set
    theirs: ``minisgl-api``, ``minisgl-sched``, ``minisgl-tok``)."""
    with open(f"/proc/{pid}/comm") as f:
        return f.read().strip()


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds that process ``pid`` has used so far (``/proc``; Linux)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[-1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def descendant_pids(pid: int) -> list[int]:
    """Every live process under ``pid``: its children, theirs, and so on (Linux)."""
    found, todo = [], [pid]
    while todo:
        kids = child_pids(todo.pop())
        found += kids
        todo += kids
    return found

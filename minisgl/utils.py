"""Small helpers shared by every layer of the package (it imports nothing from minisgl)."""

from __future__ import annotations

__lesson__ = 1

import functools
import gc
import importlib.util
import numbers
import os
import signal


def cdiv(a: int, b: int) -> int:
    """Ceiling division for non-negative ints: how many size-``b`` pages hold ``a`` tokens."""
    return -(-a // b)


@functools.cache
def flashinfer_available() -> bool:
    """Whether the FlashInfer package is installed (it is imported lazily, only on CUDA)."""
    return importlib.util.find_spec("flashinfer") is not None


def freeze_for_exit() -> None:
    """Called last by a child process (a server's scheduler or tokenizer worker, a rank) whose
    work is done and which has closed what it opened. At exit the interpreter collects garbage
    over every object still alive, and torch and transformers make hundreds of thousands (their
    operator registries, their modules): ~0.3 s of CPU at every exit of such a process, on
    every server stop. ``gc.freeze()`` moves them out of the collector's sight; exit still runs
    the ``atexit`` handlers and flushes the output, and the operating system takes the memory
    back as always."""
    gc.freeze()


def is_int(value: object) -> bool:
    """A real integer (Python or NumPy): ``True``/``False`` and ``2.0`` do not count."""
    if type(value) is int:  # the common case, fast (an ABC check costs ~1 us per token)
        return True
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def require_int(owner: str, name: str, value: object, minimum: int = 1) -> None:
    """Raise ``ValueError`` naming ``owner.name`` unless ``value`` is an int ``>= minimum``."""
    if not is_int(value) or value < minimum:  # type: ignore[operator]
        raise ValueError(f"{owner}.{name} must be an integer >= {minimum}, got {value!r}")


def is_number(value: object) -> bool:
    """A real number (int or float, Python or NumPy); ``True``/``False`` do not count."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _prctl(option: int, arg: int | bytes) -> bool:
    """Linux ``prctl(option, arg)`` on this process; False where there is no such call."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(option, arg, 0, 0, 0)
    except (OSError, AttributeError):
        return False
    return True


def exit_with_parent(parent_pid: int) -> None:
    """Have the kernel SIGKILL this process as soon as the process that started it dies (Linux
    ``prctl(PR_SET_PDEATHSIG)``; does nothing elsewhere), and exit now if it is already gone.

    For a child that must never outlive its parent whatever state it is in, even stuck in a
    driver call where no signal handler or polling loop of its own would run. The kernel
    tracks the *thread* that started the child: start such children from a thread that lives
    as long as they should (the main thread, normally)."""
    if _prctl(1, signal.SIGKILL) and os.getppid() != parent_pid:  # 1 = PR_SET_PDEATHSIG; the
        os._exit(1)  # parent died before the call took effect


def set_process_name(name: str) -> None:
    """Name this process as ``ps``, ``top`` and ``/proc/<pid>/comm`` show it (Linux
    ``prctl(PR_SET_NAME)``, at most 15 characters); does nothing elsewhere."""
    _prctl(15, name.encode()[:15])  # 15 = PR_SET_NAME

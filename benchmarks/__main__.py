"""``python -m benchmarks NAME [args]``: run one of the benchmarks."""

from __future__ import annotations

import sys


def main() -> None:
    names = {"attention": "benchmarks.attention", "offline": "benchmarks.offline", "radix": "benchmarks.radix",
             "chunked": "benchmarks.chunked", "overlap": "benchmarks.overlap",
             "host": "benchmarks.host", "graphs": "benchmarks.graphs",
             "kernels": "benchmarks.kernels", "steps": "benchmarks.steps", "tp": "benchmarks.tp",
             "http": "benchmarks.http", "serving": "benchmarks.serving"}
    if len(sys.argv) < 2 or sys.argv[1] not in names:
        raise SystemExit(f"usage: python -m benchmarks {{{','.join(names)}}} [--help]")
    import importlib

    importlib.import_module(names[sys.argv[1]]).main(sys.argv[2:])


if __name__ == "__main__":
    main()

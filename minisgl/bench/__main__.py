"""``python -m minisgl.bench NAME [args]``: run one of the benchmarks."""

from __future__ import annotations

__lesson__ = 'tooling'

import sys


def main() -> None:
    names = {"attention": "minisgl.bench.attention", "offline": "minisgl.bench.offline", "radix": "minisgl.bench.radix",
             "chunked": "minisgl.bench.chunked", "overlap": "minisgl.bench.overlap",
             "host": "minisgl.bench.host", "graphs": "minisgl.bench.graphs",
             "kernels": "minisgl.bench.kernels", "steps": "minisgl.bench.steps", "tp": "minisgl.bench.tp",
             "http": "minisgl.bench.http", "serving": "minisgl.bench.serving"}
    if len(sys.argv) < 2 or sys.argv[1] not in names:
        raise SystemExit(f"usage: python -m minisgl.bench {{{','.join(names)}}} [--help]")
    import importlib

    importlib.import_module(names[sys.argv[1]]).main(sys.argv[2:])


if __name__ == "__main__":
    main()

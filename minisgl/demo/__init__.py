"""The demo model bundled with the package: a small Qwen3 trained here, on the CPU, so that the
engine, the server and the examples produce readable text offline.

``LLM("demo")`` (and ``python -m minisgl``) load it from :func:`demo_model_path`; Hugging Face
`transformers` loads the same directory. ``python -m tests.demo_training train`` retrains it
(:mod:`tests.demo_training.train`), ``python -m tests.demo_training check`` compares the files with the
SHA-256 table of its model card. This module imports nothing heavy: the loader uses it.
"""

from __future__ import annotations

__lesson__ = 1

from pathlib import Path

DEMO_MODEL_NAME = "demo"


def demo_model_path() -> Path:
    """The bundled demo checkpoint's directory (``minisgl/demo/model``)."""
    path = Path(__file__).resolve().parent / "model"
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"the demo model is missing from {path}; reinstall minisgl or run `python -m tests.demo_training train`"
        )
    return path

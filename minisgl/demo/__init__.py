"""The demo model bundled with the package: a small Qwen3 trained here, on the CPU, so that the
engine, the server and the examples produce readable text offline; and its draft model, a much
smaller Qwen3 with the same tokenizer, for speculative decoding (lesson 12).

``LLM("demo")`` (and ``python -m minisgl``) load the demo model from :func:`demo_model_path`;
``LLM(str(demo_draft_path()))`` loads the draft; Hugging Face `transformers` loads either directory.
``python -m tests.demo_training train`` retrains the demo model (:mod:`tests.demo_training.train`),
``python -m tests.demo_training train-draft`` the draft, and ``python -m tests.demo_training check``
(``--dir`` for the draft's directory) compares a checkpoint's files with the SHA-256 table of its
model card. This module imports nothing heavy: the loader uses it.
"""

from __future__ import annotations

__lesson__ = 1

from pathlib import Path

DEMO_MODEL_NAME = "demo"
DEMO_DRAFT_NAME = "demo-draft"  # lesson 12: the demo's draft model


def _bundled(folder: str, what: str, train_command: str) -> Path:
    """``minisgl/demo/<folder>``, or a ``FileNotFoundError`` naming ``what`` and how to rebuild it."""
    path = Path(__file__).resolve().parent / folder
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"the {what} is missing from {path}; reinstall minisgl or run `{train_command}`")
    return path


def demo_model_path() -> Path:
    """The bundled demo checkpoint's directory (``minisgl/demo/model``)."""
    return _bundled("model", "demo model", "python -m tests.demo_training train")


def demo_draft_path() -> Path:
    """The bundled draft model's directory (``minisgl/demo/draft``): a 2-layer Qwen3 of 0.7M
    parameters (under 2 MB with its files) trained on the demo model's corpus with the demo's
    tokenizer, byte for byte (same vocabulary, same special tokens and eos), so its token ids are
    the demo's. It proposes tokens for the demo model to verify in speculative decoding (lesson
    12); its model card gives its held-out loss beside the demo's and how often its greedy next
    token is the demo's."""
    return _bundled("draft", "demo draft model", "python -m tests.demo_training train-draft")

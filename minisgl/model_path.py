"""Where a checkpoint lives: a local directory, the demo model bundled with the package, or a
Hugging Face hub id.

Kept apart from the loader and free of torch: the server's HTTP and tokenizer processes need
the path (for the tokenizer) but never a tensor, and importing torch costs each of them seconds
at start.
"""

from __future__ import annotations

__lesson__ = 1

import os
from pathlib import Path

from minisgl.demo import DEMO_DRAFT_NAME, DEMO_MODEL_NAME, demo_draft_path, demo_model_path


def resolve_model_path(model: str | os.PathLike) -> Path:
    """A local directory as is; ``"demo"``, the demo model bundled with the package
    (``minisgl/demo/model``; write ``./demo`` for a local folder of that name); ``"demo-draft"``,
    its draft model for lesson 12's speculative decoding (``minisgl/demo/draft``); otherwise a hub
    id, downloaded (config, tokenizer, safetensors)."""
    if str(model) == DEMO_MODEL_NAME:
        return demo_model_path()
    if str(model) == DEMO_DRAFT_NAME:
        return demo_draft_path()
    path = Path(model).expanduser()
    if path.is_dir():
        return path
    if path.exists() or str(model).startswith((".", "/", "~")):
        raise FileNotFoundError(f"model path {model!r} is not a directory")
    try:
        from huggingface_hub import snapshot_download

        return Path(
            snapshot_download(str(model), allow_patterns=["*.json", "*.safetensors", "tokenizer*", "*.jinja"])
        )
    except Exception as exc:  # network errors, unknown repo ids, ...
        raise FileNotFoundError(
            f"{model!r} is not a local directory and could not be fetched from the Hugging Face hub: {exc}"
        ) from exc

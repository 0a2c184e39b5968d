"""Measure the demo model and write its model card (``README.md`` beside the weights).

The measurements are the ones the tests repeat: held-out perplexity against unigram baselines,
and greedy samples whose words are checked against the corpus's word list.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from pathlib import Path

import torch

from tests.demo_training.corpus import AUSTEN_DEB_SHA256, AUSTEN_DEB_URL, NOVELS, sha256_bytes, words

# Greedy samples printed in the model card (and checked by the tests).
TEXT_PROMPTS = ("It was a fine morning, and Elizabeth", "The KV cache")
CHAT_PROMPTS = ("Who are you?", "What is a KV cache?", "Why does the engine split the KV cache into pages?")
SAMPLE_TOKENS = 48


def windows(ids: torch.Tensor, length: int) -> torch.Tensor:
    """``ids`` cut into consecutive windows of ``length`` (the tail dropped): ``[n, length]``."""
    n = len(ids) // length
    return ids[: n * length].view(n, length)


@torch.inference_mode()
def mean_nll(model, ids: torch.Tensor, context: int) -> float:
    """Mean negative log-likelihood (nats per token) of ``ids``, scored in windows of ``context``
    tokens (each window's first token is not predicted)."""
    total, count = 0.0, 0
    for chunk in windows(ids, context).split(8):
        logits = model(input_ids=chunk).logits.float()
        nll = torch.nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, logits.shape[-1]), chunk[:, 1:].reshape(-1), reduction="sum"
        )
        total, count = total + nll.item(), count + chunk[:, 1:].numel()
    return total / count


def file_hashes(model_dir: Path) -> dict[str, str]:
    """SHA-256 of every file of the checkpoint except the model card (which lists them)."""
    return {p.name: sha256_bytes(p.read_bytes()) for p in sorted(model_dir.iterdir())
            if p.is_file() and p.name != "README.md"}


def load_hf(model_dir: Path):
    """The checkpoint in `transformers`, in float32 (the bf16 weights upcast exactly)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(model_dir)


def heldout_perplexity(model_dir: Path) -> float:
    """Perplexity on ``heldout.txt`` (the novels' held-out paragraphs), in windows of the
    model's context length."""

    model, tokenizer = load_hf(model_dir)
    ids = torch.tensor(tokenizer.encode((model_dir / "heldout.txt").read_text(encoding="utf-8")))
    return math.exp(mean_nll(model, ids, model.config.max_position_embeddings))


def oracle_unigram_perplexity(model_dir: Path) -> float:
    """Perplexity on ``heldout.txt`` of the best possible unigram model: token frequencies
    counted on the held-out text itself. No model that ignores context can do better."""
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(model_dir).encode((model_dir / "heldout.txt").read_text(encoding="utf-8"))
    counts = Counter(ids)
    return math.exp(-sum(c * math.log(c / len(ids)) for c in counts.values()) / len(ids))


def word_list(model_dir: Path) -> set[str]:
    return set((model_dir / "words.txt").read_text(encoding="utf-8").split())


def complete_words(text: str) -> list[str]:
    """The words of a generated text, without a last word that may have been cut off."""
    found = words(text)
    if found and re.search(r"[A-Za-z']$", text):
        found = found[:-1]
    return found


def greedy_samples(model_dir: Path) -> list[dict]:
    """Greedy generations of the card's prompts by minisgl's engine (float32, CPU)."""
    from minisgl import LLM, SamplingParams

    prompts = list(TEXT_PROMPTS) + [[{"role": "user", "content": q}] for q in CHAT_PROMPTS]
    with LLM(str(model_dir), device="cpu", dtype=torch.float32) as llm:
        outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=SAMPLE_TOKENS), progress=False)
    return [{"prompt": p if isinstance(p, str) else p[0]["content"], "chat": not isinstance(p, str),
             "text": o.text, "finish_reason": o.finish_reason} for p, o in zip(prompts, outputs)]


def write_model_card(model_dir: Path, cfg, record: dict) -> None:
    """Measure the checkpoint in ``model_dir`` and write its ``README.md``."""

    training = json.loads((model_dir / "training_log.json").read_text())
    params = sum(t.numel() for t in load_hf(model_dir)[0].parameters())
    ppl = heldout_perplexity(model_dir)
    oracle = oracle_unigram_perplexity(model_dir)
    samples = greedy_samples(model_dir)
    vocab = word_list(model_dir)
    hashes = file_hashes(model_dir)

    loss_rows = "\n".join(f"| {e['step']} | {e['train_loss']:.3f} | {e['heldout_loss']:.3f} |" for e in training["log"])
    sample_blocks = []
    for s in samples:
        unknown = [w for w in complete_words(s["text"]) if w not in vocab]
        kind = "chat" if s["chat"] else "text"
        sample_blocks.append(
            f"**{kind}:** {s['prompt']!r} → ({s['finish_reason']}, words not in `words.txt`: {unknown or 'none'})\n\n"
            f"```text\n{s['text'].strip()}\n```"
        )
    hash_rows = "\n".join(f"| `{name}` | `{digest}` |" for name, digest in hashes.items())
    novels = ", ".join(f"*{t}*" for t in NOVELS.values())
    card = f"""---
license: apache-2.0
language: en
library_name: transformers
pipeline_tag: text-generation
---

# minisgl demo model

A {params / 1e6:.1f}M-parameter Qwen3-architecture model with its own {cfg.vocab_size}-token byte-level BPE, trained
from scratch on a CPU by `python -m tests.demo_training train`. It exists so that `python -m minisgl`,
the chat shell and the course's examples say something readable offline. It writes
Austen-flavoured English and answers simple questions about the course; it is tiny, so it is
often wrong. Serve a real model with `--model`.

```python
from minisgl import LLM
llm = LLM("demo")                                    # this directory, bundled with the package
from transformers import AutoModelForCausalLM
hf = AutoModelForCausalLM.from_pretrained(llm.model_path)   # the same files in transformers
```

## Model

| | |
|---|---|
| architecture | `Qwen3ForCausalLM` (QK-norm, RoPE, SwiGLU, GQA, tied embeddings) |
| layers × hidden | {cfg.num_layers} × {cfg.hidden_size}, {cfg.num_heads} query heads, {cfg.num_kv_heads} KV head{'s' * (cfg.num_kv_heads != 1)}, head dim {cfg.head_dim} |
| MLP width | {cfg.intermediate_size} |
| context | {cfg.context} tokens (the training window) |
| vocabulary | {cfg.vocab_size} (byte-level BPE; `<|endoftext|>` 0, `<|im_start|>` 1, `<|im_end|>` 2) |
| weights | bfloat16, {(model_dir / 'model.safetensors').stat().st_size / 1e6:.1f} MB |
| chat template | ChatML; generation stops at `<|im_end|>` or `<|endoftext|>` |

## Training data and licences

- **Jane Austen's six novels** ({novels}), public domain, from Debian's
  `r-cran-janeaustenr` 1.0.0-1 ([.deb]({AUSTEN_DEB_URL}), SHA-256 `{AUSTEN_DEB_SHA256}`;
  the R package is MIT-licensed, © Julia Silge). The last 1% of each novel's paragraphs is held
  out (`heldout.txt`, {training['heldout_tokens']:,} tokens) and never trained on.
- **The course's own texts**: `README.md`, `lessons/*/README.md` and `site/*.md` of the minisgl
  repository (Apache-2.0) as committed at `{record['commit']}`, mermaid diagrams removed; twice in
  the stream.
- **Question-answer pairs about the course** (`tests/demo_training/qa.jsonl`, written for this project,
  Apache-2.0), in the chat template's format, {cfg.qa_repeats} times each.

{training['training_tokens']:,} tokens in all, documents separated by `<|endoftext|>`. The SHA-256
of every input is in `training_log.json`. The weights are Apache-2.0.

## Training

`python -m tests.demo_training train` (seed {cfg.seed}): {cfg.steps} AdamW steps of {cfg.batch_size} random windows of
{cfg.context} tokens, learning rate {cfg.lr:g} after {cfg.warmup_steps} warm-up steps, cosine down to {cfg.min_lr:g}, weight
decay {cfg.weight_decay:g}, gradient clipping {cfg.grad_clip:g}; float32, {cfg.threads} threads, torch {record['torch']}. On this run's
machine ({record['cpu_count']} cores, {record['cpu']}) training took **{record['train_seconds'] / 60:.1f} min**, and
{record['total_seconds'] / 60:.1f} min with data preparation and this card.

| step | train loss | held-out loss |
|---:|---:|---:|
{loss_rows}

## Quality

| held-out perplexity (`heldout.txt`) | |
|---|---:|
| this model | **{ppl:.1f}** |
| unigram model of the training tokens | {training['unigram_heldout_perplexity']:.1f} |
| best possible unigram model (frequencies of the held-out text itself) | {oracle:.1f} |

Greedy samples (minisgl's engine, float32; `words.txt` lists the training corpus's words):

{chr(10).join(sample_blocks)}

## Files (SHA-256)

`python -m tests.demo_training train` writes exactly these bytes on a machine like the one above (same
torch, CPU kind and thread count), from a checkout of `{record['commit']}` (the commit whose
course texts it reads): `git checkout {record['commit']} && python -m tests.demo_training train`.
`python -m tests.demo_training check` compares the files with this table, and so does the test suite.

| file | SHA-256 |
|---|---|
{hash_rows}
"""
    (model_dir / "README.md").write_text(card, encoding="utf-8")

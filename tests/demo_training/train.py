"""Train the demo model: a small Qwen3 with its own byte-level BPE, on the CPU, in plain PyTorch.

``python -m tests.demo_training train`` runs :func:`train` with :class:`TrainConfig`'s defaults and
writes the checkpoint into ``minisgl/demo/model`` (config, bf16 safetensors, tokenizer files,
generation config, a training log and the model card with every file's SHA-256).
``python -m tests.demo_training train-draft`` runs it with :data:`DRAFT_CONFIG` and ``draft_for`` the
demo model: lesson 12's draft model, in ``minisgl/demo/draft``, trained on exactly the demo's corpus
with the demo's tokenizer (copied, not retrained).

Reproducible: every random choice (tokenizer ties aside, which `tokenizers` breaks
deterministically; the weight init; which windows each step reads) comes from ``seed``, and
torch runs with a fixed number of threads and deterministic algorithms. The same torch version on
the same kind of CPU with the same thread count writes the same bytes. A different CPU may pick
different matmul kernels, whose float rounding differs, and then the weights differ in their
last bits and drift from there.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import platform
import shutil
import subprocess
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch

from minisgl.tokenizer import CHATML_TEMPLATE, save_hf_tokenizer, train_byte_level_bpe
from tests.demo_training.card import card_commit, mean_nll, write_draft_card, write_model_card
from tests.demo_training.corpus import Corpus, build_corpus, shuffled, words

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # ids 0, 1, 2
ENDOFTEXT, IM_END = 0, 2


@dataclass(frozen=True)
class TrainConfig:
    """Everything that decides the demo model's bytes (with the corpus and the torch version)."""

    seed: int = 0
    vocab_size: int = 4096
    hidden_size: int = 256
    num_layers: int = 4
    num_heads: int = 2
    num_kv_heads: int = 1
    head_dim: int = 128  # a size FlashInfer ships precompiled kernels for (as is 64)
    intermediate_size: int = 768
    context: int = 512  # training window = the model's max_position_embeddings
    batch_size: int = 8  # windows per step
    steps: int = 800
    lr: float = 2e-3  # peak, after a linear warm-up, then cosine down to min_lr
    min_lr: float = 2e-4
    warmup_steps: int = 50
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    course_repeats: int = 2  # the course's texts appear this many times in the token stream
    qa_repeats: int = 20  # and each question-answer pair this many times
    threads: int = 2
    eval_every: int = 100


# The draft model for lesson 12's speculative decoding (``python -m tests.demo_training train-draft``):
# the demo's tokenizer and corpus, a model about a tenth of the demo's compute per token, under 2 MB on
# disk with its files (the 4096 x 96 tied embedding is over half of its weights), trained on one thread.
DRAFT_CONFIG = TrainConfig(
    hidden_size=96, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=64, intermediate_size=384,
    steps=1000, lr=3e-3, min_lr=3e-4, threads=1,
)


def hf_config(cfg: TrainConfig):
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
        max_position_embeddings=cfg.context, rope_theta=10000.0, rms_norm_eps=1e-6,
        tie_word_embeddings=True, bos_token_id=None, eos_token_id=IM_END, pad_token_id=ENDOFTEXT,
        torch_dtype="bfloat16", use_cache=True,
    )


def token_stream(corpus: Corpus, tokenizer, cfg: TrainConfig) -> torch.Tensor:
    """All training documents, shuffled, as one stream of token ids separated by <|endoftext|>.

    Each repetition of the course texts and of the question-answer pairs is shuffled on its own,
    so a pair has different neighbours each time it appears.
    """
    documents = list(corpus.austen)
    for r in range(cfg.course_repeats):
        documents += shuffled(corpus.course, cfg.seed * 1000 + r)
    for r in range(cfg.qa_repeats):
        documents += shuffled(corpus.qa, cfg.seed * 1000 + 500 + r)
    documents = shuffled(documents, cfg.seed)
    ids: list[int] = []
    for encoding in tokenizer.encode_batch(documents):
        ids += encoding.ids
        ids.append(ENDOFTEXT)
    return torch.tensor(ids, dtype=torch.long)


def unigram_perplexity(train_ids: torch.Tensor, heldout_ids: torch.Tensor, vocab_size: int) -> float:
    """Perplexity on ``heldout_ids`` of the unigram model of ``train_ids`` (add-one smoothing):
    what a model that knows only token frequencies achieves."""
    counts = torch.bincount(train_ids, minlength=vocab_size).double() + 1
    logp = (counts / counts.sum()).log()
    return math.exp(-logp[heldout_ids].mean().item())


def lr_at(step: int, cfg: TrainConfig) -> float:
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1 + math.cos(math.pi * progress))


def git_commit(repo_root: Path) -> str:
    """``HEAD``'s short hash (the course texts are read from it), with ``+changes`` if the demo
    package itself has uncommitted changes."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo_root, capture_output=True, text=True)
        paths = ["minisgl/demo", "tests/demo_training", "minisgl/tokenizer.py"]
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", *paths],
                               cwd=repo_root, capture_output=True, text=True).stdout.strip()
    except OSError:
        return "unknown"
    return head.stdout.strip() + ("+changes" if dirty else "") if head.returncode == 0 else "unknown"


# The tokenizer files a draft model copies from its target, byte for byte.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def train(out_dir: Path, repo_root: Path, cache_dir: Path, cfg: TrainConfig = TrainConfig(), *,
          draft_for: Path | None = None) -> dict:
    """Train and write the checkpoint to ``out_dir`` (replaced). Returns the training record.

    With ``draft_for`` (a checkpoint written by this module, the demo model), train a draft model
    for it instead: the course texts are read at the commit its model card names, so the corpus is
    exactly the one it trained on; its tokenizer files are copied, not retrained; the card compares
    the two models (:func:`~tests.demo_training.card.write_draft_card`).
    """
    from tqdm import tqdm
    from transformers import GenerationConfig, Qwen3ForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    torch.set_num_threads(cfg.threads)
    torch.use_deterministic_algorithms(True)
    started = time.perf_counter()
    commit = git_commit(repo_root)  # now: the course texts are read from this commit

    if draft_for is None:
        corpus = build_corpus(repo_root, cache_dir)
        tok = train_byte_level_bpe(corpus.austen + corpus.course + corpus.qa, cfg.vocab_size, SPECIAL_TOKENS)
    else:
        from tokenizers import Tokenizer

        corpus_commit = card_commit(draft_for)
        corpus = build_corpus(repo_root, cache_dir, rev=corpus_commit)
        tok = Tokenizer.from_file(str(draft_for / "tokenizer.json"))
        assert tok.get_vocab_size() == cfg.vocab_size, "the draft's vocabulary must be its target's"
    assert [tok.token_to_id(t) for t in SPECIAL_TOKENS] == [ENDOFTEXT, 1, IM_END]
    stream = token_stream(corpus, tok, cfg)
    heldout = torch.tensor(tok.encode(corpus.heldout).ids, dtype=torch.long)
    print(f"corpus: {len(stream):,} training tokens, {len(heldout):,} held-out tokens "
          f"({time.perf_counter() - started:.0f} s to prepare)")

    torch.manual_seed(cfg.seed)
    model = Qwen3ForCausalLM._from_config(hf_config(cfg), attn_implementation="sdpa", dtype=torch.float32)
    model.config.use_cache = False
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8,
    )
    sampler = torch.Generator().manual_seed(cfg.seed)
    log: list[dict] = []
    running: list[float] = []
    train_started = time.perf_counter()
    bar = tqdm(range(cfg.steps), desc="training", unit="step")
    for step in bar:
        starts = torch.randint(0, len(stream) - cfg.context, (cfg.batch_size,), generator=sampler)
        batch = torch.stack([stream[s : s + cfg.context] for s in starts.tolist()])
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, cfg)
        model.train()
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        running.append(loss.item())
        if (step + 1) % cfg.eval_every == 0 or step + 1 == cfg.steps:
            model.eval()
            entry = {"step": step + 1, "train_loss": round(sum(running) / len(running), 4),
                     "heldout_loss": round(mean_nll(model, heldout, cfg.context), 4)}
            log.append(entry)
            running = []
            bar.set_postfix(train=entry["train_loss"], heldout=entry["heldout_loss"])
    train_seconds = time.perf_counter() - train_started

    with tempfile.TemporaryDirectory(dir=out_dir.parent) as tmp:
        staging = Path(tmp) / "model"
        model.config.use_cache = True
        model.generation_config = GenerationConfig(
            eos_token_id=[IM_END, ENDOFTEXT], pad_token_id=ENDOFTEXT, do_sample=False, max_length=cfg.context,
        )
        model.to(torch.bfloat16).save_pretrained(staging, safe_serialization=True)
        (staging / "heldout.txt").write_text(corpus.heldout + "\n", encoding="utf-8")
        extra = {}
        if draft_for is None:
            save_hf_tokenizer(tok, staging, eos="<|im_end|>", pad="<|endoftext|>", chat_template=CHATML_TEMPLATE)
            counts = Counter(w for doc in corpus.austen + corpus.course + corpus.qa for w in words(doc))
            (staging / "words.txt").write_text("\n".join(sorted(w for w, c in counts.items() if c >= 2)) + "\n")
        else:  # the target's tokenizer, byte for byte; no words.txt (the target's serves)
            for name in TOKENIZER_FILES:
                shutil.copyfile(draft_for / name, staging / name)
            extra = {"corpus_commit": corpus_commit}
        (staging / "training_log.json").write_text(json.dumps(
            {"config": dataclasses.asdict(cfg), "log": log,
             "unigram_heldout_perplexity": round(unigram_perplexity(stream, heldout, cfg.vocab_size), 2),
             "training_tokens": len(stream), "heldout_tokens": len(heldout), **extra, "inputs": corpus.inputs},
            indent=1) + "\n")
        record = {
            "total_seconds": round(time.perf_counter() - started), "train_seconds": round(train_seconds),
            "torch": torch.__version__, "cpu": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(), "threads": cfg.threads, "commit": commit,
        }
        if draft_for is None:
            write_model_card(staging, cfg, record)
        else:
            write_draft_card(staging, cfg, record, draft_for)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        shutil.move(str(staging), out_dir)
    return record

"""Measure the demo model and write its model card (``README.md`` beside the weights); the same for
its draft model (lesson 12), whose card compares it with the demo.

The measurements are the ones the tests repeat: held-out perplexity against unigram baselines,
and greedy samples whose words are checked against the corpus's word list; for the draft, its
held-out loss beside the demo's and how often its greedy token is the demo's
(:func:`greedy_agreement`).
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


def heldout_loss(model_dir: Path) -> float:
    """Mean negative log-likelihood (nats per token) on ``heldout.txt`` (the novels' held-out
    paragraphs), in windows of the model's context length."""

    model, tokenizer = load_hf(model_dir)
    ids = torch.tensor(tokenizer.encode((model_dir / "heldout.txt").read_text(encoding="utf-8")))
    return mean_nll(model, ids, model.config.max_position_embeddings)


def heldout_perplexity(model_dir: Path) -> float:
    """Perplexity on ``heldout.txt``: ``exp`` of :func:`heldout_loss`."""
    return math.exp(heldout_loss(model_dir))


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


# ---- The draft model (lesson 12) ----

AGREEMENT_PROMPTS = 30  # held-out paragraphs, spread evenly over heldout.txt (all six novels)
AGREEMENT_PROMPT_TOKENS = 24  # each prompt: a paragraph's first 24 tokens
AGREEMENT_TOKENS = 32  # the target's greedy continuation along which the draft is scored
SPECULATION_KS = (1, 2, 4, 8)  # drafts per verify step in the simulated speculative decoding


def card_commit(model_dir: Path) -> str:
    """The commit a model card says its checkpoint was trained from (the course texts' commit)."""
    card = (model_dir / "README.md").read_text(encoding="utf-8")
    found = re.search(r"from a checkout of `([0-9a-f]{7,40})`", card)
    if not found:
        raise ValueError(f"{model_dir / 'README.md'} names no clean commit it was trained from "
                         "(retrain it from a committed checkout)")
    return found.group(1)


def agreement_prompts(model_dir: Path) -> list[list[int]]:
    """:data:`AGREEMENT_PROMPTS` prompts of :data:`AGREEMENT_PROMPT_TOKENS` tokens: the first tokens
    of held-out paragraphs (``heldout.txt``, never trained on) long enough to give them, taken at
    even intervals through the file."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    paragraphs = (model_dir / "heldout.txt").read_text(encoding="utf-8").strip().split("\n\n")
    ids = [tokenizer.encode(p) for p in paragraphs]
    long_enough = [i[:AGREEMENT_PROMPT_TOKENS] for i in ids if len(i) >= AGREEMENT_PROMPT_TOKENS]
    assert len(long_enough) >= AGREEMENT_PROMPTS
    return [long_enough[j * len(long_enough) // AGREEMENT_PROMPTS] for j in range(AGREEMENT_PROMPTS)]


@torch.inference_mode()
def greedy_continuation(model, prompt: list[int], n: int) -> list[int]:
    """``n`` greedy tokens after ``prompt`` (end-of-text tokens do not stop it), each from a full
    forward pass (no KV cache: the simplest reference)."""
    ids = list(prompt)
    for _ in range(n):
        ids.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt):]


@torch.inference_mode()
def greedy_agreement(draft_dir: Path, target_dir: Path) -> tuple[int, int]:
    """How often the draft's greedy next token is the target's, along the target's own greedy
    text: over :func:`agreement_prompts`, the target continues each prompt greedily for
    :data:`AGREEMENT_TOKENS` tokens, and the draft, fed the same prompt and continuation, predicts
    every continuation token from the tokens before it. Returns (positions where the draft's
    argmax is the target's token, positions). The fraction is the chance that one draft token is
    accepted under greedy verification (lesson 12), given the drafts before it were."""
    draft, target = load_hf(draft_dir)[0], load_hf(target_dir)[0]
    agree = total = 0
    for prompt in agreement_prompts(target_dir):
        continuation = greedy_continuation(target, prompt, AGREEMENT_TOKENS)
        logits = draft(input_ids=torch.tensor([prompt + continuation])).logits[0]
        guesses = logits[len(prompt) - 1 : -1].argmax(-1).tolist()
        agree += sum(g == t for g, t in zip(guesses, continuation))
        total += len(continuation)
    return agree, total


@torch.inference_mode()
def simulated_speculation(draft_dir: Path, target_dir: Path, k: int) -> dict:
    """Greedy speculative decoding with the draft as the proposer, simulated on the target's greedy
    continuations of :func:`agreement_prompts`: each verify step the draft proposes
    ``k' = min(k, tokens left - 1)`` tokens greedily from the text so far, the target keeps the
    longest matching prefix and adds its own next token (:func:`minisgl.engine.verify.greedy_tokens`,
    the engine's rule). Returns drafts proposed and accepted, verify steps, tokens added."""
    from minisgl.engine.verify import greedy_tokens

    draft, target = load_hf(draft_dir)[0], load_hf(target_dir)[0]
    drafted = accepted = steps = tokens = 0
    for prompt in agreement_prompts(target_dir):
        continuation = greedy_continuation(target, prompt, AGREEMENT_TOKENS)
        pos = 0
        while pos < len(continuation):
            n = min(k, len(continuation) - pos - 1)
            drafts = greedy_continuation(draft, prompt + continuation[:pos], n)
            # the target's argmax after each verify input: its own text, as long as the drafts match it
            added = greedy_tokens(drafts, continuation[pos : pos + n + 1])
            assert added == continuation[pos : pos + len(added)]
            drafted, accepted, steps = drafted + n, accepted + len(added) - 1, steps + 1
            pos += len(added)
        tokens += len(continuation)
    return {"k": k, "drafted": drafted, "accepted": accepted, "steps": steps, "tokens": tokens}


def dir_bytes(model_dir: Path) -> int:
    """Total size of the checkpoint directory's files, the model card included."""
    return sum(p.stat().st_size for p in model_dir.iterdir() if p.is_file())


def write_draft_card(model_dir: Path, cfg, record: dict, target_dir: Path) -> None:
    """Measure the draft checkpoint in ``model_dir`` beside its target and write its ``README.md``."""
    training = json.loads((model_dir / "training_log.json").read_text())
    target_training = json.loads((target_dir / "training_log.json").read_text())
    target_cfg = target_training["config"]
    params = sum(t.numel() for t in load_hf(model_dir)[0].parameters())
    target_params = sum(t.numel() for t in load_hf(target_dir)[0].parameters())
    loss, target_loss = heldout_loss(model_dir), heldout_loss(target_dir)
    agree, positions = greedy_agreement(model_dir, target_dir)
    speculation = [simulated_speculation(model_dir, target_dir, k) for k in SPECULATION_KS]
    samples = greedy_samples(model_dir)
    hashes = file_hashes(model_dir)
    target_corpus = {k: v for k, v in target_training["inputs"].items() if not k.endswith("qa.jsonl")}
    corpus = {k: v for k, v in training["inputs"].items() if not k.endswith("qa.jsonl")}
    same_qa = [v for k, v in training["inputs"].items() if k.endswith("qa.jsonl")] == \
        [v for k, v in target_training["inputs"].items() if k.endswith("qa.jsonl")]
    same_corpus = corpus == target_corpus and same_qa and training["training_tokens"] == target_training["training_tokens"]

    loss_rows = "\n".join(f"| {e['step']} | {e['train_loss']:.3f} | {e['heldout_loss']:.3f} |" for e in training["log"])
    speculation_rows = "\n".join(
        f"| {s['k']} | {s['accepted']} of {s['drafted']} ({s['accepted'] / s['drafted']:.0%}) | "
        f"{s['steps']} | {s['tokens'] / s['steps']:.2f} |" for s in speculation)
    sample_blocks = "\n".join(
        f"**{'chat' if s['chat'] else 'text'}:** {s['prompt']!r} → ({s['finish_reason']})\n\n```text\n{s['text'].strip()}\n```"
        for s in samples)
    hash_rows = "\n".join(f"| `{name}` | `{digest}` |" for name, digest in hashes.items())
    weights = (model_dir / "model.safetensors").stat().st_size
    card = f"""---
license: apache-2.0
language: en
library_name: transformers
pipeline_tag: text-generation
---

# minisgl demo draft model

A {params / 1e6:.2f}M-parameter Qwen3-architecture **draft model** for the bundled demo model
(`minisgl/demo/model`, {target_params / 1e6:.1f}M parameters), for speculative decoding (lesson 12):
a much smaller model that guesses the demo's next tokens, which the demo then verifies. It shares
the demo's tokenizer byte for byte (`tokenizer.json`, `tokenizer_config.json`, `chat_template.jinja`
are copies), so a draft token id means the same text to both. Trained from scratch on a CPU by
`python -m tests.demo_training train-draft`, on exactly the demo's corpus.

```python
from minisgl import LLM
from minisgl.demo import demo_draft_path
llm = LLM(str(demo_draft_path()))                     # this directory, bundled with the package
from transformers import AutoModelForCausalLM
hf = AutoModelForCausalLM.from_pretrained(demo_draft_path())  # the same files in transformers
```

## Model

| | this draft | the demo model (target) |
|---|---|---|
| architecture | `Qwen3ForCausalLM`, tied embeddings | the same |
| layers × hidden | {cfg.num_layers} × {cfg.hidden_size} | {target_cfg['num_layers']} × {target_cfg['hidden_size']} |
| heads | {cfg.num_heads} query, {cfg.num_kv_heads} KV, head dim {cfg.head_dim} | {target_cfg['num_heads']} query, {target_cfg['num_kv_heads']} KV, head dim {target_cfg.get('head_dim', target_cfg['hidden_size'] // target_cfg['num_heads'])} |
| MLP width | {cfg.intermediate_size} | {target_cfg['intermediate_size']} |
| parameters | {params:,} | {target_params:,} |
| context | {cfg.context} tokens | {target_cfg['context']} tokens |
| vocabulary | {cfg.vocab_size}, the demo's tokenizer | {target_cfg['vocab_size']} |
| weights | bfloat16, {weights / 1e6:.2f} MB | bfloat16, {(target_dir / 'model.safetensors').stat().st_size / 1e6:.1f} MB |

The whole directory, this card included, is {{DIR_BYTES}} bytes. The tied {cfg.vocab_size} × {cfg.hidden_size}
embedding is {cfg.vocab_size * cfg.hidden_size / params:.0%} of the parameters; the layers are small.

## Training data

Exactly the demo model's corpus: Jane Austen's novels from Debian's `r-cran-janeaustenr` (the
same held-out paragraphs, `heldout.txt`, a copy of the demo's), the course's texts as committed
at `{training['corpus_commit']}` (the commit the demo's card names, read from git whatever the checkout),
and the course's question-answer pairs; {training['training_tokens']:,} tokens, tokenized with the demo's
tokenizer. {"Every input's SHA-256 in `training_log.json` is the one in the demo's (`qa.jsonl` has moved to `tests/demo_training/` since, the same bytes), and so is the token count." if same_corpus else "**The inputs differ from the demo's (see `training_log.json`).**"}

## Training

`python -m tests.demo_training train-draft` (seed {cfg.seed}; the demo's training code, `tests/demo_training/train.py`,
with `DRAFT_CONFIG`): {cfg.steps} AdamW steps of {cfg.batch_size} random windows of {cfg.context} tokens, learning
rate {cfg.lr:g} after {cfg.warmup_steps} warm-up steps, cosine down to {cfg.min_lr:g}, weight decay {cfg.weight_decay:g},
gradient clipping {cfg.grad_clip:g}; float32, {cfg.threads} thread{'s' * (cfg.threads != 1)}, torch {record['torch']}. On this run's machine
({record['cpu_count']} cores, {record['cpu']}) training took **{record['train_seconds'] / 60:.1f} min**, and
{record['total_seconds'] / 60:.1f} min with data preparation and this card.

| step | train loss | held-out loss |
|---:|---:|---:|
{loss_rows}

## Quality, beside the demo model

| on `heldout.txt` ({training['heldout_tokens']:,} tokens never trained on) | held-out loss (nats/token) | perplexity |
|---|---:|---:|
| this draft | **{loss:.3f}** | **{math.exp(loss):.1f}** |
| the demo model | {target_loss:.3f} | {math.exp(target_loss):.1f} |
| unigram model of the training tokens | {math.log(training['unigram_heldout_perplexity']):.3f} | {training['unigram_heldout_perplexity']:.1f} |

**Greedy agreement: {agree / positions:.1%}** ({agree} of {positions} positions). {AGREEMENT_PROMPTS} prompts, the first
{AGREEMENT_PROMPT_TOKENS} tokens of held-out paragraphs spread over `heldout.txt`; the demo model continues each
greedily for {AGREEMENT_TOKENS} tokens (HF transformers, float32, CPU); at every one of those positions the draft,
given the same text so far, predicts its greedy next token, and it counts when that is the demo's.
It estimates the chance that greedy verification accepts a draft token whose predecessors
were accepted.

Greedy speculative decoding simulated on the same {AGREEMENT_PROMPTS} continuations (the draft proposes `k`
tokens from the text so far, the demo keeps the longest matching prefix plus its own next token,
as `minisgl.engine.verify.greedy_tokens` does; fewer drafts near the end of the {AGREEMENT_TOKENS} tokens):

| `k` | drafts accepted | verify steps | tokens per verify step |
|---:|---:|---:|---:|
{speculation_rows}

Greedy samples (minisgl's engine, float32):

{sample_blocks}

## Files (SHA-256)

`python -m tests.demo_training train-draft` writes exactly these bytes on a machine like the one above (same
torch, CPU kind and thread count), from a checkout of `{record['commit']}` (the commit of the training code;
the corpus is read at `{training['corpus_commit']}` whatever the checkout):
`git checkout {record['commit']} && python -m tests.demo_training train-draft`.
`python -m tests.demo_training check --dir minisgl/demo/draft` compares the files with this table, and so
does the test suite.

| file | SHA-256 |
|---|---|
{hash_rows}
"""
    # the directory's size includes this card, which states it: fill it in until it is stable
    size = 0
    while True:
        text = card.replace("{DIR_BYTES}", f"{size:,}")
        (model_dir / "README.md").write_text(text, encoding="utf-8")
        if dir_bytes(model_dir) == size:
            break
        size = dir_bytes(model_dir)

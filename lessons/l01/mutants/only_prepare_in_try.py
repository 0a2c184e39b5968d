"""step() wraps only prepare() in the try: an error raised by the model escapes without the abort.

Breaks "if prepare or the model raises, finish as abort and release the KV": a failing forward
leaves the request running and its KV held.
"""
# first: lessons/l01/test_l01_step.py::test_a_model_error_aborts_releases_and_reraises

import torch

from minisgl.generate import SequenceGenerator


def step(self: SequenceGenerator) -> int:
    if self.finished:
        raise RuntimeError("generation already finished")
    new_ids = list(self.prompt_ids) if not self.output_ids else [self.output_ids[-1]]
    start = self.num_cached
    input_ids = torch.tensor(new_ids, dtype=torch.int64, device=self.device)
    positions = torch.arange(start, start + len(new_ids), dtype=torch.int64, device=self.device)
    last = torch.tensor([len(new_ids) - 1], device=self.device)
    try:
        backend = self.kv.prepare(start, len(new_ids))
    except Exception:
        self.finish_reason = "abort"
        self.kv.release()
        raise
    self.last_logits = self.model(input_ids, positions, backend, logits_indices=last)[0]  # BUG: outside the try
    token = int(self.last_logits.argmax())
    self.output_ids.append(token)
    if token in self.stop_token_ids:
        self.finish_reason = "stop"
    elif len(self.output_ids) >= self.max_new_tokens:
        self.finish_reason = "length"
    if self.finished:
        self.kv.release()
    return token

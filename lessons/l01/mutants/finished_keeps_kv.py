"""step() sets the finish reason but never releases the KV of a finished request.

Breaks "a finished request releases its KV": with a pool shared by many requests (lesson 2 on)
every finished request keeps its pages for ever, and the pool runs dry.
"""
# first: lessons/l01/test_l01_step.py::test_length_finish_releases_the_kv_once_at_the_end

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
        self.last_logits = self.model(input_ids, positions, backend, logits_indices=last)[0]
    except Exception:
        self.finish_reason = "abort"
        self.kv.release()
        raise
    token = int(self.last_logits.argmax())
    self.output_ids.append(token)
    if token in self.stop_token_ids:
        self.finish_reason = "stop"
    elif len(self.output_ids) >= self.max_new_tokens:
        self.finish_reason = "length"
    return token  # BUG: no self.kv.release() when finished

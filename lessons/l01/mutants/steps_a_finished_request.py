"""step() has no guard for a finished generator: it runs another forward and appends another token.

Breaks "calling step on a finished generator raises RuntimeError": the extra step runs on
released KV and the output grows past its stop token or max_new_tokens.
"""
# first: lessons/l01/test_l01_step.py::test_stepping_a_finished_generator_raises

import torch

from minisgl.generate import SequenceGenerator


def step(self: SequenceGenerator) -> int:
    new_ids = list(self.prompt_ids) if not self.output_ids else [self.output_ids[-1]]  # BUG: no finished check
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
    if self.finished:
        self.kv.release()
    return token

"""step() checks max_new_tokens before the stop tokens.

Breaks the finish reason: a stop token sampled as the last allowed token reports "length"
instead of "stop" (a client then thinks the answer was cut off).
"""
# first: lessons/l01/test_l01_step.py::test_a_stop_token_on_the_last_allowed_step_finishes_as_stop

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
    if len(self.output_ids) >= self.max_new_tokens:  # BUG: the length limit first
        self.finish_reason = "length"
    elif token in self.stop_token_ids:
        self.finish_reason = "stop"
    if self.finished:
        self.kv.release()
    return token

"""step() asks the model for the logits of the first new token (logits_indices = [0]) instead of the last.

Breaks the prefill's token: the first output is predicted from the prompt's first token, not
from the whole prompt.
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
    first = torch.tensor([0], device=self.device)  # BUG: the first token's logits
    try:
        backend = self.kv.prepare(start, len(new_ids))
        self.last_logits = self.model(input_ids, positions, backend, logits_indices=first)[0]
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

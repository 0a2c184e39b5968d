"""build_batch() points each sampling row's logits index at its *first* new token (the row starts).

Breaks the sampled token of every prompt: it is predicted from the prompt's first token, not
from the whole prompt (decode rows, one token each, are unaffected).
"""
# first: lessons/l04/test_l04_schedule.py::test_build_batch_by_hand_prompt_decode_and_a_cut_prompt

import torch

from minisgl.core import Batch, Req
from minisgl.scheduler.scheduler import Scheduler


def build_batch(self: Scheduler, reqs: list[Req], num_new: list[int] | None = None) -> Batch:
    ids: list[int] = []
    positions: list[int] = []
    extend_lens: list[int] = []
    samples: list[bool] = []
    decode_rows = [req.decoding for req in reqs]
    for i, req in enumerate(reqs):
        new = self.loop.input_ids(req)
        if num_new is not None:
            new = new[: num_new[i]]
        ids.extend(new)
        positions.extend(range(req.num_cached, req.num_cached + len(new)))
        extend_lens.append(len(new))
        samples.append(req.num_cached + len(new) == req.seq_len)
    meta = self.kv.page_table.metadata([r.table_row for r in reqs], [r.num_cached for r in reqs], extend_lens)
    starts = torch.tensor(extend_lens).cumsum(0) - torch.tensor(extend_lens)  # BUG: row starts, not ends
    logits_indices = starts[torch.tensor(samples)]
    mode = "decode" if all(decode_rows) else "mixed" if any(decode_rows) else "prefill"
    batch = Batch(mode, reqs, extend_lens, torch.tensor(ids), torch.tensor(positions), logits_indices, meta,
                  samples, decode_rows=decode_rows)
    self.loop.batch_built(batch)
    return batch

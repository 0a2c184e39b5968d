"""build_batch() returns the batch without calling self.loop.batch_built(batch).

Breaks the loop's hook: lesson 7's overlapped loop fills in the tokens still on the device
there, so its batches would run with placeholders instead of tokens.
"""
# first: lessons/l04/test_l04_schedule.py::test_every_batch_is_announced_to_the_loop_once_before_it_runs

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
    ends = torch.tensor(extend_lens).cumsum(0) - 1
    logits_indices = ends[torch.tensor(samples)]
    mode = "decode" if all(decode_rows) else "mixed" if any(decode_rows) else "prefill"
    return Batch(mode, reqs, extend_lens, torch.tensor(ids), torch.tensor(positions), logits_indices, meta,
                 samples, decode_rows=decode_rows)  # BUG: self.loop.batch_built(batch) is never called

"""Passes only this step's admitted requests as ``others`` to ``sched.admit``, not the prompts already mid-prefill.

Breaks "at most one prompt at a time is chunked": a long prompt that reaches the head of the
queue while another is mid-prefill, with nothing admitted yet this step, is admitted and starts
chunking beside it (and a prompt sharing the chunked prompt's prefix computes it alongside
instead of waiting a step for the cache).
"""
# first: lessons/l06/test_l06_chunked.py::test_two_long_prompts_take_turns


def next_batch(self, sched):
    if not sched.running and not sched.waiting:
        return None
    budget = self.budget
    decoding = sched.make_room_for_decode()
    prefilling = [r for r in sched.running if not r.decoding]
    reqs, chunks = list(decoding), [1] * len(decoding)
    budget -= len(decoding)
    admitted = []
    while budget > 0 and sched.waiting and len(sched.running) < sched.config.max_running:
        req = sched.waiting[0]
        if not sched.admit(req, admitted, budget):
            break
        new_tokens = req.seq_len - req.num_cached
        reqs.append(req)
        chunks.append(min(new_tokens, budget))
        budget -= chunks[-1]
        admitted.append(req)
    for req in prefilling:
        if budget <= 0:
            break
        reqs.append(req)
        chunks.append(min(req.seq_len - req.num_cached, budget))
        budget -= chunks[-1]
    return sched.build_batch(reqs, chunks) if reqs else None

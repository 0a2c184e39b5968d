"""Counts a request's whole length (``req.seq_len``) against the budget, not its uncached tokens.

Breaks the budget's use: a prompt with a cached prefix, and every later chunk, are charged for
tokens that are not computed, so steps carry less than the budget and requests wait longer.
"""
# first: lessons/l06/test_l06_chunked.py::test_every_prompt_that_fits_joins_and_a_cache_hit_costs_only_its_uncached_tokens


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
        if not sched.admit(req, prefilling + admitted, budget):
            break
        new_tokens = req.seq_len
        reqs.append(req)
        chunks.append(min(new_tokens, budget))
        budget -= chunks[-1]
        admitted.append(req)
    for req in prefilling:
        if budget <= 0:
            break
        reqs.append(req)
        chunks.append(min(req.seq_len, budget))
        budget -= chunks[-1]
    return sched.build_batch(reqs, chunks) if reqs else None

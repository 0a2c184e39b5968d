"""Gives the prompt already mid-prefill all its remaining tokens, not ``min(uncached, budget left)``.

Breaks the budget: the second chunk of a long prompt is the whole rest of it, however long.
"""


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
        new_tokens = req.seq_len - req.num_cached
        reqs.append(req)
        chunks.append(min(new_tokens, budget))
        budget -= chunks[-1]
        admitted.append(req)
    for req in prefilling:
        if budget <= 0:
            break
        reqs.append(req)
        chunks.append(req.seq_len - req.num_cached)
        budget -= chunks[-1]
    return sched.build_batch(reqs, chunks) if reqs else None

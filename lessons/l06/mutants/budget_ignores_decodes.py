"""Forgets to take the decode tokens out of the budget (``budget -= len(decoding)`` missing).

Breaks the budget: a step carries the decode tokens *plus* a whole budget of prompt tokens,
more than ``chunked_prefill_size``.
"""


def next_batch(self, sched):
    if not sched.running and not sched.waiting:
        return None
    budget = self.budget
    decoding = sched.make_room_for_decode()
    prefilling = [r for r in sched.running if not r.decoding]
    reqs, chunks = list(decoding), [1] * len(decoding)
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
        chunks.append(min(req.seq_len - req.num_cached, budget))
        budget -= chunks[-1]
    return sched.build_batch(reqs, chunks) if reqs else None

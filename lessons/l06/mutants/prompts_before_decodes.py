"""Admits new prompts first and adds the decode tokens after them (steps 1 and 2 swapped).

Breaks the budget: the prompts take the whole budget and the decode tokens come on top, so a
step carries more than ``chunked_prefill_size`` tokens.
"""


def next_batch(self, sched):
    if not sched.running and not sched.waiting:
        return None
    budget = self.budget
    decoding = sched.make_room_for_decode()
    prefilling = [r for r in sched.running if not r.decoding]
    reqs, chunks = [], []
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
    reqs += decoding
    chunks += [1] * len(decoding)
    budget -= len(decoding)
    for req in prefilling:
        if budget <= 0:
            break
        reqs.append(req)
        chunks.append(min(req.seq_len - req.num_cached, budget))
        budget -= chunks[-1]
    return sched.build_batch(reqs, chunks) if reqs else None

"""Lists the mid-prefill requests (running, not decoding) after admitting, when this step's admissions are among them.

Breaks the batch: a request admitted this step appears twice, its first tokens computed a
second time as if they were the next ones.
"""


def next_batch(self, sched):
    if not sched.running and not sched.waiting:
        return None
    budget = self.budget
    decoding = sched.make_room_for_decode()
    reqs, chunks = list(decoding), [1] * len(decoding)
    budget -= len(decoding)
    admitted = []
    while budget > 0 and sched.waiting and len(sched.running) < sched.config.max_running:
        req = sched.waiting[0]
        if not sched.admit(req, [r for r in sched.running if not r.decoding], budget):
            break
        new_tokens = req.seq_len - req.num_cached
        reqs.append(req)
        chunks.append(min(new_tokens, budget))
        budget -= chunks[-1]
        admitted.append(req)
    prefilling = [r for r in sched.running if not r.decoding]
    for req in prefilling:
        if budget <= 0:
            break
        reqs.append(req)
        chunks.append(min(req.seq_len - req.num_cached, budget))
        budget -= chunks[-1]
    return sched.build_batch(reqs, chunks) if reqs else None

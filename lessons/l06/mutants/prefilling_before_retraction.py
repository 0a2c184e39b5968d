"""Lists the mid-prefill requests before ``sched.make_room_for_decode()`` (step 1), which may retract some of them.

Breaks retraction mid-prefill: a request retracted this step (back in the queue, its pages
gone) still gets a chunk, computed into a page-table row it no longer owns.
"""
# first: lessons/l06/test_l06_chunked.py::test_tight_pool_retracts_and_evicts_mid_prefill_and_stays_identical


def next_batch(self, sched):
    if not sched.running and not sched.waiting:
        return None
    budget = self.budget
    prefilling = [r for r in sched.running if not r.decoding]
    decoding = sched.make_room_for_decode()
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
        chunks.append(min(req.seq_len - req.num_cached, budget))
        budget -= chunks[-1]
    return sched.build_batch(reqs, chunks) if reqs else None

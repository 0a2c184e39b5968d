"""Continues the prompt being chunked before admitting new requests (steps 2 and 3 swapped).

Breaks "short requests that arrive behind a long prompt start at once": the long prompt's
chunk takes the whole budget and a short request waits for all its chunks.
"""
# first: lessons/l06/test_l06_chunked.py::test_a_short_request_is_not_stuck_behind_a_long_prompt


def next_batch(self, sched):
    if not sched.running and not sched.waiting:
        return None
    budget = self.budget
    decoding = sched.make_room_for_decode()
    prefilling = [r for r in sched.running if not r.decoding]
    reqs, chunks = list(decoding), [1] * len(decoding)
    budget -= len(decoding)
    for req in prefilling:
        if budget <= 0:
            break
        reqs.append(req)
        chunks.append(min(req.seq_len - req.num_cached, budget))
        budget -= chunks[-1]
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
    return sched.build_batch(reqs, chunks) if reqs else None

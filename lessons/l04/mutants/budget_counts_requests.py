"""next_batch() takes one off the budget per admitted request instead of its uncached tokens.

Breaks the prefill token budget's unit: max_prefill_tokens becomes a number of prompts, so a
step prefills far more tokens than allowed.
"""
# first: lessons/l04/test_l04_schedule.py::test_the_prefill_token_budget_caps_each_step

from minisgl.core import Batch, Req
from minisgl.scheduler.scheduler import Scheduler, WholePrompts


def next_batch(self: WholePrompts, sched: Scheduler) -> Batch | None:
    admitted: list[Req] = []
    budget = self.max_prefill_tokens
    while sched.waiting and len(sched.running) < sched.config.max_running:
        req = sched.waiting[0]
        if admitted and req.seq_len > budget:
            break
        if not sched.admit(req, admitted, budget):
            break
        budget -= 1  # BUG: a request, not its tokens
        admitted.append(req)
    if admitted:
        return sched.build_batch(admitted)
    decode = sched.make_room_for_decode()
    return sched.build_batch(decode) if decode else None

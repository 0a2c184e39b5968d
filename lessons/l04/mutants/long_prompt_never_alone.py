"""next_batch() stops at a prompt longer than the budget even when nothing was admitted yet this step.

Breaks "a long prompt may go alone, as the first one of the step": a prompt longer than
max_prefill_tokens never runs, and (first come, first served) nobody behind it either.
"""
# first: lessons/l04/test_l04_schedule.py::test_a_prompt_longer_than_the_budget_goes_alone

from minisgl.core import Batch, Req
from minisgl.scheduler.scheduler import Scheduler, WholePrompts


def next_batch(self: WholePrompts, sched: Scheduler) -> Batch | None:
    admitted: list[Req] = []
    budget = self.max_prefill_tokens
    while sched.waiting and len(sched.running) < sched.config.max_running:
        req = sched.waiting[0]
        if req.seq_len > budget:  # BUG: also when admitted is empty
            break
        if not sched.admit(req, admitted, budget):
            break
        budget -= req.seq_len - req.num_cached
        admitted.append(req)
    if admitted:
        return sched.build_batch(admitted)
    decode = sched.make_room_for_decode()
    return sched.build_batch(decode) if decode else None

"""next_batch() admits every waiting request that the KV pool and max_running allow, ignoring max_prefill_tokens.

Breaks the prefill token budget: one step may prefill any number of prompts, so a burst of
arrivals makes one huge forward pass that stalls every running request's next token.
"""
# first: lessons/l04/test_l04_schedule.py::test_the_prefill_token_budget_caps_each_step

from minisgl.core import Batch, Req
from minisgl.scheduler.scheduler import Scheduler, WholePrompts


def next_batch(self: WholePrompts, sched: Scheduler) -> Batch | None:
    admitted: list[Req] = []
    while sched.waiting and len(sched.running) < sched.config.max_running:
        req = sched.waiting[0]
        if not sched.admit(req, admitted):  # BUG: no budget at all
            break
        admitted.append(req)
    if admitted:
        return sched.build_batch(admitted)
    decode = sched.make_room_for_decode()
    return sched.build_batch(decode) if decode else None

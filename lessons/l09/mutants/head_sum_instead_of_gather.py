"""ParallelLMHead.forward all-reduces the ranks' logit slices instead of all-gathering them.

Breaks ``[T, vocab]``: the slices cover *different* ids, so summing them gives ``[T, vocab / tp]``
logits that mix two ids in every column.
"""
# first: lessons/l09/test_l09_tp.py::test_each_parallel_layer_equals_the_whole_layer_on_two_ranks

from minisgl.layers.decode_kernels import decode_linear


def parallel_lm_head_forward(self, x):
    logits = decode_linear(x, self.weight)
    if self.tp.size == 1:
        return logits
    return self.tp.all_reduce(logits)[..., : self.vocab_size]

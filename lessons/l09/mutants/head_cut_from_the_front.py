"""ParallelLMHead.forward keeps the *last* ``vocab_size`` columns of the gathered logits (``[..., -self.vocab_size:]``).

Breaks "rank 0's first; cut the columns past the vocabulary": when the vocabulary does not
divide by ``tp_size`` every logit is shifted by the padding, id ``i`` scored as id ``i + 1``.
"""
# first: lessons/l09/test_l09_tp.py::test_each_parallel_layer_equals_the_whole_layer_on_two_ranks

from minisgl.layers.decode_kernels import decode_linear


def parallel_lm_head_forward(self, x):
    logits = decode_linear(x, self.weight)
    if self.tp.size == 1:
        return logits
    return self.tp.all_gather_last_dim(logits)[..., -self.vocab_size:]

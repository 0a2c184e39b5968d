"""ParallelLMHead.forward returns the gathered logits without cutting them to ``self.vocab_size``.

Breaks ``[T, vocab]`` when the vocabulary does not divide by ``tp_size``: the last rank's padding
rows add columns of logits for ids that do not exist, and the sampler can pick them.
"""
# first: lessons/l09/test_l09_tp.py::test_each_parallel_layer_equals_the_whole_layer_on_two_ranks

from minisgl.layers.decode_kernels import decode_linear


def parallel_lm_head_forward(self, x):
    logits = decode_linear(x, self.weight)
    if self.tp.size == 1:
        return logits
    return self.tp.all_gather_last_dim(logits)

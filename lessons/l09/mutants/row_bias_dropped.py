"""RowParallelLinear.forward all-reduces the product and forgets the bias.

Breaks the layer's output, ``x @ W.T + bias``: a row-parallel layer with a bias loses it.
"""
# first: lessons/l09/test_l09_tp.py::test_each_parallel_layer_equals_the_whole_layer_on_two_ranks

from minisgl.layers.decode_kernels import decode_linear


def row_parallel_forward(self, x, silu_and_mul=False):
    out = self.tp.all_reduce(decode_linear(x, self.weight, silu_and_mul=silu_and_mul))
    return out

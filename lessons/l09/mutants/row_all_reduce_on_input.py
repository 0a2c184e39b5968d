"""RowParallelLinear.forward all-reduces the input slice and then multiplies, instead of the other way round.

Breaks the sum of partial products: the ranks' slices hold *different* input features, so adding
them up mixes features, and the product is not ``x @ W.T``.
"""
# first: lessons/l09/test_l09_tp.py::test_each_parallel_layer_equals_the_whole_layer_on_two_ranks

from minisgl.layers.decode_kernels import decode_linear


def row_parallel_forward(self, x, silu_and_mul=False):
    out = decode_linear(self.tp.all_reduce(x.clone()), self.weight, silu_and_mul=silu_and_mul)
    return out if self.bias is None else out + self.bias

"""RowParallelLinear.forward returns this rank's product without the all-reduce.

Breaks "the full output, identical on every rank": each rank keeps its partial sum, so every
o_proj and down_proj output is half of what it should be, and different on each rank.
"""
# first: lessons/l09/test_l09_tp.py::test_each_parallel_layer_equals_the_whole_layer_on_two_ranks

from minisgl.layers.decode_kernels import decode_linear


def row_parallel_forward(self, x, silu_and_mul=False):
    out = decode_linear(x, self.weight, silu_and_mul=silu_and_mul)
    return out if self.bias is None else out + self.bias

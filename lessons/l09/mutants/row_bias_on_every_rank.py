"""RowParallelLinear.forward passes the bias to the linear on every rank, then all-reduces the products.

Breaks "add the bias once, *after* the sum": with two ranks the bias is counted twice (a model
with a bias on o_proj or down_proj computes every layer wrong).
"""
# first: lessons/l09/test_l09_tp.py::test_each_parallel_layer_equals_the_whole_layer_on_two_ranks

from minisgl.layers.decode_kernels import decode_linear


def row_parallel_forward(self, x, silu_and_mul=False):
    return self.tp.all_reduce(decode_linear(x, self.weight, self.bias, silu_and_mul=silu_and_mul))

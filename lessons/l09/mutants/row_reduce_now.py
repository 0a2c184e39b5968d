"""RowParallelLinear.forward always all-reduces at once, never through ``self.tp.reduce_later``.

The sums are right, but the pre-norm step after the layer never gets a ``PendingSum``: on two
GPUs the all-reduce, the residual add and the RMSNorm stay two kernels instead of one.
"""
# first: lessons/l09/test_l09_tp.py::test_sums_left_to_the_pre_norm_step_give_hfs_tokens[qwen3]

from minisgl.layers.decode_kernels import decode_linear


def row_parallel_forward(self, x, silu_and_mul=False):
    out = self.tp.all_reduce(decode_linear(x, self.weight, silu_and_mul=silu_and_mul))
    return out if self.bias is None else out + self.bias

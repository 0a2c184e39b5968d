"""RowParallelLinear.forward ignores ``silu_and_mul``: the down projection multiplies ``[gate | up]`` itself.

Breaks the docstring's ``silu_and_mul`` promise: the MLP's down projection hands over this rank's
``[gate | up]``, twice as wide as the weight's input, and expects ``silu(gate) * up`` to be
multiplied. Without the flag the matmul gets the wrong width and fails (on the CPU
``F.linear``'s shape error, raised in each rank).
"""
# first: lessons/l09/test_l09_tp.py::test_tp2_matches_hf[qwen3]

from minisgl.layers.decode_kernels import decode_linear


def row_parallel_forward(self, x, silu_and_mul=False):
    out = self.tp.all_reduce(decode_linear(x, self.weight))
    return out if self.bias is None else out + self.bias

"""Every Triton kernel of the package compiled for a GPU, on a machine without one.

    python -m tests.tools.kernels_compile              # sm_90 (H100, H200)
    python -m tests.tools.kernels_compile --arch 80    # another compute capability

Triton's interpreter (``TRITON_INTERPRET=1``) runs a kernel's Python on the CPU, which checks
what it computes, but it never compiles the kernel: a construct the GPU's compiler refuses
passes there and then fails every GPU test. (It happened: a helper with a string default for a
``tl.constexpr`` argument ran in the interpreter and compiled with Triton 3.9, and Triton 3.6,
the GPU machine's, rejected it.) This tool swaps Triton's active driver for one that only
compiles, for ``--arch``, and calls each kernel's Python wrapper with CPU tensors of the dtypes
and shapes the engine uses (:data:`CASES`): every launch compiles its variant down to a cubin
and launches nothing. The inputs' values are never read. For sm_90 and later each case runs
three times, then with programmatic dependent launch in each of its modes (:func:`force_pdl`),
as on the GPU: CPU tensors alone would only compile the variants without it.

It needs Triton itself, which the CPU wheel of torch does not bring: install the version the GPU
machine's torch pins (``pip download --no-deps triton==3.6.0`` for torch 2.11, then
``pip install --no-deps --target DIR`` and put ``DIR`` on ``PYTHONPATH``). Nothing here runs in
CI, which has no Triton; run it before spending device time on a changed kernel.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from collections.abc import Callable

import torch

BF16, I32, I64, F32 = torch.bfloat16, torch.int32, torch.int64, torch.float32


def _t(*shape: int, dtype: torch.dtype = BF16) -> torch.Tensor:
    return torch.empty(*shape, dtype=dtype)


def _decode_kernels() -> None:
    """Lesson 8's one-row GEMV (plain, with a bias, SwiGLU fused, uneven), its pre-norm form
    (with and without the residual add), and Qwen3's q/k norms + RoPE (decode and prefill)."""
    from minisgl.layers.decode_kernels import gemv, norm_gemv, qk_norm_rope

    gemv(_t(1, 1024), _t(4096, 1024))
    gemv(_t(1, 300), _t(37, 300), _t(37))
    gemv(_t(1, 2 * 3072), _t(1024, 3072), silu_and_mul=True)
    for k, n in ((1024, 4096), (2048, 5120), (300, 37)):
        norm_gemv(_t(1, k), _t(1, k), _t(k), 1e-6, _t(n, k))
        norm_gemv(_t(1, k), None, _t(k), 1e-6, _t(n, k))
    for tokens in (1, 100):
        qkv = _t(tokens, (16 + 2 * 8) * 128)
        q, k = qkv[:, : 16 * 128].view(tokens, 16, 128), qkv[:, 16 * 128: 24 * 128].view(tokens, 8, 128)
        qk_norm_rope(torch.zeros(tokens, dtype=I64), q, k, _t(128), _t(128), 1e-6, _t(4096, 128, dtype=F32))


def _fused_decode() -> None:
    """Lesson 8's fused append + split-KV decode + merge, without and with the rotation (with
    and without Qwen3's q/k norms)."""
    from minisgl.attention.fused_decode import AppendDecodeWorkspace, QKRotation, append_decode_attention

    bs, hq, hkv, d, pages, page_size = 4, 16, 8, 128, 64, 16
    workspace = AppendDecodeWorkspace(bs, hq, hkv, d, torch.device("cpu"))
    qkv = _t(bs, (hq + 2 * hkv) * d)
    q = qkv[:, : hq * d].view(bs, hq, d)
    k = qkv[:, hq * d: (hq + hkv) * d].view(bs, hkv, d)
    v = qkv[:, (hq + hkv) * d:].view(bs, hkv, d)
    cache = _t(pages, page_size, hkv, d)
    meta = (torch.zeros(bs + 1, dtype=I32), torch.zeros(pages, dtype=I32), torch.ones(bs, dtype=I32))
    cos_sin = _t(4096, d, dtype=F32)
    for rotation in (None, QKRotation(torch.zeros(bs, dtype=I64), cos_sin),
                     QKRotation(torch.zeros(bs, dtype=I64), cos_sin, _t(d), _t(d), 1e-6)):
        append_decode_attention(q, k, v, cache, cache, *meta, workspace, rotation=rotation)


def _triton_decode() -> None:
    """Lesson 3's Triton paged decode attention."""
    from minisgl.attention.triton_decode import paged_decode_attention

    paged_decode_attention(_t(4, 16, 128), _t(64, 16, 8, 128), _t(64, 16, 8, 128), torch.zeros(5, dtype=I32),
                           torch.zeros(64, dtype=I32), torch.ones(4, dtype=I32))


def _fused_moe() -> None:
    """Lesson 11's router (softmax + top-k alone, the one-launch decode router, and it with the
    pre-norm step), the grouping,
    the grouped expert kernels and top-k sum, and the decode (matrix-vector) kernels."""
    from minisgl.layers.fused_moe import GEMV_MAX_TOKENS, fused_moe, fused_topk, route, route_normed

    experts, hidden, inter, top_k = 128, 2048, 768, 8
    fused_topk(_t(16, experts, dtype=F32), top_k, True, BF16)
    route(_t(GEMV_MAX_TOKENS, hidden), _t(experts, hidden), top_k, True)
    for residual in (_t(1, hidden), None):  # the router with the pre-norm step
        route_normed(_t(1, hidden), residual, _t(hidden), 1e-6, _t(experts, hidden), top_k, True)
    gate_up, down = _t(experts, 2 * inter, hidden), _t(experts, hidden, inter)
    for tokens, path in ((16, "grouped"), (1, "gemv")):
        fused_moe(_t(tokens, hidden), gate_up, down, _t(tokens, top_k), torch.zeros(tokens, top_k, dtype=I64), path=path)


def _all_reduce_norm() -> None:
    """Lesson 9's all-reduce + residual add + RMSNorm, for two ranks (rank 1) and four, at the
    hidden sizes of Qwen3-0.6B and Llama-3.1-8B. Built without its constructor (no process group
    here): the buffer addresses are never read."""
    from minisgl.distributed.all_reduce_norm import MAX_ROWS, AllReduceAddNorm

    for size, hidden, rows in ((2, 4096, 1), (2, 1024, 8), (4, 4096, 3)):
        fused = object.__new__(AllReduceAddNorm)
        fused.rank, fused.size = 1, size
        fused.buffers, fused.epochs = torch.zeros(size, dtype=I64), torch.zeros(MAX_ROWS, dtype=I64)
        fused(_t(rows, hidden), _t(rows, hidden), _t(hidden), 1e-5)
        fused(_t(rows, hidden), None, _t(hidden), 1e-5)  # the first layer's: no residual stream yet


def _all_gather() -> None:
    """Lesson 9's logits all-gather, for two ranks (rank 1) and four, at the vocabulary slices of
    Qwen3-0.6B and Llama-3.1-8B at TP=2. Built without its constructor, as above."""
    from minisgl.distributed.all_gather import MAX_SLOTS, SymmetricAllGather

    for size, rows, n in ((2, 1, 75968), (2, 4, 64128), (4, 2, 8192)):
        gather = object.__new__(SymmetricAllGather)
        gather.rank, gather.size = 1, size
        gather.buffers, gather.epochs = torch.zeros(size, dtype=I64), torch.zeros(MAX_SLOTS, dtype=I64)
        gather(_t(rows, n))


#: What is compiled: a name and a function that calls the wrappers of one module.
CASES: dict[str, Callable[[], None]] = {
    "decode_kernels (lesson 8)": _decode_kernels,
    "fused_decode (lesson 8)": _fused_decode,
    "triton_decode (lesson 3)": _triton_decode,
    "fused_moe (lesson 11)": _fused_moe,
    "all_reduce_norm (lesson 9)": _all_reduce_norm,
    "all_gather (lesson 9)": _all_gather,
}


def compile_only(arch: int) -> list[str]:
    """Make every Triton launch from now on compile for compute capability ``arch`` and return
    without launching; the returned list collects the kernels' names as they compile."""
    from triton.backends.compiler import GPUTarget
    from triton.backends.driver import DriverBase
    from triton.runtime.driver import driver
    from triton.runtime.jit import JITFunction

    class CompileOnlyDriver(DriverBase):
        def __init__(self) -> None:  # no CUDA to look up
            pass

        @staticmethod
        def is_active() -> bool:
            return True

        def get_current_target(self) -> GPUTarget:
            return GPUTarget("cuda", arch, 32)

        def get_current_device(self) -> int:
            return 0

        def get_current_stream(self, device: int | None = None) -> int:
            return 0

        def get_active_torch_device(self) -> torch.device:
            return torch.device("cpu")

        def get_device_interface(self):
            return torch.cuda

        def map_python_to_cpp_type(self, ty: str) -> str:
            return ty

        def get_benchmarker(self):
            raise RuntimeError("compile only: nothing runs")

        def get_empty_cache_for_benchmark(self):
            raise RuntimeError("compile only: nothing runs")

        def clear_cache(self, cache) -> None:
            pass

    driver.set_active(CompileOnlyDriver())
    compiled: list[str] = []
    launch = JITFunction.run

    def run_compile_only(self, *args, grid, warmup, **kwargs):
        kernel = launch(self, *args, grid=grid, warmup=True, **kwargs)  # warmup: compile, do not launch
        compiled.append(self.fn.__name__)
        return kernel

    JITFunction.run = run_compile_only
    return compiled


def force_pdl(mode: int) -> None:
    """Make every wrapper launch its kernel with programmatic dependent launch in ``mode``, as
    it does on a Hopper GPU (on CPU tensors :func:`~minisgl.layers.decode_kernels.pdl` says no)."""
    from minisgl.attention import fused_decode
    from minisgl.layers import decode_kernels, fused_moe

    for module in (decode_kernels, fused_decode, fused_moe):
        module.pdl = lambda x: mode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", type=int, default=90, help="compute capability to compile for (90: H100/H200)")
    args = parser.parse_args(argv)
    try:
        import triton
    except ImportError:
        print("Triton is not installed: see this module's docstring for how to get the GPU machine's version")
        return 2
    compiled = compile_only(args.arch)
    print(f"Triton {triton.__version__}, compiling for sm_{args.arch}")
    failed = 0
    cases = dict(CASES)
    if args.arch >= 90:
        for mode, label in ((1, "early"), (2, "late")):  # decode_kernels.PDL_EARLY, PDL_LATE
            cases.update({f"{name}, PDL {label}": (lambda case=case, mode=mode: (force_pdl(mode), case()))
                          for name, case in CASES.items()})
    for name, case in cases.items():
        start, before = time.perf_counter(), len(compiled)
        try:
            case()
        except Exception:  # report every module's failure, then fail
            failed += 1
            print(f"FAILED   {name}\n{traceback.format_exc(limit=-3)}")
            continue
        kernels = sorted(set(compiled[before:]))
        print(f"ok       {name}: {len(compiled) - before} launches compiled ({', '.join(kernels)}) "
              f"in {time.perf_counter() - start:.1f} s")
    print(f"{len(cases) - failed} of {len(cases)} cases compiled")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

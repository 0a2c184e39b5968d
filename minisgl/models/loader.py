"""Load a Hugging Face checkpoint (local directory or hub id) into :class:`CausalLM`.

HF stores q/k/v and gate/up as separate tensors; our model fuses them, so the loader copies
each checkpoint tensor into its slice of the fused parameter. Every slice must be written
exactly once: a missing tensor is an error, never a silently random weight.

A module may place its checkpoint tensors itself: one with a ``checkpoint_pieces(key, tp_rank)``
method (lesson 11's stacked experts) is asked where each tensor below its name goes.
"""

from __future__ import annotations

__lesson__ = 1

import json
import os
import re
from pathlib import Path

import torch
from safetensors import safe_open
from tqdm.auto import tqdm

from minisgl.config import ModelConfig
from minisgl.model_path import resolve_model_path
from minisgl.models.model import CausalLM, Layers

# (parameter name below the module, index into the parameter, index into the checkpoint tensor)
Piece = tuple[str, tuple, tuple]


class CheckpointError(RuntimeError):
    """The checkpoint is incomplete or does not match the model (missing/unexpected tensors)."""


# Checkpoint tensors that carry no weights we need.
_IGNORED = re.compile(r".*rotary_emb\.inv_freq$")


def fused_target(name: str, config: ModelConfig) -> tuple[str, int, int] | None:
    """Map a checkpoint tensor name onto ``(our_param_name, row_offset, rows)`` for fused params.

    Returns None for tensors that map one-to-one onto a parameter of the same name.
    """
    m = re.match(r"(.*\.self_attn)\.([qkv])_proj\.(weight|bias)$", name)
    if m:
        prefix, which, kind = m.groups()
        q, kv = config.q_size, config.kv_size
        offset, rows = {"q": (0, q), "k": (q, kv), "v": (q + kv, kv)}[which]
        return f"{prefix}.qkv_proj.{kind}", offset, rows
    m = re.match(r"(.*\.mlp)\.(gate|up)_proj\.weight$", name)
    if m:
        prefix, which = m.groups()
        inter = config.intermediate_size
        return f"{prefix}.gate_up_proj.weight", (0 if which == "gate" else inter), inter
    return None


def checkpoint_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [path / s for s in shards]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"no *.safetensors files in {path}")
    return files


def shard_dims(model: CausalLM) -> dict[str, int]:
    """Lesson 9: for each sharded parameter, the dimension of the checkpoint tensor that
    tensor parallelism cuts (the owning layer's ``shard_dim``; a bias is cut only with dim 0)."""
    dims = {}
    for module_name, module in model.named_modules():
        dim = getattr(module, "shard_dim", None)
        if dim is None:
            continue
        for pname, p in module.named_parameters(recurse=False):
            if p.dim() > dim:
                dims[f"{module_name}.{pname}"] = dim
    return dims


def _placing_module(modules: dict, name: str) -> tuple[str, object] | None:
    """The nearest module above checkpoint tensor ``name`` that places its tensors itself (has
    ``checkpoint_pieces``), with its name; None for the ordinary case."""
    prefix = name
    while "." in prefix:
        prefix = prefix.rpartition(".")[0]
        module = modules.get(prefix)
        if module is not None and hasattr(module, "checkpoint_pieces"):
            return prefix, module
    return None


def _place(f, name: str, prefix: str, module, rank: int, params: dict, written: dict[str, int]) -> bool:
    """Copy checkpoint tensor ``name`` into the parameters of ``module`` (named ``prefix``) where
    its ``checkpoint_pieces`` says, reading only those parts; False if the module does not know it."""
    pieces: list[Piece] | None = module.checkpoint_pieces(name[len(prefix) + 1:], rank)
    if pieces is None:
        return False
    for pname, dest_index, src_index in pieces:
        dest, tensor = params[f"{prefix}.{pname}"].data[dest_index], f.get_slice(name)[src_index]
        if dest.shape != tensor.shape:
            raise CheckpointError(f"{name}{list(src_index)}: checkpoint shape {tuple(tensor.shape)} "
                                  f"!= expected {tuple(dest.shape)}")
        dest.copy_(tensor)
        written[f"{prefix}.{pname}"] += dest.numel()
    return True


def _read(f, name: str, dim: int | None, start: int, length: int) -> torch.Tensor:
    """The checkpoint tensor ``name``, or only ``length`` entries from ``start`` along ``dim``
    (read from the file as a slice: a rank never loads the other ranks' parts)."""
    if dim is None:
        return f.get_tensor(name)
    sliced = f.get_slice(name)
    full = sliced.get_shape()[dim]
    index = [slice(None)] * len(sliced.get_shape())
    index[dim] = slice(min(start, full), min(start + length, full))
    return sliced[tuple(index)]


def load_weights(model: CausalLM, path: Path, progress: bool = False, tp_rank: int = 0) -> None:
    """Copy every tensor of the checkpoint at ``path`` into ``model`` (fusing q/k/v and gate/up).

    Under tensor parallelism (``model.config.tp_size > 1``) each parameter gets only this
    rank's slice: rows ``rank * n .. (rank + 1) * n`` of a column-parallel weight (for the
    fused QKV: of q, of k and of v separately), columns of a row-parallel one, rows of the
    vocabulary; norms are copied whole."""
    config = model.config
    rank = tp_rank if config.tp_size > 1 else 0
    params = dict(model.named_parameters())
    modules = dict(model.named_modules())
    dims = shard_dims(model) if config.tp_size > 1 else {}
    # elements written so far per parameter; a fully loaded parameter has all of them written.
    written: dict[str, int] = {name: 0 for name in params}
    unexpected: list[str] = []
    files = checkpoint_files(path)
    for file in tqdm(files, desc="loading shards", disable=not progress):
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for name in f.keys():
                if _IGNORED.match(name):
                    continue
                if name == "lm_head.weight" and config.tie_word_embeddings:
                    continue  # tied: the embedding is the LM head
                placing = _placing_module(modules, name)
                if placing is not None:  # e.g. lesson 11's experts
                    if not _place(f, name, *placing, rank, params, written):
                        unexpected.append(name)
                    continue
                target = fused_target(name, config)
                param_name, offset, rows = target if target else (name, 0, None)
                if param_name not in params:
                    unexpected.append(name)
                    continue
                param = params[param_name]
                dest = param.data if rows is None else param.data.narrow(0, offset, rows)
                written[param_name] += dest.numel()
                dim = dims.get(param_name)
                if dim is not None and dest.dim() <= dim:
                    dim = None
                tensor = _read(f, name, dim, rank * dest.shape[dim] if dim is not None else 0,
                               dest.shape[dim] if dim is not None else 0)
                if dim is not None and tensor.shape[dim] < dest.shape[dim]:  # the last vocabulary slice
                    dest = dest.narrow(dim, 0, tensor.shape[dim])
                if dest.shape != tensor.shape:
                    raise CheckpointError(f"{name}: checkpoint shape {tuple(tensor.shape)} != expected {tuple(dest.shape)}")
                dest.copy_(tensor)
    if unexpected:
        raise CheckpointError(f"checkpoint has tensors this model does not expect: {unexpected[:8]}")
    missing = [n for n, p in params.items() if written[n] != p.numel()]
    if config.tie_word_embeddings:
        missing = [n for n in missing if n != "lm_head.weight"]
    if missing:
        raise CheckpointError(f"checkpoint {path} is missing tensors for: {missing[:8]}")


def load_model(
    model: str | os.PathLike,
    dtype: torch.dtype | None = None,
    device: str | torch.device = "cpu",
    dummy_weights: bool = False,
    progress: bool = False,
    tp_size: int = 1,
    tp_rank: int = 0,
    layers: Layers | None = None,
    ep_size: int = 1,
) -> CausalLM:
    """Build :class:`CausalLM` from a checkpoint directory or hub id.

    ``dtype`` defaults to the checkpoint's. ``dummy_weights=True`` skips the safetensors and
    fills random weights of the real shapes (benchmarks: speed does not depend on the values).
    ``tp_size > 1`` (lesson 9) builds and loads the slice of rank ``tp_rank`` only, with
    ``layers`` that cut the matrices (lesson 9's ``ParallelLayers``). ``ep_size == tp_size``
    (lesson 11) gives each rank whole experts instead of a slice of each (``ModelConfig.shard``).
    """
    path = resolve_model_path(model)
    if tp_size > 1 and layers is None:
        raise ValueError("tp_size > 1 needs layers that cut and communicate (lesson 9's ParallelLayers)")
    config = ModelConfig.from_dir(path).shard(tp_size, ep_size)
    dtype = dtype or config.dtype
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # build parameters directly in the target dtype
    try:
        with torch.device(device):
            net = CausalLM(config, layers)
    finally:
        torch.set_default_dtype(previous)
    if dummy_weights:
        gen = torch.Generator(device=device).manual_seed(0)
        for name, p in net.named_parameters():
            if name.endswith("norm.weight"):
                p.data.fill_(1.0)
            else:
                p.data.normal_(0.0, 0.02, generator=gen)
    else:
        load_weights(net, path, progress=progress, tp_rank=tp_rank)
    return net.eval()

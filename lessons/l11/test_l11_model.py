"""Lesson 11: Qwen3-MoE (and Qwen2-MoE) in the one model, reference path, gives exactly HF's tokens.

Run: pytest lessons/l11

A mixture-of-experts layer routes every token to ``k`` of ``E`` SwiGLU experts. These tests
check the pieces (the config, the router, the one-expert-at-a-time reference against a
token-by-token formula, both checkpoint layouts), then whole generations against HF alone,
for a checkpoint where every layer is sparse and top-k weights are renormalised, one with
dense layers in between and raw top-k weights, and a Qwen2-MoE one with a shared expert; that
the routing really spreads over the experts; and that three classic bugs are caught by the
parity check.
"""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F

from minisgl.attention.base import NoCacheBackend
from minisgl.attention.contiguous import ContiguousBackend
from minisgl.config import ModelConfig, UnsupportedModelError
from minisgl.generate import generate
from minisgl.kvcache import ContiguousKVCache
from minisgl.layers.moe import MoELayers, Router, SparseMoE, reference_moe
from minisgl.models import CheckpointError, load_model
from minisgl.testing import (
    SPARSE_MOE_KWARGS,
    TEST_PROMPTS,
    HFReference,
    distinct_fraction,
    expert_usage,
    tiny_checkpoint,
)
from minisgl.tokenizer import load_tokenizer

NEW_TOKENS = 40
# name -> (architecture, tiny_checkpoint overrides)
CHECKPOINTS = {"every_layer": ("qwen3_moe", {}), "sparse_step": ("qwen3_moe", SPARSE_MOE_KWARGS),
               "shared_expert": ("qwen2_moe", {})}


def checkpoint(name: str, **kw):
    arch, overrides = CHECKPOINTS[name]
    return tiny_checkpoint(arch, **overrides, **kw)


@functools.cache
def model(name: str, **kw):
    return load_model(checkpoint(name, **kw), layers=MoELayers())


@functools.cache
def prompts() -> list[list[int]]:
    tok = load_tokenizer(checkpoint("every_layer"))
    return [tok.encode(p) for p in TEST_PROMPTS]


@functools.cache
def hf_tokens(name: str, prompt: tuple[int, ...], n: int = NEW_TOKENS) -> list[int]:
    return HFReference(checkpoint(name)).greedy(list(prompt), n)


def alone(net, ids: list[int], n: int = NEW_TOKENS) -> list[int]:
    """Lesson 1's loop: one request, a contiguous KV cache."""
    return generate(net, ContiguousBackend(ContiguousKVCache.for_model(net.config, 256, torch.float32, "cpu")), ids, n)


# --- the config ------------------------------------------------------------------------------


def test_config_reads_the_moe_fields() -> None:
    every = ModelConfig.from_dir(checkpoint("every_layer"))
    assert (every.architecture, every.num_experts, every.num_experts_per_tok, every.norm_topk_prob) == (
        "qwen3_moe", 8, 2, True)
    assert every.qk_norm and every.moe_intermediate_size == 32
    assert [every.is_moe_layer(i) for i in range(every.num_layers)] == [True] * 3
    sparse = ModelConfig.from_dir(checkpoint("sparse_step"))
    assert (sparse.decoder_sparse_step, sparse.mlp_only_layers, sparse.norm_topk_prob) == (2, (3,), False)
    # every second layer counting from 1 (1, 3, 5), except the listed 3
    assert [i for i in range(sparse.num_layers) if sparse.is_moe_layer(i)] == [1, 5]
    qwen2 = ModelConfig.from_dir(checkpoint("shared_expert"))
    assert (qwen2.architecture, qwen2.shared_expert_intermediate_size, qwen2.attention_bias, qwen2.qk_norm) == (
        "qwen2_moe", 64, True, False)
    assert every.shared_expert_intermediate_size == 0
    with pytest.raises(UnsupportedModelError, match="sliding"):
        ModelConfig.from_dict({**qwen2.extra, "use_sliding_window": True})
    dense = ModelConfig.from_dir(tiny_checkpoint("qwen3"))
    assert dense.num_experts == 0 and not any(dense.is_moe_layer(i) for i in range(dense.num_layers))


def test_config_accepts_both_expert_count_names_and_validates() -> None:
    raw = dict(ModelConfig.from_dir(checkpoint("every_layer")).extra)
    raw.pop("num_experts", None)
    raw["num_local_experts"] = 8  # what transformers 5 writes
    assert ModelConfig.from_dict(raw).num_experts == 8
    raw["num_experts"] = 16  # what the hub's checkpoints write (wins)
    assert ModelConfig.from_dict(raw).num_experts == 16
    for bad, match in [({"num_experts_per_tok": 17}, "num_experts_per_tok"), ({"num_experts_per_tok": 0}, "num_experts_per_tok"),
                       ({"moe_intermediate_size": 0}, "moe_intermediate_size"),
                       ({"decoder_sparse_step": 0}, "decoder_sparse_step"), ({"mlp_only_layers": [7]}, "mlp_only_layers")]:
        with pytest.raises(UnsupportedModelError, match=match):
            ModelConfig.from_dict({**raw, **bad})
    with pytest.raises(UnsupportedModelError, match="num_experts"):
        ModelConfig.from_dict({k: v for k, v in raw.items() if k not in ("num_experts", "num_local_experts")})
    config = ModelConfig.from_dict(raw)
    assert config.shard(2).moe_intermediate_size == 16  # lesson 9: each rank a slice of every expert
    with pytest.raises(UnsupportedModelError, match="moe_intermediate_size"):
        ModelConfig.from_dict({**raw, "moe_intermediate_size": 33}).shard(2)


def test_lesson_one_layers_refuse_an_moe_model() -> None:
    with pytest.raises(UnsupportedModelError, match="MoELayers"):
        load_model(checkpoint("every_layer"))
    assert load_model(tiny_checkpoint("qwen3")).config.num_experts == 0  # dense models unchanged


def test_moe_layers_build_sparse_and_dense_mlps() -> None:
    net = model("sparse_step")
    kinds = [type(layer.mlp).__name__ for layer in net.model.layers]
    assert kinds == ["MLP", "SparseMoE", "MLP", "MLP", "MLP", "SparseMoE"]
    moe = net.model.layers[1].mlp
    assert moe.experts.gate_up_proj.shape == (8, 64, 64) and moe.experts.down_proj.shape == (8, 64, 32)
    assert net.model.layers[0].mlp.gate_up_proj.weight.shape == (256, 64)  # dense: intermediate_size 128
    assert moe.shared_expert is None
    shared = model("shared_expert").model.layers[0].mlp  # Qwen2-MoE: one more expert, 64 wide
    assert shared.shared_expert.gate_up_proj.shape == (1, 128, 64) and shared.shared_expert_gate.weight.shape == (1, 64)


# --- the router and the reference path ---------------------------------------------------------


def test_router_picks_the_top_k_of_a_float32_softmax() -> None:
    torch.manual_seed(0)
    x = torch.randn(50, 16)
    for renormalize in (True, False):
        router = Router(16, 8, 3, renormalize)
        torch.nn.init.normal_(router.weight, std=0.5)
        weights, ids = router(x)
        assert weights.shape == ids.shape == (50, 3) and ids.dtype == torch.int64
        assert all(len(set(row)) == 3 for row in ids.tolist()), "an expert is chosen at most once per token"
        probs = torch.softmax(x @ router.weight.T, dim=-1)
        assert torch.equal(ids[:, 0], probs.argmax(-1)) and bool((weights[:, :-1] >= weights[:, 1:]).all())
        sums = weights.sum(-1)
        if renormalize:
            torch.testing.assert_close(sums, torch.ones(50))
        else:
            torch.testing.assert_close(weights, probs.gather(1, ids))
            assert bool((sums < 1).all())


def test_router_picks_the_float32_top_k_of_a_bf16_model() -> None:
    """A bf16 router (what a GPU serves): the softmax still runs in float32, so the experts are
    the float32 top-k of the bf16 logits (in bf16, close probabilities round to ties and the
    top-k may pick another expert), and the weights come back in bf16, ``x``'s dtype. The model
    tests run in float32, where neither mistake shows."""
    torch.manual_seed(0)
    x = torch.randn(200, 64).bfloat16()
    for renormalize in (True, False):
        router = Router(64, 64, 8, renormalize)
        torch.nn.init.normal_(router.weight, std=0.02)
        router = router.to(torch.bfloat16)
        weights, ids = router(x)
        assert weights.dtype == torch.bfloat16 and ids.dtype == torch.int64
        probs = torch.softmax(F.linear(x, router.weight).float(), dim=-1)
        chosen = probs.gather(1, ids)
        assert torch.equal(chosen, probs.topk(8, dim=-1).values), "not the float32 top-k, largest first"
        expected = chosen / chosen.sum(-1, keepdim=True) if renormalize else chosen
        torch.testing.assert_close(weights, expected.bfloat16())


def test_reference_moe_equals_the_per_token_formula() -> None:
    """``out[t] = sum_j w[t, j] * expert_{ids[t, j]}(x[t])``, computed token by token."""
    torch.manual_seed(1)
    T, H, inter, E, k = 13, 16, 8, 6, 2
    x, gate_up, down = torch.randn(T, H), torch.randn(E, 2 * inter, H), torch.randn(E, H, inter)
    ids = torch.stack([torch.randperm(E)[:k] for _ in range(T)])
    ids[:5, 0] = 3  # one expert many tokens choose; others (maybe) none
    weights = torch.rand(T, k)
    expected = torch.zeros(T, H)
    for t in range(T):
        for j in range(k):
            e = int(ids[t, j])
            h = gate_up[e] @ x[t]
            expected[t] += weights[t, j] * (down[e] @ (F.silu(h[:inter]) * h[inter:]))
    torch.testing.assert_close(reference_moe(x, gate_up, down, weights, ids), expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name", CHECKPOINTS)
def test_logits_match_hf(name: str) -> None:
    ids = prompts()[3]
    ours = model(name)(torch.tensor(ids), torch.arange(len(ids)), NoCacheBackend())
    torch.testing.assert_close(ours, HFReference(checkpoint(name)).logits(ids), atol=1e-4, rtol=1e-4)


# --- both checkpoint layouts -------------------------------------------------------------------


def test_hub_and_stacked_layouts_load_the_same_weights() -> None:
    """``save_pretrained`` writes the hub's one-matrix-per-expert layout; the stacked layout is
    what transformers holds in memory. HF and minisgl load both to the same model."""
    from safetensors import safe_open

    per_expert, stacked = checkpoint("every_layer"), checkpoint("every_layer", expert_layout="stacked")
    with safe_open(str(per_expert / "model.safetensors"), "pt") as f:
        assert "model.layers.0.mlp.experts.7.down_proj.weight" in f.keys()
    with safe_open(str(stacked / "model.safetensors"), "pt") as f:
        assert f.get_slice("model.layers.0.mlp.experts.gate_up_proj").get_shape() == [8, 64, 64]
        assert not any(".experts.0." in k for k in f.keys())
    a, b = model("every_layer").state_dict(), model("every_layer", expert_layout="stacked").state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    ids = prompts()[2]
    assert torch.equal(HFReference(per_expert).logits(ids), HFReference(stacked).logits(ids))


def test_a_missing_expert_is_an_error(tmp_path) -> None:
    from safetensors.torch import load_file, save_file

    src = checkpoint("every_layer")
    tensors = load_file(src / "model.safetensors")
    for name in ("config.json", "generation_config.json"):
        (tmp_path / name).write_text((src / name).read_text())
    del tensors["model.layers.2.mlp.experts.5.up_proj.weight"]
    save_file(tensors, tmp_path / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"layers\.2\.mlp\.experts\.gate_up_proj"):
        load_model(tmp_path, layers=MoELayers())
    tensors["model.layers.2.mlp.experts.5.up_proj.weight"] = torch.zeros(32, 64)
    tensors["model.layers.2.mlp.experts.8.up_proj.weight"] = torch.zeros(32, 64)  # a ninth expert
    save_file(tensors, tmp_path / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"experts\.8\.up_proj"):
        load_model(tmp_path, layers=MoELayers())


# --- generations against HF ---------------------------------------------------------------------


@pytest.mark.parametrize("name", CHECKPOINTS)
def test_greedy_tokens_identical_to_hf(name: str) -> None:
    net, outputs = model(name), []
    for ids in prompts():
        ours = alone(net, ids)
        assert ours == hf_tokens(name, tuple(ids)), f"{name}: mismatch for prompt {ids}"
        assert distinct_fraction(ours) > 0.5, ours  # teeth: no repeated token
        outputs.append(tuple(ours))
    assert len(set(outputs)) == len(outputs), "different prompts must give different generations"


@pytest.mark.parametrize("name", CHECKPOINTS)
def test_routing_spreads_over_the_experts(name: str) -> None:
    """A parity test proves little if every token goes to the same two experts."""
    usage = expert_usage(model(name), prompts())
    assert list(usage) == ([1, 5] if name == "sparse_step" else [0, 1, 2])
    for layer, counts in usage.items():
        assert int(counts.sum()) == 2 * sum(len(p) for p in prompts())  # top-2 for every token
        assert int((counts > 0).sum()) >= 7, f"layer {layer}: only experts {counts.nonzero().flatten().tolist()} used"
        assert int(counts.max()) < 0.35 * int(counts.sum()), f"layer {layer}: one expert takes most tokens: {counts}"


# --- teeth: classic router bugs are caught --------------------------------------------------------


def no_renormalisation(self: Router, x: torch.Tensor):
    """The bug: ``norm_topk_prob`` ignored (top-k probabilities used as they are)."""
    probs = torch.softmax(F.linear(x, self.weight), dim=-1, dtype=torch.float32)
    weights, ids = probs.topk(self.top_k, dim=-1)
    return weights.to(x.dtype), ids


def softmax_after_top_k(self: Router, x: torch.Tensor):
    """The bug: softmax over the k chosen logits only (always sums to 1). It equals the right
    answer when ``norm_topk_prob`` is on, so it shows only on a checkpoint where it is off."""
    top, ids = F.linear(x, self.weight).topk(self.top_k, dim=-1)
    return torch.softmax(top, dim=-1, dtype=torch.float32).to(x.dtype), ids


def shared_expert_ungated(self: SparseMoE, x: torch.Tensor):
    """The bug: Qwen2-MoE's shared expert added without its sigmoid gate."""
    weights, ids = self.gate(x)
    shared = self.shared_expert(x, torch.ones(len(x), 1), torch.zeros(len(x), 1, dtype=torch.int64))
    return self.experts(x, weights, ids) + shared


@pytest.mark.parametrize("name,cls,bug", [("every_layer", Router, no_renormalisation),
                                          ("sparse_step", Router, softmax_after_top_k),
                                          ("shared_expert", SparseMoE, shared_expert_ungated)])
def test_parity_check_catches_a_classic_bug(name: str, cls, bug, monkeypatch) -> None:
    monkeypatch.setattr(cls, "forward", bug)
    net = model(name)
    mismatches = sum(alone(net, ids) != hf_tokens(name, tuple(ids)) for ids in prompts())
    assert mismatches >= len(prompts()) - 1, f"the parity check must notice {bug.__name__}"


def test_softmax_after_top_k_is_renormalisation() -> None:
    """Why the second bug needs the second checkpoint: on a renormalising one it is no bug."""
    moe: SparseMoE = model("every_layer").model.layers[0].mlp
    x = torch.randn(20, 64)
    right, bug = moe.gate(x), softmax_after_top_k(moe.gate, x)
    assert torch.equal(right[1], bug[1])
    torch.testing.assert_close(right[0], bug[0])


# --- tensor parallelism: each rank a slice of every expert ----------------------------------------


@pytest.mark.parametrize("name,layout", [("every_layer", "per_expert"), ("every_layer", "stacked"),
                                         ("shared_expert", "per_expert")])
def test_each_rank_loads_its_slice_of_every_expert(name: str, layout: str) -> None:
    """In this process, as rank 0 and then rank 1 of 2 (no collectives run while loading): rank
    ``r`` holds gate rows, up rows and down columns ``r * I/2 .. (r + 1) * I/2`` of every expert
    (the shared one too); the routers are whole on every rank."""
    from minisgl.distributed.tp import TPGroup, get_tp, set_tp
    from minisgl.layers.parallel import ParallelLayers

    path = checkpoint(name, expert_layout=layout)
    full = dict(model(name).named_parameters())
    saved = get_tp()
    try:
        for rank in range(2):
            set_tp(TPGroup(rank, 2))
            net = load_model(path, tp_size=2, tp_rank=rank, layers=MoELayers(ParallelLayers()))
            for pname, p in net.named_parameters():
                f = full[pname]
                if pname.endswith(("experts.gate_up_proj", "shared_expert.gate_up_proj")):
                    gate, up = f.chunk(2, dim=1)
                    n = gate.shape[1] // 2
                    want = torch.cat([gate[:, rank * n:(rank + 1) * n], up[:, rank * n:(rank + 1) * n]], dim=1)
                elif pname.endswith(("experts.down_proj", "shared_expert.down_proj")):
                    want = f.chunk(2, dim=2)[rank]
                elif pname.endswith(("mlp.gate.weight", "shared_expert_gate.weight")):
                    want = f
                else:
                    continue  # lesson 9's layers, checked by lesson 9
                assert p.shape == want.shape and torch.equal(p, want), f"rank {rank}: {pname}"
    finally:
        set_tp(saved)

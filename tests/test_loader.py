"""The checkpoint loader: fusing, sharding, tied embeddings and clear errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from minisgl.attention import NoCacheBackend
from minisgl.config import ModelConfig, UnsupportedModelError
from minisgl.models import CheckpointError, load_model
from minisgl.testing import ARCHITECTURES, HFReference, multi_file_checkpoint, tiny_checkpoint


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_fused_weights_equal_hf_projections(arch: str) -> None:
    path = tiny_checkpoint(arch)
    ours = load_model(path)
    hf = HFReference(path).model
    cfg = ours.config
    for i in range(cfg.num_layers):
        attn = hf.model.layers[i].self_attn
        q, k, v = ours.model.layers[i].self_attn.qkv_proj.weight.split([cfg.q_size, cfg.kv_size, cfg.kv_size])
        torch.testing.assert_close(q, attn.q_proj.weight, rtol=0, atol=0)
        torch.testing.assert_close(k, attn.k_proj.weight, rtol=0, atol=0)
        torch.testing.assert_close(v, attn.v_proj.weight, rtol=0, atol=0)
        if cfg.attention_bias:
            bias = torch.cat([attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias])
            torch.testing.assert_close(ours.model.layers[i].self_attn.qkv_proj.bias, bias, rtol=0, atol=0)
        mlp = hf.model.layers[i].mlp
        gate, up = ours.model.layers[i].mlp.gate_up_proj.weight.chunk(2)
        torch.testing.assert_close(gate, mlp.gate_proj.weight, rtol=0, atol=0)
        torch.testing.assert_close(up, mlp.up_proj.weight, rtol=0, atol=0)


def test_config_reads_architecture_specifics() -> None:
    qwen3 = ModelConfig.from_dir(tiny_checkpoint("qwen3"))
    assert qwen3.qk_norm and qwen3.tie_word_embeddings and not qwen3.attention_bias
    qwen2 = ModelConfig.from_dir(tiny_checkpoint("qwen2"))
    assert qwen2.attention_bias and not qwen2.qk_norm
    llama = ModelConfig.from_dir(tiny_checkpoint("llama"))
    assert len(llama.eos_token_ids) == 2, "Llama 3 has several EOS ids"
    assert llama.rope_scaling and llama.rope_scaling["rope_type"] == "llama3"


def test_config_reads_released_checkpoint_format() -> None:
    """Released Qwen3/Llama checkpoints use top-level rope_theta/rope_scaling and list EOS ids in generation_config."""
    raw = {
        "architectures": ["LlamaForCausalLM"], "vocab_size": 128256, "hidden_size": 4096,
        "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
        "num_key_value_heads": 8, "rope_theta": 500000.0, "eos_token_id": 128001, "torch_dtype": "bfloat16",
        "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    }
    cfg = ModelConfig.from_dict(raw, {"eos_token_id": [128001, 128008, 128009]})
    assert cfg.head_dim == 128 and cfg.rope_theta == 500000.0 and cfg.dtype == torch.bfloat16
    assert cfg.eos_token_ids == (128001, 128008, 128009)
    assert cfg.kv_bytes_per_token() == 2 * 8 * 128 * 32 * 2


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_missing_tensor_is_a_clear_error(tmp_path: Path) -> None:
    path = _copy(tiny_checkpoint("qwen2"), tmp_path / "ckpt")
    tensors = load_file(path / "model.safetensors")
    del tensors["model.layers.1.self_attn.k_proj.weight"]
    save_file(tensors, path / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"missing.*layers\.1\.self_attn\.qkv_proj"):
        load_model(path)


def test_unexpected_tensor_is_a_clear_error(tmp_path: Path) -> None:
    path = _copy(tiny_checkpoint("qwen2"), tmp_path / "ckpt")
    tensors = load_file(path / "model.safetensors")
    tensors["model.layers.0.mystery.weight"] = torch.zeros(2)
    save_file(tensors, path / "model.safetensors")
    with pytest.raises(CheckpointError, match="mystery"):
        load_model(path)


def test_unknown_architecture_is_a_clear_error(tmp_path: Path) -> None:
    path = _copy(tiny_checkpoint("llama"), tmp_path / "ckpt")
    cfg = json.loads((path / "config.json").read_text())
    cfg["architectures"] = ["GPT2LMHeadModel"]
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedModelError, match="GPT2LMHeadModel"):
        load_model(path)


def test_sharded_checkpoint_loads(tmp_path: Path) -> None:
    a, b = load_model(tiny_checkpoint("llama")), load_model(multi_file_checkpoint("llama", tmp_path / "sharded"))
    ids = torch.tensor([3, 14, 15, 92, 65])
    positions = torch.arange(5)
    torch.testing.assert_close(a(ids, positions, NoCacheBackend()), b(ids, positions, NoCacheBackend()), rtol=0, atol=0)


def test_tied_embeddings_share_storage() -> None:
    model = load_model(tiny_checkpoint("qwen3"))
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


def test_unreachable_hub_id_is_a_clear_error() -> None:
    with pytest.raises(FileNotFoundError, match="not a local directory"):
        load_model("minisgl-test/does-not-exist")


def test_dummy_weights_have_real_shapes_without_safetensors(tmp_path: Path) -> None:
    path = _copy(tiny_checkpoint("qwen3"), tmp_path / "ckpt")
    (path / "model.safetensors").unlink()
    model = load_model(path, dummy_weights=True, dtype=torch.bfloat16)
    assert model.model.layers[0].self_attn.qkv_proj.weight.dtype == torch.bfloat16
    assert model.model.layers[0].self_attn.rotary.inv_freq.dtype == torch.float32, "RoPE frequencies stay float32"


def test_an_engine_loads_its_tokenizer_only_when_first_needed() -> None:
    """A server's scheduler process builds an engine but never tokenizes (the tokenizer worker
    does): the tokenizer is loaded on first use, and it is the same one after that."""
    from minisgl import LLM, SamplingParams

    llm = LLM(tiny_checkpoint("qwen3"), max_seq_len=64)
    assert "tokenizer" not in vars(llm.core), "the tokenizer was loaded while the engine was built"
    (out,) = llm.generate([[5, 6, 7]], SamplingParams(max_tokens=3, ignore_eos=True), progress=False)
    assert len(out.token_ids) == 3
    tokenizer = llm.tokenizer
    assert tokenizer is llm.core.tokenizer and out.text == tokenizer.decode(out.token_ids, skip_special_tokens=True)

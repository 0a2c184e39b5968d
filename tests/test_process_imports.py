"""The server's API process and its tokenizer worker never import torch.

Only the scheduler runs a model. torch's import costs over a second of CPU, paid by every
process that imports it on every server start (the test suite starts dozens of servers), so
``python -m minisgl`` checks its flags with :class:`~minisgl.engine.config.EngineConfig`
without torch (see that module's docstring), and the tokenizer worker loads its Hugging Face
tokenizer with torch marked absent (:func:`minisgl.server.child.keep_torch_out`). Each check
runs in a fresh interpreter: this process has imported torch long ago.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from minisgl.attention.factory import ATTENTION_BACKENDS
from minisgl.engine.config import ATTENTION_BACKENDS as CONFIG_BACKENDS
from minisgl.engine.config import EngineConfig


def fresh_python(code: str) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    return r


def test_the_api_process_checks_its_flags_and_serves_without_torch() -> None:
    fresh_python("""
        import sys
        from minisgl.__main__ import parse_args
        args, shell = parse_args(["--device", "cpu", "--page-size", "4", "--max-running", "8", "--attention-backend",
                                  "torch", "--no-overlap", "--cuda-graph-max-bs", "0", "--api-key", "k"])
        assert args.llm == dict(device="cpu", page_size=4, max_running=8, attention_backend="torch", overlap=False,
                                cuda_graph_max_bs=0), args.llm
        import uvicorn
        import minisgl.model_path, minisgl.server.api, minisgl.server.launcher, minisgl.server.metrics
        from minisgl.server.launcher import build_app  # what serve() imports once the children are up
        assert "torch" not in sys.modules, "the API process imported torch"
    """)


def test_a_bad_flag_is_refused_without_torch() -> None:
    r = subprocess.run([sys.executable, "-c", "import sys; from minisgl.__main__ import parse_args\n"
                        "try:\n    parse_args(['--device', 'tpu'])\n"
                        "finally:\n    print('torch' in sys.modules)"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "EngineConfig.device must be None or a CPU or CUDA device, got 'tpu'" in r.stderr
    assert r.stdout.strip() == "False", r.stdout


def test_a_given_dtype_is_a_torch_dtype() -> None:
    """The one setting that needs torch to hold its value: given by name, it is a torch dtype."""
    import torch

    assert EngineConfig(dtype="bfloat16").dtype is torch.bfloat16
    assert EngineConfig(dtype="torch.float16").to_dict()["dtype"] == "float16"
    with pytest.raises(ValueError, match=r"dtype must be None or one of \['bfloat16', 'float16', 'float32'\]"):
        EngineConfig(dtype="int8")


def test_the_tokenizer_worker_tokenizes_without_torch() -> None:
    r = fresh_python("""
        import json, sys
        from minisgl.server.child import keep_torch_out
        keep_torch_out()  # what the launcher's tokenizer child does first
        from minisgl.server.tokenizer_worker import run_tokenizer_worker
        from minisgl.tokenizer import encode_prompt, load_tokenizer
        tok = load_tokenizer("demo")
        ids = encode_prompt(tok, [{"role": "user", "content": "Who is Mr. Darcy?"}])
        print(json.dumps([ids, tok.decode(ids)]))
        assert "transformers" in sys.modules and sys.modules.get("torch") is None, "the tokenizer worker imported torch"
    """)
    assert "PyTorch was not found" not in r.stderr, r.stderr  # transformers' note stays out of the server's log
    # The same tokens and text as a tokenizer loaded beside torch (this process).
    from minisgl.tokenizer import encode_prompt, load_tokenizer

    tok = load_tokenizer("demo")
    ids = encode_prompt(tok, [{"role": "user", "content": "Who is Mr. Darcy?"}])
    assert json.loads(r.stdout) == [ids, tok.decode(ids)]


def test_the_config_names_the_attention_backends_the_factory_builds() -> None:
    """:data:`minisgl.engine.config.ATTENTION_BACKENDS` is a copy (lesson 3's list, imported,
    would bring torch): the two must agree."""
    assert CONFIG_BACKENDS == ATTENTION_BACKENDS

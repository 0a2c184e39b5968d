"""``python -m minisgl``: the OpenAI-compatible server (lesson 10), or a chat in the terminal.

With no arguments it serves the demo model bundled with the package (a small Qwen3 trained on
Jane Austen's novels and the course's texts: readable, often wrong) on http://127.0.0.1:1919,
offline. ``--model`` takes a checkpoint directory or a Hugging Face hub id.
"""

from __future__ import annotations

import argparse
import sys

from minisgl.server.launcher import ChildStartError, ServerArgs, configure_logging, serve


def parse_args(argv: list[str] | None = None) -> tuple[ServerArgs, bool]:
    p = argparse.ArgumentParser(prog="python -m minisgl", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="demo",
                   help="checkpoint directory or hub id (default: 'demo', the small model bundled with minisgl)")
    p.add_argument("--served-model-name", default=None, help="the name /v1/models lists (default: --model)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1, this machine only)")
    p.add_argument("--port", type=int, default=1919, help="port (default: 1919)")
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on every request but /health")
    p.add_argument("--shell", action="store_true", help="chat with the model in this terminal (tokens stream as they come)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    p.add_argument("--tp-size", type=int, default=1, help="tensor-parallel ranks (lesson 9): one process per rank, one GPU each")
    p.add_argument("--page-size", type=int, default=16, help="tokens per KV page")
    p.add_argument("--num-pages", type=int, default=None, help="KV pages in the pool (default: sized from memory)")
    p.add_argument("--max-running", type=int, default=256, help="most requests in a batch")
    p.add_argument("--max-seq-len", type=int, default=None, help="prompt + max_tokens limit (default: the model's context)")
    p.add_argument("--no-prefix-cache", action="store_true", help="turn the radix cache off (lesson 5)")
    p.add_argument("--chunked-prefill-size", type=int, default=8192, help="token budget per step (lesson 6; 0: whole prompts)")
    p.add_argument("--no-overlap", action="store_true", help="the synchronous scheduler loop (lesson 7)")
    p.add_argument("--cuda-graph-max-bs", type=int, default=None, help="largest CUDA-graph batch (lesson 8; 0: off)")
    p.add_argument("--dummy-weights", action="store_true", help="random weights of the checkpoint's shape (benchmarks)")
    a = p.parse_args(argv)
    llm = dict(device=a.device, page_size=a.page_size, num_pages=a.num_pages, max_running=a.max_running,
               max_seq_len=a.max_seq_len, prefix_cache=not a.no_prefix_cache,
               chunked_prefill_size=a.chunked_prefill_size or None, overlap=not a.no_overlap,
               cuda_graph_max_bs=a.cuda_graph_max_bs, dummy_weights=a.dummy_weights, tp_size=a.tp_size)
    return ServerArgs(a.model, a.host, a.port, a.api_key, a.served_model_name, llm), a.shell


def main(argv: list[str] | None = None) -> int:
    args, shell = parse_args(argv)
    configure_logging()
    try:
        if shell:
            from minisgl.server.shell import run_shell

            return run_shell(args)
        return serve(args)
    except (ChildStartError, FileNotFoundError) as exc:
        print(f"minisgl: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

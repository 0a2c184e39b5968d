"""Lesson 10 smoke run: the server in its own processes, asked over HTTP, compared with Hugging Face.

    python lessons/l10/smoke.py                  # the tiny Qwen3 test checkpoint
    python lessons/l10/smoke.py --arch llama     # Llama 3 (two EOS ids, its own chat template)
    python lessons/l10/smoke.py --model demo     # the bundled demo model
    python lessons/l10/smoke.py --mine           # YOUR lessons/l10/exercise.py (--mine-file PATH: another file)

Starts ``python -m minisgl`` on a free port, prints its processes, sends a few prompts through
the official ``openai`` client, streamed and not, compares each answer's tokens and text with
Hugging Face's greedy generation, shows one stream chunk by chunk, stops the server with SIGTERM
and checks that no child process is left. The last line is MATCH or MISMATCH (exit 1).
"""

from __future__ import annotations

import argparse
import sys

import openai

from minisgl.models.loader import resolve_model_path
from minisgl.testing import TEST_PROMPTS, HFReference, tiny_checkpoint
from minisgl.testing.server import ServerProcess
from minisgl.tokenizer import load_tokenizer

if any(arg.startswith("--mine") for arg in sys.argv[1:]):  # YOUR lessons/l10/exercise.py, as pytest --mine
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the clone's root: tests/tools
    from tests.tools.exercises import mine_for_script

    sys.argv = mine_for_script(10)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--arch", default="qwen3", choices=["qwen3", "llama", "qwen2"])
    parser.add_argument("--model", default=None, help="a checkpoint dir, or 'demo' (default: the tiny --arch checkpoint)")
    parser.add_argument("--max-tokens", type=int, default=12)
    args = parser.parse_args()
    model = args.model or str(tiny_checkpoint(args.arch))
    tok = load_tokenizer(model)
    ref = HFReference(resolve_model_path(model))
    eos = [tok.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<|endoftext|>")
           if t in tok.get_vocab()]

    ok = True
    with ServerProcess(model) as server:
        print(f"server pid {server.proc.pid}, children {server.children} (scheduler, tokenizer), {server.url}")
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)
        for prompt in TEST_PROMPTS[:4]:
            want = ref.greedy(tok.encode(prompt), args.max_tokens, stop_token_ids=eos)
            want_text = tok.decode(want, skip_special_tokens=True)
            out = client.completions.create(model=model, prompt=prompt, max_tokens=args.max_tokens, temperature=0)
            pieces = [c.choices[0].text for c in client.completions.create(
                model=model, prompt=prompt, max_tokens=args.max_tokens, temperature=0, stream=True)]
            same = (out.choices[0].text == want_text == "".join(pieces)
                    and out.usage.completion_tokens == len(want) == len(pieces))
            ok &= same
            print(f"{'same' if same else 'DIFF'}  {prompt[:40]!r:44} -> {out.choices[0].text!r} "
                  f"({out.usage.completion_tokens} tokens, {len(pieces)} chunks, {out.choices[0].finish_reason})")
        print("one stream, chunk by chunk:")
        for chunk in client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hello!"}],
                                                    max_tokens=8, temperature=0, stream=True,
                                                    stream_options={"include_usage": True}):
            if chunk.choices:
                print(f"  delta {chunk.choices[0].delta.content!r:24} finish_reason={chunk.choices[0].finish_reason}")
            else:
                print(f"  usage {chunk.usage.prompt_tokens} prompt + {chunk.usage.completion_tokens} completion tokens")
    print(f"SIGTERM: server and children gone in {server.stop_seconds:.2f} s")
    print("MATCH" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

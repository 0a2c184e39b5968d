"""python -m minisgl: the OpenAI-compatible server (lesson 10), or a chat in the terminal.

With no arguments it serves the demo model bundled with the package (a small Qwen3 trained on
Jane Austen's novels and the course's texts: readable, often wrong) on http://127.0.0.1:1919,
offline. --model takes a checkpoint directory or a Hugging Face hub id. The engine's flags
are the settings of minisgl.engine.config.EngineConfig, with the same defaults.
"""

from __future__ import annotations

__lesson__ = "assembly"

import argparse
import dataclasses
import sys

from minisgl.engine.config import EngineConfig
from minisgl.server.launcher import ChildStartError, ServerArgs, configure_logging, serve

VALUE_TYPES = {"bool": bool, "int": int, "float": float, "str": str}


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def declared_type(f: dataclasses.Field) -> type:
    """The type a setting's annotation names first, other than ``None``: ``"int | None"`` is
    ``int``; a type other than bool, int, float or str (the dtype's ``torch.dtype``: a flag
    gives it by name) is ``str``. The annotation is read as the text it is (config.py has
    ``from __future__ import annotations``), not evaluated with ``typing.get_type_hints``:
    that would import torch into this process, which never runs a model."""
    first = next(name.strip() for name in f.type.split("|") if name.strip() != "None")
    return VALUE_TYPES.get(first, str)


def add_engine_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per :class:`EngineConfig` setting marked for the command line: a ``bool`` that
    is on by default becomes ``--no-NAME``, one that is off ``--NAME``; the rest take a value.
    Defaults are left to the config (a flag not given is not passed on)."""
    group = parser.add_argument_group("engine settings (EngineConfig)")
    for f in dataclasses.fields(EngineConfig):
        if not f.metadata.get("flag"):
            continue
        help_text = f"{f.metadata['help']} (lesson {f.metadata['lesson']})"
        if declared_type(f) is bool:
            if f.default:
                group.add_argument(_flag("no_" + f.name), dest=f.name, action="store_false", default=argparse.SUPPRESS,
                                   help=f"turn off: {help_text}")
            else:
                group.add_argument(_flag(f.name), dest=f.name, action="store_true", default=argparse.SUPPRESS,
                                   help=help_text)
            continue
        kind = type(f.default) if f.default is not None else declared_type(f)  # the value's type
        default = "" if f.default is None else f" (default: {f.default})"
        group.add_argument(_flag(f.name), dest=f.name, type=kind, default=argparse.SUPPRESS,
                           metavar=f.name.upper(), help=help_text + (default if "default" not in help_text else ""))


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
    add_engine_flags(p)
    a = vars(p.parse_args(argv))
    server = {name: a.pop(name) for name in ("model", "served_model_name", "host", "port", "api_key", "shell")}
    try:
        settings = EngineConfig(**a)  # checked here, before any process starts
    except ValueError as exc:
        p.error(str(exc))
    llm = {name: value for name, value in settings.to_dict().items() if name in a}  # only what was given
    return ServerArgs(server["model"], server["host"], server["port"], server["api_key"], server["served_model_name"],
                      llm), server["shell"]


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

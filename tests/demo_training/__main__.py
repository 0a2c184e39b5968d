"""``python -m tests.demo_training train|train-draft|check``: retrain the demo model or its draft
model (lesson 12), or verify a checkpoint's files against its model card."""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
from pathlib import Path

from minisgl.demo import demo_model_path


def recorded_hashes(model_dir: Path) -> dict[str, str]:
    """The ``| `file` | `sha256` |`` rows of the model card's file table."""
    card = (model_dir / "README.md").read_text(encoding="utf-8")
    return dict(re.findall(r"^\| `([^`]+)` \| `([0-9a-f]{64})` \|$", card, flags=re.M))


def check(model_dir: Path) -> list[str]:
    """Differences between the model card's SHA-256 table and the files (empty: all match)."""
    from tests.demo_training.card import file_hashes

    recorded, actual = recorded_hashes(model_dir), file_hashes(model_dir)
    problems = [f"{name}: not in the model card" for name in actual.keys() - recorded.keys()]
    problems += [f"{name}: in the model card but missing" for name in recorded.keys() - actual.keys()]
    problems += [f"{name}: SHA-256 {actual[name]} but the card says {recorded[name]}"
                 for name in sorted(actual.keys() & recorded.keys()) if actual[name] != recorded[name]]
    return problems


def main(argv: list[str] | None = None) -> int:
    from tests.demo_training.train import DRAFT_CONFIG, TrainConfig

    parser = argparse.ArgumentParser(prog="python -m tests.demo_training", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    default_dir = demo_model_path()
    draft_dir = default_dir.parent / "draft"  # what demo_draft_path() returns once it exists
    repo_root = Path(__file__).resolve().parents[2]

    def train_parser(name: str, help: str, out: Path, defaults: TrainConfig) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help)
        p.add_argument("--out", type=Path, default=out, help=f"checkpoint directory (default: {out})")
        p.add_argument("--repo", type=Path, default=repo_root, help="repository root, for the course texts")
        p.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "minisgl",
                       help="where the downloaded Debian package is kept")
        for field in dataclasses.fields(TrainConfig):
            value = getattr(defaults, field.name)
            p.add_argument(f"--{field.name.replace('_', '-')}", type=type(value), default=value, help=f"(default: {value})")
        return p

    train_parser("train", "train the demo model (about 25 minutes on 2 CPU cores)", default_dir, TrainConfig())
    p_draft = train_parser("train-draft", "train the demo's draft model for speculative decoding, lesson 12 "
                           "(about 10 minutes on 1 CPU core)", draft_dir, DRAFT_CONFIG)
    p_draft.add_argument("--target", type=Path, default=default_dir,
                         help=f"the model it drafts for: its tokenizer and corpus (default: {default_dir})")
    p_check = sub.add_parser("check", help="compare the checkpoint's files with its model card's SHA-256 table")
    p_check.add_argument("--dir", type=Path, default=None, help="checkpoint directory (default: the bundled demo model)")
    args = parser.parse_args(argv)

    if args.command in ("train", "train-draft"):
        from tests.demo_training.train import train

        cfg = TrainConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig)})
        target = args.target.resolve() if args.command == "train-draft" else None
        record = train(args.out.resolve(), args.repo.resolve(), args.cache, cfg, draft_for=target)
        print(f"wrote {args.out} in {record['total_seconds'] / 60:.1f} min (training {record['train_seconds'] / 60:.1f} min)")
        return 0
    model_dir = args.dir or demo_model_path()
    problems = check(model_dir)
    for problem in problems:
        print(problem, file=sys.stderr)
    print(f"{model_dir}: " + ("every file matches its model card" if not problems else f"{len(problems)} mismatches"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

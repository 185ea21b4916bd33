"""Small build steps run as subprocesses like every other step
(``python -m trtspec.build.tools <command>``), so they go through the same
executor, log, staging and cache: ``copy-tokenizer`` copies a model's
tokenizer and chat-template files into an engine folder's ``tokenizer/``;
``download`` fetches a hub model with ``huggingface_hub`` (present in the
TensorRT-LLM container) into a source folder."""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

# Files that describe the tokenizer and the chat format of a Hugging Face folder.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "generation_config.json",
    "config.json",
)


def copy_tokenizer(source: Path, output: Path) -> list[str]:
    """Copy the tokenizer files present in ``source``; at least one must exist."""
    found = [n for n in TOKENIZER_FILES if (source / n).is_file()]
    if not any(n.startswith(("tokenizer", "vocab")) for n in found):
        raise SystemExit(
            f"error: no tokenizer files in {source} (looked for tokenizer.json, "
            "tokenizer.model, vocab.json)"
        )
    output.mkdir(parents=True, exist_ok=True)
    for name in found:
        shutil.copy2(source / name, output / name)
    return found


def download(repo_id: str, output: Path) -> None:
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise SystemExit(
            "error: huggingface_hub is not installed; download the model yourself "
            "and point the spec at the local folder"
        ) from None
    output.mkdir(parents=True, exist_ok=True)
    snapshot_download(repo_id=repo_id, local_dir=str(output))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trtspec.build.tools")
    sub = parser.add_subparsers(dest="command", required=True)
    tok = sub.add_parser("copy-tokenizer", help="copy tokenizer files into an engine folder")
    tok.add_argument("--source", required=True, type=Path)
    tok.add_argument("--output", required=True, type=Path)
    dl = sub.add_parser("download", help="download a hub model into a folder")
    dl.add_argument("--repo-id", required=True)
    dl.add_argument("--output", required=True, type=Path)
    args = parser.parse_args(argv)
    if args.command == "copy-tokenizer":
        names = copy_tokenizer(args.source, args.output)
        print(f"copied {', '.join(names)} -> {args.output}")
    else:
        download(args.repo_id, args.output)
        print(f"downloaded {args.repo_id} -> {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

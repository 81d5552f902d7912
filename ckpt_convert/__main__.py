"""``python -m ckpt_convert {hf,gguf,eagle3} SRC OUT_DIR``: convert a checkpoint, exit 2 with the reason on failure."""

from __future__ import annotations

import argparse
import os
import sys

from mindspore_eagle.storage.checkpoint import is_gguf_file
from mindspore_eagle.errors import CheckpointError, EagleError

from mindspore_eagle.convert import convert_eagle3, convert_gguf, convert_hf


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ckpt_convert", description=__doc__)
    parser.add_argument("kind", choices=["hf", "gguf", "eagle3"], help="source format (eagle3: a draft head)")
    parser.add_argument("src", help="HF checkpoint directory, or a .gguf file")
    parser.add_argument("out", help="output model directory (written atomically)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing output directory")
    args = parser.parse_args(argv)
    try:
        if args.kind != "gguf" and is_gguf_file(args.src):
            raise CheckpointError(f"{args.src} is a GGUF file: convert it with `python -m ckpt_convert gguf "
                                  f"{args.src} {args.out}`")
        if args.kind == "gguf" and os.path.isdir(args.src):
            raise CheckpointError(f"{args.src} is a directory, not a GGUF file: convert a HuggingFace directory "
                                  f"with `python -m ckpt_convert hf {args.src} {args.out}`")
        if args.kind == "eagle3":
            head = convert_eagle3(args.src, args.out, overwrite=args.overwrite)
            summary = (f"EAGLE-3 head {args.src} -> {args.out} (hidden {head.hidden_size}, draft vocab "
                       f"{head.draft_vocab_size} of {head.vocab_size})")
        else:
            fn = convert_hf if args.kind == "hf" else convert_gguf
            cfg = fn(args.src, args.out, overwrite=args.overwrite)
            summary = (f"{args.src} -> {args.out} ({cfg.architecture}, {cfg.num_layers} layers, "
                       f"hidden {cfg.hidden_size}, vocab {cfg.vocab_size})")
    except EagleError as exc:
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    print(f"converted {summary}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

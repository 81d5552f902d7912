"""Multi-worker generation / benchmark: each worker takes prompts ``range(rank, n, world)`` and writes its own JSONL.

Three ways to run it (``scripts/msrun_generate.sh`` wraps the first and the merge)::

    # msrun (MindSpore's launcher; CPU or Ascend): one worker per rank, then merge the rank files
    msrun --worker_num=2 --local_worker_num=2 --master_port=8118 --log_dir=OUT/msrun --join=True \\
        scripts/multi_generate.py --model DIR --prompts P.jsonl --out OUT --mode bench
    python scripts/multi_generate.py --merge-only --out OUT

    # plain multi-process fallback (no msrun): spawns the workers, waits, merges
    python scripts/multi_generate.py --workers 2 --model DIR --prompts P.jsonl --out OUT

    # one process (rank 0 of 1), merged
    python scripts/multi_generate.py --model DIR --out OUT

Rank and world come from ``--rank/--world``, else ``RANK_ID/RANK_SIZE`` (set by msrun), else 0/1. msrun also
starts this script as its scheduler (``MS_ROLE=MS_SCHED``); the workers never call ``communication.init()``
(they share nothing), so the scheduler copy exits at once -- otherwise rank 0's shard would run twice.

Prompts: JSONL, one object per line, ``{"prompt": "text"}`` (chat template applied unless ``--raw``) or
``{"prompt_ids": [ids]}``; default: the built-in benchmark prompts. Prompt ``i`` is line ``i`` (its stable id).
Modes: ``greedy`` (teacher only), ``spec`` (EAGLE-3 tree speculation), ``bench`` (both per prompt, with
``lossless`` and ``speedup``; a warm-up compiles every shape first). Output: ``OUT/rank{r}.jsonl`` per worker;
the merge writes ``OUT/generations.jsonl`` (sorted by id, each id exactly once) and ``OUT/summary.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # run from a checkout without installing


def build_parser() -> argparse.ArgumentParser:
    from mindspore_eagle.drafting import add_drafting_flags

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="output directory (rank files, merged generations, summary)")
    p.add_argument("--model", default=None, help="converted teacher directory (default: the installed SmolLM2)")
    p.add_argument("--prompts", default=None, help='JSONL of {"prompt": ...} or {"prompt_ids": [...]} lines')
    p.add_argument("--mode", choices=["greedy", "spec", "bench"], default="spec")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--raw", action="store_true", help="text prompts without the chat template")
    p.add_argument("--no-warmup", dest="warmup", action="store_false", help="greedy/spec: time the compiling run")
    p.add_argument("--device", choices=["CPU", "Ascend"], default="CPU")
    p.add_argument("--max-cache-len", type=int, default=1024)
    p.add_argument("--buckets", default=None, help="comma-separated token buckets (default: RuntimeConfig's)")
    p.add_argument("--prefill-chunk", type=int, default=None)
    add_drafting_flags(p)  # --draft, --proposer, --budget, --max-nodes, ...: the product's drafting and defaults
    p.add_argument("--max-query-tokens", type=int, default=16, help="Ascend: query tokens per fused round")
    p.add_argument("--compile-cache", default=None,
                   help="persist compiled graphs in this directory (one subdirectory per rank)")
    p.add_argument("--rank", type=int, default=None)
    p.add_argument("--world", type=int, default=None)
    p.add_argument("--workers", type=int, default=None, help="fallback launcher: spawn this many local workers")
    p.add_argument("--merge-only", action="store_true", help="only merge OUT/rank*.jsonl")
    return p


# ----- prompts and sharding ----------------------------------------------------------------------------------


def load_prompt_items(path: str | None) -> list[dict]:
    """``[{"id": i, "prompt": str} | {"id": i, "prompt_ids": [int]}]`` in file order."""
    from mindspore_eagle.app.bench import DEFAULT_PROMPTS, read_prompt_file

    if path is None:
        return [{"id": i, "prompt": p} for i, p in enumerate(DEFAULT_PROMPTS)]
    return read_prompt_file(path, allow_ids=True)


# ----- one worker --------------------------------------------------------------------------------------------


def run_worker(args, rank: int, world: int) -> str:
    from mindspore_eagle.app.bench import run_bench
    from mindspore_eagle.app.build import build
    from mindspore_eagle.runtime import Buckets, RuntimeConfig
    from mindspore_eagle.deploy import AscendDeployment, enable_compile_cache
    from mindspore_eagle.drafting import drafting_from_args
    from mindspore_eagle.evaluation.sharding import shard

    all_items = load_prompt_items(args.prompts)
    items = shard(all_items, rank, world)
    os.environ["RANK_ID"] = str(rank)
    inherited = os.environ.get("MS_COMPILER_CACHE_PATH") if os.environ.get("MS_COMPILER_CACHE_ENABLE") == "1" else None
    if args.compile_cache or inherited:
        # one directory per rank: workers sharing one cache directory corrupt it (see deploy.enable_compile_cache)
        enable_compile_cache(args.compile_cache or inherited)
    runtime_kw = dict(max_cache_len=args.max_cache_len, device=args.device)
    if args.buckets:
        runtime_kw["buckets"] = Buckets.parse(args.buckets)
    if args.prefill_chunk:
        runtime_kw["prefill_chunk"] = args.prefill_chunk
    drafting = drafting_from_args(args) if args.mode != "greedy" else None
    deployment = AscendDeployment(max_query_tokens=args.max_query_tokens)  # compile cache: set above
    stack = build(args.model, RuntimeConfig(**runtime_kw), drafting, deployment=deployment,
                  tokenizer=any("prompt" in it for it in all_items))
    engine, tok = stack.engine, stack.tokenizer
    ids = [it["prompt_ids"] if "prompt_ids" in it else
           (tok.encode(it["prompt"]) if args.raw else tok.encode_chat([{"role": "user", "content": it["prompt"]}]))
           for it in items]
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"rank{rank}.jsonl")

    def log(msg: str) -> None:
        print(f"[rank {rank}/{world}] {msg}", file=sys.stderr, flush=True)

    log(f"{len(items)} prompts ({', '.join(str(it['id']) for it in items)}), mode {args.mode}, device {args.device}")
    rows = []
    if items and args.mode == "bench":
        results = run_bench(engine, ids, stack.proposer_for, args.max_new_tokens, stack.eos, log=log)
        for it, p, r in zip(items, ids, results):
            rows.append({**_row(it, p, r.spec, tok, rank), "greedy_tokens": list(r.greedy.tokens),
                         "greedy_tok_s": r.greedy.tok_s, "lossless": r.lossless, "speedup": r.speedup})
    elif items:
        speculative = drafting is not None
        proposer = stack.proposer_for(None) if speculative else None
        if args.warmup:
            engine.generate(ids[0], min(16, args.max_new_tokens), (), proposer=proposer)
        for it, p in zip(items, ids):
            g = engine.generate(p, args.max_new_tokens, stack.eos, proposer=proposer)
            rows.append(_row(it, p, g, tok, rank))
            log(f"prompt {it['id']}: {len(g.tokens)} tokens, {g.tok_s:.2f} tok/s" +
                (f", tau {g.tau:.2f}" if speculative else ""))
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    os.replace(tmp, path)  # a rank file exists only when its shard is complete
    log(f"wrote {path}")
    return path


def _row(item: dict, prompt_ids, g, tok, rank: int) -> dict:
    tau = None if math.isnan(g.tau) else g.tau
    return {"id": item["id"], "rank": rank, "prompt_tokens": [int(t) for t in prompt_ids], "tokens": list(g.tokens),
            "text": tok.decode(list(g.tokens)) if tok else None, "stop": g.stop_reason, "ttft_s": g.ttft_s,
            "total_s": g.total_s, "tok_s": g.tok_s, "cycles": g.cycles, "tau": tau}


# ----- merge ---------------------------------------------------------------------------------------------------


def remove_rank_files(out_dir: str) -> None:
    """Forget a previous run's shards (a stale rankN.jsonl would be merged as a duplicate)."""
    for name in os.listdir(out_dir):
        if name.startswith("rank") and name.endswith(".jsonl"):
            os.remove(os.path.join(out_dir, name))


def merge(out_dir: str, expected: int | None = None) -> dict:
    """Merge ``rank*.jsonl`` into ``generations.jsonl`` (by id) and ``summary.json``; every id exactly once."""
    from mindspore_eagle.errors import ConfigError

    files = sorted(f for f in os.listdir(out_dir) if f.startswith("rank") and f.endswith(".jsonl"))
    if not files:
        raise ConfigError(f"{out_dir}: no rank*.jsonl files to merge")
    rows = []
    for name in files:
        with open(os.path.join(out_dir, name), encoding="utf-8") as f:
            rows.extend(json.loads(line) for line in f if line.strip())
    ids = sorted(r["id"] for r in rows)
    n = expected if expected is not None else len(ids)
    if ids != list(range(n)):
        dup = sorted({i for i in ids if ids.count(i) > 1})
        missing = sorted(set(range(n)) - set(ids))
        raise ConfigError(f"{out_dir}: rank files cover ids {ids}; duplicates {dup}, missing {missing} "
                          f"(expected each of 0..{n - 1} once)")
    rows.sort(key=lambda r: r["id"])
    with open(os.path.join(out_dir, "generations.jsonl"), "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    summary = {"prompts": len(rows), "ranks": len(files), "tokens": sum(len(r["tokens"]) for r in rows)}
    if rows and "lossless" in rows[0]:
        summary["lossless_prompts"] = sum(bool(r["lossless"]) for r in rows)
        summary["speedup_mean"] = round(sum(r["speedup"] for r in rows) / len(rows), 3)
    taus = [r["tau"] for r in rows if r.get("tau") is not None]
    if taus:
        summary["tau_mean"] = round(sum(taus) / len(taus), 3)
    with open(os.path.join(out_dir, "summary.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=1)
    return summary


# ----- the fallback launcher ---------------------------------------------------------------------------------


def spawn(args, argv: list[str]) -> int:
    """Run ``args.workers`` copies of this script as ranks 0..N-1 (no msrun), wait, then merge."""
    os.makedirs(args.out, exist_ok=True)
    remove_rank_files(args.out)
    child_argv = _without_workers(argv)
    procs = []
    for r in range(args.workers):
        log_path = os.path.join(args.out, f"worker_{r}.log")
        env = {**os.environ, "RANK_ID": str(r), "RANK_SIZE": str(args.workers)}
        env.pop("MS_ROLE", None)
        cmd = [sys.executable, os.path.abspath(__file__), *child_argv, "--rank", str(r), "--world", str(args.workers)]
        with open(log_path, "w") as log:
            procs.append((r, log_path, subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)))
    failed = [(r, path, p.wait()) for r, path, p in procs]
    failed = [(r, path, rc) for r, path, rc in failed if rc != 0]
    if failed:
        for r, path, rc in failed:
            print(f"worker {r} exited with {rc}; log: {path}", file=sys.stderr)
        return 1
    return 0


def _without_workers(argv: list[str]) -> list[str]:
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == "--workers":
            skip = True
        elif not a.startswith("--workers="):
            out.append(a)
    return out


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    from mindspore_eagle.evaluation.sharding import is_scheduler, resolve_rank

    if is_scheduler():
        return 0  # msrun's scheduler copy: the workers need no collectives, so there is nothing to schedule
    os.environ.setdefault("GLOG_v", "3")
    args = build_parser().parse_args(argv)
    from mindspore_eagle.errors import EagleError

    try:
        if args.merge_only:
            print(json.dumps(merge(args.out)))
            return 0
        n = len(load_prompt_items(args.prompts))
        if args.workers is not None:
            if args.workers < 1:
                raise EagleError(f"--workers {args.workers}: must be >= 1")
            rc = spawn(args, argv)
            if rc == 0:
                print(json.dumps(merge(args.out, n)))
            return rc
        rank, world = resolve_rank(args.rank, args.world)
        start = time.perf_counter()
        run_worker(args, rank, world)
        if world == 1:
            print(json.dumps(merge(args.out, n)))
        print(f"[rank {rank}/{world}] done in {time.perf_counter() - start:.1f} s", file=sys.stderr)
        return 0
    except EagleError as exc:
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

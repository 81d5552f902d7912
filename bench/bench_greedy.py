"""Greedy decoding speed of the default teacher: ours vs HuggingFace transformers, fp32 and bf16, same weights.

Four workers, each in its own process (after MindSpore graphs have run, its thread pool slows torch matmuls in
the same process several-fold): ours fp32 and bf16 (the default runtime: the fused custom kernels where this
machine runs them), transformers fp32 and bf16 (the SmolLM2 GGUF dequantized to fp32, ``.to(bfloat16)`` for
bf16; ``--torch-threads`` torch threads, default 1). Workers run in rounds, ours and theirs alternating, and
each reports decode ms/token (prefill excluded) per prompt; the summary takes medians over prompts and rounds.
Both sides decode the same prompts for the same number of tokens (no EOS stop); the summary also says whether
the tokens agree (fp32 must: transformers is the parity reference; bf16 rounds differently on each side).
Last stdout line: one JSON object.

    python bench/bench_greedy.py [--new-tokens 64] [--rounds 2] [--torch-threads 1] [--skip-hf]
    python bench/bench_greedy.py --worker ours|hf --dtype float32|bfloat16   (one worker, JSON on stdout)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("GLOG_v", "3")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PROMPTS = [
    "Explain in two sentences why the sky is blue.",
    "Write a Python function that checks whether a string is a palindrome.",
    "Give me three tips for learning a new language.",
]
DTYPES = ("float32", "bfloat16")


def prompt_ids() -> list[list[int]]:
    from mindspore_eagle.storage.assets import require_default_model
    from mindspore_eagle.tokenizer import load_tokenizer

    tok = load_tokenizer(require_default_model())
    return [tok.encode_chat([{"role": "user", "content": p}]) for p in PROMPTS]


def worker_ours(dtype: str, new_tokens: int) -> dict:
    from mindspore_eagle.storage.assets import require_default_model
    from mindspore_eagle.runtime import RuntimeConfig
    from mindspore_eagle.engine import SpeculativeEngine
    from mindspore_eagle.teacher import Teacher

    prompts = prompt_ids()
    teacher = Teacher.load(require_default_model(), RuntimeConfig(max_cache_len=1024, dtype=dtype))
    engine = SpeculativeEngine(teacher)
    start = time.perf_counter()
    engine.generate(prompts[0], 2)  # compiles the prefill bucket and the decode bucket
    warmup = time.perf_counter() - start
    ms_tok, tokens = [], []
    for ids in prompts:
        r = engine.generate(ids, new_tokens)
        ms_tok.append((r.total_s - r.ttft_s) / max(len(r.tokens) - 1, 1) * 1000)
        tokens.append(list(r.tokens))
    return {"ms_per_token": ms_tok, "tokens": tokens, "warmup_s": warmup,
            "matmul": f"{teacher.compute.matmul.backend}/{teacher.compute.matmul.dtype}"}


def worker_hf(dtype: str, new_tokens: int, threads: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from mindspore_eagle.storage.assets import default_gguf_path

    torch.set_num_threads(threads)
    prompts = prompt_ids()
    gguf = default_gguf_path()
    model = AutoModelForCausalLM.from_pretrained(os.path.dirname(gguf), gguf_file=os.path.basename(gguf),
                                                 dtype=torch.float32).eval()
    if dtype == "bfloat16":
        model = model.to(torch.bfloat16)
    ms_tok, tokens = [], []
    with torch.no_grad():
        model.generate(torch.tensor([prompts[0]]), max_new_tokens=2, do_sample=False, pad_token_id=0)
        for ids in prompts:
            x = torch.tensor([ids])
            t0 = time.perf_counter()
            model.generate(x, max_new_tokens=1, do_sample=False, pad_token_id=0)
            t1 = time.perf_counter()
            out = model.generate(x, max_new_tokens=new_tokens, do_sample=False, pad_token_id=0, eos_token_id=None)
            t2 = time.perf_counter()
            # decode ms/token: (full run - a 1-token run) / (n - 1), i.e. prefill excluded as on our side
            ms_tok.append(((t2 - t1) - (t1 - t0)) / (new_tokens - 1) * 1000)
            tokens.append(out[0, len(ids):].tolist())
    return {"ms_per_token": ms_tok, "tokens": tokens, "torch_threads": threads}


def run_worker(side: str, dtype: str, args) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", side, "--dtype", dtype,
           "--new-tokens", str(args.new_tokens), "--torch-threads", str(args.torch_threads)]
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"worker {side} {dtype} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def agreement(a: list[list[int]], b: list[list[int]]) -> float:
    """Fraction of positions where two token lists agree, up to the first difference of each prompt."""
    same = total = 0
    for x, y in zip(a, b):
        n = next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), min(len(x), len(y)))
        same += n
        total += min(len(x), len(y))
    return same / total if total else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--torch-threads", type=int, default=1)
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--worker", choices=("ours", "hf"))
    ap.add_argument("--dtype", choices=DTYPES, default="float32")
    args = ap.parse_args()
    if args.worker == "ours":
        print(json.dumps(worker_ours(args.dtype, args.new_tokens)))
        return
    if args.worker == "hf":
        print(json.dumps(worker_hf(args.dtype, args.new_tokens, args.torch_threads)))
        return

    sides = ("ours",) if args.skip_hf else ("ours", "hf")
    runs: dict = {(s, d): [] for s in sides for d in DTYPES}
    for r in range(args.rounds):
        for d in DTYPES:
            for s in sides:
                res = run_worker(s, d, args)
                runs[s, d].append(res)
                print(f"round {r + 1}: {s:4s} {d:8s} ms/token " + ", ".join(f"{v:.1f}" for v in res["ms_per_token"]),
                      flush=True)
    summary = {"new_tokens": args.new_tokens, "rounds": args.rounds, "torch_threads": args.torch_threads,
               "load_average": round(os.getloadavg()[0], 2)}
    for d in DTYPES:
        ours = statistics.median(v for res in runs["ours", d] for v in res["ms_per_token"])
        entry = {"ours_ms_per_token": round(ours, 2), "ours_tok_s": round(1000 / ours, 2),
                 "ours_matmul": runs["ours", d][0]["matmul"], "ours_warmup_s": round(runs["ours", d][0]["warmup_s"], 1)}
        if not args.skip_hf:
            hf = statistics.median(v for res in runs["hf", d] for v in res["ms_per_token"])
            entry.update(hf_ms_per_token=round(hf, 2), hf_tok_s=round(1000 / hf, 2), speedup_vs_hf=round(hf / ours, 2),
                         token_agreement=round(agreement(runs["ours", d][0]["tokens"], runs["hf", d][0]["tokens"]), 3))
        summary[d] = entry
        line = f"{d:8s}: ours {ours:6.1f} ms/token"
        if not args.skip_hf:
            line += (f", transformers {entry['hf_ms_per_token']:6.1f} ms/token -> ours {entry['speedup_vs_hf']:.2f}x "
                     f"faster; tokens agree on {entry['token_agreement']:.0%} of positions")
        print(line)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()

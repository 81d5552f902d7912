"""Greedy decoding speed of the default teacher: our graph mode vs HuggingFace transformers, side by side.

Both run the same weights (the SmolLM2 GGUF, dequantized to fp32) in one process, one after the other, on
the same prompts after an untimed warm-up. Also reports the warm-up (compile) time and the memory-bandwidth
floor (fp32 weight bytes read once per decode step / measured bandwidth). Last stdout line: one JSON object.

    python scripts/bench_greedy.py [--new-tokens 64] [--skip-hf]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import numpy as np

os.environ.setdefault("GLOG_v", "3")

PROMPTS = [
    "Explain in two sentences why the sky is blue.",
    "Write a Python function that checks whether a string is a palindrome.",
    "Give me three tips for learning a new language.",
]


def measure_bandwidth_gbs(size_mb: int = 512, repeats: int = 5) -> float:
    """Read bandwidth: best of ``repeats`` sums over a ``size_mb`` float32 array (one pass, read-only)."""
    a = np.ones(size_mb * (1 << 20) // 4, np.float32)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        a.sum()
        best = min(best, time.perf_counter() - t)
    return a.nbytes / best / 1e9


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--skip-hf", action="store_true")
    args = ap.parse_args()

    from mindspore_eagle.assets import default_gguf_path, require_default_model
    from mindspore_eagle.config import RuntimeConfig
    from mindspore_eagle.engine import greedy_generate
    from mindspore_eagle.teacher import Teacher
    from mindspore_eagle.tokenizer import load_tokenizer

    model_dir = require_default_model()
    tok = load_tokenizer(model_dir)
    prompts = [tok.encode_chat([{"role": "user", "content": p}]) for p in PROMPTS]
    teacher = Teacher.load(model_dir, RuntimeConfig(max_cache_len=1024))
    weight_bytes = sum(int(np.prod(p.shape)) * 4 for p in teacher.cell.weight_parameters().values())

    t = time.perf_counter()
    greedy_generate(teacher, prompts[0], max_new_tokens=2)  # compiles prefill bucket 64 and decode bucket 1
    warmup_s = time.perf_counter() - t

    ours_ms, ours_tokens = [], []
    for ids in prompts:
        r = greedy_generate(teacher, ids, args.new_tokens)  # no EOS stop: equal token counts for both sides
        ours_ms.append((r.total_s - r.ttft_s) / max(len(r.tokens) - 1, 1) * 1000)
        ours_tokens.append(list(r.tokens))
    ours_ms_tok = statistics.median(ours_ms)

    hf_ms_tok = float("nan")
    same = None
    if not args.skip_hf:
        import torch
        from transformers import AutoModelForCausalLM

        gguf = default_gguf_path()
        hf = AutoModelForCausalLM.from_pretrained(os.path.dirname(gguf), gguf_file=os.path.basename(gguf),
                                                  dtype=torch.float32).eval()
        with torch.no_grad():
            hf.generate(torch.tensor([prompts[0]]), max_new_tokens=2, do_sample=False, pad_token_id=0)
            hf_ms, same = [], True
            for ids, ours in zip(prompts, ours_tokens):
                x = torch.tensor([ids])
                t = time.perf_counter()
                first = hf.generate(x, max_new_tokens=1, do_sample=False, pad_token_id=0)
                t1 = time.perf_counter()
                out = hf.generate(x, max_new_tokens=args.new_tokens, do_sample=False, pad_token_id=0,
                                  eos_token_id=None)
                t2 = time.perf_counter()
                # decode ms/token: (full run - a 1-token run) / (n - 1), i.e. prefill excluded on both sides
                hf_ms.append(((t2 - t1) - (t1 - t)) / (args.new_tokens - 1) * 1000)
                same &= out[0, len(ids):].tolist() == ours
                del first
        hf_ms_tok = statistics.median(hf_ms)

    bw = measure_bandwidth_gbs()
    floor_ms = weight_bytes / (bw * 1e9) * 1000
    print(f"warm-up (compiles prefill bucket 64 and decode bucket 1): {warmup_s:.1f} s")
    print(f"weights {weight_bytes / 1e6:.0f} MB fp32, read bandwidth {bw:.1f} GB/s -> floor {floor_ms:.1f} ms/token")
    print(f"ours (graph):   {ours_ms_tok:.1f} ms/token = {1000 / ours_ms_tok:.2f} tok/s  ({ours_ms_tok / floor_ms:.2f}x floor)")
    if not args.skip_hf:
        print(f"transformers:   {hf_ms_tok:.1f} ms/token = {1000 / hf_ms_tok:.2f} tok/s")
        print(f"speed ratio ours/transformers: {hf_ms_tok / ours_ms_tok:.2f}x; identical tokens: {same}")
    print(json.dumps({"ours_ms_per_token": round(ours_ms_tok, 2), "ours_tok_s": round(1000 / ours_ms_tok, 2),
                      "hf_ms_per_token": round(hf_ms_tok, 2), "hf_tok_s": round(1000 / hf_ms_tok, 2),
                      "ratio_vs_hf": round(hf_ms_tok / ours_ms_tok, 2), "floor_ms_per_token": round(floor_ms, 1),
                      "x_floor": round(ours_ms_tok / floor_ms, 2), "bandwidth_gbs": round(bw, 2),
                      "warmup_s": round(warmup_s, 1),
                      "identical_tokens": same, "new_tokens": args.new_tokens}))


if __name__ == "__main__":
    main()

"""Can the greedy token of the Q8_0 LM head be found exactly without its exact fp32 pass over the whole vocabulary?

The tied LM head of the default teacher (49,152 x 576, GGUF Q8_0: w = d * q, fp16 ``d`` per 32 weights, int8 ``q``)
is 10% of a one-row native forward and 15-20% of an 8-16-row one on a 2-vCPU Zen 4 (``docs/kernels.md``). At one row
it streams its 28 MB at about the memory's speed; at 8-16 rows it is bound by rebuilding ``d * q`` as floats (the
exact path's instruction floor). Greedy decoding and greedy verification need only each row's argmax, and that can
be found exactly from integer arithmetic plus a rigorous error bound:

    x (the row after the final RMSNorm) -> qx = round(x / s), s = max|x| / (2^(b-1) - 1)  (b = 16: int16)
    A_j = s * sum_blocks d_jb * sum_k qx_k q_jk          (the inner sums exact in int32: pmaddwd / vpdpwssd)
    |L_j - A_j| <= B_j = (gamma_K * max|x| + E) * W1_j     L_j: the kernel's exact fp32 logit (a sequential fma
                                                           chain, |L_j - x.w_j| <= gamma_K sum|x_k w_jk|),
                                                           E = max_k |x_k - s qx_k|, W1_j = sum_k |w_jk|
    candidates = {j : A_j + B_j >= max_i (A_i - B_i)}       every other j is provably below the argmax

and only the candidates' exact logits computed (the kernel's own chain, so the same bits and numpy's tie rule).
This experiment measures the candidate sets on real rows: the teacher's final-norm hidden states at every
position of its own greedy answers (HuggingFace transformers on the same GGUF, CPU torch: the rows are the
teacher's up to rounding, which only the bound's sanity check below depends on), and checks that the argmax of the
fp64 logits is always among the candidates.

    .venv/bin/python experiments/lm_head_bound.py [--prompts-file F.jsonl] [--prompts 12] [--new-tokens 96]
        [--bits 16,8]

``--prompts-file``: JSON lines with a "prompt" field (default: the first MT-Bench turns of the evaluation set).
Last stdout line: JSON (per activation width: rows, candidates mean / p50 / p99 / max, share of rows with a single
candidate, median bound, the 10th percentile of the top-2 logit gap).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

EMBED = "model.embed_tokens.weight"


def q8_table(model_dir: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The tied LM head's GGUF blocks and weights: d float32 [V, KB], q int8 [V, KB, 32], and w = d * q float32
    [V, K] as the converter computes it (``kernels.layout``: the fields and arithmetic the kernels are tested on)."""
    from safetensors import safe_open

    from mindspore_eagle.convert.teacher import QUANTIZED_NAME
    from mindspore_eagle.kernels.layout import QUANT_BLOCK, dequantize_fields, gguf_fields

    with safe_open(os.path.join(model_dir, QUANTIZED_NAME), "np") as f:
        kind = (f.metadata() or {}).get(EMBED)
        raw = f.get_tensor(EMBED)
    if kind != "Q8_0":
        raise SystemExit(f"{EMBED} is {kind}, this experiment reads Q8_0 blocks")
    d, m, q = gguf_fields(raw, kind)
    return d, q.reshape(q.shape[0], -1, QUANT_BLOCK), dequantize_fields(d, m, q, "q8")


def final_rows(prompts: list[str], new_tokens: int) -> np.ndarray:
    """The final-norm hidden state of every position that chose a generated token (greedy), [rows, K]."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mindspore_eagle.storage.assets import default_gguf_path, default_model_dir

    gguf = default_gguf_path()
    model = AutoModelForCausalLM.from_pretrained(os.path.dirname(gguf), gguf_file=os.path.basename(gguf),
                                                 dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(default_model_dir())
    rows = []
    for p in prompts:
        ids = tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                      return_tensors="pt", return_dict=True)["input_ids"]
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=new_tokens, do_sample=False)
            hidden = model(out, output_hidden_states=True).hidden_states[-1][0]  # after the final norm
        rows.append(hidden[ids.shape[1] - 1:-1].numpy())
    return np.concatenate(rows).astype(np.float32)


def candidates(x: np.ndarray, d: np.ndarray, q64: np.ndarray, w1: np.ndarray, bits: int) -> tuple[np.ndarray, float]:
    """(the candidate mask over the vocabulary, the median bound) of one row."""
    kb = d.shape[1]
    k = kb * 32
    qmax = 2 ** (bits - 1) - 1
    s = np.float32(np.abs(x).max() / qmax)
    qx = np.rint(x / s).astype(np.int64)
    e = np.abs(x.astype(np.float64) - float(s) * qx).max() * (1 + 1e-9)
    inner = np.einsum("bk,vbk->vb", qx.reshape(kb, 32), q64, optimize=True)  # exact integers
    a = float(s) * (d.astype(np.float64) * inner).sum(1)
    u = 2.0 ** -24
    gamma = k * u / (1 - k * u)
    bound = (gamma * float(np.abs(x).max()) + e) * w1 * 1.001 + 1e-6  # the margin covers the fp64 sums above
    return a + bound >= (a - bound).max(), float(np.median(bound))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts-file", help="JSON lines with a 'prompt' field (default: MT-Bench first turns)")
    ap.add_argument("--prompts", type=int, default=12, help="first N prompts (default 12)")
    ap.add_argument("--new-tokens", type=int, default=96, help="greedy tokens per prompt (default 96)")
    ap.add_argument("--bits", default="16,8", help="activation widths to try (default 16,8)")
    args = ap.parse_args(argv)
    from mindspore_eagle.evaluation.evalset import load_mtbench
    from mindspore_eagle.storage.assets import default_model_dir

    if args.prompts_file:
        with open(args.prompts_file, encoding="utf-8") as f:
            prompts = [json.loads(line)["prompt"] for line in f if line.strip()]
    else:
        prompts = [item.turns[0] for item in load_mtbench()]
    prompts = prompts[:args.prompts]
    d, q, w = q8_table(default_model_dir())
    q64 = q.astype(np.int64)
    w = w.astype(np.float64)
    w1 = np.abs(w).sum(1)
    rows = final_rows(prompts, args.new_tokens)
    result = {"prompts": len(prompts), "source": args.prompts_file or "mtbench", "rows": int(len(rows)),
              "xmax_median": float(np.median(np.abs(rows).max(1)))}
    logits = rows.astype(np.float64) @ w.T  # fp64 reference logits, [rows, V]
    top2 = np.sort(logits, axis=1)[:, -2:]
    result["top2_gap_p10"] = float(np.percentile(top2[:, 1] - top2[:, 0], 10))
    argmax = np.argmax(logits, axis=1)
    for bits in (int(b) for b in args.bits.split(",")):
        counts, bounds, missed = [], [], 0
        for x, best in zip(rows, argmax):
            mask, median_bound = candidates(x, d, q64, w1, bits)
            missed += not mask[int(best)]
            counts.append(int(mask.sum()))
            bounds.append(median_bound)
        c = np.array(counts)
        result[f"int{bits}"] = {"candidates_mean": round(float(c.mean()), 4), "candidates_p50": float(np.median(c)),
                                "candidates_p99": float(np.percentile(c, 99)), "candidates_max": int(c.max()),
                                "single_candidate": round(float((c == 1).mean()), 4),
                                "bound_median": round(float(np.median(bounds)), 5), "argmax_missed": missed}
        print(bits, json.dumps(result[f"int{bits}"]), flush=True)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

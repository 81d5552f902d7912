"""Time one full EAGLE-3 tree growth next to one decode step of the default teacher.

The draft head is random (timing depends on shapes only) at the default teacher's width: hidden 576, heads 9,
kv heads 3, intermediate 1536, vocabulary 49152, draft vocabulary 8192; it reads the teacher's embeddings. The
context is a real teacher prefill of ``--context`` random tokens; the draft gets random features of the aux width.
Reported (medians of interleaved repeats, after an untimed warm-up that compiles every graph):
  grow         ``propose()`` = the growth graph (``candidates()``: root logits + depth-1 levels) + the host
               selection (``select_tree``), timed separately;
  update       one draft context forward of a typical round (3 accepted + bonus = 4 entries, bucket 8): the
               catch-up of ``accept()``;
  decode       one teacher forward of one token (T = 1) at the same context length.
Last stdout line: one JSON object.

    python scripts/bench_grow.py [--depth 6 --top-k 8 --max-nodes 32 --context 256 --repeats 20]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import numpy as np

os.environ.setdefault("GLOG_v", "3")


def random_head(cfg, max_len: int, seed: int = 0):
    """A head with random weights (set before the first compile) and a random reduced vocabulary map."""
    import mindspore as ms

    from mindspore_eagle.models.eagle3 import Eagle3DraftHead

    head = Eagle3DraftHead(cfg, 1, max_len)
    rng = np.random.default_rng(seed)
    for name, p in head.weight_parameters().items():
        if p.ndim == 1:
            data = 1.0 + 0.1 * rng.standard_normal(p.shape)
        else:
            data = rng.standard_normal(p.shape) / np.sqrt(p.shape[0])
        p.set_data(ms.Tensor(data.astype(np.float32)))
    ids = np.sort(rng.choice(cfg.vocab_size, cfg.draft_vocab_size, replace=False))
    t2d = np.zeros(cfg.vocab_size, np.bool_)
    t2d[ids] = True
    head.set_vocab_map(ids - np.arange(cfg.draft_vocab_size), t2d)
    return head


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--depth", type=int, default=6)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--max-nodes", type=int, default=32)
    ap.add_argument("--draft-vocab", type=int, default=8192)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()

    from mindspore_eagle.assets import require_default_model
    from mindspore_eagle.config import RuntimeConfig
    from mindspore_eagle.draft import Eagle3Proposer, select_tree
    from mindspore_eagle.draft_config import DraftConfig, TreeBudget
    from mindspore_eagle.engine import SpeculativeEngine
    from mindspore_eagle.teacher import Teacher
    from mindspore_eagle.tree import ForwardInputs, TreeLayout

    teacher = Teacher.load(require_default_model(), RuntimeConfig(max_cache_len=1024))
    tc = teacher.cfg
    cfg = DraftConfig(hidden_size=tc.hidden_size, intermediate_size=tc.intermediate_size, num_heads=tc.num_heads,
                      num_kv_heads=tc.num_kv_heads, vocab_size=tc.vocab_size, draft_vocab_size=args.draft_vocab,
                      rms_norm_eps=tc.rms_norm_eps, rope_theta=tc.rope_theta)
    budget = TreeBudget(max_nodes=args.max_nodes, depth=args.depth, top_k=args.top_k)
    head = random_head(cfg, teacher.max_len + budget.tree_rows + 8)
    proposer = Eagle3Proposer.for_teacher(head, teacher, budget)

    rng = np.random.default_rng(1)
    prompt = rng.integers(0, tc.vocab_size, args.context).tolist()
    first = SpeculativeEngine(teacher).generate(prompt, 1)  # prefill: fills cache rows [0, context)
    prefill_s = first.ttft_s
    root = first.tokens[0]
    # Draft features of the right shape (timing depends on shapes only).
    feats = rng.standard_normal((args.context, 3 * tc.hidden_size)).astype(np.float32)
    proposer.begin(prompt, feats, root)

    L = len(prompt)
    step = ForwardInputs.for_tree(TreeLayout.single(root), L, 1, teacher.max_len)

    def decode():
        teacher.forward(step)  # rewrites row L each time; nothing committed

    commit_feats = rng.standard_normal((4, 3 * tc.hidden_size)).astype(np.float32)

    def commit_round():
        proposer.extend([1, 2, 3, root], commit_feats)  # what accept() does for 3 accepted drafts + the bonus
        proposer.cache.rollback(L)  # keep the context length fixed across repeats

    t = time.perf_counter()
    proposer.propose(root)  # compiles the growth graph
    grow_compile_s = time.perf_counter() - t
    decode()
    commit_round()
    # Interleaved, so that a busy machine slows every measurement alike.
    graph, select, update, dec = [], [], [], []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        cands = proposer.candidates()
        t1 = time.perf_counter()
        tree = select_tree(root, *cands, budget.max_nodes)
        t2 = time.perf_counter()
        commit_round()
        t3 = time.perf_counter()
        decode()
        t4 = time.perf_counter()
        graph.append(t1 - t0), select.append(t2 - t1), update.append(t3 - t2), dec.append(t4 - t3)
    graph_ms, select_ms, update_ms, decode_ms = (statistics.median(x) * 1000 for x in (graph, select, update, dec))
    grow_ms = graph_ms + select_ms
    print(f"teacher: hidden {tc.hidden_size}, {tc.num_layers} layers; prefill {args.context} tokens {prefill_s:.1f} s")
    print(f"draft head: hidden {cfg.hidden_size}, draft vocab {cfg.draft_vocab_size}; budget {budget} "
          f"({budget.num_candidates} candidates, {budget.tree_rows} tree rows); growth compile {grow_compile_s:.1f} s")
    print(f"grow (propose):  {grow_ms:.1f} ms  (graph {graph_ms:.1f} ms + select {select_ms:.2f} ms); "
          f"tree of {tree.layout.num_nodes} nodes, depth {tree.layout.max_depth}")
    print(f"draft update (4 entries): {update_ms:.1f} ms")
    print(f"teacher decode step (T=1): {decode_ms:.1f} ms  -> grow / decode = {grow_ms / decode_ms:.2f}")
    print(json.dumps({"grow_ms": round(grow_ms, 2), "grow_graph_ms": round(graph_ms, 2),
                      "select_ms": round(select_ms, 3), "draft_update_ms": round(update_ms, 2),
                      "teacher_decode_ms": round(decode_ms, 2), "grow_over_decode": round(grow_ms / decode_ms, 3),
                      "depth": budget.depth, "top_k": budget.top_k, "max_nodes": budget.max_nodes,
                      "hidden": cfg.hidden_size, "draft_vocab": cfg.draft_vocab_size, "context": args.context,
                      "grow_compile_s": round(grow_compile_s, 1)}))


if __name__ == "__main__":
    main()

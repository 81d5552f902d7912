"""Memorisation or a limit of the head? Score heads on text they were trained on and on text they never saw.

Three fixed samples of the same data set (``--data``, split as the trainer splits it): the held-out sample the
trainer evaluates on; training sequences among the first ``--seen-tokens`` answer tokens in data order (the part a
head trained on a prefix of this data has seen); training sequences after that mark (never seen by such a head,
yet drawn from the training split). For each head (``--head``, any number), held-out-style evaluation
(``Trainer.evaluate``: acc_k per TTT step, simulated tau) on each sample. If the seen sample scores far above
the two unseen ones, which score alike, the head fits what it is shown and generalises by what it is shown:
more varied data (and the compute to pass over it) is what moves held-out acceptance, not the head's capacity
to fit.

    .venv/bin/python experiments/head_gap.py --data ~/.cache/mindspore_eagle/train_data/smollm2-135m-chat \
        --seen-tokens 936217 --head shipped=assets/heads/smollm2-135m-eagle3 [--head NAME=DIR ...] [--out DIR]

Last stdout line: JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

os.environ.setdefault("GLOG_v", "3")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--seen-tokens", type=int, required=True,
                    help="answer tokens (in data order, both splits) the heads' training data held")
    ap.add_argument("--head", action="append", required=True, metavar="NAME=DIR")
    ap.add_argument("--sample", type=int, default=128, help="sequences per sample")
    ap.add_argument("--ttt-steps", type=int, default=3)
    ap.add_argument("--heldout", type=float, default=0.08)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    heads = []
    for spec in a.head:
        if "=" not in spec:
            raise SystemExit(f"--head {spec!r}: expected NAME=DIR")
        heads.append(tuple(spec.split("=", 1)))

    from mindspore_eagle.storage.assets import default_model_dir
    from mindspore_eagle.runtime import RuntimeConfig
    from mindspore_eagle.teacher_config import TeacherConfig
    from mindspore_eagle.draft_config import DraftConfig
    from mindspore_eagle.teacher import Teacher
    from mindspore_eagle.train.data import index_sequences
    from mindspore_eagle.train.trainer import (Trainer, _read_init_head, _start_from, fixed_sample, heldout,
                                               init_head, make_batches)

    teacher_dir = default_model_dir()
    tcfg = TeacherConfig.load(teacher_dir)
    teacher = Teacher.load(teacher_dir, RuntimeConfig(max_cache_len=64, batch_size=1, buckets=(1,), prefill_chunk=1))
    seqs = index_sequences(a.data)
    total, seen_ids = 0, set()
    for s in seqs:  # data order; whole sequences until the mark
        if total >= a.seen_tokens:
            break
        seen_ids.add(s.pid)
        total += len(s.tokens) - s.prompt_len
    train = [s for s in seqs if not heldout(s.pid, a.heldout)]
    samples = {"heldout": fixed_sample([s for s in seqs if heldout(s.pid, a.heldout)], a.sample),
               "train_seen": fixed_sample([s for s in train if s.pid in seen_ids], a.sample),
               "train_unseen": fixed_sample([s for s in train if s.pid not in seen_ids], a.sample)}
    rng = np.random.default_rng(0)
    # a head that passed over all of its training split leaves no unseen training text: that sample is skipped
    batches = {k: make_batches(v, (256,), 1024, rng, shuffle=False) for k, v in samples.items() if v}
    rows = []
    for name, path in heads:
        init = _read_init_head(path, tcfg)
        vocab = init[1]
        cfg = DraftConfig(hidden_size=tcfg.hidden_size, intermediate_size=tcfg.intermediate_size,
                          num_heads=tcfg.num_heads, num_kv_heads=tcfg.num_kv_heads, vocab_size=tcfg.vocab_size,
                          draft_vocab_size=vocab.size, target_hidden_size=tcfg.hidden_size, head_dim=tcfg.head_dim,
                          rms_norm_eps=tcfg.rms_norm_eps, rope_theta=tcfg.rope_theta, rope_scaling=tcfg.rope_scaling,
                          max_position_embeddings=tcfg.max_position_embeddings, aux_layer_ids=tcfg.aux_layer_ids)
        head, table = init_head(cfg, teacher.cell, vocab, 0)
        _start_from(head, init, vocab)
        trainer = Trainer(head, table, vocab, a.ttt_steps)
        row = {"head": name, "path": path}
        for k, b in batches.items():
            ev = trainer.evaluate(b)
            row[k] = {"tau": ev["tau"], "acc": ev["acc"], "positions": ev["positions"]}
            print(f"{name:>12} {k:<13} tau {ev['tau']:.4f} acc {ev['acc']} ({ev['positions']} positions)", flush=True)
        rows.append(row)
    result = {"data": a.data, "seen_tokens": a.seen_tokens, "seen_sequences": len(seen_ids),
              "sample": a.sample, "rows": rows}
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "head_gap.json"), "w") as f:
            json.dump(result, f, indent=1)
        lines = ["| head | held-out tau | training, seen tau | training, unseen tau |", "|---|---|---|---|"]
        lines += ["| " + " | ".join([r["head"]] + [f"{r[k]['tau']:.3f}" if k in r else "-" for k in samples]) + " |"
                  for r in rows]
        with open(os.path.join(a.out, "head_gap.md"), "w") as f:
            f.write(f"Depth-{a.ttt_steps} simulated tau on fixed {a.sample}-sequence samples of `{a.data}`; 'seen' = "
                    f"training sequences among the first {a.seen_tokens:,} answer tokens in data order "
                    "(`experiments/head_gap.py`)\n\n" + "\n".join(lines) + "\n")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

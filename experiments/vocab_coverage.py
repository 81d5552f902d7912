"""How much of the teacher's output a draft vocabulary of each size can propose: the vocabulary's bound on a head.

A head drafts only ids of its draft vocabulary, so its held-out acc_0 can never exceed the vocabulary's coverage
of the teacher's held-out answer tokens. This builds the vocabulary the trainer would build
(``train.vocab.build_draft_vocab`` on the training split's answer tokens, ties by the teacher's top-k candidates,
EOS always in) at each size and prints its held-out coverage, plus the coverage of a head's own vocabulary
(``--head``). Reads the token and top-k arrays only (no features), split as the trainer splits.

    .venv/bin/python experiments/vocab_coverage.py --data ~/.cache/mindspore_eagle/train_data/smollm2-135m-chat \
        [--sizes 2048,4096,6144,8192,12288,16384,32768] [--head assets/heads/smollm2-135m-eagle3] [--out DIR]

Last stdout line: JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from mindspore_eagle.teacher_config import TeacherConfig  # noqa: E402
from mindspore_eagle.train.data import index_sequences  # noqa: E402
from mindspore_eagle.train.trainer import _count_candidates, heldout  # noqa: E402
from mindspore_eagle.train.vocab import DraftVocab, build_draft_vocab, count_tokens, coverage  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True, help="a train.data directory")
    ap.add_argument("--teacher", default=None, help="converted teacher directory (default: the default teacher)")
    ap.add_argument("--sizes", default="2048,4096,6144,8192,12288,16384,32768")
    ap.add_argument("--heldout", type=float, default=0.08, help="the trainer's --heldout")
    ap.add_argument("--head", action="append", default=[], help="a head directory whose vocabulary to score too")
    ap.add_argument("--out", default=None, help="directory for vocab_coverage.{json,md}")
    a = ap.parse_args(argv)
    from mindspore_eagle.storage.assets import default_model_dir
    from mindspore_eagle.convert.eagle3 import read_checked_head

    tcfg = TeacherConfig.load(a.teacher or default_model_dir())
    seqs = index_sequences(a.data)
    train = [s for s in seqs if not heldout(s.pid, a.heldout)]
    held = [s for s in seqs if heldout(s.pid, a.heldout)]
    counts = count_tokens([s.tokens[s.prompt_len:] for s in train], tcfg.vocab_size)
    cand = _count_candidates(train, tcfg.vocab_size)
    held_counts = count_tokens([s.tokens[s.prompt_len:] for s in held], tcfg.vocab_size)
    seen = int(((counts > 0) | (cand > 0)).sum())
    rows = []
    for size in (int(x) for x in a.sizes.split(",")):
        v = build_draft_vocab(counts, min(size, seen), tcfg.eos_token_ids, cand)
        rows.append({"draft_vocab": v.size, "heldout_coverage": round(coverage(held_counts, v), 4)})
    heads = []
    for path in a.head:
        _, _, d2t, _ = read_checked_head(path)
        v = DraftVocab.from_d2t(d2t, tcfg.vocab_size)
        heads.append({"head": path, "draft_vocab": v.size, "heldout_coverage": round(coverage(held_counts, v), 4)})
    result = {"data": a.data, "train_answer_tokens": int(counts.sum()), "heldout_answer_tokens": int(held_counts.sum()),
              "distinct_ids_seen": seen, "sizes": rows, "heads": heads}
    lines = ["| draft vocabulary | held-out coverage (= the bound on acc_0) |", "|---|---|"]
    lines += [f"| {r['draft_vocab']} | {r['heldout_coverage']:.4f} |" for r in rows]
    lines += [f"| {h['draft_vocab']} (`{h['head']}`) | {h['heldout_coverage']:.4f} |" for h in heads]
    print("\n".join(lines))
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "vocab_coverage.json"), "w") as f:
            json.dump(result, f, indent=1)
        with open(os.path.join(a.out, "vocab_coverage.md"), "w") as f:
            f.write(f"{result['train_answer_tokens']:,} training / {result['heldout_answer_tokens']:,} held-out "
                    f"answer tokens of `{a.data}` (`experiments/vocab_coverage.py`)\n\n" + "\n".join(lines) + "\n")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

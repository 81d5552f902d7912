"""Record the EAGLE-3 head's candidates at every output position of evaluation turns (for exact offline replays).

For each selected turn of a committed evaluation trace, the teacher prefills prompt + greedy output once (its
features at every position), then the head is extended one committed token at a time, exactly as the engine
would have left it at that position, and grows its candidates (``Eagle3Proposer.candidates``: scores, tokens,
parents). Because the greedy output is known, ``scripts/replay_suffix.py --eagle FILE`` can then replay any
merge of head and suffix candidates sequentially, step by step, as the engine would run it. Growth levels do
not depend on the total depth, so a recording at depth D also holds every shallower budget with the same top_k.

Output: one ``.npz`` with, per turn ``k``, ``scores_k [T, C]``, ``tokens_k [T, C]``, ``parents_k [T, C]`` (row i:
the candidates under root ``output[i]``) and ``turns`` (the ids). Last stdout line: JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class _CaptureFeatures:
    """A proposer that only keeps the prefill's features (``generate(seq, 1)`` runs no speculative step)."""

    max_nodes = 1

    def begin(self, prompt, aux_hidden, first_token):
        self.aux = np.asarray(aux_hidden, np.float32)

    def propose(self, root_token):
        raise AssertionError("no speculative step expected")

    def accept(self, acceptance, aux_hidden):
        raise AssertionError("no speculative step expected")


def main(argv=None) -> int:
    from mindspore_eagle.runtime import RuntimeConfig
    from mindspore_eagle.draft import load_proposer
    from mindspore_eagle.draft_config import TreeBudget
    from mindspore_eagle.engine import SpeculativeEngine
    from mindspore_eagle.storage.assets import default_model_dir
    from mindspore_eagle.teacher import Teacher
    from scripts.replay_suffix import load_turns

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", default="results/eval-default/merged.jsonl.gz")
    ap.add_argument("--out", required=True)
    ap.add_argument("--half", choices=("eval", "fit", "all"), default="eval",
                    help="conversations of replay_suffix.py's eval half (odd positions in id order), fit half, or all")
    ap.add_argument("--every", type=int, default=1, help="every k-th conversation of that selection")
    ap.add_argument("--depth", type=int, default=5)
    ap.add_argument("--top-k", type=int, default=4)
    args = ap.parse_args(argv)
    t0 = time.time()
    parity = {"eval": (1,), "fit": (0,), "all": (0, 1)}[args.half]
    chosen = sorted({t.conversation for t in load_turns(args.trace) if t.conversation % 2 in parity})[::args.every]
    turns = [t for t in load_turns(args.trace) if t.conversation in set(chosen)]
    longest = max(len(t.prompt) + len(t.output) for t in turns)
    teacher = Teacher.load(default_model_dir(), RuntimeConfig(max_cache_len=int(np.ceil((longest + 64) / 64) * 64)))
    budget = TreeBudget(max_nodes=16, depth=args.depth, top_k=args.top_k)
    eagle = load_proposer(None, teacher, budget)
    capture = _CaptureFeatures()
    engine = SpeculativeEngine(teacher)
    arrays, ids = {}, []
    for k, t in enumerate(turns):
        seq = t.prompt + t.output[:-1]
        engine.generate(seq, 1, proposer=capture)
        aux = capture.aux  # [len(seq), 3H]: features at positions 0 .. P + T - 2
        p = len(t.prompt)
        eagle.begin(t.prompt, aux[:p], t.output[0])
        rows = []
        for i in range(len(t.output)):
            if i:
                eagle.extend([t.output[i]], aux[p + i - 1:p + i])
            rows.append(eagle.candidates())
        arrays[f"scores_{k}"] = np.stack([r[0] for r in rows]).astype(np.float32)
        arrays[f"tokens_{k}"] = np.stack([r[1] for r in rows]).astype(np.int32)
        arrays[f"parents_{k}"] = np.stack([r[2] for r in rows]).astype(np.int16)
        ids.append(t.id)
        print(f"{k + 1}/{len(turns)} {t.id}: {len(t.output)} positions ({time.time() - t0:.0f} s)", flush=True)
    tmp = args.out + ".tmp.npz"
    np.savez_compressed(tmp, turns=np.asarray(ids), depth=args.depth, top_k=args.top_k, **arrays)
    os.replace(tmp, args.out)
    print(json.dumps({"turns": len(ids), "positions": int(sum(arrays[f"scores_{k}"].shape[0] for k in range(len(ids)))),
                      "seconds": round(time.time() - t0, 1), "out": args.out}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

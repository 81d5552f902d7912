"""Replay suffix drafting and the hybrid tree over a committed evaluation trace, offline (no teacher runs).

The trace (``results/eval-default/merged.jsonl.gz``) holds, per turn, the greedy output and, per speculative
step, what the EAGLE-3 head got accepted. Prompts are rebuilt exactly (``evaluate.build_prompt``: evaluation
set + the default model's tokenizer; their lengths are checked against the trace). Because the output is the
teacher's greedy output, any tree's greedy verification is known offline (``draft.replay``).

What it prints (a table per group, then one JSON line; ``--out`` also writes replay.json / replay.md):
  1. the issue's table, at the recorded steps: tau of the head as recorded; tau of a plain lookup (the
     continuation, up to 8 tokens, after the last earlier occurrence of the longest suffix of 4..1 tokens);
     tau of the better of the two per step;
  2. ``--fit``: the suffix calibration (``draft.calibration.SuffixCalibration``) fitted on the *fit* half of the
     conversations (even positions in id order; both turns of a conversation in one half), its reliability on
     the other half, written to OUT/calibration.json (and, with ``--install``, as the package default);
  3. on the *eval* half (and the fit half, to see over-fitting): our proposer and merge rule per recorded
     step (suffix tree alone; suffix tree + the head's recorded accepted tokens as the EAGLE branch, fixed
     and adaptive budgets), and exact sequential replays of suffix-only drafting (fixed / adaptive budgets);
     with a cost model (``draft.budget.VerifyCosts``) each policy's estimated ms per token and speedup over
     plain decoding.

Replays price steps with the cost model, so their proposers do not learn costs (``learn_costs=False``). In the
per-step evaluation the EAGLE branch is approximated by the recorded accepted chain (its rejected nodes are unknown), each node
with the head's empirical depth profile P(accepted >= d) from the fit half as its p: optimistic for the head
(its chain is always right where it exists) but blind to how confident it was at that step.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from mindspore_eagle.draft.budget import EagleProfile, VerifyCosts, plan_budget, should_grow  # noqa: E402
from mindspore_eagle.draft.hybrid import HybridProposer  # noqa: E402
from mindspore_eagle.draft.merge import CandidateTree, select, union  # noqa: E402
from mindspore_eagle.draft.online_calibration import labelled_nodes  # noqa: E402
from mindspore_eagle.draft.replay import accepted_path, replay  # noqa: E402
from mindspore_eagle.draft.calibration import (CALIBRATION_FILE, NodeFeatures, fit_calibration,  # noqa: E402
                                               node_features)
from mindspore_eagle.draft.suffix import (SuffixConfig, SuffixIndex, continuation_trie, score_trie,  # noqa: E402
                                          suffix_candidates)
from mindspore_eagle.drafting import DraftingConfig  # noqa: E402
from mindspore_eagle.errors import ConfigError  # noqa: E402

MATCH_EDGES = (1, 2, 3, 4, 6, 8, 12, 16, 20, 28)
COUNT_EDGES = (1, 2, 3)
FIXED_NODES = 16  # the trace's budget (16 nodes)


@dataclass
class Turn:
    id: str
    group: str  # "humaneval" | "mtbench-t1" | "mtbench-t2"
    category: str
    conversation: int  # index of the conversation in id order (the split key)
    prompt: list
    output: list
    steps: list  # StepTrace


def load_turns(trace_path: str) -> list[Turn]:
    """The trace's turns with their prompts rebuilt (ConfigError if a rebuilt length differs)."""
    from mindspore_eagle.storage.assets import default_model_dir
    from mindspore_eagle.teacher_config import TeacherConfig
    from mindspore_eagle.evaluation.evalset import load_evalset
    from mindspore_eagle.evaluation.evaluate import build_prompt
    from mindspore_eagle.tokenizer import load_tokenizer
    from mindspore_eagle.evaluation.trace import read_trace

    model = default_model_dir()
    tok = load_tokenizer(model)
    eos = tuple(dict.fromkeys(tuple(TeacherConfig.load(model).eos_token_ids) + tuple(tok.eos_token_ids)))
    trace = read_trace(trace_path)
    summaries = {s.turn: s for s in trace.turns}
    turns = []
    for c, item in enumerate(sorted(load_evalset(), key=lambda i: i.id)):
        answers = []
        for k, tid in enumerate(item.turn_ids):
            if tid not in summaries:
                raise ConfigError(f"{trace_path}: turn {tid} missing")
            s = summaries[tid]
            prompt = build_prompt(item, k, answers, tok, eos)
            if len(prompt) != s.prompt_tokens:
                raise ConfigError(f"{tid}: rebuilt prompt has {len(prompt)} tokens, the trace says {s.prompt_tokens}")
            group = "humaneval" if s.category == "humaneval" else f"mtbench-t{k + 1}"
            turns.append(Turn(tid, group, s.category, c, prompt, list(s.output_ids), trace.steps[tid]))
            answers.append(list(s.output_ids))
    return turns


def step_positions(turn: Turn):
    """(emitted-before, step) per recorded step: the step's root is output[pos - 1]."""
    pos = 1
    for s in turn.steps:
        yield pos, s
        pos += s.emitted


def plain_lookup(seq: list, max_ngram: int = 4, k: int = 8) -> list:
    """The issue's baseline: continuation after the last earlier occurrence of the longest suffix (4..1)."""
    n = len(seq)
    for m in range(min(max_ngram, n - 1), 0, -1):
        pat = seq[n - m:]
        for j in range(n - m - 1, -1, -1):
            if seq[j:j + m] == pat:
                return seq[j + m:j + m + k]
    return []


def common_prefix(a, b) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


# ----- calibration fit ---------------------------------------------------------------------------------------


def fit_rows(turns, cfg: SuffixConfig, calibration=None):
    """At every output position, the continuation-trie nodes whose parent lies on the true continuation:
    their features and label (the node is on it too), for the fit. With ``calibration``, also every node's
    path p and whether the whole path is right (reliability rows ``[M, 2]``)."""
    parts, labels, path_rows = [], [], []
    for t in turns:
        idx = SuffixIndex(cfg.max_match)
        idx.extend(t.prompt + t.output[:1])
        for i in range(1, len(t.output)):
            trie = continuation_trie(idx.tokens, idx.matches(cfg.max_occurrences, cfg.min_match), cfg.max_depth)
            idx.extend(t.output[i:i + 1])
            if trie.num_nodes == 1:
                continue
            true = t.output[i:i + cfg.max_depth]
            known = trie.depth <= len(true)
            labelled, right = labelled_nodes(trie.tokens, trie.parents, true)
            sel = np.flatnonzero(labelled)
            f = node_features(trie)
            parts.append(np.stack([f.m_eff[sel], f.role[sel], f.count[sel]], 1))
            labels.append(right[sel])
            if calibration is not None:
                p = score_trie(trie, calibration)
                path_rows.append(np.stack([p[1:][known[1:]], right[1:][known[1:]]], 1))
    feats = np.concatenate(parts)
    features = NodeFeatures(feats[:, 0], feats[:, 1], feats[:, 2])
    rows = np.concatenate(path_rows) if path_rows else np.zeros((0, 2))
    return features, np.concatenate(labels), rows


def reliability(rows: np.ndarray, edges=(0, .1, .2, .3, .4, .5, .6, .7, .8, .9, 1.0001)) -> list[dict]:
    out = []
    for lo, hi in zip(edges, edges[1:]):
        sel = (rows[:, 0] >= lo) & (rows[:, 0] < hi)
        if sel.any():
            out.append({"bin": [lo, min(hi, 1.0)], "nodes": int(sel.sum()),
                        "predicted": round(float(rows[sel, 0].mean()), 3),
                        "observed": round(float(rows[sel, 1].mean()), 3)})
    return out


# ----- per-step evaluation at the recorded steps ---------------------------------------------------------------


def eagle_profile(turns, depth: int) -> np.ndarray:
    """P(head accepted >= d) for d = 1..depth over the recorded steps of ``turns``."""
    a = np.array([s.accepted_len for t in turns for s in t.steps])
    return np.array([(a >= d).mean() for d in range(1, depth + 1)])


def eagle_chain(root: int, tokens: list, profile: np.ndarray) -> CandidateTree:
    """The head's recorded accepted tokens as a chain, node d with p = profile[d - 1]."""
    k = len(tokens)
    return CandidateTree([root] + tokens, [0] + list(range(k)), np.concatenate([[1.0], profile[:k]]))


def recorded_step_eval(turns, cfg: SuffixConfig, calibration, profile: np.ndarray, costs: VerifyCosts):
    """Per recorded step: emitted tokens and estimated ms of each policy (see the module docstring)."""
    prof = EagleProfile(warmup=1)
    prof.update(profile)
    policies = ("eagle_recorded", "lookup", "best_of_two", "suffix_fixed", "hybrid_fixed", "hybrid_adaptive",
                "suffix_adaptive")
    ms = dict(costs.bucket_ms)
    cost_fixed = ms[min(b for b in ms if b >= FIXED_NODES)]
    rows = {p: [] for p in policies}
    grew = []
    for t in turns:
        idx = SuffixIndex(cfg.max_match)
        for pos, s in step_positions(t):
            seq = t.prompt + t.output[:pos]
            idx.extend(seq[len(idx):])
            true = t.output[pos:]

            def emitted(layout):  # accepted drafts + bonus, as StepTrace.emitted counts them
                return len(accepted_path(layout, true))

            a_lookup = common_prefix(plain_lookup(seq), true)
            rows["eagle_recorded"].append((s.emitted, cost_fixed + costs.grow_ms))
            rows["lookup"].append((1 + a_lookup, cost_fixed))
            rows["best_of_two"].append((1 + max(a_lookup, s.accepted_len), cost_fixed + costs.grow_ms))
            suffix = suffix_candidates(idx, cfg, calibration)
            chain = eagle_chain(seq[-1], list(s.tokens[:s.accepted_len]), profile)
            sfx = union(None, suffix)
            rows["suffix_fixed"].append((emitted(select(sfx, FIXED_NODES).layout), cost_fixed))
            both = union(chain, suffix)
            rows["hybrid_fixed"].append((emitted(select(both, FIXED_NODES).layout), cost_fixed + costs.grow_ms))
            plan = plan_budget(sfx.sorted_probs(), costs, costs.suffix_ms)
            rows["suffix_adaptive"].append((emitted(select(sfx, plan.num_nodes).layout), ms[plan.bucket]))
            first = suffix.probs[1:][suffix.parents[1:] == 0]
            g = should_grow(sfx.sorted_probs(), float(first.max()) if first.size else 0.0, prof, costs)
            grew.append(g)
            cands = both if g else sfx
            draft = costs.suffix_ms + (costs.grow_ms if g else 0.0)
            plan = plan_budget(cands.sorted_probs(), costs, draft)
            rows["hybrid_adaptive"].append((emitted(select(cands, plan.num_nodes).layout), ms[plan.bucket] + draft))
    return rows, float(np.mean(grew)) if grew else float("nan")


class PlainLookupProposer:
    """The issue's baseline as a proposer (a chain of ``plain_lookup``), for its sequential replay."""

    def begin(self, prompt, aux_hidden, first_token):
        self.seq = list(prompt) + [int(first_token)]

    def propose(self, root_token):
        from mindspore_eagle.tree import TreeLayout

        cont = plain_lookup(self.seq)
        return TreeLayout.from_parents([root_token] + cont, [0] + list(range(len(cont))))

    def accept(self, acceptance, aux_hidden):
        self.seq += list(acceptance.tokens)


class RecordedEagle:
    """Stands in for ``Eagle3Proposer`` inside ``HybridProposer``: returns the head's candidates recorded by
    ``experiments/record_eagle_candidates.py`` at the current position (the head's context is a function of the
    committed tokens only, so the recording is what the head would grow there)."""

    def __init__(self, prompt_len: int, scores, tokens, parents):
        self.prompt_len, self.scores, self.tokens, self.parents = prompt_len, scores, tokens, parents
        self.committed = 0

    def reset(self):
        self.committed = 0

    def extend(self, tokens, feats):
        self.committed += len(tokens)

    def candidates(self):
        i = self.committed - self.prompt_len  # row i: candidates under root output[i]
        return self.scores[i], self.tokens[i], self.parents[i]


def load_recorded(paths) -> dict:
    """turn id -> (scores, tokens, parents) ``[T, C]`` each, from recordings (``--eagle FILE ...``)."""
    out = {}
    for path in [paths] if isinstance(paths, str) else paths:
        data = np.load(path)
        for k, tid in enumerate(data["turns"]):
            out[str(tid)] = (data[f"scores_{k}"], data[f"tokens_{k}"].astype(np.int64),
                             data[f"parents_{k}"].astype(np.int64))
    return out


SEQUENTIAL_VARIANTS = {  # name -> (DraftingConfig, further HybridProposer arguments)
    "eagle_fixed": (DraftingConfig(proposer="eagle", budget="fixed", max_nodes=FIXED_NODES), {}),
    "eagle_adaptive": (DraftingConfig(proposer="eagle", budget="adaptive", max_nodes=64), {}),
    "hybrid_fixed": (DraftingConfig(proposer="hybrid", budget="fixed", max_nodes=FIXED_NODES), {}),
    "hybrid_adaptive": (DraftingConfig(proposer="hybrid", budget="adaptive", max_nodes=64), {}),
    "hybrid_adaptive_always_grow": (DraftingConfig(proposer="hybrid", budget="adaptive", max_nodes=64),
                                    {"explore_every": 1}),  # grow the head every step
    "hybrid_adaptive_max16": (DraftingConfig(proposer="hybrid", budget="adaptive", max_nodes=16), {}),
    "suffix_fixed": (DraftingConfig(proposer="suffix", budget="fixed", max_nodes=FIXED_NODES), {}),
    "suffix_adaptive": (DraftingConfig(proposer="suffix", budget="adaptive", max_nodes=64), {}),
}
# The variant whose head p was exp(1.1 * score) (the power fitted on the fit half) was dropped once the product
# kept power 1: results/hybrid-replay/README.md, sections 2 and 3 (1.58x against 1.59x with the raw p).


def hybrid_sequential_eval(turns, recorded: dict, calibration, costs: VerifyCosts) -> dict:
    """Exact sequential replays of the ``SEQUENTIAL_VARIANTS`` with the recorded head candidates: (emitted,
    ms) per step, ms from the cost model (a growth costs ``grow_ms``, a suffix proposal ``suffix_ms``)."""
    ms = dict(costs.bucket_ms)
    out: dict = {}
    for name, (drafting, kw) in SEQUENTIAL_VARIANTS.items():
        rows, grown, sources = [], 0, {"eagle": 0, "suffix": 0, "both": 0}
        # One proposer for all turns, as a server keeps one: the head's profile persists across requests.
        head = RecordedEagle(0, None, None, None) if drafting.uses_head else None
        prop = HybridProposer(drafting, head, buckets=list(ms), calibration=calibration, costs=costs,
                              learn_costs=False, **kw)
        for t in turns:
            if prop.eagle is not None:
                prop.eagle = RecordedEagle(len(t.prompt), *recorded[t.id])
            steps = replay(prop, t.prompt, t.output)
            for st, info in zip(steps, prop.log):
                bucket = min(b for b in ms if b >= st.nodes)
                draft = (costs.grow_ms if info.grew else 0.0) + (costs.suffix_ms if prop.mode != "eagle" else 0.0)
                rows.append((st.emitted, ms[bucket] + draft))
                grown += info.grew
            for k, v in prop.accepted_by_source().items():
                sources[k] += v
        out[f"{name}_sequential"] = rows
        out[f"{name}_grow_share"] = grown / max(len(rows), 1)
        out[f"{name}_sources"] = sources
    return out


def fit_eagle_power(turns, recorded: dict, grid=np.round(np.arange(0.7, 2.01, 0.05), 2)) -> float:
    """The power whose p = exp(power * score) has the least log-loss on the recorded candidates of ``turns``."""
    scores, right = eagle_rows(turns, recorded)
    losses = []
    for g in grid:
        p = np.clip(np.exp(g * scores), 1e-9, 1 - 1e-9)
        losses.append(-np.mean(right * np.log(p) + (1 - right) * np.log(1 - p)))
    return float(grid[int(np.argmin(losses))])


def sequential_groups(turns, recorded, calibration, costs, greedy_ms) -> dict:
    """``hybrid_sequential_eval`` summarised per group, with the trace's own EAGLE steps of the same turns
    (a check of the recording: eagle_fixed_sequential should match eagle_recorded_trace)."""
    ms16 = dict(costs.bucket_ms)[min(b for b in dict(costs.bucket_ms) if b >= FIXED_NODES)]
    out = {}
    categories = sorted({t.category for t in turns} - {"humaneval"})
    for gname in ("all", "humaneval", "mtbench-t1", "mtbench-t2", *categories):
        sel = [t for t in turns if gname in group_of(t)]
        if not sel:
            continue
        seq = hybrid_sequential_eval(sel, recorded, calibration, costs)
        g = {k: summarize(v, greedy_ms) for k, v in seq.items() if k.endswith("_sequential")}
        for k, v in seq.items():
            if k.endswith("_grow_share"):
                g[k.replace("_grow_share", "_sequential")]["grow_share"] = round(v, 3)
            if k.endswith("_sources") and k.startswith("hybrid"):
                g[k.replace("_sources", "_sequential")]["accepted_by_source"] = v
        g["eagle_recorded_trace"] = summarize([(s.emitted, ms16 + costs.grow_ms) for t in sel for s in t.steps],
                                              greedy_ms)
        out[gname] = g
    return out


def eagle_rows(turns, recorded: dict) -> tuple[np.ndarray, np.ndarray]:
    """Every recorded candidate at every position: (cumulative log-prob, its path spells the next output
    tokens), for the candidates whose depth the output still covers."""
    scores, right_all = [], []
    for t in turns:
        sc, tokens, parents = recorded[t.id]
        for i in range(sc.shape[0]):
            true = t.output[i + 1:]
            c = sc.shape[1]
            right = np.zeros(c + 1, bool)
            right[0] = True
            depth = np.zeros(c + 1, np.int64)
            known = np.ones(c + 1, bool)
            for j in range(c):  # candidate j has id j + 1; parents have smaller ids
                par = parents[i, j]
                depth[j + 1] = depth[par] + 1
                known[j + 1] = depth[j + 1] <= len(true)
                right[j + 1] = known[j + 1] and right[par] and tokens[i, j] == true[depth[j + 1] - 1]
            scores.append(sc[i][known[1:]])
            right_all.append(right[1:][known[1:]])
    return np.concatenate(scores).astype(np.float64), np.concatenate(right_all).astype(np.float64)


def eagle_reliability(turns, recorded: dict, power: float) -> list[dict]:
    """Calibration of the head's p = exp(power * cumulative log-prob): predicted vs observed."""
    scores, right = eagle_rows(turns, recorded)
    return reliability(np.stack([np.exp(power * scores), right], 1))


def sequential_eval(turns, calibration, costs: VerifyCosts):
    """Exact sequential replays of model-free drafting: (emitted, ms) per step, per proposer."""
    ms = dict(costs.bucket_ms)
    rows = []
    for t in turns:
        for st in replay(PlainLookupProposer(), t.prompt, t.output):
            rows.append((st.emitted, ms[min(b for b in ms if b >= st.nodes)]))
    out = {"lookup_sequential": rows}
    for budget in ("fixed", "adaptive"):
        rows = []
        for t in turns:
            drafting = DraftingConfig(proposer="suffix", budget=budget,
                                      max_nodes=64 if budget == "adaptive" else FIXED_NODES)
            prop = HybridProposer(drafting, buckets=list(ms), calibration=calibration, costs=costs, learn_costs=False)
            for st in replay(prop, t.prompt, t.output):
                bucket = min(b for b in ms if b >= st.nodes)
                rows.append((st.emitted, ms[bucket] + costs.suffix_ms))
        out[f"suffix_{budget}_sequential"] = rows
    return out


def summarize(rows, greedy_ms: float) -> dict:
    a = np.asarray(rows, np.float64)
    tau = a[:, 0].mean()
    ms_per_token = a[:, 1].sum() / a[:, 0].sum()
    return {"steps": int(a.shape[0]), "tau": round(float(tau), 3), "ms_per_token": round(float(ms_per_token), 2),
            "est_speedup": round(float(greedy_ms / ms_per_token), 3)}


def group_of(t: Turn) -> list[str]:
    return ["all", t.group, t.category] if t.category != "humaneval" else ["all", "humaneval"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", default="results/eval-default/merged.jsonl.gz")
    ap.add_argument("--fit", action="store_true", help="fit the calibration on the fit half (else use the shipped one)")
    ap.add_argument("--install", action="store_true", help="with --fit: write it as the package default")
    ap.add_argument("--out", default=None, help="directory for calibration.json, replay.json, replay.md")
    ap.add_argument("--eagle", nargs="+", default=None,
                    help="recorded head candidates (experiments/record_eagle_candidates.py), any number of files")
    ap.add_argument("--costs", default=None, help='JSON {"bucket_ms": {"1": 72, ...}, "grow_ms": 30}')
    args = ap.parse_args(argv)
    t0 = time.time()
    cfg = SuffixConfig()
    costs = VerifyCosts()
    if args.costs:
        d = json.loads(args.costs)
        costs = VerifyCosts.from_mapping({int(k): v for k, v in d["bucket_ms"].items()}, d.get("grow_ms", 30.0))
    greedy_ms = dict(costs.bucket_ms)[1]
    turns = load_turns(args.trace)
    fit = [t for t in turns if t.conversation % 2 == 0]
    held = [t for t in turns if t.conversation % 2 == 1]
    print(f"{len(turns)} turns ({len(fit)} fit / {len(held)} eval), prompts rebuilt and checked "
          f"({time.time() - t0:.1f} s)")
    result: dict = {"trace": args.trace, "suffix_config": cfg.__dict__, "costs": {"bucket_ms": dict(costs.bucket_ms),
                    "grow_ms": costs.grow_ms, "suffix_ms": costs.suffix_ms}}

    if args.fit:
        feats, labels, _ = fit_rows(fit, cfg)
        calibration = fit_calibration(feats, labels, MATCH_EDGES, COUNT_EDGES,
                                      source=f"scripts/replay_suffix.py --fit on {args.trace}: "
                                      f"{len(fit)} turns of the even-indexed conversations, {labels.size} nodes")
        print(f"calibration fitted on {labels.size} labelled nodes ({time.time() - t0:.1f} s)")
        if args.out:
            _write_text(os.path.join(args.out, "calibration.json"), calibration.to_json())
        if args.install:
            _write_text(CALIBRATION_FILE, calibration.to_json())
            print(f"installed {CALIBRATION_FILE}")
    else:
        from mindspore_eagle.draft.calibration import default_calibration

        calibration = default_calibration()
    _, _, rel_rows = fit_rows(held, cfg, calibration)
    result["reliability_eval_half"] = reliability(rel_rows)
    brier = float(np.mean((rel_rows[:, 0] - rel_rows[:, 1]) ** 2))
    result["brier_eval_half"] = round(brier, 4)

    profile = eagle_profile(fit, 5)
    result["eagle_depth_profile_fit_half"] = [round(float(x), 4) for x in profile]
    tables, every_row, every_group = {}, {}, []
    for half, ts in (("eval", held), ("fit", fit)):
        rows, grew = recorded_step_eval(ts, cfg, calibration, profile, costs)
        step_groups = [group_of(t) for t in ts for _ in t.steps]
        for policy, r in rows.items():
            every_row.setdefault(policy, []).extend(r)
        every_group += step_groups
        per_group: dict = {}
        for policy, r in rows.items():
            for gname in sorted({g for gs in step_groups for g in gs}):
                sel = [row for row, gs in zip(r, step_groups) if gname in gs]
                per_group.setdefault(gname, {})[policy] = summarize(sel, greedy_ms)
        for policy, r in sequential_eval(ts, calibration, costs).items():
            per_group["all"][policy] = summarize(r, greedy_ms)
        tables[half] = {"groups": per_group, "hybrid_adaptive_grow_share": round(grew, 3)}
        print(f"{half} half evaluated ({time.time() - t0:.1f} s)")
    issue = {}
    for gname in ("all", "humaneval", "mtbench-t1", "mtbench-t2", "extraction", "writing", "roleplay", "stem"):
        issue[gname] = {p: summarize([row for row, gs in zip(every_row[p], every_group) if gname in gs],
                                     greedy_ms)["tau"] for p in ("eagle_recorded", "lookup", "best_of_two")}
    result["issue_table_all_turns"] = issue
    if args.eagle:
        recorded = load_recorded(args.eagle)
        section: dict = {"files": args.eagle}
        fit_rec = [t for t in fit if t.id in recorded]
        power = fit_eagle_power(fit_rec, recorded) if fit_rec else 1.0
        section["eagle_power_fit_half"] = power
        print(f"head calibration power {power} (fitted on {len(fit_rec)} turns of the fit half)")
        for half, ts in (("eval", held), ("fit", fit)):
            sel = [t for t in ts if t.id in recorded]
            if sel:
                section[half] = {"turns": len(sel),
                                 "eagle_reliability_raw": eagle_reliability(sel, recorded, 1.0),
                                 "eagle_reliability": eagle_reliability(sel, recorded, power),
                                 "groups": sequential_groups(sel, recorded, calibration, costs, greedy_ms)}
                print(f"recorded head, {half} half: {len(sel)} turns replayed ({time.time() - t0:.1f} s)")
        result["recorded_head"] = section
    result["halves"] = tables
    _print(result)
    if args.out:
        _write_json(os.path.join(args.out, "replay.json"), result)
        with open(os.path.join(args.out, "replay.md"), "w", encoding="utf-8") as f:
            f.write(_markdown(result))
    every = tables["eval"]["groups"]["all"]
    summary = {"turns": len(turns), "issue_table_all": issue["all"],
               "eval_half_at_recorded_steps_tau": {p: r["tau"] for p, r in every.items()
                                                   if not p.endswith("_sequential")},
               "eval_half_sequential": {p.replace("_sequential", ""): {"tau": r["tau"], "est_speedup": r["est_speedup"]}
                                        for p, r in every.items() if p.endswith("_sequential")},
               "suffix_brier_eval_half": result["brier_eval_half"]}
    if "recorded_head" in result and "eval" in result["recorded_head"]:
        rec = result["recorded_head"]
        summary["eagle_power_fit_half"] = rec["eagle_power_fit_half"]
        summary["eval_half_sequential_with_recorded_head"] = {
            p.replace("_sequential", ""): {k: r[k] for k in ("tau", "est_speedup", "grow_share") if k in r}
            for p, r in rec["eval"]["groups"]["all"].items()}
    summary["seconds"] = round(time.time() - t0, 1)
    print(json.dumps(summary, separators=(",", ":")))
    return 0


def _write_text(path: str, text: str) -> None:
    from mindspore_eagle.storage.atomic import write_text

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    write_text(path, text)


def _write_json(path: str, obj) -> None:
    _write_text(path, json.dumps(obj, indent=1) + "\n")


def _markdown(result: dict) -> str:
    lines = ["## The issue's table (all 240 turns, at the recorded steps)", "",
             "| turns | tau, EAGLE-3 head (recorded) | tau, plain lookup | tau, best of the two |", "|---|---|---|---|"]
    for g, r in result["issue_table_all_turns"].items():
        lines.append(f"| {g} | {r['eagle_recorded']} | {r['lookup']} | {r['best_of_two']} |")
    for half in ("eval", "fit"):
        lines += ["", f"## Our proposer on the {half} half (tau / estimated speedup over plain decoding)", "",
                  "Columns without `_sequential` are evaluated at the head's recorded step positions: they weight "
                  "each stretch of output by its length (a long copied stretch counts once per recorded step "
                  "inside it), so their tau is far above what a run driven by that proposer reaches. The "
                  "`_sequential` columns are exact replays of such runs.", ""]
        groups = result["halves"][half]["groups"]
        policies = list(groups["all"])
        lines.append("| group | " + " | ".join(policies) + " |")
        lines.append("|---|" + "---|" * len(policies))
        for g, r in groups.items():
            cells = [f"{r[p]['tau']} / {r[p]['est_speedup']}x" if p in r else "" for p in policies]
            lines.append(f"| {g} | " + " | ".join(cells) + " |")
        lines.append(f"\nhybrid adaptive grew the head at {result['halves'][half]['hybrid_adaptive_grow_share']:.1%} "
                     "of the steps")
    rec = result.get("recorded_head", {})
    for half in ("eval", "fit"):
        if half not in rec:
            continue
        lines += ["", f"## Sequential replays with the recorded head, {half} half ({rec[half]['turns']} turns): "
                  "tau / estimated speedup (share of steps that grew the head)", ""]
        groups = rec[half]["groups"]
        policies = list(groups["all"])
        lines.append("| group | " + " | ".join(p.replace("_sequential", "") for p in policies) + " |")
        lines.append("|---|" + "---|" * len(policies))
        for g, r in groups.items():
            cells = [f"{r[p]['tau']} / {r[p]['est_speedup']}x" + (f" ({r[p]['grow_share']:.0%})" if "grow_share" in r[p]
                     else "") for p in policies]
            lines.append(f"| {g} | " + " | ".join(cells) + " |")
        lines += ["", f"Accepted draft tokens by source, hybrid adaptive ({half} half): which source wins", "",
                  "| group | eagle only | suffix only | both | suffix share |", "|---|---|---|---|---|"]
        for g, r in groups.items():
            src = r["hybrid_adaptive_sequential"].get("accepted_by_source")
            if src:
                total = max(sum(src.values()), 1)
                lines.append(f"| {g} | {src['eagle']} | {src['suffix']} | {src['both']} | "
                             f"{(src['suffix'] + src['both']) / total:.0%} |")
        lines += ["", f"Head calibration ({half} half): p = exp(power * cumulative draft log-prob) vs observed, "
                  f"power 1 (raw) and {rec['eagle_power_fit_half']} (fitted on the fit half)", "",
                  "| bin | candidates | predicted | observed | candidates (fitted) | predicted | observed |",
                  "|---|---|---|---|---|---|---|"]
        raw = {tuple(r["bin"]): r for r in rec[half]["eagle_reliability_raw"]}
        cal = {tuple(r["bin"]): r for r in rec[half]["eagle_reliability"]}
        for b in sorted(set(raw) | set(cal)):
            a, c = raw.get(b, {}), cal.get(b, {})
            lines.append(f"| {b[0]:.1f}-{b[1]:.1f} | {a.get('nodes', '')} | {a.get('predicted', '')} | "
                         f"{a.get('observed', '')} | {c.get('nodes', '')} | {c.get('predicted', '')} | "
                         f"{c.get('observed', '')} |")
    lines += ["", "## Reliability of the suffix p on the eval half (node paths)", "",
              "| bin | nodes | predicted | observed |",
              "|---|---|---|---|"]
    for r in result["reliability_eval_half"]:
        lines.append(f"| {r['bin'][0]:.1f}-{r['bin'][1]:.1f} | {r['nodes']} | {r['predicted']} | {r['observed']} |")
    return "\n".join(lines) + "\n"


def _print(result: dict) -> None:
    print(_markdown(result))


if __name__ == "__main__":
    sys.exit(main())

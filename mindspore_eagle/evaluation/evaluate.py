"""``mindspore-eagle eval``: greedy vs speculative on every turn of the evaluation set, sharded, resumable.

For each turn the teacher-only greedy baseline and the speculative run go through ``harness.compare`` on the same
prompt, one after the other in the same process, after ``harness.warm_up`` compiled every shape. A worker
writes its own trace file ``OUT/shard-RRR.jsonl`` (schema in ``mindspore_eagle.evaluation.trace``): per turn, one
line per speculative step, then one ``TurnSummary`` line; the whole block goes out in one write + ``fsync``.

Sharding is deterministic and independent of timing (``mindspore_eagle.evaluation.sharding``). The unit is the
*conversation* (``EvalItem``): sorted by id, worker ``rank`` of ``world`` takes ``items[rank::world]``. Both turns of
an MT-Bench question therefore run on one worker, turn 2 after turn 1, conditioned on turn 1's greedy answer
(the speculative answer is the same when lossless; greedy is used either way). Seeds derive from the turn id
(``turn_seed``), never from the rank, so 1, 2 or 4 workers produce the same tokens and the same tau.

Resume. On start a worker reads every shard file in ``OUT``: any turn with a summary line is finished and
skipped (its greedy answer is read back when the next turn of its conversation needs it). Its own file is
first truncated after the last complete turn, which drops a torn line or step lines whose summary was never
written (an interrupted turn is rerun from scratch). Every session that runs a turn appends a "run" header, in
the same write as its first turn (a session that fails before that -- a bad budget, a warm-up error -- leaves
nothing behind, so the corrected rerun is not locked out); all headers in ``OUT`` must carry the same
``RunConfig`` (another model, draft, budget or token limit needs another ``OUT``). The RunConfig holds the
*content* fingerprints of the model and head directories (``fingerprint.directory_fingerprint``), not only their
paths: a model re-converted or a head re-trained in place is refused on resume instead of being mixed into the
trace. ``--limit`` is not part of it: a run with a larger limit continues a smaller one.

``merge`` joins the shards into ``OUT/merged.jsonl``: one header, then the turns sorted by id (each turn's
steps, then its summary); a turn present twice (only possible if shards of different runs were copied in) is
kept once.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import time
import zlib
from dataclasses import dataclass
from typing import Callable, Sequence

from ..storage.atomic import write_text
from ..errors import CacheCapacityError, ConfigError
from .evalset import EvalItem, check_unique_ids, spread_sample
from ..engine import validate_request
from ..app.harness import compare, warm_up
from .sharding import shard as shard_items
from .trace import MERGED_NAME, SHARD_GLOB, SkippedTurn, TraceFile, TurnSummary, read_trace


def shard_path(out_dir: str, rank: int) -> str:
    return os.path.join(out_dir, f"shard-{rank:03d}.jsonl")


@dataclass(frozen=True)
class RunConfig:
    """Everything a trace's numbers depend on; recorded in every header, compared on resume and merge."""

    model: str  # teacher model directory
    draft: str  # draft head directory, or "oracle" / "wrong"
    model_fingerprint: str  # content of the model directory (fingerprint.directory_fingerprint)
    draft_fingerprint: str  # content of the head directory; "" for oracles
    max_nodes: int
    depth: int
    top_k: int
    exec_mode: str  # "performance" | "reference"
    max_cache_len: int
    max_new_tokens: int
    evalset: str  # evalset_digest of the full (unlimited) set
    buckets: tuple[int, ...] = (1, 8, 16, 32, 64)  # the teacher's RuntimeConfig.buckets
    prefill_chunk: int = 64
    proposer: str = "eagle"  # draft source: eagle / suffix / hybrid (or the oracle's name)
    budget_mode: str = "fixed"  # fixed / adaptive
    dtype: str = "float32"  # Linear compute dtype of teacher and head
    matmul: str = "mindspore"  # the Linear implementation actually used ("custom" or "mindspore")
    suffix_calibration: str = "shipped"  # shipped / online (traces before the option: shipped)

    def __post_init__(self) -> None:
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ConfigError(f"RunConfig.max_new_tokens={self.max_new_tokens!r}: must be an integer >= 1")

    def to_dict(self) -> dict:
        """JSON-shaped (tuples as lists), so it compares equal to a header read back from a file."""
        return json.loads(json.dumps(dataclasses.asdict(self)))

    @classmethod
    def for_stack(cls, stack, items: Sequence[EvalItem], max_new_tokens: int) -> "RunConfig":
        """The RunConfig of evaluating ``items`` with a ``build.Stack`` (runtime fields are its teacher's, drafting
        fields its ``DraftingConfig``'s; an oracle's proposer is its name, its budget fixed)."""
        from .evalset import evalset_digest
        from ..storage.fingerprint import directory_fingerprint

        rt, d = stack.teacher.runtime, stack.drafting
        draft_fp = directory_fingerprint(stack.draft_label) if os.path.isdir(stack.draft_label) else ""
        return cls(model=stack.model_dir, draft=stack.draft_label, model_fingerprint=directory_fingerprint(
                   stack.model_dir), draft_fingerprint=draft_fp, max_nodes=d.max_nodes, depth=d.depth,
                   top_k=d.top_k, exec_mode=rt.exec_mode.value, max_cache_len=rt.max_cache_len,
                   max_new_tokens=max_new_tokens, evalset=evalset_digest(items), buckets=rt.buckets.sizes,
                   prefill_chunk=rt.prefill_chunk, proposer=d.head if d.oracle else d.proposer.value,
                   budget_mode="fixed" if d.oracle else d.budget.value, dtype=stack.teacher.compute.matmul.dtype,
                   matmul=stack.teacher.compute.matmul.backend, suffix_calibration=d.suffix_calibration.value)


# ----- sharding and seeds ------------------------------------------------------------------------------------


def turn_seed(turn_id: str) -> int:
    """The seed of a turn: crc32 of its id (stable across runs, Python versions and worker counts)."""
    return zlib.crc32(turn_id.encode("utf-8"))


def shard(items: Sequence[EvalItem], rank: int, world: int, chosen: set[str] | None = None) -> list[EvalItem]:
    """The conversations of worker ``rank``: ``sharding.shard`` over the items sorted by id; with ``chosen`` (turn
    ids), over the conversations that have a chosen turn only. A spread sample takes every k-th conversation: with k
    a multiple of ``world``, sharding the whole set would give every one of them to the same worker."""
    ordered = sorted(items, key=lambda i: i.id)
    check_unique_ids(ordered, "evaluation set")
    if chosen is not None:
        ordered = [i for i in ordered if any(t in chosen for t in i.turn_ids)]
    return shard_items(ordered, rank, world)


def select_turns(items: Sequence[EvalItem], limit: int | None = None, spread: bool = False) -> list[str]:
    """Turn ids to run, in order: conversations sorted by id, turns in order; the first ``limit`` of them.

    ``spread`` picks a sample for sweeps instead: the *first* turn of each of ``spread_sample(items, limit)``
    (the same conversations as ``bench --prompts evalset:N``); the first ``limit`` ids would all be HumanEval."""
    if limit is not None and limit < 1:
        raise ConfigError(f"limit={limit}: must be >= 1")
    if spread:
        if limit is None or limit > len(items):
            raise ConfigError(f"spread sample of {limit} turns: needs a limit between 1 and the {len(items)} "
                              "conversations of the set")
        return [item.turn_ids[0] for item in spread_sample(items, limit)]
    ids = [t for item in sorted(items, key=lambda i: i.id) for t in item.turn_ids]
    return ids if limit is None else ids[:limit]


# ----- prompts -----------------------------------------------------------------------------------------------


def strip_eos(tokens: Sequence[int], eos: Sequence[int]) -> list[int]:
    out = [int(t) for t in tokens]
    while out and out[-1] in set(eos):
        out.pop()
    return out


def build_prompt(item: EvalItem, k: int, answers: Sequence[Sequence[int]], tokenizer=None,
                 eos: Sequence[int] = ()) -> list[int]:
    """Prompt ids of turn ``k`` given the greedy answers of turns ``0..k-1``.

    Text turns: the chat template over ``[user t0, assistant a0, ..., user tk]`` (answers decoded without
    their trailing end-of-turn tokens). Id turns: ``turns_ids[0] + a0 + ... + turns_ids[k]`` (answers likewise
    without trailing EOS)."""
    if len(answers) < k:
        raise ConfigError(f"{item.turn_ids[k]}: needs the answers of the {k} earlier turns")
    if item.turns_ids:
        ids: list[int] = []
        for j in range(k):
            ids += list(item.turns_ids[j]) + strip_eos(answers[j], eos)
        return ids + list(item.turns_ids[k])
    if tokenizer is None:
        raise ConfigError(f"{item.id}: text turns need a tokenizer")
    messages = []
    for j in range(k):
        messages.append({"role": "user", "content": item.turns[j]})
        messages.append({"role": "assistant", "content": tokenizer.decode(strip_eos(answers[j], eos))})
    messages.append({"role": "user", "content": item.turns[k]})
    return list(tokenizer.encode_chat(messages))


# ----- reading what is done ----------------------------------------------------------------------------------


def _check_headers(tf: TraceFile, config: dict) -> None:
    for h in tf.headers:
        old = h.get("config", {})
        if old != config:
            diff = {k: (old.get(k), config.get(k)) for k in sorted(set(old) | set(config))
                    if old.get(k) != config.get(k)}
            changed = [k for k in ("model_fingerprint", "draft_fingerprint") if k in diff]
            why = ""
            if changed and all(old.get(k[:-len("_fingerprint")]) == config.get(k[:-len("_fingerprint")])
                               for k in changed):
                what = " and ".join(config.get(k[:-len("_fingerprint")]) for k in changed)
                why = (f": the content of {what} changed since that run (re-converted or re-trained in place?), so "
                       "its turns come from another model")
            raise ConfigError(f"{tf.path} was written with a different configuration {diff} (old, new){why}; resume "
                              "only with identical settings and models, or use another --out directory")


def finished_turns(out_dir: str, config: dict | None = None) -> dict[str, TurnSummary]:
    """Summaries of every finished turn in ``out_dir``'s shard files (first occurrence of an id wins)."""
    return _read_done(out_dir, config)[0]


def _read_done(out_dir: str, config: dict | None = None) -> tuple[dict[str, TurnSummary], dict[str, SkippedTurn]]:
    """(finished turns, skipped turns) of ``out_dir``'s shard files, headers checked against ``config``."""
    done: dict[str, TurnSummary] = {}
    skipped: dict[str, SkippedTurn] = {}
    for path in sorted(glob.glob(os.path.join(out_dir, SHARD_GLOB))):
        if not os.path.isfile(path):
            raise ConfigError(f"{path}: a directory named like a shard file; move it out of {out_dir}")
        tf = read_trace(path)
        if config is not None:
            _check_headers(tf, config)
        for s in tf.turns:
            done.setdefault(s.turn, s)
        for s in tf.skipped:
            skipped.setdefault(s.turn, s)
    return done, skipped


def repair_shard(path: str) -> TraceFile | None:
    """Truncate ``path`` after its last complete turn (drop a torn line and orphan step lines)."""
    if not os.path.exists(path):
        return None
    tf = read_trace(path)
    if tf.torn or tf.orphan_steps or os.path.getsize(path) != tf.good_bytes:
        with open(path, "r+b") as f:
            f.truncate(tf.good_bytes)
            f.flush()
            os.fsync(f.fileno())
    return tf


def _append(f, text: str) -> None:
    """One write, flushed and fsynced: a turn is on disk entirely or (after repair) not at all."""
    f.write(text)
    f.flush()
    os.fsync(f.fileno())


# ----- the runner --------------------------------------------------------------------------------------------


def run_shard(stack, items: Sequence[EvalItem], config: RunConfig, out_dir: str, rank: int = 0, world: int = 1, *,
              limit: int | None = None, spread: bool = False, log: Callable[[str], None] = print,
              on_turn: Callable[[TurnSummary], None] | None = None) -> list[TurnSummary]:
    """Run this worker's unfinished turns with ``stack`` (a ``build.Stack`` with a draft), appending each to
    ``shard_path(out_dir, rank)``; return the summaries written in this session. ``on_turn`` is called after
    each turn is on disk."""
    from ..verify import SamplingParams

    os.makedirs(out_dir, exist_ok=True)
    cfg = config.to_dict()
    done, skipped = _read_done(out_dir, cfg)
    path = shard_path(out_dir, rank)
    repaired = repair_shard(path)
    if repaired is not None and (repaired.torn or repaired.orphan_steps):
        log(f"[rank {rank}] {path}: dropped an interrupted turn ({repaired.orphan_steps} step lines"
            f"{', a torn line' if repaired.torn else ''})")
    selected = select_turns(items, limit, spread)
    chosen = set(selected)
    mine = shard(items, rank, world, chosen)
    todo = [t for item in mine for t in item.turn_ids if t in chosen and t not in done and t not in skipped]
    mine_selected = [t for item in mine for t in item.turn_ids if t in chosen]
    log(f"[rank {rank}/{world}] {len(mine_selected)} of the {len(selected)} selected turns are this worker's: "
        f"{len(todo)} to run, {len(mine_selected) - len(todo)} already finished")
    header = {"record": "run", "config": cfg, "rank": rank, "world": world, "selected": selected,
              "started": time.strftime("%Y-%m-%dT%H:%M:%S"), "pid": os.getpid()}
    pending_header = json.dumps(header, separators=(",", ":")) + "\n"  # written with this session's first turn
    written: list[TurnSummary] = []
    if not todo:
        return written
    eos = stack.eos
    warm_up(stack.engine, stack.proposer_for, _warm_up_prompt(stack, mine, config), config.max_new_tokens, eos)
    with open(path, "a", encoding="utf-8") as f:  # opened once warm-up succeeded: a failed one leaves no file
        for item in mine:
            answers: list[Sequence[int]] = []
            for k, tid in enumerate(item.turn_ids):
                if tid not in chosen or tid in skipped:
                    break  # a skipped turn's conversation cannot continue: its later turns were skipped with it
                if tid in done:
                    answers.append(done[tid].output_ids)
                    continue
                prompt = build_prompt(item, k, answers, stack.tokenizer, eos)
                sampling = SamplingParams(seed=turn_seed(tid))  # greedy: the seed draws nothing, but is per turn
                try:
                    # the turn's own input first (ids outside the vocabulary, an empty turn, a prompt longer than
                    # the cache): such a turn is recorded with the reason and the run goes on
                    validate_request(prompt, config.max_new_tokens, stack.teacher.cfg.vocab_size,
                                     stack.teacher.max_len)
                    r = compare(stack.engine, prompt, stack.proposer_for, config.max_new_tokens, eos, sampling)
                except (CacheCapacityError, ConfigError) as exc:  # this turn cannot run: record it and go on
                    later = [t for t in item.turn_ids[k + 1:] if t in chosen]
                    records = [SkippedTurn(tid, item.category, str(exc))] + [
                        SkippedTurn(t, item.category, f"an earlier turn of the conversation ({tid}) was skipped")
                        for t in later]
                    _append(f, pending_header + "".join(rec.to_json() + "\n" for rec in records))
                    pending_header = ""
                    log(f"[rank {rank}] {tid:<16} SKIPPED: {exc}" + (f" (and {len(later)} later turns)" if later
                                                                     else ""))
                    break
                summary = summarize_turn(tid, item.category, rank, r.greedy, r.spec, r.sources)
                block = "".join(st.to_json(record="step", turn=tid) + "\n" for st in r.spec.steps) + summary.to_json() + "\n"
                _append(f, pending_header + block)
                pending_header = ""
                written.append(summary)
                answers.append(r.greedy.tokens)
                tau = f"{summary.tau:5.2f}" if summary.tau is not None else "  n/a"
                log(f"[rank {rank}] {tid:<16} {summary.tokens:>4} tok  greedy {summary.greedy_tok_s:7.2f} tok/s  "
                    f"spec {summary.spec_tok_s:7.2f} tok/s  tau {tau}  speedup {summary.speedup:5.2f}  "
                    f"{'lossless' if summary.lossless else 'OUTPUT DIFFERS'}")
                if on_turn is not None:
                    on_turn(summary)
    return written


def _warm_up_prompt(stack, mine: Sequence[EvalItem], config: RunConfig) -> list[int]:
    """The first of this worker's first turns that can run (a bad one is recorded during the run, not here); the
    first turn itself when none can (the warm-up then reports why)."""
    eos = stack.eos
    first = build_prompt(mine[0], 0, [], stack.tokenizer, eos)
    for item in mine:
        prompt = build_prompt(item, 0, [], stack.tokenizer, eos)
        try:
            validate_request(prompt, config.max_new_tokens, stack.teacher.cfg.vocab_size, stack.teacher.max_len)
            return prompt
        except (CacheCapacityError, ConfigError):
            continue
    return first


def summarize_turn(turn_id: str, category: str, rank: int, greedy, spec, sources: dict | None = None) -> TurnSummary:
    """The ``TurnSummary`` of one turn from its greedy and speculative ``Generation``s."""
    emitted = sum(st.emitted for st in spec.steps)
    lossless = greedy.tokens == spec.tokens
    return TurnSummary(
        turn=turn_id, category=category, seed=turn_seed(turn_id), rank=rank,
        prompt_tokens=len(greedy.prompt_tokens), tokens=len(greedy.tokens), spec_tokens=len(spec.tokens),
        stop_reason=greedy.stop_reason, greedy_s=round(greedy.total_s, 6), spec_s=round(spec.total_s, 6),
        greedy_ttft_s=round(greedy.ttft_s, 6), spec_ttft_s=round(spec.ttft_s, 6),
        greedy_tok_s=round(greedy.tok_s, 4), spec_tok_s=round(spec.tok_s, 4),
        speedup=round(spec.tok_s / greedy.tok_s, 4), cycles=spec.cycles, emitted=emitted,
        tau=round(emitted / spec.cycles, 4) if spec.cycles else None,
        spec_teacher_s=round(spec.teacher_s, 6),
        spec_draft_s=round(spec.seconds("grow") + spec.seconds("update"), 6),
        lossless=lossless, output_ids=tuple(int(t) for t in greedy.tokens),
        spec_ids=None if lossless else tuple(int(t) for t in spec.tokens),
        spec_host_s=round(spec.seconds("host"), 6),
        accepted_eagle=None if sources is None else int(sources["eagle"]),
        accepted_suffix=None if sources is None else int(sources["suffix"]),
        accepted_both=None if sources is None else int(sources["both"]))


# ----- merge -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MergeResult:
    path: str
    turns: int
    missing: tuple[str, ...]  # selected by some session but with no summary in any shard
    duplicates: int  # turn summaries seen more than once (kept once)
    orphan_steps: int  # step lines of interrupted turns, dropped
    skipped: tuple[str, ...] = ()  # turns recorded as skipped (their prompt does not fit the cache)


def merge(out_dir: str, out_path: str | None = None) -> MergeResult:
    """Join ``out_dir``'s shard files into one trace sorted by turn id (written atomically)."""
    paths = sorted(glob.glob(os.path.join(out_dir, SHARD_GLOB)))
    if not paths:
        raise ConfigError(f"{out_dir}: no shard files ({SHARD_GLOB}) to merge")
    files = [read_trace(p) for p in paths]
    headers = [h for tf in files for h in tf.headers]
    if not headers:
        raise ConfigError(f"{out_dir}: shard files without a run header")
    config = headers[0]["config"]
    for tf in files:
        _check_headers(tf, config)
    turns, steps, duplicates = {}, {}, 0
    for tf in files:
        for s in tf.turns:
            if s.turn in turns:
                duplicates += 1
                continue
            turns[s.turn], steps[s.turn] = s, tf.steps[s.turn]
    skipped = {}
    for tf in files:
        for s in tf.skipped:
            if s.turn not in turns:
                skipped.setdefault(s.turn, s)
    selected = sorted({t for h in headers for t in h.get("selected", ())})
    missing = tuple(t for t in selected if t not in turns and t not in skipped)
    out_path = out_path or os.path.join(out_dir, MERGED_NAME)
    header = {"record": "run", "config": config, "rank": None, "world": max(h.get("world", 1) for h in headers),
              "selected": selected, "merged_from": [os.path.basename(p) for p in paths]}
    lines = [json.dumps(header, separators=(",", ":"))]
    for tid in sorted(turns):
        lines += [st.to_json(record="step", turn=tid) for st in steps[tid]]
        lines.append(turns[tid].to_json())
    lines += [skipped[tid].to_json() for tid in sorted(skipped)]
    write_text(out_path, "\n".join(lines) + "\n")
    return MergeResult(out_path, len(turns), missing, duplicates, sum(tf.orphan_steps for tf in files),
                       tuple(sorted(skipped)))


# ----- the evaluation set, shared by the CLI and experiments/ ------------------------------------------------


def load_items(eval_set: str | None = None, subset: str = "all") -> list[EvalItem]:
    """The default 240-turn set (``subset`` all / mtbench / humaneval) or a custom JSONL set."""
    from .evalset import load_custom, load_evalset

    return load_custom(eval_set) if eval_set else load_evalset(subset)


__all__ = ["MERGED_NAME", "MergeResult", "RunConfig", "build_prompt", "finished_turns", "load_items", "merge",
           "repair_shard", "run_shard", "select_turns", "shard", "shard_path", "summarize_turn", "turn_seed"]

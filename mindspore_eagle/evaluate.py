"""``mindspore-eagle eval``: greedy vs speculative on every turn of the evaluation set, sharded, resumable.

For each turn the teacher-only greedy baseline and the speculative engine run on the same prompt, one after
the other in the same process. Graph compilation stays out of the timings: before the first turn both
engines run untimed on a prompt of each bucket's length (every prefill and draft-context shape). A worker
writes its own trace file ``OUT/shard-RRR.jsonl`` (schema in ``mindspore_eagle.trace``): per turn, one
line per speculative step, then one ``TurnSummary`` line; the whole block goes out in one write + ``fsync``.

Sharding is deterministic and independent of timing. The unit is the *conversation* (``EvalItem``): sorted
by id, worker ``rank`` of ``world`` takes ``items[rank::world]``, i.e. ``range(rank, n, world)``. Both turns of
an MT-Bench question therefore run on one worker, turn 2 after turn 1, conditioned on turn 1's greedy answer
(the speculative answer is the same when lossless; greedy is used either way). Seeds derive from the turn id
(``turn_seed``), never from the rank, so 1, 2 or 4 workers produce the same tokens and the same tau.

Resume. On start a worker reads every shard file in ``OUT``: any turn with a summary line is finished and
skipped (its greedy answer is read back when the next turn of its conversation needs it). Its own file is
first truncated after the last complete turn, which drops a torn line or step lines whose summary was never
written (an interrupted turn is rerun from scratch). Every session appends a "run" header; all headers in
``OUT`` must carry the same ``RunConfig`` (another model, draft, budget or token limit needs another ``OUT``).
``--limit`` is not part of it: a run with a larger limit continues a smaller one.

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

from .errors import ConfigError
from .evalset import EvalItem, spread_sample
from .trace import TraceFile, TurnSummary, read_trace

SHARD_GLOB = "shard-*.jsonl"
MERGED_NAME = "merged.jsonl"


def shard_path(out_dir: str, rank: int) -> str:
    return os.path.join(out_dir, f"shard-{rank:03d}.jsonl")


@dataclass(frozen=True)
class RunConfig:
    """Everything a trace's numbers depend on; recorded in every header, compared on resume and merge."""

    model: str  # teacher model directory
    draft: str  # draft head directory, or "oracle" / "wrong"
    max_nodes: int
    depth: int
    top_k: int
    window: int | None  # draft context window (None: full context)
    commit: str  # "auto" | "length" | "path_index"
    exec_mode: str  # "performance" | "reference"
    max_cache_len: int
    max_new_tokens: int
    evalset: str  # evalset_digest of the full (unlimited) set
    buckets: tuple[int, ...] = (1, 8, 16, 32, 64)  # the teacher's RuntimeConfig.buckets
    prefill_chunk: int = 64

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ConfigError(f"RunConfig.max_new_tokens={self.max_new_tokens}: must be >= 1")
        if self.commit not in ("auto", "length", "path_index"):
            raise ConfigError(f"RunConfig.commit={self.commit!r}: expected auto, length or path_index")

    def to_dict(self) -> dict:
        """JSON-shaped (tuples as lists), so it compares equal to a header read back from a file."""
        return json.loads(json.dumps(dataclasses.asdict(self)))

    @classmethod
    def for_teacher(cls, teacher, **kw) -> "RunConfig":
        """A RunConfig whose runtime fields (exec mode, cache length, buckets) are ``teacher``'s."""
        rt = teacher.runtime
        return cls(exec_mode=rt.exec_mode, max_cache_len=rt.max_cache_len, buckets=tuple(rt.buckets),
                   prefill_chunk=rt.prefill_chunk, **kw)

    @property
    def commit_mode(self):
        from .cache import CommitMode

        return None if self.commit == "auto" else CommitMode(self.commit)


# ----- sharding and seeds ------------------------------------------------------------------------------------


def turn_seed(turn_id: str) -> int:
    """The seed of a turn: crc32 of its id (stable across runs, Python versions and worker counts)."""
    return zlib.crc32(turn_id.encode("utf-8"))


def shard(items: Sequence[EvalItem], rank: int, world: int) -> list[EvalItem]:
    """The conversations of worker ``rank``: ``range(rank, n, world)`` over the items sorted by id."""
    if not (isinstance(world, int) and world >= 1 and isinstance(rank, int) and 0 <= rank < world):
        raise ConfigError(f"rank={rank}, world={world}: need world >= 1 and 0 <= rank < world")
    ordered = sorted(items, key=lambda i: i.id)
    ids = [i.id for i in ordered]
    if len(set(ids)) != len(ids):
        raise ConfigError("evaluation set has duplicate conversation ids")
    return [ordered[j] for j in range(rank, len(ordered), world)]


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


# ----- proposers ---------------------------------------------------------------------------------------------


def proposer_factory(draft: str | None, teacher, budget, window: int | None = None
                     ) -> tuple[Callable, str]:
    """``(make_proposer(greedy_generation), label)``: oracles read that request's greedy output; a real head is
    loaded once (``draft`` None: the default head) and reused (``begin`` resets it)."""
    if draft in ("oracle", "wrong"):
        from .oracle import OracleProposer

        mode = draft
        return (lambda greedy: OracleProposer(greedy.tokens, budget.depth, teacher.cfg.vocab_size, mode)), draft
    from .draft import default_head_dir, load_proposer

    proposer = load_proposer(draft, teacher, budget, window)
    return (lambda greedy: proposer), os.path.abspath(draft or default_head_dir())


# ----- reading what is done ----------------------------------------------------------------------------------


def _check_headers(tf: TraceFile, config: dict) -> None:
    for h in tf.headers:
        old = h.get("config", {})
        if old != config:
            diff = {k: (old.get(k), config.get(k)) for k in sorted(set(old) | set(config))
                    if old.get(k) != config.get(k)}
            raise ConfigError(f"{tf.path} was written with a different configuration {diff} (old, new); resume "
                              "only with identical settings, or use another --out directory")


def finished_turns(out_dir: str, config: dict | None = None) -> dict[str, TurnSummary]:
    """Summaries of every finished turn in ``out_dir``'s shard files (first occurrence of an id wins)."""
    done: dict[str, TurnSummary] = {}
    for path in sorted(glob.glob(os.path.join(out_dir, SHARD_GLOB))):
        tf = read_trace(path)
        if config is not None:
            _check_headers(tf, config)
        for s in tf.turns:
            done.setdefault(s.turn, s)
    return done


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


def run_shard(teacher, items: Sequence[EvalItem], make_proposer: Callable, config: RunConfig, out_dir: str,
              rank: int = 0, world: int = 1, *, tokenizer=None, eos: Sequence[int] = (), limit: int | None = None,
              spread: bool = False, log: Callable[[str], None] = print, on_turn: Callable[[TurnSummary], None] | None = None
              ) -> list[TurnSummary]:
    """Run this worker's unfinished turns, appending each to ``shard_path(out_dir, rank)``; return the
    summaries written in this session. ``on_turn`` is called after each turn is on disk."""
    from .bench import PerRequestProposer
    from .engine import SpeculativeEngine
    from .verify import SamplingParams

    os.makedirs(out_dir, exist_ok=True)
    cfg = config.to_dict()
    done = finished_turns(out_dir, cfg)
    path = shard_path(out_dir, rank)
    repaired = repair_shard(path)
    if repaired is not None and (repaired.torn or repaired.orphan_steps):
        log(f"[rank {rank}] {path}: dropped an interrupted turn ({repaired.orphan_steps} step lines"
            f"{', a torn line' if repaired.torn else ''})")
    selected = select_turns(items, limit, spread)
    chosen = set(selected)
    mine = shard(items, rank, world)
    todo = [t for item in mine for t in item.turn_ids if t in chosen and t not in done]
    mine_selected = [t for item in mine for t in item.turn_ids if t in chosen]
    log(f"[rank {rank}/{world}] {len(mine_selected)} of the {len(selected)} selected turns are this worker's: "
        f"{len(todo)} to run, {len(mine_selected) - len(todo)} already finished")
    header = {"record": "run", "config": cfg, "rank": rank, "world": world, "selected": selected,
              "started": time.strftime("%Y-%m-%dT%H:%M:%S"), "pid": os.getpid()}
    written: list[TurnSummary] = []
    with open(path, "a", encoding="utf-8") as f:
        _append(f, json.dumps(header, separators=(",", ":")) + "\n")
        if not todo:
            return written
        eos = tuple(int(e) for e in eos)
        greedy_engine = SpeculativeEngine(teacher)
        state = {"greedy": None}
        spec_engine = SpeculativeEngine(teacher, PerRequestProposer(make_proposer, state), config.commit_mode)
        # Warm-up (untimed): compile every shape both loops can use before the first timed turn. A prompt of
        # each bucket's length compiles that prefill bucket and the draft's context chunk of the same size.
        first = build_prompt(mine[0], 0, [], tokenizer, eos)
        rt = teacher.runtime
        for b in [b for b in rt.buckets if b <= rt.prefill_chunk and b + 16 < teacher.max_len] or [len(first)]:
            warm = (first * (b // len(first) + 1))[:b]
            state["greedy"] = greedy_engine.generate(warm, min(8, config.max_new_tokens), eos)
            spec_engine.generate(warm, min(16, config.max_new_tokens), eos)
        for item in mine:
            answers: list[Sequence[int]] = []
            for k, tid in enumerate(item.turn_ids):
                if tid not in chosen:
                    break
                if tid in done:
                    answers.append(done[tid].output_ids)
                    continue
                prompt = build_prompt(item, k, answers, tokenizer, eos)
                sampling = SamplingParams(seed=turn_seed(tid))  # greedy: the seed draws nothing, but is per turn
                g = greedy_engine.generate(prompt, config.max_new_tokens, eos, sampling)
                state["greedy"] = g
                s = spec_engine.generate(prompt, config.max_new_tokens, eos, sampling)
                summary = summarize_turn(tid, item.category, rank, g, s)
                block = "".join(st.to_json(record="step", turn=tid) + "\n" for st in s.steps) + summary.to_json() + "\n"
                _append(f, block)
                written.append(summary)
                answers.append(g.tokens)
                tau = f"{summary.tau:5.2f}" if summary.tau is not None else "  n/a"
                log(f"[rank {rank}] {tid:<16} {summary.tokens:>4} tok  greedy {summary.greedy_tok_s:7.2f} tok/s  "
                    f"spec {summary.spec_tok_s:7.2f} tok/s  tau {tau}  speedup {summary.speedup:5.2f}  "
                    f"{'lossless' if summary.lossless else 'OUTPUT DIFFERS'}")
                if on_turn is not None:
                    on_turn(summary)
    return written


def summarize_turn(turn_id: str, category: str, rank: int, greedy, spec) -> TurnSummary:
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
        spec_teacher_s=round(spec.teacher_s, 6), spec_draft_s=round(spec.seconds("draft"), 6),
        lossless=lossless, output_ids=tuple(int(t) for t in greedy.tokens),
        spec_ids=None if lossless else tuple(int(t) for t in spec.tokens))


# ----- merge -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MergeResult:
    path: str
    turns: int
    missing: tuple[str, ...]  # selected by some session but with no summary in any shard
    duplicates: int  # turn summaries seen more than once (kept once)
    orphan_steps: int  # step lines of interrupted turns, dropped


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
    selected = sorted({t for h in headers for t in h.get("selected", ())})
    missing = tuple(t for t in selected if t not in turns)
    out_path = out_path or os.path.join(out_dir, MERGED_NAME)
    header = {"record": "run", "config": config, "rank": None, "world": max(h.get("world", 1) for h in headers),
              "selected": selected, "merged_from": [os.path.basename(p) for p in paths]}
    lines = [json.dumps(header, separators=(",", ":"))]
    for tid in sorted(turns):
        lines += [st.to_json(record="step", turn=tid) for st in steps[tid]]
        lines.append(turns[tid].to_json())
    tmp = out_path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, out_path)
    return MergeResult(out_path, len(turns), missing, duplicates, sum(tf.orphan_steps for tf in files))


# ----- set-up shared by the CLI and scripts/ ------------------------------------------------------------------


@dataclass
class Setup:
    teacher: object
    tokenizer: object  # None for token-id sets
    items: list
    eos: tuple
    model_dir: str


def load_setup(model: str | None = None, *, max_cache_len: int = 1024, exec_mode: str = "performance",
               device: str = "CPU", eval_set: str | None = None, subset: str = "all",
               buckets: Sequence[int] | None = None, prefill_chunk: int | None = None) -> Setup:
    """Teacher (``model`` or the installed default), the evaluation items (the default 240-turn set or a custom
    JSONL), its tokenizer when the turns are text, and the end-of-turn ids (model config + tokenizer)."""
    from .assets import require_default_model
    from .config import RuntimeConfig
    from .evalset import load_custom, load_evalset
    from .teacher import Teacher
    from .tokenizer import load_tokenizer

    items = load_custom(eval_set) if eval_set else load_evalset(subset)
    model_dir = os.path.abspath(model or require_default_model())
    extra = {}
    if buckets:
        extra["buckets"] = tuple(int(b) for b in buckets)
    if prefill_chunk:
        extra["prefill_chunk"] = int(prefill_chunk)
    teacher = Teacher.load(model_dir, RuntimeConfig(max_cache_len=max_cache_len, exec_mode=exec_mode, device=device,
                                                    **extra))
    tok = load_tokenizer(model_dir) if any(i.turns for i in items) else None
    eos = tuple(int(e) for e in teacher.cfg.eos_token_ids) + (tuple(tok.eos_token_ids) if tok is not None else ())
    return Setup(teacher, tok, items, tuple(dict.fromkeys(eos)), model_dir)


def prepare_run(setup: Setup, draft: str | None, budget, window: int | None, commit: str, max_new_tokens: int,
                teacher=None) -> tuple[Callable, RunConfig]:
    """The proposer factory and the ``RunConfig`` of one configuration (``teacher`` defaults to the setup's)."""
    from .evalset import evalset_digest

    teacher = teacher or setup.teacher
    make_proposer, label = proposer_factory(draft, teacher, budget, window)
    config = RunConfig.for_teacher(teacher, model=setup.model_dir, draft=label, max_nodes=budget.max_nodes,
                                   depth=budget.depth, top_k=budget.top_k, window=window, commit=commit,
                                   max_new_tokens=max_new_tokens, evalset=evalset_digest(setup.items))
    return make_proposer, config


def evaluate_variant(setup: Setup, out_dir: str, *, draft: str | None, budget, window: int | None = None,
                     commit: str = "auto", max_new_tokens: int = 256, limit: int | None = None, spread: bool = False,
                     teacher=None, log: Callable[[str], None] = print) -> dict:
    """One configuration end to end (run or resume in ``out_dir``, merge, metrics): the building block of the
    sweep and ablation scripts. ``teacher`` overrides ``setup.teacher`` (e.g. one in another exec mode)."""
    from .report import load, metrics

    teacher = teacher or setup.teacher
    make_proposer, config = prepare_run(setup, draft, budget, window, commit, max_new_tokens, teacher)
    run_shard(teacher, setup.items, make_proposer, config, out_dir, tokenizer=setup.tokenizer, eos=setup.eos,
              limit=limit, spread=spread, log=log)
    loaded = load([merge(out_dir).path])
    return metrics(loaded.turns, loaded.steps)


def resolve_rank(rank: int | None, world: int | None) -> tuple[int, int]:
    """``--rank/--world`` if given, else msrun's ``RANK_ID`` / ``RANK_SIZE``, else a single worker."""
    env_world = os.environ.get("RANK_SIZE")
    if world is None:
        world = int(env_world) if env_world else 1
    if rank is None:
        rank = int(os.environ.get("RANK_ID", "0")) if world > 1 else 0
    if not (world >= 1 and 0 <= rank < world):
        raise ConfigError(f"rank={rank}, world={world}: need world >= 1 and 0 <= rank < world")
    return rank, world


__all__ = ["MERGED_NAME", "MergeResult", "RunConfig", "Setup", "build_prompt", "evaluate_variant", "finished_turns",
           "load_setup", "merge", "prepare_run", "proposer_factory", "repair_shard", "resolve_rank", "run_shard",
           "select_turns", "shard", "shard_path", "summarize_turn", "turn_seed"]

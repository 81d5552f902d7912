"""Sharded evaluation on a tiny random teacher: 1, 2 and 4 workers merge to the single-worker result; an
interrupted run resumes without losing or duplicating a turn; the plain multi-process launcher and msrun give
the same traces as the in-process API."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
import zlib

import pytest

from mindspore_eagle.app.build import Stack, oracle_factory
from mindspore_eagle.runtime import RuntimeConfig
from mindspore_eagle.drafting import DraftingConfig
from mindspore_eagle.engine import SpeculativeEngine
from mindspore_eagle.errors import ConfigError
from mindspore_eagle.evaluation.evalset import EvalItem
from mindspore_eagle.evaluation.evaluate import (MERGED_NAME, RunConfig, build_prompt, finished_turns, merge, run_shard,
                                      shard_path, strip_eos)
from mindspore_eagle.oracle import OracleProposer
from mindspore_eagle.teacher import Teacher
from mindspore_eagle.evaluation.trace import read_trace
from tests.helpers import load_script, torch_greedy

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUNTIME = dict(max_cache_len=96, buckets=(1, 8), prefill_chunk=8)  # two graphs: the tests stay fast
MAX_NEW = 8
DEPTH = 4
EOS = (2,)  # the tiny checkpoint's eos_token_id (LlamaConfig default), as the CLI uses it
ITEMS = [
    EvalItem("conv-a", "alpha", turns_ids=((3, 17, 42, 5), (9, 9, 1))),
    EvalItem("conv-b", "beta", turns_ids=((11, 12), (13,))),
    EvalItem("conv-c", "alpha", turns_ids=((50,),)),
    EvalItem("conv-d", "beta", turns_ids=((5, 6, 8, 9, 10, 12, 14, 15, 16),)),
    EvalItem("conv-e", "alpha", turns_ids=((20, 21, 22), (23, 24), (25,))),
]
NUM_TURNS = sum(i.num_turns for i in ITEMS)


class FlakyOracle(OracleProposer):
    """The teacher's own future as a chain, corrupted at a level that depends on the position: accepted
    lengths vary from step to step (0..DEPTH drafts), deterministically."""

    def propose(self, root_token):
        layout = super().propose(root_token)
        toks = [int(t) for t in layout.tokens[:layout.num_nodes]]
        cut = 1 + (self.pos + int(root_token)) % (DEPTH + 1)
        if cut < len(toks):
            toks[cut] = (toks[cut] + 1) % self.vocab
        return type(layout).from_parents(toks, [0] + list(range(len(toks) - 1)))


def flaky_factory(teacher):
    return lambda greedy: FlakyOracle(greedy.tokens, DEPTH, teacher.cfg.vocab_size)


@pytest.fixture(scope="module")
def tiny(hf_tiny):
    _, ms_dir, torch_model = hf_tiny("pangu")
    teacher = Teacher.load(ms_dir, RuntimeConfig(**RUNTIME))
    stack = Stack(teacher, SpeculativeEngine(teacher), None, EOS, ms_dir, flaky_factory(teacher), "flaky",
                  DraftingConfig(proposer="eagle", budget="fixed", max_nodes=DEPTH + 1, depth=DEPTH, top_k=1))
    return stack, ms_dir, torch_model


def config(stack, **kw):
    return dataclasses.replace(RunConfig.for_stack(stack, ITEMS, MAX_NEW), **kw)


def run(tiny, out, world=1, stack=None, **kw):
    stack = stack or tiny[0]
    for rank in range(world):
        run_shard(stack, ITEMS, config(stack), str(out), rank, world, log=lambda s: None, **kw)
    return merge(str(out))


def canonical(path):
    """Everything in a merged trace that does not depend on timing or on which worker ran the turn."""
    tf = read_trace(path)
    timing = {"rank", "greedy_s", "spec_s", "greedy_ttft_s", "spec_ttft_s", "greedy_tok_s", "spec_tok_s", "speedup",
              "spec_teacher_s", "spec_draft_s", "spec_host_s"}
    out = []
    for s in tf.turns:
        d = {k: v for k, v in vars(s).items() if k not in timing}
        d["steps"] = [(st.step, st.committed_len, st.tree_nodes, st.bucket, st.depth, st.accepted_len, st.bonus,
                       st.path, st.tokens) for st in tf.steps[s.turn]]
        out.append(d)
    return out


@pytest.fixture(scope="module")
def single(tiny, tmp_path_factory):
    out = tmp_path_factory.mktemp("single")
    m = run(tiny, out)
    return m, canonical(m.path)


def test_single_worker_runs_every_turn_losslessly_with_varied_acceptance(single):
    m, turns = single
    assert m.turns == NUM_TURNS and not m.missing and m.duplicates == 0
    assert [t["turn"] for t in turns] == sorted(t for i in ITEMS for t in i.turn_ids)
    assert all(t["lossless"] and t["spec_ids"] is None for t in turns)
    accepted = {st[5] for t in turns for st in t["steps"]}
    assert len(accepted) >= 3, accepted  # the flaky oracle makes several acceptance lengths
    for t in turns:
        assert t["emitted"] == sum(len(st[8]) for st in t["steps"]) and t["cycles"] == len(t["steps"])
        assert t["tau"] == pytest.approx(t["emitted"] / t["cycles"], abs=1e-4)
        assert t["seed"] == zlib.crc32(t["turn"].encode())


def test_later_turns_condition_on_the_teachers_greedy_answers(tiny, single):
    """Turn k's prompt is the earlier turns and greedy answers concatenated; its output is the teacher's greedy
    continuation, checked against HF transformers (no code shared with the engine)."""
    _, _, torch_model = tiny
    by_id = {t["turn"]: t for t in single[1]}
    item = ITEMS[4]
    answers = [by_id[t]["output_ids"] for t in item.turn_ids]
    prompt = build_prompt(item, 2, answers[:2], eos=EOS)
    assert prompt == [20, 21, 22, *strip_eos(answers[0], EOS), 23, 24, *strip_eos(answers[1], EOS), 25]
    assert by_id["conv-e-t3"]["prompt_tokens"] == len(prompt)
    want = torch_greedy(torch_model, prompt, MAX_NEW)
    got = list(answers[2])
    assert got == want[:len(got)] and (len(got) == MAX_NEW or got[-1] in EOS)


@pytest.mark.parametrize("world", [2, 4])
def test_merged_shards_equal_the_single_worker_run(tiny, single, tmp_path, world):
    m = run(tiny, tmp_path, world)
    assert canonical(m.path) == single[1]
    ranks = {s.turn: s.rank for s in read_trace(m.path).turns}
    # sharded by conversation: all turns of one conversation ran on the same worker, conversations round-robin
    for j, item in enumerate(sorted(ITEMS, key=lambda i: i.id)):
        assert {ranks[t] for t in item.turn_ids} == {j % world}
    assert sorted(os.listdir(tmp_path)) == sorted([MERGED_NAME] + [f"shard-{r:03d}.jsonl" for r in range(world)])


class Stop(Exception):
    pass


def test_interrupted_run_resumes_without_losing_or_duplicating_turns(tiny, single, tmp_path):
    stack = tiny[0]
    cfg = config(stack)
    seen = []

    def interrupt(summary):
        seen.append(summary.turn)
        if len(seen) == 3:
            raise Stop

    with pytest.raises(Stop):
        run_shard(stack, ITEMS, cfg, str(tmp_path), log=lambda s: None,
                  on_turn=interrupt)
    assert sorted(finished_turns(str(tmp_path))) == sorted(seen)
    # A kill in the middle of the next write: two of its step lines and half of its summary reach the disk.
    path = shard_path(str(tmp_path), 0)
    tf = read_trace(path)
    last = tf.turns[-1]
    step = json.dumps({"record": "step", "turn": "conv-zz", **vars(tf.steps[last.turn][0])})
    with open(path, "a") as f:
        f.write(step + "\n" + step + "\n" + last.to_json()[:40])
    tf = read_trace(path)
    assert tf.torn and tf.orphan_steps == 2 and len(tf.turns) == 3
    # Resume with a smaller limit first (only what is missing of the first 5 turns), then everything.
    resumed = run_shard(stack, ITEMS, cfg, str(tmp_path), log=lambda s: None,
                        limit=5)
    assert [s.turn for s in resumed] == [t for t in sorted(finished_turns(str(tmp_path))) if t not in seen]
    assert len(finished_turns(str(tmp_path))) == 5
    run_shard(stack, ITEMS, cfg, str(tmp_path), log=lambda s: None)
    tf = read_trace(path)
    assert not tf.torn and tf.orphan_steps == 0 and len(tf.turns) == NUM_TURNS
    assert len({s.turn for s in tf.turns}) == NUM_TURNS  # nothing ran twice
    assert len(tf.headers) == 3  # one per session
    m = merge(str(tmp_path))
    assert m.duplicates == 0 and not m.missing and canonical(m.path) == single[1]
    # A fourth session has nothing to do.
    assert run_shard(stack, ITEMS, cfg, str(tmp_path), log=lambda s: None) == []


def test_resuming_with_other_settings_is_refused(tiny, tmp_path):
    stack = tiny[0]
    run_shard(stack, ITEMS, config(stack), str(tmp_path), log=lambda s: None, limit=1)
    with pytest.raises(ConfigError, match="max_new_tokens"):
        run_shard(stack, ITEMS, config(stack, max_new_tokens=4), str(tmp_path), log=lambda s: None)


def test_resuming_after_the_model_changed_in_place_is_refused(tiny, tmp_path):
    """Same path, other content (a re-conversion or re-training in place): the fingerprint in the run header differs,
    and the rerun is refused naming the model, instead of mixing two models' turns in one trace."""
    import shutil

    stack, ms_dir, _ = tiny
    model = tmp_path / "model"
    shutil.copytree(ms_dir, model)
    copy = dataclasses.replace(stack, model_dir=str(model))
    out = tmp_path / "out"
    run_shard(copy, ITEMS, config(copy), str(out), log=lambda s: None, limit=1)
    assert len(finished_turns(str(out))) == 1
    weights = model / "weights.safetensors"
    data = bytearray(weights.read_bytes())
    data[-3] ^= 0x01  # one bit of the last weight: same size, same header
    weights.write_bytes(bytes(data))
    with pytest.raises(ConfigError, match=r"the content of .*model changed since that run"):
        run_shard(copy, ITEMS, config(copy), str(out), log=lambda s: None)


def test_a_session_that_fails_before_its_first_turn_leaves_nothing(tiny, tmp_path):
    """No header without a turn: a run that fails in warm-up does not lock OUT against the corrected rerun."""
    stack = tiny[0]

    def broken(greedy):
        raise ConfigError("a draft that cannot be built")

    bad = dataclasses.replace(stack, proposer_for=broken)
    with pytest.raises(ConfigError, match="cannot be built"):
        run_shard(bad, ITEMS, config(bad, max_new_tokens=4), str(tmp_path), log=lambda s: None, limit=1)
    assert not os.path.exists(shard_path(str(tmp_path), 0))
    run_shard(stack, ITEMS, config(stack), str(tmp_path), log=lambda s: None, limit=1)  # another config: accepted
    assert len(finished_turns(str(tmp_path))) == 1


def test_an_empty_prompt_is_refused_before_the_warm_up_compiles_anything(tiny):
    """The warm-up repeats its example prompt to each bucket length: an empty one was a ZeroDivisionError."""
    from mindspore_eagle.app.harness import warm_up

    stack = tiny[0]
    compiled = dict(stack.teacher.first_call_s)
    with pytest.raises(ConfigError, match="empty prompt"):
        warm_up(stack.engine, stack.proposer_for, [], MAX_NEW, EOS)
    assert stack.teacher.first_call_s == compiled


def test_a_turn_longer_than_the_cache_is_skipped_and_the_rest_runs(tiny, tmp_path, capsys):
    """The long turn (and the later turn of its conversation) is recorded as skipped with the reason; every other
    turn runs; a rerun does not retry it; merge and report say which turns are missing and why."""
    from mindspore_eagle.app.cli import _print_report

    stack = tiny[0]
    items = [EvalItem("conv-long", "alpha", turns_ids=(tuple(range(1, 101)), (7,))), *ITEMS[:2]]  # 100 > 96 rows
    cfg = dataclasses.replace(RunConfig.for_stack(stack, items, MAX_NEW))
    run_shard(stack, items, cfg, str(tmp_path), log=lambda s: None)
    done = finished_turns(str(tmp_path))
    assert sorted(done) == sorted(t for i in items[1:] for t in i.turn_ids)
    assert run_shard(stack, items, cfg, str(tmp_path), log=lambda s: None) == []  # nothing retried
    m = merge(str(tmp_path))
    assert m.skipped == ("conv-long-t1", "conv-long-t2") and not m.missing
    skipped = read_trace(m.path).skipped
    assert "does not fit the cache" in skipped[0].reason and "conv-long-t1" in skipped[1].reason
    _print_report([m.path], None)
    out = capsys.readouterr().out
    assert "2 turns were skipped" in out and "conv-long-t1: prompt of 100 tokens" in out


def test_report_names_the_selected_turns_that_have_no_result(tiny, tmp_path, capsys):
    from mindspore_eagle.app.cli import _print_report

    stack = tiny[0]
    run_shard(stack, ITEMS, config(stack), str(tmp_path), log=lambda s: None, limit=2)
    path = shard_path(str(tmp_path), 0)
    lines = open(path).read().splitlines()
    header = json.loads(lines[0])
    header["selected"] = header["selected"] + ["conv-e-t1"]  # asked for, never run
    open(path, "w").write("\n".join([json.dumps(header)] + lines[1:]) + "\n")
    _print_report([path], None)
    assert "1 selected turns have no result (first: conv-e-t1)" in capsys.readouterr().out


def test_spread_sample_runs_only_first_turns_of_spaced_conversations(tiny, tmp_path):
    stack = tiny[0]
    run_shard(stack, ITEMS, config(stack), str(tmp_path), log=lambda s: None, limit=2, spread=True)
    # conversations 0 and 5 // 2 = 2 of the five sorted ones: conv-a and conv-c; conv-a's second turn is not run
    assert sorted(finished_turns(str(tmp_path))) == ["conv-a-t1", "conv-c"]


def test_workers_share_a_spread_sample_even_when_its_stride_is_a_multiple_of_their_count(tiny, tmp_path):
    """A spread sample of 2 of the 5 conversations takes conv-a and conv-c (positions 0 and 2): sharding the whole
    set over 2 workers would give both to rank 0 and none to rank 1; sharding the sampled conversations gives one
    to each."""
    stack = tiny[0]
    for rank in range(2):
        run_shard(stack, ITEMS, config(stack), str(tmp_path), rank, 2, log=lambda s: None, limit=2, spread=True)
    by_rank = {}
    for s in finished_turns(str(tmp_path)).values():
        by_rank.setdefault(s.rank, []).append(s.turn)
    assert {r: sorted(t) for r, t in by_rank.items()} == {0: ["conv-a-t1"], 1: ["conv-c"]}


# ----- launchers -------------------------------------------------------------------------------------------------


def cli_flags(ms_dir, set_path):
    return ["--model", ms_dir, "--eval-set", set_path, "--draft", "oracle", "--depth", str(DEPTH),
            "--max-new-tokens", str(MAX_NEW), "--max-cache-len", str(RUNTIME["max_cache_len"]),
            "--buckets", "1,8", "--prefill-chunk", "8", "--no-plots"]


def write_set(path, copies=1):
    """ITEMS as an ``--eval-set`` file; ``copies`` > 1 repeats them under new ids (a longer run)."""
    with open(path, "w") as f:
        for k in range(copies):
            for i in ITEMS:
                line = {"id": i.id if k == 0 else f"{i.id}-{k}", "category": i.category,
                        "turns_ids": [list(t) for t in i.turns_ids]}
                f.write(json.dumps(line) + "\n")
    return str(path)


@pytest.fixture(scope="module")
def oracle_single(tiny, tmp_path_factory):
    """The in-process reference for the launchers: one worker, the CLI's oracle draft, the CLI's RunConfig."""
    stack, ms_dir, _ = tiny
    out = tmp_path_factory.mktemp("oracle_single")
    oracle = dataclasses.replace(stack, proposer_for=oracle_factory("oracle", DEPTH, stack.teacher.cfg.vocab_size),
                                 draft_label="oracle", drafting=DraftingConfig(head="oracle", depth=DEPTH))
    m = run(tiny, out, stack=oracle)
    return canonical(m.path)


def launch(argv, tmp_path, timeout=240, **env_extra):
    env = {**os.environ, "GLOG_v": "3", "VENV_BIN": os.path.dirname(sys.executable), **env_extra}
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.slow  # worker processes stay in the default suite through the SIGKILL-resume test
def test_plain_multiprocess_launcher_equals_the_in_process_run(tiny, oracle_single, tmp_path):
    _, ms_dir, _ = tiny
    out = tmp_path / "out"
    stdout = launch(["bash", os.path.join(ROOT, "scripts", "eval_local.sh"), "2", str(out),
                     *cli_flags(ms_dir, write_set(tmp_path / "set.jsonl"))], tmp_path)
    assert f"merged {NUM_TURNS} turns" in stdout
    assert f"lossless {NUM_TURNS}/{NUM_TURNS}" in stdout
    summary = json.loads(stdout.strip().splitlines()[-1])
    assert summary["turns"] == NUM_TURNS and summary["tau"] > 1
    assert canonical(str(out / MERGED_NAME)) == oracle_single
    assert {s.rank for s in read_trace(str(out / MERGED_NAME)).turns} == {0, 1}


def test_an_eval_worker_killed_with_sigkill_resumes_without_losing_a_turn(tiny, tmp_path):
    """A real ``kill -9`` of ``mindspore-eagle eval`` once at least one turn is on disk: the rerun of the same command
    loses no finished turn, runs none twice, leaves no stray file, and its merged trace equals an uninterrupted run
    of the same command. The set is ITEMS eight times over: a tiny-model turn takes milliseconds, and the kill must
    land before the last one."""
    import signal
    import time

    _, ms_dir, _ = tiny
    copies = 8
    set_path = write_set(tmp_path / "set.jsonl", copies)
    out, whole = tmp_path / "out", tmp_path / "whole"
    argv = [sys.executable, "-m", "mindspore_eagle.app.cli", "eval", "--out", str(out), *cli_flags(ms_dir, set_path)]
    env = {**os.environ, "GLOG_v": "3"}
    proc = subprocess.Popen(argv, env=env, cwd=str(tmp_path), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    shard = shard_path(str(out), 0)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        if os.path.exists(shard) and '"record":"turn"' in open(shard).read():
            break
        time.sleep(0.002)
    assert proc.poll() is None, "the run finished before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = finished_turns(str(out))
    assert 1 <= len(before) < copies * NUM_TURNS
    launch(argv, tmp_path)
    tf = read_trace(shard)
    assert len(tf.turns) == copies * NUM_TURNS == len({s.turn for s in tf.turns}) and not tf.torn
    assert tf.orphan_steps == 0
    assert {t: before[t].output_ids for t in before} == {t: s.output_ids for t, s in finished_turns(str(out)).items()
                                                          if t in before}
    assert sorted(os.listdir(out)) == sorted([MERGED_NAME, os.path.basename(shard)])  # no stray file
    launch([a if a != str(out) else str(whole) for a in argv], tmp_path)
    assert canonical(str(out / MERGED_NAME)) == canonical(str(whole / MERGED_NAME))


@pytest.mark.slow
def test_msrun_launcher_equals_the_in_process_run(tiny, oracle_single, tmp_path):
    _, ms_dir, _ = tiny
    if not os.path.exists(os.path.join(os.path.dirname(sys.executable), "msrun")):
        pytest.skip("msrun is not installed beside this python")
    out = tmp_path / "out"
    with socket.socket() as s:  # a free port for msrun's scheduler
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    launch(["bash", os.path.join(ROOT, "scripts", "eval_msrun.sh"), "2", str(out),
            *cli_flags(ms_dir, write_set(tmp_path / "set.jsonl"))], tmp_path, MASTER_PORT=str(port))
    assert canonical(str(out / MERGED_NAME)) == oracle_single
    assert sorted(os.listdir(out / "msrun_logs")) == ["scheduler.log", "worker_0.log", "worker_1.log"]


# ----- sweep and ablation experiments (experiments/: they must still run) ------------------------------------------


def test_sweep_and_ablation_experiments_write_their_tables_and_plots(tiny, tmp_path, monkeypatch, capsys):
    stack = tiny[0]
    sweep, ablate = load_script("experiments", "sweep_budget.py"), load_script("experiments", "ablate.py")
    for script in (sweep, ablate):
        monkeypatch.setattr(script, "build", lambda *a, **k: stack)
        monkeypatch.setattr(script, "load_items", lambda *a, **k: ITEMS)
    common = ["--draft", "oracle", "--limit", "2", "--max-new-tokens", "6"]
    assert sweep.main(["--out", str(tmp_path / "sw"), "--max-nodes", "3,5", "--depths", "2,4", "--top-ks", "1",
                       *common]) == 0
    out = capsys.readouterr().out
    assert "skip n=5 d=2 k=1" in out and "sweet spot: max_nodes=" in out
    rows = json.load(open(tmp_path / "sw" / "sweep_budget.json"))
    assert [(r["max_nodes"], r["depth"]) for r in rows] == [(3, 2), (3, 4), (5, 4)]
    assert all(r["turns"] == 2 and r["lossless_turns"] == 2 for r in rows)
    assert rows[2]["tau"] > rows[0]["tau"] > 1  # the oracle accepts every level: deeper trees, longer accepts
    assert (tmp_path / "sw" / "sweep_budget.md").read_text().startswith("| max_nodes | depth | top_k |")
    assert ablate.main(["--out", str(tmp_path / "ab"), "--what", "exec", "--exec-limit", "2",
                        "--exec-max-new-tokens", "6", "--depth", "3", "--max-nodes", "4", "--top-k", "1", *common]) == 0
    rows = json.load(open(tmp_path / "ab" / "ablate_exec.json"))
    assert [r["variant"] for r in rows] == ["performance", "reference"]
    assert all(r["turns"] == 2 and r["lossless_turns"] == 2 for r in rows)
    if __import__("importlib").util.find_spec("matplotlib"):
        assert (tmp_path / "sw" / "sweep_budget.png").is_file() and (tmp_path / "ab" / "ablate_exec.png").is_file()


def test_a_turn_with_bad_ids_is_recorded_and_the_run_goes_on(tiny, tmp_path):
    """Ids outside the vocabulary stopped the whole run with a ConfigError (issue 34); the turn is now recorded as
    skipped with the reason, the later turn of its conversation with it, and every other turn runs, even when the bad
    conversation comes first (the warm-up takes the first turn that can run)."""
    stack = tiny[0]
    items = [EvalItem("conv-0bad", "alpha", turns_ids=((1, 2, 10 ** 6), (7,))), *ITEMS[:2]]
    cfg = dataclasses.replace(RunConfig.for_stack(stack, items, MAX_NEW))
    run_shard(stack, items, cfg, str(tmp_path), log=lambda s: None)
    assert sorted(finished_turns(str(tmp_path))) == sorted(t for i in items[1:] for t in i.turn_ids)
    m = merge(str(tmp_path))
    assert m.skipped == ("conv-0bad-t1", "conv-0bad-t2")
    assert "outside the vocabulary" in read_trace(m.path).skipped[0].reason

"""The compile cache is used only in the way that cannot hand a graph the wrong file (storage.graph_cache), and the
fixed compile plan (app.compile_plan) compiles every graph a request meets, so a second process loads them all and
produces the same tokens."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import textwrap

import pytest

from mindspore_eagle.errors import EagleError
from mindspore_eagle.storage import graph_cache
from mindspore_eagle.storage.graph_cache import MARKER, GraphCache, prune

from .helpers import default_model_or_skip

LABELS = ["teacher argmax t=1", "teacher argmax t=8", "head growth"]


@pytest.fixture
def fresh_process(monkeypatch):
    """As a new process would be: no cache directory used yet, no graph compiled, the variables unset."""
    monkeypatch.setitem(graph_cache._PROCESS, "path", None)
    monkeypatch.setattr(graph_cache, "compiled_graphs", lambda: 0)
    monkeypatch.delenv("MS_COMPILER_CACHE_ENABLE", raising=False)
    monkeypatch.delenv("MS_COMPILER_CACHE_PATH", raising=False)


def fill(cache: GraphCache, counts=(1, 1, 1)):
    with cache.open() as use:
        assert os.environ.get("MS_COMPILER_CACHE_ENABLE") == "1"
        assert os.environ.get("MS_COMPILER_CACHE_PATH") == cache.path
        for label, n in zip(cache.labels, counts):
            use.step_done(label, n)
    graph_cache._PROCESS["path"] = None  # the next open plays a new process
    return use


def test_key_depends_on_every_part_and_label(tmp_path):
    base = GraphCache(str(tmp_path), {"model": "sha256:a", "sources": "x"}, LABELS)
    assert GraphCache(str(tmp_path), {"sources": "x", "model": "sha256:a"}, LABELS).path == base.path
    assert GraphCache(str(tmp_path), {"model": "sha256:b", "sources": "x"}, LABELS).path != base.path
    assert GraphCache(str(tmp_path), {"model": "sha256:a", "sources": "y"}, LABELS).path != base.path
    assert GraphCache(str(tmp_path), {"model": "sha256:a", "sources": "x"}, LABELS[::-1]).path != base.path


def test_a_complete_fill_is_loaded_by_the_next_process_and_the_switch_is_off_after_the_plan(tmp_path, fresh_process):
    cache = GraphCache(str(tmp_path), {"k": 1}, LABELS)
    assert fill(cache).mode == "fill"
    assert "MS_COMPILER_CACHE_ENABLE" not in os.environ  # nothing compiled after the plan is cached
    with open(os.path.join(cache.path, MARKER)) as f:
        assert json.load(f) == {"labels": LABELS, "counts": [1, 1, 1]}
    assert fill(cache).mode == "load"


def test_an_interrupted_fill_is_removed_and_filled_again(tmp_path, fresh_process):
    cache = GraphCache(str(tmp_path), {"k": 1}, LABELS)
    with pytest.raises(KeyboardInterrupt):
        with cache.open() as use:
            use.step_done(LABELS[0], 1)
            open(os.path.join(cache.path, "compile_cache_0.mindir"), "w").close()
            raise KeyboardInterrupt
    assert not os.path.exists(os.path.join(cache.path, MARKER))
    graph_cache._PROCESS["path"] = None
    with cache.open() as use:
        assert use.mode == "fill"
        assert os.listdir(cache.path) == []  # the half-written file is gone


def test_a_load_whose_graph_counts_differ_stops_and_removes_the_directory(tmp_path, fresh_process):
    cache = GraphCache(str(tmp_path), {"k": 1}, LABELS)
    fill(cache)
    with pytest.raises(EagleError, match="removed"):
        with cache.open() as use:
            assert use.mode == "load"
            use.step_done(LABELS[0], 1)
            use.step_done(LABELS[1], 2)  # one graph more than the fill compiled: the files no longer line up
    assert not os.path.exists(cache.path)


def test_a_directory_another_process_holds_is_not_used(tmp_path, fresh_process):
    cache = GraphCache(str(tmp_path), {"k": 1}, LABELS)
    fill(cache)
    with open(cache.path + ".lock", "a+") as other:  # another open file: flock conflicts as between processes
        fcntl.flock(other, fcntl.LOCK_EX)
        with cache.open() as use:
            assert use.mode == "off" and "another process" in use.reason
            assert "MS_COMPILER_CACHE_ENABLE" not in os.environ


def test_the_cache_is_off_after_a_compile_or_a_first_use_in_this_process(tmp_path, fresh_process, monkeypatch):
    cache = GraphCache(str(tmp_path), {"k": 1}, LABELS)
    monkeypatch.setattr(graph_cache, "compiled_graphs", lambda: 3)
    with cache.open() as use:
        assert use.mode == "off" and "compiled before the plan" in use.reason
    monkeypatch.setattr(graph_cache, "compiled_graphs", lambda: 0)
    with cache.open() as use:
        assert use.mode == "fill"
    other = GraphCache(str(tmp_path), {"k": 2}, LABELS)
    with other.open() as use:  # MindSpore keeps the first path: a second directory would get the first one's files
        assert use.mode == "off" and "already used" in use.reason


def test_mindspore_hashes_a_fixed_entry_script_during_the_plan_and_the_real_one_after(tmp_path, fresh_process):
    from mindspore.graph import api

    saved = api.entry_script_path
    with GraphCache(str(tmp_path), {"k": 1}, LABELS).open() as use:
        assert use.mode == "fill"
        assert api.entry_script_path == graph_cache.ENTRY  # python -c / python -m ... would make its scan raise
        assert api._get_compile_cache_dep_files() == [graph_cache.ENTRY]
    assert api.entry_script_path == saved


def test_a_dependency_scan_that_would_fail_turns_the_cache_off(tmp_path, fresh_process, monkeypatch):
    from mindspore.graph import api

    def scan():
        raise ImportError("no package specified for '..drafting.PROPOSERS'")  # what python -m once met

    monkeypatch.setattr(api, "_get_compile_cache_dep_files", scan)
    with GraphCache(str(tmp_path), {"k": 1}, LABELS).open() as use:
        assert use.mode == "off" and "ImportError" in use.reason
        assert "MS_COMPILER_CACHE_ENABLE" not in os.environ


def test_prune_keeps_the_most_recently_used_and_any_held_directory(tmp_path):
    paths = []
    for i in range(5):
        p = tmp_path / f"d{i}"
        p.mkdir()
        (p / MARKER).write_text("{}")
        os.utime(p / MARKER, (1000 + i, 1000 + i))
        paths.append(str(p))
    with open(paths[0] + ".lock", "a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        removed = prune(str(tmp_path), keep=2)
    assert sorted(removed) == paths[1:3]  # d0 is the oldest but held; d3, d4 are the newest
    assert sorted(os.listdir(tmp_path)) == ["d0", "d0.lock", "d3", "d4"]


CHILD = textwrap.dedent("""
    import json, sys
    from mindspore_eagle.app.build import build
    from mindspore_eagle.app.compile_plan import compile_ahead
    from mindspore_eagle.app.harness import warm_up
    from mindspore_eagle.drafting import DraftingConfig
    from mindspore_eagle.runtime import Buckets, RuntimeConfig
    from mindspore_eagle.storage.graph_cache import compiled_graphs

    # three buckets, not seven: the same plan steps, half the compiles (the default suite's time)
    stack = build(None, RuntimeConfig(buckets=Buckets((1, 4, 32)), prefill_chunk=32), DraftingConfig())
    proposer = stack.proposer_for(None)
    plan = compile_ahead(stack, proposer, cache_root=sys.argv[1])
    after_plan = compiled_graphs()
    ids = stack.tokenizer.encode_chat([{"role": "user", "content": "List three uses of a paper clip."}])
    warm_up(stack.engine, stack.proposer_for, ids, 24, stack.eos)
    spec = stack.engine.generate(ids, 24, stack.eos, proposer=proposer)
    print(json.dumps({"mode": plan.mode, "graphs": plan.graphs, "after_plan": compiled_graphs() - after_plan,
                      "tokens": spec.tokens}))
""")


def run_twice(tmp_path, source: str) -> tuple[dict, dict]:
    """Run the child script ``source`` in two fresh processes on one cache root; their JSON lines. The first must
    fill the cache and the second load it, the same number of graphs, at least eight."""
    default_model_or_skip()
    child = tmp_path / "child.py"
    child.write_text(source)
    runs = []
    for _ in range(2):
        proc = subprocess.run([sys.executable, str(child), str(tmp_path / "graphs")], capture_output=True, text=True,
                              timeout=600, env={**os.environ, "GLOG_v": "3"})
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    first, second = runs
    assert (first["mode"], second["mode"]) == ("fill", "load")
    assert first["graphs"] == second["graphs"] >= 8
    return first, second


def test_a_second_process_loads_every_graph_of_the_plan_and_decodes_the_same_tokens(tmp_path):
    first, second = run_twice(tmp_path, CHILD)  # teacher, row moves, head context and growth
    # the plan is complete: the warm-up and the request (tree buckets the adaptive budget chose) compiled nothing
    assert first["after_plan"] == 0 and second["after_plan"] == 0
    assert second["tokens"] == first["tokens"]


BATCH_CHILD = textwrap.dedent("""
    import json, sys
    from mindspore_eagle.app.compile_plan import compile_batch_ahead
    from mindspore_eagle.runtime import Buckets, RuntimeConfig
    from mindspore_eagle.serving.stack import build_batch
    from mindspore_eagle.storage.graph_cache import compiled_graphs
    from mindspore_eagle.verify import SamplingParams

    stack = build_batch(None, 4, 320, RuntimeConfig(buckets=Buckets((1, 4, 32)), prefill_chunk=32))
    plan = compile_batch_ahead(stack, sys.argv[1])
    after_plan = compiled_graphs()
    engine, chat = stack.engine, lambda p: stack.tokenizer.encode_chat([{"role": "user", "content": p}])
    reqs = [engine.submit(chat("Copy this list exactly: apples, bananas, cherries, dates, figs."), 24, stack.eos),
            engine.submit(chat("Name three rivers."), 24, stack.eos, SamplingParams(0.8, 0.9, 0, 7)),
            engine.submit(chat("What is the capital of France?"), 24, stack.eos, proposer="eagle"),
            engine.submit(chat("Write a haiku about snow."), 24, stack.eos, max_nodes=1)]
    while engine.has_work():
        engine.step()
    print(json.dumps({"mode": plan.mode, "graphs": plan.graphs, "after_plan": compiled_graphs() - after_plan,
                      "tokens": [list(r.tokens) for r in reqs]}))
""")


# slow: the cache's load in a second process stays in the default suite through the generate plan's test above
@pytest.mark.slow
def test_a_second_server_start_loads_the_batch_engines_warm_up_and_serves_the_same_tokens(tmp_path):
    first, second = run_twice(tmp_path, BATCH_CHILD)
    # greedy, sampled, head-only and plain requests in one batch met no graph the warm-up had not compiled
    assert first["after_plan"] == 0 and second["after_plan"] == 0
    assert second["tokens"] == first["tokens"] and all(first["tokens"])


def test_a_lock_file_pruned_between_open_and_lock_is_not_trusted(tmp_path, fresh_process, monkeypatch):
    cache = GraphCache(str(tmp_path), {"k": 1}, LABELS)
    real_flock = fcntl.flock

    def flock_after_prune(f, op):
        real_flock(f, op)
        os.remove(cache.path + ".lock")  # pruned by another process between our open and our lock
        open(cache.path + ".lock", "a").close()  # and a third process made a new one (it may lock that one)

    monkeypatch.setattr(graph_cache.fcntl, "flock", flock_after_prune)
    with cache.open() as use:
        assert use.mode == "off" and "another process" in use.reason


def test_there_is_no_plan_where_nothing_compiles():
    from types import SimpleNamespace

    from mindspore_eagle.app.compile_plan import compile_ahead
    from mindspore_eagle.runtime import ExecMode

    def stack(fused: bool, mode: ExecMode):
        teacher = SimpleNamespace(cell=SimpleNamespace(fused_attention=fused))
        return SimpleNamespace(engine=SimpleNamespace(teacher=teacher, runtime=SimpleNamespace(exec_mode=mode)))

    assert compile_ahead(stack(True, ExecMode.REFERENCE)) is None  # PyNative: the plan would only run forwards
    assert compile_ahead(stack(False, ExecMode.PERFORMANCE)) is None  # primitive attention: no plan (docstring)

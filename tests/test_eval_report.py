"""Report math on a hand-made trace equals values worked out by hand; the trace reader drops interrupted turns;
`report` draws its plots with matplotlib and still prints every table without it."""

from __future__ import annotations

import json
import math
import os
import sys

import pytest

from mindspore_eagle.app import cli
from mindspore_eagle.evaluation.report import PLOTS_SKIPPED, load, report
from mindspore_eagle.evaluation.trace import read_trace
from tests.helpers import legacy_step_record, turn_record


@pytest.fixture
def trace(tmp_path):
    # speedups 1.0, 2.0, 1.5, 3.0; per-turn tau 2, 4, 2, 5 (36 tokens over 13 cycles)
    lines = [{"record": "run", "config": {"max_new_tokens": 12}, "rank": 0, "world": 1, "selected": []},
             legacy_step_record("humaneval-000", 0, 1.0), legacy_step_record("humaneval-000", 1, 3.0),
             turn_record("humaneval-000", "humaneval", 1.0, 2.0, 2.0, 4, 8),
             turn_record("humaneval-001", "humaneval", 2.0, 2.0, 1.0, 2, 8),
             turn_record("mtbench-081-t1", "writing", 1.5, 3.0, 2.0, 5, 10),
             turn_record("mtbench-081-t2", "writing", 3.0, 3.0, 1.0, 2, 10, lossless=False),
             legacy_step_record("mtbench-082-t1", 0, 50.0)]  # an interrupted turn: steps, no summary
    p = tmp_path / "traces.jsonl"
    p.write_text("\n".join(json.dumps(d) for d in lines) + "\n" + '{"record": "turn", "turn": "mtb')  # torn tail
    return str(p)


def test_trace_reader_keeps_finished_turns_only(trace):
    tf = read_trace(trace)
    assert [t.turn for t in tf.turns] == ["humaneval-000", "humaneval-001", "mtbench-081-t1", "mtbench-081-t2"]
    assert tf.torn and tf.orphan_steps == 1
    assert [s.grow_ms for s in tf.steps["humaneval-000"]] == [1.0, 3.0] and tf.steps["humaneval-001"] == []
    legacy = tf.steps["humaneval-000"][0]  # the old verify (10 ms) was host work + the forward (9 ms)
    assert (legacy.verify_ms, legacy.host_ms, legacy.commit_ms, legacy.update_ms) == (9.0, 1.0, 1.0, 0.0)


def test_report_math_on_a_hand_made_trace(trace):
    r = report(load([trace]))
    assert r["turns"] == 4 and r["lossless_turns"] == 3
    assert r["tau"] == 2.769  # 36 / 13
    assert r["speedup_mean"] == 1.875  # (1 + 2 + 1.5 + 3) / 4
    assert r["speedup_p50"] == 1.75  # sorted 1, 1.5, 2, 3: halfway between 1.5 and 2
    assert r["speedup_p90"] == 2.7  # rank 0.9 * 3 = 2.7: 2 + 0.7 * (3 - 2)
    assert r["speedup_p99"] == 2.97  # rank 2.97: 2 + 0.97
    # Pearson: tau deviations (-1.25, .75, -1.25, 1.75), speedup deviations (-.875, .125, -.375, 1.125)
    assert r["corr_tau_speedup"] == round(3.625 / math.sqrt(6.75 * 2.1875), 3) == 0.943
    assert r["tok_s_greedy"] == 4.8 and r["tok_s_spec"] == 8.0  # 48 tokens in 10 s and in 6 s
    assert r["overhead_share"] == 0.1  # a legacy trace: 1 - 0.8 (teacher) - 0.1 (draft)
    assert r["step_ms"]["grow"] == 2.0 and r["step_ms"]["verify"] == 9.0  # the orphan step is not counted
    assert r["step_ms"]["host"] == 1.0
    assert r["by_category"] == {
        "humaneval": {"turns": 2, "lossless_turns": 2, "tau": 2.667, "speedup_mean": 1.5, "speedup_p50": 1.5,
                      "tok_s_greedy": 6.0, "tok_s_spec": 8.0},
        "writing": {"turns": 2, "lossless_turns": 1, "tau": 2.857, "speedup_mean": 2.25, "speedup_p50": 2.25,
                    "tok_s_greedy": 4.0, "tok_s_spec": 8.0}}
    assert r["by_source"]["mtbench"] == r["by_category"]["writing"]


def test_overhead_share_is_host_time_only_in_current_traces(tmp_path):
    lines = [{"record": "run", "config": {}, "rank": 0, "world": 1, "selected": []},
             {**turn_record("humaneval-000", "humaneval", 1.0, 2.0, 2.0, 4, 8), "spec_host_s": 0.05},
             {**turn_record("humaneval-001", "humaneval", 2.0, 2.0, 1.0, 2, 8), "spec_host_s": 0.15}]
    p = tmp_path / "t.jsonl"
    p.write_text("\n".join(json.dumps(d) for d in lines) + "\n")
    assert report(load([str(p)]))["overhead_share"] == 0.0667  # (0.05 + 0.15) s of 3 s spec time


def test_a_turn_in_two_files_counts_once(trace, tmp_path):
    other = tmp_path / "copy.jsonl"
    other.write_text(open(trace).read().rsplit("\n", 1)[0] + "\n")
    loaded = load([trace, str(other)])
    assert len(loaded.turns) == 4 and loaded.duplicates == 4


def test_report_cli_draws_three_plots(trace, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    plots = tmp_path / "plots"
    assert cli.main(["report", trace, "--plots", str(plots), "--json", str(tmp_path / "r.json")]) == 0
    out = capsys.readouterr().out
    assert sorted(os.listdir(plots)) == ["speedup_cdf.png", "tau_hist.png", "tau_vs_speedup.png"]
    assert all((plots / f).read_bytes()[:4] == b"\x89PNG" for f in os.listdir(plots))
    assert json.loads(out.strip().splitlines()[-1]) == json.load(open(tmp_path / "r.json"))
    assert "speedup mean 1.875  p50 1.75  p90 2.7  p99 2.97" in out


def test_report_cli_without_matplotlib_prints_tables_and_a_note(trace, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` now raises ImportError
    assert cli.main(["report", trace, "--plots", str(tmp_path / "plots")]) == 0
    out = capsys.readouterr().out
    assert PLOTS_SKIPPED in out and not (tmp_path / "plots").exists()
    assert "humaneval" in out and "writing" in out and "lossless 3/4" in out


def test_report_cli_names_a_missing_trace(tmp_path, capsys):
    assert cli.main(["report", str(tmp_path / "nope.jsonl")]) == 2
    assert "nope.jsonl" in capsys.readouterr().err


def test_compressed_traces_read_like_plain_ones(trace, tmp_path):
    import gzip

    gz = tmp_path / "merged.jsonl.gz"
    gz.write_bytes(gzip.compress(open(trace, "rb").read()))
    assert report(load([str(tmp_path)])) == report(load([trace]))

"""The training-runs report reads the trainer's state files: best evaluation per run, table and JSON lines."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def _state(path, taus, tokens):
    path.mkdir()
    hist = [{"step": 50 * i, "tau": t, "acc": [0.5, 0.4], "loss": 1.0, "peak_rss_gb": 3.0 + i}
            for i, t in enumerate(taus)]
    (path / "state.json").write_text(json.dumps({"step": 50 * (len(taus) - 1), "train_seconds": 600.0,
                                                 "history": hist, "data": {"train_answer_tokens": tokens}}))


def test_report_picks_each_runs_best_evaluation_and_writes_table_and_json(tmp_path):
    _state(tmp_path / "a", [1.2, 1.9, 1.7], 1000)
    _state(tmp_path / "b", [1.1, 1.3], 2000)
    script = os.path.join(os.path.dirname(__file__), "..", "scripts", "head_runs_report.py")
    out = subprocess.run([sys.executable, script, str(tmp_path / "out"), f"small={tmp_path / 'a'}",
                          f"big={tmp_path / 'b'}"], capture_output=True, text=True, check=True).stdout
    rows = [json.loads(line) for line in (tmp_path / "out" / "runs.jsonl").read_text().splitlines()]
    assert [(r["run"], r["best_step"], r["best_tau"], r["peak_rss_gb"]) for r in rows] == [
        ("small", 50, 1.9, 5.0), ("big", 50, 1.3, 4.0)]
    assert "| small | 1000 |" in (tmp_path / "out" / "table.md").read_text() and '"run": "big"' in out
    bad = subprocess.run([sys.executable, script, str(tmp_path / "out"), f"x={tmp_path / 'missing'}"],
                         capture_output=True, text=True)
    assert bad.returncode != 0 and "state.json" in bad.stderr


def test_runs_of_different_ttt_lengths_compare_on_their_common_depth():
    import runpy

    mod = runpy.run_path(os.path.join(os.path.dirname(__file__), "..", "scripts", "head_runs_report.py"))
    add_common_depth, tau_over = mod["add_common_depth"], mod["tau_over"]

    assert tau_over([0.5, 0.5, 0.5], 2) == 1.75 and tau_over([0.5], 3) == 1.5
    rows = [{"best_acc": [0.6, 0.5, 0.4, 0.3]}, {"best_acc": [0.7, 0.4]}]
    assert add_common_depth(rows) == 2
    assert [r["tau_common"] for r in rows] == [1.9, 1.98]

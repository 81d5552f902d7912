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


def test_scaling_table_orders_by_data_and_reports_passes_and_why_each_run_stopped(tmp_path):
    script = os.path.join(os.path.dirname(__file__), "..", "scripts", "head_runs_report.py")
    for name, taus, tokens, positions, stop in (("big", [1.0, 1.5, 1.8], 4000, 51200, "steps"),
                                                ("small", [1.0, 1.4, 1.3], 1000, 1024, "plateau")):
        _state(tmp_path / name, taus, tokens)
        state = json.loads((tmp_path / name / "state.json").read_text())
        state["data"]["train_positions"], state["stopped_by"] = positions, stop
        (tmp_path / name / "state.json").write_text(json.dumps(state))
    _state(tmp_path / "ref", [2.0], 4000)  # another head on the same held-out sample, drawn as a line
    subprocess.run([sys.executable, script, str(tmp_path / "out"), f"big={tmp_path / 'big'}",
                    f"small={tmp_path / 'small'}", "--scaling", "--reference", f"ref={tmp_path / 'ref'}"],
                   capture_output=True, text=True, check=True)
    lines = (tmp_path / "out" / "scaling.md").read_text().splitlines()[2:]
    # 100 steps x 1024 entries: 100 passes over 1,024 positions, 2 over 51,200; tau over depth 2 of acc .5/.4
    assert lines[0].startswith("| small | 1,000 |") and "| 100 | 100.0 | plateau | 50 | 1.700 |" in lines[0]
    assert lines[1].startswith("| big | 4,000 |") and "| 100 | 2.0 | steps | 100 | 1.700 |" in lines[1]
    assert (tmp_path / "out" / "scaling.png").stat().st_size > 0


def test_a_malformed_or_misplaced_reference_is_refused_before_anything_is_written(tmp_path):
    script = os.path.join(os.path.dirname(__file__), "..", "scripts", "head_runs_report.py")
    _state(tmp_path / "run", [1.0, 1.5], 4000)
    for extra, message in ((["--scaling", "--reference", str(tmp_path / "run")], "expected NAME=RUN_DIR"),
                           (["--reference", f"ref={tmp_path / 'run'}"], "add --scaling")):
        out = tmp_path / "out"
        proc = subprocess.run([sys.executable, script, str(out), f"run={tmp_path / 'run'}", *extra],
                              capture_output=True, text=True)
        assert proc.returncode != 0 and message in proc.stderr, proc.stderr
        assert not out.exists()

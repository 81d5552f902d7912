"""The multi-worker generation launcher: 2 workers on CPU under msrun (and the plain multi-process fallback)
shard prompts ``range(rank, n, world)``, each writes its own JSONL, the merge holds every prompt exactly once, and
every speculative generation equals the teacher's greedy one.

The tiny teacher and draft head are written here with numpy + safetensors in the public HF / EAGLE-3 layouts
(no torch, so the MindFormers environment reuses them: ``tests/mindformers/test_adapter.py``).
``kind="copy"`` builds a pair whose greedy continuation repeats the last prompt token and whose head predicts
exactly that (its ``fc`` picks the layer-0 tap, i.e. the token embedding, and its ``lm_head`` is the teacher's
embedding table), so drafts are accepted; ``kind="random"`` gives a non-degenerate teacher whose drafts are
mostly rejected. Lossless must hold for both.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys

import numpy as np
import pytest

from tests.helpers import make_tiny_pair

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "multi_generate.py")
TINY = dict(vocab=101, hidden=64, inter=96, layers=2, heads=4, kv=2)  # head_dim 16: also fits the fused op
PROMPTS = [[3, 17, 42, 5], [9, 8, 7], [60, 61, 62, 63, 64], [11, 22], [1, 2, 3, 4, 5, 6]]
RUN_FLAGS = ["--max-cache-len", "96", "--buckets", "1,8,16", "--prefill-chunk", "8", "--max-nodes", "8",
             "--depth", "3", "--top-k", "4", "--max-new-tokens", "10"]


def write_prompts(path: str) -> str:
    with open(path, "w") as f:
        for p in PROMPTS:
            f.write(json.dumps({"prompt_ids": p}) + "\n")
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("msrun_tiny"))
    teacher, head = make_tiny_pair(root, "random")
    return teacher, head, write_prompts(os.path.join(root, "prompts.jsonl"))


def _env() -> dict:
    venv_bin = os.path.dirname(sys.executable)
    env = {**os.environ, "PATH": venv_bin + os.pathsep + os.environ.get("PATH", ""), "GLOG_v": "3",
           "PYTHON": sys.executable, "MASTER_PORT": str(free_port())}
    for key in ("MS_ROLE", "RANK_ID", "RANK_SIZE", "MS_COMPILER_CACHE_ENABLE", "MS_COMPILER_CACHE_PATH"):
        env.pop(key, None)
    return env


def _check_outputs(out: str, world: int) -> None:
    ranks = {}
    for r in range(world):
        with open(os.path.join(out, f"rank{r}.jsonl")) as f:
            ranks[r] = [json.loads(line) for line in f]
    for r, rows in ranks.items():  # rank r holds exactly prompts r, r + world, ...
        assert [row["id"] for row in rows] == list(range(r, len(PROMPTS), world))
        assert all(row["rank"] == r for row in rows)
    with open(os.path.join(out, "generations.jsonl")) as f:
        merged = [json.loads(line) for line in f]
    assert [row["id"] for row in merged] == list(range(len(PROMPTS)))
    for row in merged:
        assert row["prompt_tokens"] == PROMPTS[row["id"]]
        assert row["lossless"] and row["tokens"] == row["greedy_tokens"] and len(row["tokens"]) == 10
    with open(os.path.join(out, "summary.json")) as f:
        summary = json.load(f)
    assert summary["prompts"] == len(PROMPTS) and summary["lossless_prompts"] == len(PROMPTS)


def test_msrun_two_cpu_workers_shard_prompts_and_stay_lossless(tiny, tmp_path):
    if shutil.which("msrun", path=os.path.dirname(sys.executable)) is None:
        pytest.skip("msrun is not installed next to this Python (it ships with MindSpore)")
    teacher, head, prompts = tiny
    out = str(tmp_path / "out")
    cmd = ["bash", os.path.join(ROOT, "scripts", "msrun_generate.sh"), "2", out, "--model", teacher, "--draft", head,
           "--prompts", prompts, "--mode", "bench", *RUN_FLAGS]
    proc = subprocess.run(cmd, env=_env(), cwd=str(tmp_path), capture_output=True, text=True, timeout=600)
    log_dir = os.path.join(out, "msrun")
    logs = "".join(open(os.path.join(log_dir, f)).read()[-3000:] for f in sorted(os.listdir(log_dir))
                   ) if os.path.isdir(log_dir) else ""
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:] + logs
    _check_outputs(out, 2)
    # the scheduler copy exited at once: only the two workers logged a shard
    worker_logs = [f for f in os.listdir(os.path.join(out, "msrun")) if f.startswith("worker")]
    assert len(worker_logs) == 2
    assert "prompts" not in open(os.path.join(out, "msrun", "scheduler.log")).read()


@pytest.mark.slow  # sharding over workers stays in the default suite through the msrun test
def test_fallback_launcher_without_msrun_gives_the_same_shards(tiny, tmp_path):
    teacher, head, prompts = tiny
    out = str(tmp_path / "out")
    cmd = [sys.executable, SCRIPT, "--workers", "2", "--out", out, "--model", teacher, "--draft", head,
           "--prompts", prompts, "--mode", "bench", *RUN_FLAGS]
    proc = subprocess.run(cmd, env=_env(), cwd=str(tmp_path), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:] + "".join(
        open(os.path.join(out, f"worker_{r}.log")).read()[-2000:] for r in range(2) if os.path.exists(
            os.path.join(out, f"worker_{r}.log")))
    _check_outputs(out, 2)


def test_scheduler_role_exits_without_working(tmp_path):
    env = {**_env(), "MS_ROLE": "MS_SCHED", "RANK_ID": "0", "RANK_SIZE": "2"}
    proc = subprocess.run([sys.executable, SCRIPT, "--out", str(tmp_path / "out"), "--model", "/nonexistent"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and not os.path.exists(tmp_path / "out")


def test_shard_takes_every_world_th_prompt():
    from mindspore_eagle.evaluation.sharding import shard

    items = list(range(5))
    assert shard(items, 0, 2) == [0, 2, 4] and shard(items, 1, 2) == [1, 3]
    assert sorted(shard(items, 0, 3) + shard(items, 1, 3) + shard(items, 2, 3)) == items

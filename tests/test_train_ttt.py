"""Draft-head training on a tiny random teacher: the TTT unroll against a naive
numpy reference (step k must read step k-1's output, not the teacher features), the draft vocabulary, and a
few optimizer steps lowering the loss."""

from __future__ import annotations

import numpy as np
import pytest

from mindspore_eagle.train.vocab import DraftVocab, build_draft_vocab, count_tokens

PROMPTS = [[1, 5, 9, 13, 17, 21, 25], [3, 8, 2], [40, 41, 42, 43, 44], [7, 70, 77, 7, 70]]
NEW = 8


@pytest.fixture(scope="module")
def tiny_dir(tiny_taps_dir):
    return tiny_taps_dir


@pytest.fixture(scope="module")
def tiny(tiny_dir):
    from mindspore_eagle.runtime import RuntimeConfig
    from mindspore_eagle.teacher import Teacher

    rt = dict(max_cache_len=48, exec_mode="reference", buckets=(1, 8), prefill_chunk=8)
    return tuple(Teacher.load(tiny_dir, RuntimeConfig(batch_size=b, **rt)) for b in (4, 1))


def _generate(teacher, prompts, new, prefix="s"):
    """Greedy answers + features for id prompts with the training-data generator (``train.batch_greedy``)."""
    from mindspore_eagle.evaluation.evalset import EvalItem
    from mindspore_eagle.train.batch_greedy import BatchGreedyGenerator

    items = [EvalItem(f"{prefix}{i}", "test", turns_ids=(tuple(int(t) for t in p),)) for i, p in enumerate(prompts)]
    done = {}
    BatchGreedyGenerator(teacher, new, (), topk=8).run(items, lambda f: done.__setitem__(f.item.id, f.sequences[0]))
    return [done[i.id] for i in items]


@pytest.fixture(scope="module")
def tiny_seqs(tiny):
    return _generate(tiny[0], PROMPTS, NEW)


def _one_shard_args(tiny, tiny_dir, tmp_path, seed: int, prompt_len: int, prefix: str) -> list[str]:
    """``train-draft`` arguments over a one-shard data set of 16 random prompts answered by the tiny teacher."""
    import json
    import os

    from mindspore_eagle.train.data import MANIFEST, write_shard

    rng = np.random.default_rng(seed)
    seqs = _generate(tiny[0], [list(rng.integers(1, 90, size=prompt_len)) for _ in range(16)], NEW, prefix=prefix)
    data = tmp_path / "data"
    data.mkdir()
    name = os.path.basename(write_shard(str(data), 0, seqs))
    (data / MANIFEST).write_text(json.dumps({"shard": name, "ids": [s.pid for s in seqs]}) + "\n")
    return ["train-draft", "--teacher", tiny_dir, "--data", str(data), "--ttt-steps", "2", "--buckets", "16",
            "--tokens-per-batch", "64", "--heldout", "0.25", "--dtype", "float32"]


def test_draft_vocab_keeps_the_most_frequent_ids_and_a_consistent_map():
    from mindspore_eagle.draft_config import DraftConfig
    from mindspore_eagle.models.eagle3 import check_vocab_map

    counts = count_tokens([np.array([5, 5, 5, 9, 9, 2, 7, 7, 7, 7])], 12)
    v = build_draft_vocab(counts, 4, always=[11])
    assert list(v.target_ids) == [5, 7, 9, 11]  # 7 (x4), 5 (x3), 9 (x2) + forced EOS 11; ascending
    assert list(v.d2t) == [5, 6, 7, 8] and list(np.flatnonzero(v.t2d)) == [5, 7, 9, 11]
    assert v.draft_of[9] == 2 and v.draft_of[2] == -1
    cfg = DraftConfig(hidden_size=8, intermediate_size=8, num_heads=2, num_kv_heads=1, vocab_size=12,
                      draft_vocab_size=4)
    check_vocab_map(cfg, v.d2t, v.t2d, "test")
    assert np.array_equal(DraftVocab.from_d2t(v.d2t, 12).target_ids, v.target_ids)
    secondary = np.zeros(12, np.int64)
    secondary[10] = 3  # unseen ids: the teacher's frequent candidate 10 beats lower ids 0, 1, ...
    assert list(build_draft_vocab(counts, 5, secondary=secondary).target_ids) == [2, 5, 7, 9, 10]


def _head(tiny, seqs, vocab_size=60, seed=0):
    from mindspore_eagle.draft_config import DraftConfig
    from mindspore_eagle.train.trainer import init_head

    t = tiny[0]
    c = t.cfg
    vocab = build_draft_vocab(count_tokens([s.tokens for s in seqs], c.vocab_size), vocab_size)
    cfg = DraftConfig(hidden_size=c.hidden_size, intermediate_size=c.intermediate_size, num_heads=c.num_heads,
                      num_kv_heads=c.num_kv_heads, vocab_size=c.vocab_size, draft_vocab_size=vocab.size,
                      head_dim=c.head_dim, rms_norm_eps=c.rms_norm_eps, rope_theta=c.rope_theta)
    head, table = init_head(cfg, t.cell, vocab, seed)
    return head, table, vocab


# ---- numpy reference of the TTT unroll (per entry, keys listed explicitly) ---------------------------------
def _rms(x, w, eps):
    return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps) * w


def _rope(x, pos, inv_freq):
    ang = pos * inv_freq
    cos, sin = np.cos(np.concatenate([ang, ang])), np.sin(np.concatenate([ang, ang]))
    half = x.shape[-1] // 2
    return x * cos + np.concatenate([-x[..., half:], x[..., :half]], -1) * sin


def np_unroll(head, table, ids, feats, steps, recycle=True):
    """``recycle=False`` is the wrong objective (every step reads fc(teacher features)): used to show the
    test can tell the two apart."""
    cfg = head.cfg
    W = {n: p.asnumpy().astype(np.float64) for n, p in head.weight_parameters().items()}
    eps, nh, nkv, d = cfg.rms_norm_eps, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    inv_freq = 1.0 / cfg.rope_theta ** (np.arange(0, d, 2) / d)
    t = feats.shape[0]
    fc = feats.astype(np.float64) @ W["fc.weight"]
    hidden = fc
    K = {}  # (step, entry) -> (k [nkv, d] rotated, v [nkv, d])
    outs = []
    for k in range(steps):
        out = np.zeros_like(hidden)
        for i in range(t):
            e = table[ids[i + 1 + k]].astype(np.float64)
            x = np.concatenate([_rms(e, W["midlayer.input_layernorm.weight"], eps),
                                _rms(hidden[i], W["midlayer.hidden_norm.weight"], eps)])
            q = (x @ W["midlayer.self_attn.q_proj.weight"]).reshape(nh, d)
            kk = (x @ W["midlayer.self_attn.k_proj.weight"]).reshape(nkv, d)
            vv = (x @ W["midlayer.self_attn.v_proj.weight"]).reshape(nkv, d)
            q = _rope(q, i + k, inv_freq)
            K[(k, i)] = (_rope(kk, i + k, inv_freq), vv)
        for i in range(t):
            e = table[ids[i + 1 + k]].astype(np.float64)
            x = np.concatenate([_rms(e, W["midlayer.input_layernorm.weight"], eps),
                                _rms(hidden[i], W["midlayer.hidden_norm.weight"], eps)])
            q = _rope((x @ W["midlayer.self_attn.q_proj.weight"]).reshape(nh, d), i + k, inv_freq)
            visible = [(0, j) for j in range(i + 1)] + [(s, i) for s in range(1, k + 1)]
            ks = np.stack([K[v][0] for v in visible])  # [n, nkv, d]
            vs = np.stack([K[v][1] for v in visible])
            heads = []
            for h in range(nh):
                g = h // (nh // nkv)
                sc = ks[:, g] @ q[h] / np.sqrt(d)
                pr = np.exp(sc - sc.max())
                pr /= pr.sum()
                heads.append(pr @ vs[:, g])
            hh = hidden[i] + np.concatenate(heads) @ W["midlayer.self_attn.o_proj.weight"]
            m = _rms(hh, W["midlayer.post_attention_layernorm.weight"], eps)
            gate = m @ W["midlayer.mlp.gate_proj.weight"]
            act = gate / (1 + np.exp(-gate)) * (m @ W["midlayer.mlp.up_proj.weight"])
            out[i] = hh + act @ W["midlayer.mlp.down_proj.weight"]
        outs.append(out)
        hidden = out if recycle else fc
    return outs


def test_ttt_step_k_reads_step_k_minus_1_output(tiny, tiny_seqs):
    """Every step's output equals the reference that feeds step k with step k-1's output; the alternative
    (feeding the teacher features again) differs, so a forward that ignored its own outputs would fail here."""
    from mindspore import Tensor

    from mindspore_eagle.train.ttt import TTTLoss, pack_batch

    head, table, vocab = _head(tiny, tiny_seqs, seed=1)
    rng = np.random.default_rng(0)
    for name, p in head.weight_parameters().items():  # larger weights than the 0.02 init: steps differ visibly
        if p.ndim == 2 and name != "lm_head.weight":
            p.set_data(Tensor(rng.normal(0, 0.3, p.shape).astype(np.float32)))
    steps, t = 3, 12
    cell = TTTLoss(head, table, steps)
    ids, feats = pack_batch(tiny_seqs[:2], vocab, t, steps)[:2]
    outs = [o.asnumpy() for o in cell.unroll(Tensor(ids), Tensor(feats))]
    for b in range(2):
        ref = np_unroll(head, table, ids[b], feats[b], steps)
        wrong = np_unroll(head, table, ids[b], feats[b], steps, recycle=False)
        for k in range(steps):
            np.testing.assert_allclose(outs[k][b], ref[k], rtol=1e-3, atol=1e-3, err_msg=f"step {k}")
        for k in range(1, steps):
            assert np.abs(wrong[k] - ref[k]).max() > 100 * 1e-3, "test cannot tell recycling from features"


def test_a_few_training_steps_lower_the_loss(tiny, tiny_seqs):
    from mindspore_eagle.train.trainer import Trainer

    head, table, vocab = _head(tiny, tiny_seqs)
    tr = Trainer(head, table, vocab, steps=2, lr=3e-3, warmup=1, total_steps=1000, jit=False)
    losses = [tr.train_batch(16, tiny_seqs)[0] for _ in range(6)]
    assert losses[-1] < 0.8 * losses[0], losses
    ev = tr.evaluate([(16, tiny_seqs)])
    assert len(ev["acc"]) == 2 and 1.0 <= ev["tau"] <= 3.0


def test_simulated_tau_is_one_plus_sum_of_prefix_products():
    from mindspore_eagle.train.ttt import simulated_tau

    assert simulated_tau([0.5, 0.5, 1.0]) == pytest.approx(1 + 0.5 + 0.25 + 0.25)
    assert simulated_tau([0.0, 1.0]) == 1.0


def test_training_resumes_from_its_checkpoint_with_identical_state(tiny, tiny_seqs, tmp_path):
    """``last.safetensors`` holds head and optimizer moments: a fresh trainer restored from it takes the
    same next step (same loss, same weights) as the trainer that wrote it."""
    from mindspore_eagle.train.trainer import LAST_FILE, Trainer

    head, table, vocab = _head(tiny, tiny_seqs, seed=3)
    tr = Trainer(head, table, vocab, steps=2, lr=3e-3, warmup=1, total_steps=1000, jit=False)
    for _ in range(2):
        tr.train_batch(16, tiny_seqs)
    tr.save(str(tmp_path), LAST_FILE)
    head2, _, _ = _head(tiny, tiny_seqs, seed=4)  # different initial weights: restore must overwrite them all
    tr2 = Trainer(head2, table, vocab, steps=2, lr=3e-3, warmup=1, total_steps=1000, jit=False)
    tr2.restore(str(tmp_path / LAST_FILE))
    tr2.step = tr.step
    a, b = tr.train_batch(16, tiny_seqs)[0], tr2.train_batch(16, tiny_seqs)[0]
    assert a == pytest.approx(b, rel=1e-6)
    for name, p in head.weight_parameters().items():
        np.testing.assert_allclose(head2.weight_parameters()[name].asnumpy(), p.asnumpy(), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("jit", [True, False])
def test_learning_rate_schedule_reaches_the_compiled_step(tiny, tiny_seqs, jit):
    """Each step uses the schedule's current learning rate: a zero rate leaves the weights unchanged and a
    positive one moves them (a rate set on the host after compilation was once silently ignored)."""
    from mindspore_eagle.train.trainer import Trainer

    head, table, vocab = _head(tiny, tiny_seqs, seed=5)
    tr = Trainer(head, table, vocab, steps=2, lr=3e-3, warmup=1, total_steps=1000, jit=jit)

    def change(lr):
        before = {n: p.asnumpy().copy() for n, p in head.weight_parameters().items()}
        tr.schedule = lambda step, frac=0.0: lr
        tr.train_batch(16, tiny_seqs)
        return max(np.abs(p.asnumpy() - before[n]).max() for n, p in head.weight_parameters().items())

    assert change(3e-3) > 1e-3  # Adam moves every touched weight by about lr
    assert change(0.0) == 0.0
    assert change(3e-2) > 1e-2


def _train_draft_args(tiny, tiny_dir, tmp_path, ckpt_every: int = 1) -> list[str]:
    """``train-draft`` arguments for a run on 24 generated conversations of the tiny teacher (2 shards)."""
    import json
    import os

    from mindspore_eagle.train.data import MANIFEST, write_shard

    rng = np.random.default_rng(7)
    prompts = [list(rng.integers(1, 90, size=int(rng.integers(3, 8)))) for _ in range(24)]
    seqs = _generate(tiny[0], prompts, NEW, prefix="p")
    data = tmp_path / "data"
    data.mkdir()
    names = [os.path.basename(write_shard(str(data), k, seqs[k * 12:(k + 1) * 12])) for k in range(2)]
    (data / MANIFEST).write_text("".join(json.dumps({"shard": n, "ids": [s.pid for s in seqs[k * 12:(k + 1) * 12]]})
                                         + "\n" for k, n in enumerate(names)))
    return ["train-draft", "--teacher", tiny_dir, "--data", str(data), "--out", str(tmp_path / "head"),
            "--run-dir", str(tmp_path / "run"), "--draft-vocab", "40", "--ttt-steps", "2", "--buckets", "16",
            "--tokens-per-batch", "64", "--heldout", "0.25", "--eval-every", "2", "--ckpt-every", str(ckpt_every),
            "--dtype", "float32"]


# slow: the trainer's CLI end to end (~77 s on a 2-vCPU Zen 3); resume with identical state stays in the default suite
# (test_training_resumes_from_its_checkpoint_with_identical_state), export in test_train_export
@pytest.mark.slow
def test_train_draft_cli_trains_exports_and_resumes(tiny, tiny_dir, tmp_path, capsys):
    """``mindspore-eagle train-draft`` end to end on a tiny teacher: trains to --max-steps, exports a head the
    converter loads, and a second call with a larger budget resumes from the checkpoint (same step count,
    training time carried over) instead of starting again."""
    import json
    import os

    from mindspore_eagle.convert.eagle3 import convert_eagle3
    from mindspore_eagle.app import cli

    args = _train_draft_args(tiny, tiny_dir, tmp_path)
    assert cli.main(args + ["--max-steps", "3", "--train-eval-max", "4"]) == 0
    state = json.loads((tmp_path / "run" / "state.json").read_text())
    assert state["step"] == 3 and state["train_seconds"] > 0 and state["history"][-1]["step"] == 3
    # every evaluation also scored a fixed training sample (the train/held-out gap), on the same TTT steps
    assert all(len(h["train"]["acc"]) == 2 and h["train"]["positions"] > 0 for h in state["history"])
    assert cli.main(args + ["--max-steps", "3", "--train-eval-max", "-1"]) == 2
    assert "--train-eval-max -1" in capsys.readouterr().err
    assert state["stopped_by"] == "steps" and [h["step"] for h in state["history"]] == [0, 2, 3]
    data_info = state["data"]
    assert data_info["train_positions"] > data_info["train_answer_tokens"] > 0  # prompts count as positions
    assert sorted(os.listdir(tmp_path / "head")) == ["config.json", "model.safetensors"]
    cfg = convert_eagle3(str(tmp_path / "head"), str(tmp_path / "ours"))
    assert cfg.draft_vocab_size == 40 and cfg.hidden_size == tiny[0].cfg.hidden_size
    capsys.readouterr()
    assert cli.main(args + ["--max-steps", "5"]) == 0
    assert "resumed from step 3" in capsys.readouterr().err
    state2 = json.loads((tmp_path / "run" / "state.json").read_text())
    assert state2["step"] == 5 and state2["train_seconds"] >= state["train_seconds"]
    # a held-out gain of 10 never comes: patience 1 stops at the first evaluation after step 0 and says so
    plateau = [a if a != str(tmp_path / "run") else str(tmp_path / "run-plateau") for a in args]
    assert cli.main(plateau + ["--max-steps", "9", "--patience", "1", "--min-delta", "10"]) == 0
    state3 = json.loads((tmp_path / "run-plateau" / "state.json").read_text())
    assert state3["stopped_by"] == "plateau" and state3["step"] == 2 and len(state3["history"]) == 2


@pytest.mark.slow  # a trainer run of ~40 s on a 2-vCPU Zen 3; resume-with-identical-state stays in the default suite
def test_sigterm_stops_a_run_after_its_batch_saves_it_and_exports_the_head(tiny, tiny_dir, tmp_path, monkeypatch,
                                                                            capsys):
    """A SIGTERM (a background job's session ending) during step 3 of a 6-step run: the run finishes that batch,
    saves it (no evaluation: ``--ckpt-every 5`` would not have saved step 3), exports the head and returns 0, with
    the previous SIGTERM handler back; a resume starts from step 3."""
    import json
    import os
    import signal
    import threading

    from mindspore_eagle.app import cli
    from mindspore_eagle.train import trainer as tr

    assert threading.current_thread() is threading.main_thread()  # else the signal would kill the test process
    args = _train_draft_args(tiny, tiny_dir, tmp_path, ckpt_every=5)
    real = tr.Trainer.train_batch

    def train_batch(self, *a, **k):
        if self.step == 2:  # this call trains step 3
            os.kill(os.getpid(), signal.SIGTERM)
        return real(self, *a, **k)

    monkeypatch.setattr(tr.Trainer, "train_batch", train_batch)
    before = signal.getsignal(signal.SIGTERM)
    assert cli.main(args + ["--max-steps", "6"]) == 0
    assert signal.getsignal(signal.SIGTERM) is before
    state = json.loads((tmp_path / "run" / "state.json").read_text())
    assert state["step"] == 3 and state["stopped_by"] == "signal"
    assert [h["step"] for h in state["history"]] == [0, 2]
    assert "SIGTERM: stopping after step 3" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path / "head")) == ["config.json", "model.safetensors"]
    monkeypatch.setattr(tr.Trainer, "train_batch", real)
    assert cli.main(args + ["--max-steps", "4"]) == 0
    assert "resumed from step 3" in capsys.readouterr().err
    assert json.loads((tmp_path / "run" / "state.json").read_text())["step"] == 4


@pytest.mark.slow  # a trainer run of ~50 s on a 2-vCPU Zen 3
def test_a_run_started_from_a_head_keeps_its_weights_and_moves_lm_head_rows_by_token(tiny, tiny_dir, tmp_path):
    """``--init-head``: with ``--vocab-from-head`` and ``--max-steps 0`` the exported head equals the initial one
    tensor for tensor (the evaluation-only baseline of a new data set); with a vocabulary built from the data,
    every token both vocabularies hold keeps its lm_head row."""
    from safetensors.numpy import load_file

    from mindspore_eagle.app import cli

    common = _one_shard_args(tiny, tiny_dir, tmp_path, seed=11, prompt_len=5, prefix="q")

    def run(out, *extra):
        assert cli.main(common + ["--out", str(tmp_path / out), "--run-dir", str(tmp_path / f"run-{out}"),
                                  *extra]) == 0
        return load_file(str(tmp_path / out / "model.safetensors"))

    first = run("h1", "--draft-vocab", "40", "--max-steps", "2")
    same = run("h2", "--init-head", str(tmp_path / "h1"), "--vocab-from-head", "--max-steps", "0")
    assert sorted(same) == sorted(first)
    assert all(np.array_equal(same[k], first[k]) for k in first)
    moved = run("h3", "--init-head", str(tmp_path / "h1"), "--draft-vocab", "30", "--max-steps", "0")
    old_ids = np.arange(40) + first["d2t"]
    new_ids = np.arange(30) + moved["d2t"]
    shared = np.intersect1d(old_ids, new_ids)
    assert len(shared) >= 20
    for t in shared:  # lm_head is [Vd, H] in the public layout
        assert np.array_equal(moved["lm_head.weight"][np.searchsorted(new_ids, t)],
                              first["lm_head.weight"][np.searchsorted(old_ids, t)])
    assert np.array_equal(moved["fc.weight"], first["fc.weight"])


@pytest.mark.slow  # four trainer runs (~19 s); a niche of --init-head, whose default-suite test is the one above
def test_a_widened_head_drafts_exactly_as_the_head_it_grew_from(tiny, tiny_dir, tmp_path, capsys):
    """``--head-intermediate`` wider than ``--init-head``: the exported head holds the old MLP units first and a
    zero down-projection for the new ones (public layout: gate/up ``[I, H]``, down ``[H, I]``), every other tensor
    unchanged, and the trainer's step-0 held-out evaluation scores it exactly as the narrow head; narrowing and a
    non-positive width are refused (exit 2) naming the flag."""
    import json

    from safetensors.numpy import load_file

    from mindspore_eagle.app import cli

    common = _one_shard_args(tiny, tiny_dir, tmp_path, seed=13, prompt_len=6, prefix="w")

    def run(out, *extra):
        code = cli.main(common + ["--out", str(tmp_path / out), "--run-dir", str(tmp_path / f"run-{out}"), *extra])
        if code != 0:
            return code
        state = json.loads((tmp_path / f"run-{out}" / "state.json").read_text())
        return load_file(str(tmp_path / out / "model.safetensors")), state["history"][0]

    narrow, _ = run("n", "--draft-vocab", "40", "--max-steps", "2")
    width = narrow["midlayer.mlp.gate_proj.weight"].shape[0]
    same, same_eval = run("s", "--init-head", str(tmp_path / "n"), "--vocab-from-head", "--max-steps", "0")
    wide, wide_eval = run("w", "--init-head", str(tmp_path / "n"), "--vocab-from-head", "--max-steps", "0",
                          "--head-intermediate", str(2 * width))
    for k in ("gate_proj", "up_proj"):
        w = wide[f"midlayer.mlp.{k}.weight"]
        assert w.shape == (2 * width, narrow[f"midlayer.mlp.{k}.weight"].shape[1])
        assert np.array_equal(w[:width], narrow[f"midlayer.mlp.{k}.weight"]) and np.abs(w[width:]).max() > 0
    down = wide["midlayer.mlp.down_proj.weight"]
    assert np.array_equal(down[:, :width], narrow["midlayer.mlp.down_proj.weight"]) and not down[:, width:].any()
    assert all(np.array_equal(wide[k], same[k]) for k in same if "mlp" not in k)
    assert wide_eval["tau"] == same_eval["tau"] and wide_eval["acc"] == same_eval["acc"]
    capsys.readouterr()
    assert run("x", "--init-head", str(tmp_path / "n"), "--vocab-from-head", "--max-steps", "0",
               "--head-intermediate", str(width // 2)) == 2
    assert "widened, not narrowed" in capsys.readouterr().err
    assert run("z", "--head-intermediate", "0", "--max-steps", "0") == 2
    assert "--head-intermediate 0" in capsys.readouterr().err

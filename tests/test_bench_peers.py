"""The peer benchmark's fast parts: the stop rule and the summary, the patched copy of SafeAILab/EAGLE (on a fake
source tree: each patch applies once and changes behaviour as intended), the head copy, the transformers worker's
measurement (on a tiny random model against a full-recompute greedy), that transformers' chat template gives
our prompt ids, and the llama.cpp rows: the f32 GGUF holds the original's dequantized tensors, the rows' names and
their "not run" reason, and the worker's measurement through the real protocol on a stand-in ``llama_cpp`` module
(llama-cpp-python itself lives in its own venv, never needed here). A full run is a benchmark
(bench/bench_peers.py), not a test."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import types

import numpy as np
import pytest

from tests.helpers import default_gguf_or_skip, default_model_or_skip, load_script, make_hf_checkpoint, torch_greedy

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def peers():
    return load_script("bench", "bench_peers.py")


# ----- stop rule and summary ---------------------------------------------------------------------------------------


def test_clip_keeps_the_first_end_of_turn_token_and_at_most_n_tokens(peers):
    assert peers.clip([5, 2, 7, 2], eos=[2, 0], max_new_tokens=8) == (5, 2)
    assert peers.clip([5, 6, 7], eos=[2], max_new_tokens=2) == (5, 6)
    assert peers.clip([0], eos=[2, 0], max_new_tokens=4) == (0,)
    assert peers.first_difference((1, 2, 3), (1, 9, 3)) == 1
    assert peers.first_difference((1, 2), (1, 2, 3)) == 2
    assert peers.first_difference((1, 2), (1, 2)) is None


def _run(peers, name, outputs, seconds, cycles=None, cycle_tokens=None, group="float32"):
    cycles = cycles or [len(t) - 1 for t in outputs]
    cycle_tokens = cycle_tokens or [len(t) - 1 for t in outputs]
    return peers.Run(name, prompts=tuple(peers.PromptRun(tuple(t), s, c, k)
                                         for t, s, c, k in zip(outputs, seconds, cycles, cycle_tokens)), group=group)


def test_summary_counts_equal_outputs_and_divides_by_the_reference_of_the_same_pass(peers):
    greedy = [[1, 2, 3, 4], [5, 6]]
    runs = [
        _run(peers, "hf greedy float32", greedy, [1.5, 1.5]),
        _run(peers, "ours greedy float32", greedy, [2.0, 1.0]),
        _run(peers, "ours spec float32", greedy, [1.0, 0.5], cycles=[1, 1], cycle_tokens=[3, 1]),
        _run(peers, "hf greedy float32", greedy, [3.0, 3.0], group="bfloat16"),  # the reference, slower this pass
        _run(peers, "hf greedy bfloat16", [[1, 2, 9, 9], [5, 6]], [1.0, 1.0], group="bfloat16"),
        _run(peers, "hf pld3 bfloat16", [[1, 2, 9, 4], [5, 6]], [1.0, 1.0], cycles=[2, 1], cycle_tokens=[3, 1],
             group="bfloat16"),
        peers.Run("ours spec bfloat16", "not run", "no --dtype yet", group="bfloat16"),
    ]
    rows = peers.summarize_runs(runs)
    assert rows["hf greedy float32"]["tok_s"] == 2.0 and rows["hf greedy float32"]["x_hf"] == 1.0
    spec = rows["ours spec float32"]
    assert spec["tok_s"] == 4.0 and spec["x_hf"] == 2.0 and spec["tau"] == 2.0  # 6 tokens / 1.5 s; (3 + 1) / 2 cycles
    assert spec["x_hf_mean"] == round((4 / 1.0 / (4 / 1.5) + 2 / 0.5 / (2 / 1.5)) / 2, 3)
    assert spec["same_as_ours_greedy"] == spec["same_as_hf_greedy"] == spec["same_as_own_greedy"] == 2
    assert rows["ours greedy float32"]["x_hf"] == 1.0 and rows["ours greedy float32"]["tau"] == 1.0
    assert "same_as_own_greedy" not in rows["ours greedy float32"]
    again = rows["hf greedy float32 (bfloat16 pass)"]
    assert again["tok_s"] == 1.0 and again["same_as_hf_greedy"] == 2
    pld = rows["hf pld3 bfloat16"]
    assert pld["ref_tok_s"] == 1.0 and pld["x_hf"] == 3.0  # against the bf16 pass's own measurement of the reference
    assert pld["same_as_ours_greedy"] == 1 and pld["first_diff_vs_hf_greedy"] == [2, None]
    assert pld["same_as_own_greedy"] == 1 and pld["first_diff_vs_own_greedy"] == [3, None]  # vs hf greedy bf16
    assert pld["tau"] == round(4 / 3, 3)
    assert rows["ours spec bfloat16"] == {"status": "not run", "reason": "no --dtype yet", "group": "bfloat16"}
    json.dumps(rows, allow_nan=False)
    table = peers.format_table(rows)
    assert "NOT RUN: no --dtype yet" in table and "2/2" in table and "1/2" in table


def test_summary_without_a_reference_leaves_ratio_and_equality_out(peers):
    rows = peers.summarize_runs([_run(peers, "hf pld5 float32", [[1, 2]], [1.0]),
                                 peers.Run("hf greedy float32", "failed", "worker exit 1", group="float32")])
    row = rows["hf pld5 float32"]
    assert row["x_hf"] is None and row["x_hf_mean"] is None
    assert not any(k.startswith("same_as") for k in row)
    json.dumps(rows, allow_nan=False)
    assert "FAILED: worker exit 1" in peers.format_table(rows)


def test_a_reference_with_other_prompts_is_refused(peers):
    with pytest.raises(ValueError, match="prompts"):
        peers.summarize_runs([_run(peers, "ours greedy float32", [[1], [2]], [1.0, 1.0]),
                              _run(peers, "eagle float32", [[1]], [1.0])])


def test_own_greedy_pairs_each_speculative_row_with_the_greedy_of_its_library_and_precision(peers):
    assert peers.own_greedy("ours spec bfloat16") == "ours greedy bfloat16"
    assert peers.own_greedy("hf pld10 float32") == "hf greedy float32"
    assert peers.own_greedy("eagle bfloat16") == "hf greedy bfloat16"
    assert peers.own_greedy("hf greedy bfloat16") is None and peers.own_greedy("ours greedy float32") is None


def test_every_pass_holds_the_reference_and_ours_comes_before_eagle(peers):
    passes = peers.plan_passes(["ours", "hf", "pld", "eagle"], ["bfloat16", "float32"], [3, 10])
    assert [g for g, _ in passes] == ["float32", "bfloat16"]
    names = [[n for j in jobs for n in j.names] for _, jobs in passes]
    assert names[0] == ["hf greedy float32", "ours greedy float32", "ours spec float32", "hf pld3 float32",
                        "hf pld10 float32", "eagle float32"]
    assert names[1] == ["hf greedy float32", "ours greedy bfloat16", "ours spec bfloat16", "hf greedy bfloat16",
                        "hf pld3 bfloat16", "hf pld10 bfloat16", "eagle bfloat16"]
    assert [j.fields.get("check_prompt_ids") for _, jobs in passes for j in jobs if j.names == ("hf greedy float32",)] \
        == [True, False]
    assert peers.turn_order("abc", 0) == ["a", "b", "c"] and peers.turn_order("abc", 4) == ["b", "c", "a"]
    assert peers.turn_order([], 3) == []


# ----- the worker protocol, with a stand-in worker -----------------------------------------------------------------

STAND_IN = """
import json, sys, time
req = json.load(open(sys.argv[sys.argv.index("--request") + 1]))
def send(m):
    sys.stdout.write(MARK + json.dumps(m) + "\\n"); sys.stdout.flush()
print("library noise on stdout")
if req["mode"] == "not_run":
    send({"not_run": "no such option"}); sys.exit(0)
if req["mode"] == "hang":
    time.sleep(60)
send({"ready": req["rows"], "info": {"budget": 7}})
for line in iter(sys.stdin.readline, ""):
    cmd = line.split()
    if cmd[0] == "run":
        i = int(cmd[1])
        if req["mode"] == "crash" and i == 1:
            print("Traceback: boom", file=sys.stderr); sys.exit(3)
        send({"runs": {n: {"tokens": [i, i + 1], "seconds": 0.5, "cycles": 1, "cycle_tokens": 1} for n in req["rows"]}})
    else:
        send({"info": {req["rows"][0]: {"quit": True}}}); sys.exit(0)
"""


def _stand_in(peers, tmp_path, mode, rows=("a float32",), timeout=30.0):
    script = tmp_path / "stand_in.py"
    script.write_text(f"MARK = {peers.MARK!r}\n" + STAND_IN)
    job = peers.Job("hf", tuple(rows), {})
    return peers.Worker(job, {"mode": mode, "rows": list(rows)}, str(tmp_path), timeout, mode,
                        cmd=[sys.executable, str(script)])


def test_worker_protocol_collects_prompts_and_final_info(peers, tmp_path):
    w = _stand_in(peers, tmp_path, "ok", rows=("a float32", "b float32"))
    assert w.status == "ok" and w.ready_info == {"budget": 7}
    for i in range(2):
        msg = w.ask(f"run {i}")
        for name, d in msg["runs"].items():
            w.prompts[name][i] = peers.PromptRun.from_dict(d)
    w.close()
    a, b = w.runs("float32", 2)
    assert a.status == b.status == "ok" and a.prompts[1].tokens == (1, 2) and a.info == {"quit": True}
    assert b.info == {} and w.proc.returncode == 0
    assert "library noise on stdout" in (tmp_path / "ok.log").read_text()


def test_a_crashing_silent_or_refusing_worker_becomes_a_row_with_its_reason(peers, tmp_path):
    w = _stand_in(peers, tmp_path, "crash")
    assert w.ask("run 0") is not None and w.ask("run 1") is None
    assert w.status == "failed" and "exited with code 3" in w.reason and "Traceback: boom" in w.reason
    w.close()
    assert w.runs("float32", 2)[0].status == "failed"
    w = _stand_in(peers, tmp_path, "hang", timeout=1.0)
    assert w.status == "failed" and "no answer within 1 s" in w.reason and w.proc.poll() is not None
    w.close()
    w = _stand_in(peers, tmp_path, "not_run")
    w.close()
    (row,) = w.runs("bfloat16", 2)
    assert row.status == "not run" and row.reason == "no such option"


# ----- the patched EAGLE copy, on a fake source tree ----------------------------------------------------------------


def _fake_eagle_files(peers) -> dict[str, str]:
    """A tree holding each patch's snippet inside just enough code to run it, plus files the patches do not touch."""
    old = {(p.path, i): p.old for i, p in enumerate(peers.EAGLE_PATCHES)}
    by_file = {}
    for (path, _), text in old.items():
        by_file.setdefault(path, []).append(text)
    imports, configpath = by_file["eagle/model/ea_model.py"]
    tied, llama_rope = by_file["eagle/model/modeling_llama_kv.py"]
    (head_rope,) = by_file["eagle/model/cnets.py"]
    rotary = ("class LlamaRotaryEmbedding:\n"
              "    def __init__(self, dim, max_position_embeddings=2048, base=10000):\n"
              "        self.dim, self.max_position_embeddings, self.base = dim, max_position_embeddings, base\n"
              "        self.inv_freq = [1.0 / base ** (i / dim) for i in range(0, dim, 2)]\n\n"
              "    def _set_cos_sin_cache(self):\n"
              "        pass\n\n\n"
              "class Attention:\n"
              "    def __init__(self, config):\n"
              "        self.config, self.head_dim, self.max_position_embeddings = config, 8, 16\n"
              "        self._init_rope()\n\n"
              "    def _init_rope(self):\n")
    return {
        "eagle/__init__.py": "",
        "eagle/model/__init__.py": "",
        "eagle/model/utils.py": "TOPK = 10  # untouched\n",
        "eagle/train/main.py": "raise SystemExit('not part of the copy')\n",
        "eagle/model/ea_model.py": ("import os\n" + imports + "\n\ndef from_pretrained(base_model, ea_model_path):\n"
                                    + configpath + "        return configpath\n"),
        "eagle/model/modeling_llama_kv.py": (rotary + llama_rope + "        else:\n"
                                             "            raise KeyError('type')\n\n\nclass LlamaForCausalLM:\n"
                                             + tied),
        "eagle/model/cnets.py": (rotary + head_rope + "            else:\n"
                                 "                self.rotary_emb = LlamaRotaryEmbedding(self.head_dim)\n"
                                 "        else:\n"
                                 "            raise KeyError('type')\n"),
    }


def _write_tree(root, files):
    for rel, text in files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)


def _git_repo(root, files):
    _write_tree(root, files)
    git = ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t"]
    for cmd in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "fake EAGLE"]):
        subprocess.run(git + cmd, check=True, capture_output=True)
    return subprocess.run(git + ["rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()


def _import_copy(src_dir, name):
    sys.path.insert(0, src_dir)
    try:
        for mod in [m for m in sys.modules if m == "eagle" or m.startswith("eagle.")]:
            del sys.modules[mod]
        return importlib.import_module(name)
    finally:
        sys.path.remove(src_dir)


def test_eagle_copy_from_a_git_dir_and_a_checkout_applies_each_patch_once(peers, tmp_path):
    files = _fake_eagle_files(peers)
    rev = _git_repo(tmp_path / "repo", files)
    for src in (tmp_path / "repo" / ".git", tmp_path / "repo"):  # bare-style git directory, then the checkout
        out, got_rev = peers.prepare_eagle_source(str(src), str(tmp_path / f"work-{src.name}"))
        assert got_rev == rev and os.path.basename(out) == f"eagle-src-{rev[:12]}"
        copied = {os.path.relpath(os.path.join(d, n), out) for d, _, ns in os.walk(out) for n in ns}
        assert copied == {"eagle/__init__.py", "eagle/model/__init__.py", "eagle/model/utils.py",
                          "eagle/model/ea_model.py", "eagle/model/modeling_llama_kv.py", "eagle/model/cnets.py"}
        with open(os.path.join(out, "eagle/model/utils.py")) as f:
            assert f.read() == files["eagle/model/utils.py"]
        for p in peers.EAGLE_PATCHES:
            with open(os.path.join(out, p.path)) as f:
                text = f.read()
            assert text.count(p.new) == 1 and text.count(p.old) == p.new.count(p.old), p.why  # some new keep old
    with open(tmp_path / "repo" / "eagle/model/cnets.py") as f:
        assert f.read() == files["eagle/model/cnets.py"]  # the source is never modified


def test_patched_copy_reads_transformers_5_rope_and_rebuilds_rotary_buffers(peers, tmp_path):
    files = _fake_eagle_files(peers)
    _write_tree(tmp_path / "orig", files)
    out, _ = peers.prepare_eagle_source(str(tmp_path / "orig"), str(tmp_path / "work"))
    v5 = types.SimpleNamespace(rope_scaling={"rope_theta": 1e5, "rope_type": "default"},
                               rope_parameters={"rope_theta": 1e5, "rope_type": "default"})
    v4 = types.SimpleNamespace(rope_scaling=None, rope_theta=5e5)
    for module in ("eagle.model.cnets", "eagle.model.modeling_llama_kv"):
        original = _import_copy(str(tmp_path / "orig"), module)
        with pytest.raises(KeyError):
            original.Attention(v5)  # what upstream does under transformers 5
        patched = _import_copy(out, module)
        assert patched.Attention(v5).rotary_emb.base == 1e5
        assert patched.Attention(v4).rotary_emb.base == 5e5  # transformers 4 configs still read
    llama = _import_copy(out, "eagle.model.modeling_llama_kv")
    assert llama.LlamaForCausalLM._tied_weights_keys == {"lm_head.weight": "model.embed_tokens.weight"}

    ea_model = _import_copy(out, "eagle.model.ea_model")  # Mixtral/Qwen modules absent: imported as None
    assert ea_model.KVMixtralForCausalLM is None and ea_model.KVQwen3ForCausalLM is None
    rot = llama.LlamaRotaryEmbedding(8, max_position_embeddings=16, base=1e5)
    expected = list(rot.inv_freq)
    rot.inv_freq = "uninitialised"  # what meta-device loading leaves
    base_model = types.SimpleNamespace(modules=lambda: [object(), rot])
    assert ea_model.from_pretrained(base_model, "/head") == "/head/config.json"
    assert rot.inv_freq == expected and rot.base == 1e5


def test_a_missing_or_repeated_snippet_is_refused_naming_the_file(peers, tmp_path):
    files = _fake_eagle_files(peers)
    cnets = files["eagle/model/cnets.py"]
    for bad, expect in ((cnets.replace("rope_scaling is None", "rope_scaling == None"), "found 0 times"),
                        (cnets + "\n" + cnets, "found 2 times")):
        with pytest.raises(peers.PatchError, match=rf"eagle/model/cnets.py: snippet {expect}"):
            peers.apply_patches({**files, "eagle/model/cnets.py": bad})
    with pytest.raises(peers.PatchError, match="neither a checkout"):
        peers.read_eagle_files(str(tmp_path))


def test_head_copy_drops_target_hidden_size_only_when_it_equals_hidden_size(peers, tmp_path):
    for target, kept in ((576, False), (4096, True)):
        src = tmp_path / f"head{target}"
        src.mkdir()
        (src / "config.json").write_text(json.dumps({"hidden_size": 576, "target_hidden_size": target}))
        (src / "model.safetensors").write_bytes(b"weights")
        out = tmp_path / f"copy{target}"
        peers.prepare_head_copy(str(src), str(out))
        cfg = json.loads((out / "config.json").read_text())
        assert ("target_hidden_size" in cfg) == kept and cfg["hidden_size"] == 576
        assert (out / "model.safetensors").read_bytes() == b"weights"
        assert json.loads((src / "config.json").read_text())["target_hidden_size"] == target


# ----- the transformers worker and the prompt ids ---------------------------------------------------------------------


def test_hf_worker_outputs_greedy_tokens_and_counts_verification_forwards(peers, tmp_path, monkeypatch):
    model = make_hf_checkpoint("llama", str(tmp_path / "tiny"))
    monkeypatch.setattr(peers, "load_hf_gguf", lambda gguf, dtype: model)
    prompt, m = [5, 6, 7, 8, 9] * 6, 12
    expected = peers.clip(torch_greedy(model, prompt, m), [100], m)
    req = {"dtype": "float32", "max_new_tokens": m, "eos": [100], "prompt_ids": [prompt, prompt[:7]],
           "prompts": ["", ""], "gguf": "unused"}

    def measure(system):
        (name,) = system.rows
        return peers.Run(name, prompts=tuple(system.run(ids)[name] for ids in req["prompt_ids"]))

    greedy = measure(peers.HFSystem(req))
    pld = measure(peers.HFSystem({**req, "pld": 3}))
    assert greedy.name == "hf greedy float32" and pld.name == "hf pld3 float32"
    first = greedy.prompts[0]
    assert first.tokens == expected and first.cycles == first.cycle_tokens == len(expected) - 1
    assert greedy.tau == 1.0
    for g, p in zip(greedy.prompts, pld.prompts):
        assert p.tokens == g.tokens and p.cycle_tokens == len(p.tokens) - 1 and 1 <= p.cycles <= g.cycles
    assert pld.tau > 1.0  # the greedy output repeats itself on the second prompt: a lookup is accepted


@pytest.mark.slow  # a benchmark harness's check
def test_transformers_chat_template_gives_our_prompt_ids(peers):
    """What the benchmark feeds every system is our ids; on these prompts a transformers user gets the same ones.
    (Not always: on text with a space run before a digit transformers' GGUF tokenizer splits differently from the
    original tokenizer.json, which our tokenizer reproduces; the benchmark reports how many prompts agree.)"""
    from transformers import AutoTokenizer

    from mindspore_eagle.app.bench import DEFAULT_PROMPTS
    from mindspore_eagle.tokenizer import load_tokenizer

    ours = load_tokenizer(default_model_or_skip())
    gguf = default_gguf_or_skip()
    theirs = AutoTokenizer.from_pretrained(os.path.dirname(gguf), gguf_file=os.path.basename(gguf))
    for prompt in DEFAULT_PROMPTS[:4]:
        ids = ours.encode_chat([{"role": "user", "content": prompt}])
        assert peers.hf_prompt_ids(theirs, prompt) == ids, prompt


# ----- llama.cpp: the f32 GGUF, the rows, and the worker on a stand-in llama_cpp -------------------------------------


def _tiny_quantized_gguf(path):
    """Q4_1, Q8_0 and F32 tensors (one 3-D) with metadata of every kind the default GGUF has, 64-byte alignment."""
    import gguf

    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_custom_alignment(64)
    w.add_name("tiny")
    w.add_block_count(1)
    w.add_rope_freq_base(1e5)
    w.add_bool("tokenizer.ggml.add_bos_token", False)
    w.add_token_list(["a", "b", "<|end|>"])
    w.add_token_types([1, 1, 3])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_1)
    tensors = {"blk.0.attn_q.weight": (rng.standard_normal((8, 64)), "Q4_1"),
               "token_embd.weight": (rng.standard_normal((3, 32)), "Q8_0"),
               "output_norm.weight": (rng.standard_normal(7), None),
               "blk.0.cube.weight": (rng.standard_normal((2, 3, 5)), None)}
    for name, (arr, kind) in tensors.items():
        arr = arr.astype(np.float32)
        if kind:
            qtype = gguf.GGMLQuantizationType[kind]
            w.add_tensor(name, gguf.quants.quantize(arr, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _gguf_contents(path):
    import gguf

    r = gguf.GGUFReader(str(path))
    fields = {f.name: ([t.name for t in f.types], f.contents()) for f in r.fields.values()
              if not f.name.startswith("GGUF.")}
    tensors = {t.name: (t.tensor_type.name, [int(d) for d in t.shape],
                        gguf.quants.dequantize(t.data, t.tensor_type).reshape([int(d) for d in reversed(t.shape)]))
               for t in r.tensors}
    return fields, tensors


def test_f32_gguf_holds_the_dequantized_tensors_and_the_same_metadata(peers, tmp_path):
    src = _tiny_quantized_gguf(tmp_path / "tiny.Q4_1.gguf")
    out = peers.prepare_f32_gguf(str(src), str(tmp_path / "f32"))
    assert out == str(tmp_path / "f32" / "tiny.Q4_1.f32.gguf")
    fields, tensors = _gguf_contents(src)
    got_fields, got_tensors = _gguf_contents(out)
    assert got_fields.pop("general.file_type") == (["UINT32"], 0)  # ALL_F32
    assert fields.pop("general.file_type") == (["UINT32"], 3)
    assert got_fields == fields and fields["general.alignment"] == (["UINT32"], 64)
    assert list(got_tensors) == list(tensors)
    assert {n: k for n, (k, _, _) in tensors.items()}["blk.0.attn_q.weight"] == "Q4_1"
    for name, (kind, shape, values) in tensors.items():
        got_kind, got_shape, got_values = got_tensors[name]
        assert got_kind == "F32" and got_shape == shape and got_values.dtype == np.float32, name
        np.testing.assert_array_equal(got_values, values, err_msg=name)
    assert peers.gguf_label(str(src)) == "q4_1" and peers.gguf_label(out) == "f32"

    written = os.stat(out).st_mtime_ns
    assert peers.prepare_f32_gguf(str(src), str(tmp_path / "f32")) == out and os.stat(out).st_mtime_ns == written
    os.utime(src, (1, 1))  # the source changed: written again
    peers.prepare_f32_gguf(str(src), str(tmp_path / "f32"))
    assert os.stat(out).st_mtime_ns != written


def test_llamacpp_rows_are_named_after_the_file_and_measured_in_the_first_pass_only(peers):
    passes = peers.plan_passes(["ours", "llamacpp"], ["bfloat16", "float32"], [3, 10], ("q4_1", "f32"))
    names = [[n for j in jobs for n in j.names] for _, jobs in passes]
    assert names[0] == ["hf greedy float32", "ours greedy float32", "ours spec float32",
                        "llamacpp greedy q4_1", "llamacpp pld3 q4_1", "llamacpp pld10 q4_1",
                        "llamacpp greedy f32", "llamacpp pld3 f32", "llamacpp pld10 f32"]
    assert not any(n.startswith("llamacpp") for n in names[1])
    job = next(j for _, jobs in passes for j in jobs if j.names == ("llamacpp pld10 f32",))
    assert job.kind == "llamacpp" and job.fields == {"file": "f32", "pld": 10}
    assert peers.own_greedy("llamacpp pld3 q4_1") == "llamacpp greedy q4_1"
    assert peers.own_greedy("llamacpp greedy f32") is None
    assert "llamacpp" in peers.parse_args([]).families


def test_without_a_llamacpp_venv_its_rows_say_not_run_and_why(peers, tmp_path, monkeypatch):
    src = str(_tiny_quantized_gguf(tmp_path / "tiny.Q4_1.gguf"))
    monkeypatch.setattr(peers, "LLAMACPP_PYTHON", tmp_path / "no-venv" / "bin" / "python")
    missing = peers.llamacpp_fields(None, src, str(tmp_path))
    assert missing["llamacpp"] is None and "make bench-peers-setup" in missing["llamacpp_reason"]
    (tmp_path / "python").write_text("not executable")
    assert "not an executable file" in peers.llamacpp_fields(str(tmp_path / "python"), src, str(tmp_path))[
        "llamacpp_reason"]
    assert not (tmp_path / "gguf-f32").exists()  # nothing written for rows that will not run

    (_, jobs), = peers.plan_passes(["llamacpp"], ["float32"], [3])
    jobs = [j for j in jobs if j.kind == "llamacpp"]
    args = types.SimpleNamespace(worker_timeout=5, repeats=1, settle=0.0)
    runs = peers.run_pass("float32", jobs, {"prompt_ids": [[1]]}, args, str(tmp_path), dict(missing))
    assert [(r.name, r.status, r.reason) for r in runs] == [
        (n, "not run", missing["llamacpp_reason"]) for n in ("llamacpp greedy q4_1", "llamacpp pld3 q4_1",
                                                             "llamacpp greedy f32", "llamacpp pld3 f32")]
    assert "NOT RUN: no " in peers.format_table(peers.summarize_runs(runs))


# A stand-in for llama-cpp-python's ``Llama.generate`` (same calls: one ``eval`` per forward, drafts from
# ``draft_model`` appended after the last sampled token and checked against the greedy successor) whose teacher's
# greedy successor depends on the last token only: 7 -> 99, else a cycle 14 13 12 11 10 15.
FAKE_LLAMA_CPP = """
__version__ = "stand-in"

def successor(t):
    return 99 if t == 7 else 10 + (t + 1) % 6

class Llama:
    def __init__(self, model_path, n_ctx, n_threads, n_threads_batch, verbose, draft_model=None):
        assert model_path.endswith(".gguf") and n_threads == n_threads_batch == 2 and n_ctx >= 256
        self.draft_model, self.ids = draft_model, None

    def reset(self):
        self.ids = []

    def eval(self, tokens):
        self.ids += list(tokens)

    def generate(self, tokens, top_k, temp, repeat_penalty):
        assert self.ids == [] and (top_k, temp, repeat_penalty) == (1, 0.0, 1.0), "not reset, or not greedy"
        pending, checked = list(tokens), len(tokens) - 1
        while True:
            self.eval(pending)
            for pos in range(checked, len(self.ids)):
                token = successor(self.ids[pos])
                yield token
                if pos + 1 == len(self.ids) or self.ids[pos + 1] != token:  # no draft left, or this one rejected
                    del self.ids[pos + 1:]
                    break
            checked = len(self.ids)
            pending = [token] + (list(self.draft_model(self.ids + [token])) if self.draft_model else [])
"""

FAKE_SPECULATIVE = """
class LlamaPromptLookupDecoding:
    def __init__(self, num_pred_tokens):
        self.k = num_pred_tokens

    def __call__(self, ids):
        for start in range(len(ids) - 2, -1, -1):
            if ids[start] == ids[-1]:
                return ids[start + 1:start + 1 + self.k]
        return []
"""


def test_llamacpp_worker_measures_greedy_and_prompt_lookup_without_torch_or_mindspore(peers, tmp_path, monkeypatch):
    fake = tmp_path / "fake" / "llama_cpp"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(FAKE_LLAMA_CPP)
    (fake / "llama_speculative.py").write_text(FAKE_SPECULATIVE)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "fake"))
    files = {label: str(tmp_path / f"{label}.gguf") for label in ("q4_1", "f32")}  # only passed through
    m, eos = 20, [99]
    req = {"prompt_ids": [[1, 2, 3], [5, 7], [4, 3, 2, 3]], "eos": eos, "max_new_tokens": m, "prompts": ["", "", ""]}
    (_, jobs), = peers.plan_passes(["llamacpp"], ["float32"], [3])
    jobs = [j for j in jobs if j.kind == "llamacpp"]
    args = types.SimpleNamespace(worker_timeout=60, repeats=1, settle=0.0)
    runs = peers.run_pass("float32", jobs, req, args, str(tmp_path),
                          {"llamacpp": {"python": sys.executable, "files": files}})
    assert all(r.status == "ok" for r in runs), [(r.name, r.reason) for r in runs]
    by_name = {r.name: r for r in runs}

    def greedy(ids):
        out = [ids[-1]]
        while len(out) <= m and out[-1] not in eos:
            out.append(10 + (out[-1] + 1) % 6 if out[-1] != 7 else 99)
        return tuple(out[1:])

    for label in ("q4_1", "f32"):
        g, p = by_name[f"llamacpp greedy {label}"], by_name[f"llamacpp pld3 {label}"]
        assert [x.tokens for x in g.prompts] == [x.tokens for x in p.prompts] == [greedy(i) for i in req["prompt_ids"]]
        assert g.prompts[1].tokens == (99,) and g.prompts[1].cycles == 0  # the prefill's token alone
        assert all(x.cycles == x.cycle_tokens == len(x.tokens) - 1 for x in g.prompts) and g.tau == 1.0
        assert all(x.cycle_tokens == len(x.tokens) - 1 for x in p.prompts) and p.tau > 1.5  # lookups accepted
        for r in (g, p):
            assert r.info["gguf"] == files[label] and r.info["n_threads"] == 2
            assert r.info["torch_imported"] is False and r.info["mindspore_imported"] is False
    rows = peers.summarize_runs(runs)
    assert rows["llamacpp pld3 f32"]["same_as_own_greedy"] == 3


@pytest.mark.slow  # a benchmark harness's end-to-end run (~60 s on a 2-vCPU Zen 3)
def test_our_rows_run_through_the_cli_builder_and_report_the_drafting_they_used(peers):
    """Our two rows, for real on the default teacher (two prompts, 8 tokens): the worker builds through the CLI's
    parser and builder, answers both rows per prompt, and reports the drafting config the builder used (a renamed
    builder attribute once broke only this row, silently, in the benchmark)."""
    from mindspore_eagle.storage.assets import require_default_model
    from mindspore_eagle.tokenizer import load_tokenizer

    default_model_or_skip()
    tok = load_tokenizer(require_default_model())
    ids = [tok.encode_chat([{"role": "user", "content": p}]) for p in ("Name a colour.", "Count to five.")]
    from mindspore_eagle.teacher_config import TeacherConfig

    eos = list(dict.fromkeys([*TeacherConfig.load(require_default_model()).eos_token_ids, *tok.eos_token_ids]))
    system = peers.OursSystem({"dtype": "float32", "max_new_tokens": 8, "prompt_ids": ids, "eos": eos,
                               "ours_flags": ["--max-nodes", "8"]})
    runs = [system.run(p) for p in ids]
    for got in runs:
        assert set(got) == {"ours greedy float32", "ours spec float32"}
        assert got["ours spec float32"].tokens == got["ours greedy float32"].tokens  # lossless
        assert 1 <= len(got["ours greedy float32"].tokens) <= 8
    info = system.final_info()["ours spec float32"]
    assert info["budget"] == {"max_nodes": 8, "depth": 2, "top_k": 4, "proposer": "hybrid", "budget": "adaptive"}
    assert info["bench"]["turns"] == 2 and info["bench"]["lossless_turns"] == 2

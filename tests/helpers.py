"""Helpers shared by the test files (and the MindFormers-environment tests): tiny checkpoints written by
HuggingFace ``transformers`` or by numpy in the public layouts, independent numpy references, cache-test rigs and
the hypothesis tree strategy. Test files import from here, never from each other.

Module-level imports stay to numpy and our package: torch/transformers are imported inside the functions that
need them, hypothesis inside ``tree_layouts``, so the MindFormers environment (no torch, no hypothesis) can import
this module.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from mindspore_eagle.runtime import RuntimeConfig
from mindspore_eagle.tree import ForwardInputs, TreeLayout

DEFAULT_TEACHER_PROMPTS = [
    "What is the capital of France? Answer briefly.",
    "Write a Python function that returns the factorial of n.",
    "List three colours of the rainbow.",
]
TOL = 1e-5  # cache tests: relative tolerance of rows and logits recomputed along another path
CACHE_RUNTIME = RuntimeConfig(max_cache_len=128, buckets=(1, 8, 16, 32), prefill_chunk=16)  # the cache tests' teacher

# ----- HuggingFace tiny checkpoints (torch) and the default model ---------------------------------------


TINY = dict(vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5, rope_theta=10000.0)


# kind -> (HF class name, config overrides, config.json rewrite)
FORMS = {
    "pangu": ("LlamaForCausalLM", dict(attention_bias=True, tie_word_embeddings=False)),
    "llama": ("LlamaForCausalLM", dict(attention_bias=False, tie_word_embeddings=True)),
    "qwen2": ("Qwen2ForCausalLM", dict(tie_word_embeddings=False)),
}


def _randomize(model, seed: int) -> None:
    """Replace HF's tiny init (std 0.02 -> near-uniform logits) with weights that make tokens distinct."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith("bias"):
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / np.sqrt(p.shape[-1]) * 1.5)


def make_hf_checkpoint(kind: str, out_dir: str, seed: int = 0, dtype: str = "float32", **sizes):
    """Write a tiny random HF checkpoint of ``kind`` to ``out_dir``; return the torch model (fp32, eval). ``sizes``
    replace ``TINY``'s (e.g. ``num_hidden_layers=3``)."""
    import torch
    import transformers

    cls_name, overrides = FORMS[kind]
    torch.manual_seed(seed)
    tiny = {**TINY, **sizes}
    if cls_name == "Qwen2ForCausalLM":
        cfg = transformers.Qwen2Config(**tiny, **overrides)
    else:
        cfg = transformers.LlamaConfig(**tiny, **overrides)
    model = getattr(transformers, cls_name)(cfg).eval()
    _randomize(model, seed)
    save_model = model if dtype == "float32" else model.to(getattr(torch, dtype))
    save_model.save_pretrained(out_dir, safe_serialization=True)
    model = model.float()
    if kind == "pangu":
        # Rewrite config.json exactly as openPangu-Embedded ships it (architecture name and `bias` key).
        path = os.path.join(out_dir, "config.json")
        with open(path) as f:
            d = json.load(f)
        d["architectures"] = ["PanguEmbeddedForCausalLM"]
        d["model_type"] = "PanguEmbedded"
        d["bias"] = True
        d.pop("attention_bias", None)
        d.pop("mlp_bias", None)
        with open(path, "w") as f:
            json.dump(d, f)
    return model


def torch_greedy(model, prompt: list[int], n: int) -> list[int]:
    """Greedy tokens from a torch model by full recompute each step (no cache: nothing shared with us)."""
    import torch

    seq = list(prompt)
    out = []
    with torch.no_grad():
        for _ in range(n):
            logits = model(torch.tensor([seq])).logits[0, -1]
            tok = int(torch.argmax(logits))
            out.append(tok)
            seq.append(tok)
    return out


def load_script(*path: str):
    """A script of the repository that is not a package module (``bench/``, ``experiments/``), imported from its
    file: ``load_script("experiments", "ablate.py")``. Registered in ``sys.modules`` under its stem first, since
    dataclasses resolve their annotations through it."""
    import importlib.util
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    spec = importlib.util.spec_from_file_location(os.path.splitext(path[-1])[0], os.path.join(root, *path))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def default_gguf_or_skip() -> str:
    """The SmolLM2 GGUF that ``mindspore-eagle setup`` downloads (``assets.default_gguf_path``). Skips when absent,
    unless MSE_REQUIRE_DEFAULT_MODEL=1 (set by `make test`), where a missing file is a failure."""
    from mindspore_eagle.storage.assets import default_gguf_path

    path = default_gguf_path()
    if not os.path.isfile(path):
        if os.environ.get("MSE_REQUIRE_DEFAULT_MODEL") == "1":
            pytest.fail(f"default GGUF missing at {path}; `make test` runs `mindspore-eagle setup`, which puts it there")
        pytest.skip(f"SmolLM2 GGUF not found at {path} (run `mindspore-eagle setup`)")
    return path


def default_model_or_skip() -> str:
    """The converted default model dir. Skips when absent, unless MSE_REQUIRE_DEFAULT_MODEL=1 (set by
    `make test`), where a missing model is a failure rather than a silent skip."""
    from mindspore_eagle.storage.assets import default_model_dir

    d = default_model_dir()
    if not os.path.isfile(os.path.join(d, "weights.safetensors")):
        if os.environ.get("MSE_REQUIRE_DEFAULT_MODEL") == "1":
            pytest.fail(f"default model missing at {d}; `make test` should have installed it")
        pytest.skip(f"default model not installed at {d} (run `mindspore-eagle setup`)")
    return d


# ----- the cache-test rig ---------------------------------------------------------------------------------


#        0
#      / | \
#     1  2  .
#     |  | \
#     3  4  5
#     |     |
#     6     7
BRANCHY_PARENTS = [0, 0, 0, 1, 2, 2, 3, 5]


def make_pairs(shapes, seed=0):
    """Random (k, v) Parameter pairs of the given ``[B, Hkv, max_len, D]`` shapes, and their numpy copies."""
    from mindspore import Parameter, Tensor

    rng = np.random.default_rng(seed)
    pairs, arrays = [], []
    for n, shape in enumerate(shapes):
        k = rng.standard_normal(shape).astype(np.float32)
        v = rng.standard_normal(shape).astype(np.float32)
        pairs.append((Parameter(Tensor(k.copy()), name=f"k{n}_{seed}", requires_grad=False),
                      Parameter(Tensor(v.copy()), name=f"v{n}_{seed}", requires_grad=False)))
        arrays += [k, v]
    return pairs, arrays


def buffers(pairs):
    """Host copies of every buffer, in order k0, v0, k1, v1, ..."""
    return [p.asnumpy().copy() for pair in pairs for p in pair]


def prefill_committed(teacher, cache, tokens):
    """Write ``tokens`` after the committed prefix as chain rounds (the engine's prefill rule); last output."""
    out, off = None, 0
    rt = teacher.runtime
    for size, bucket in rt.buckets.chunks(len(tokens), rt.prefill_chunk, cache.max_len - cache.committed_len):
        L = cache.begin_round(bucket)
        out = teacher.forward(ForwardInputs.for_tree(TreeLayout.chain(tokens[off:off + size]), L, bucket,
                                                     teacher.max_len))
        cache.commit(range(size))
        off += size
    return out


def tree_round(teacher, cache, layout, bucket):
    """One speculative round: reserve, then verify the whole tree (padded to ``bucket``) in one forward."""
    L = cache.begin_round(bucket)
    return teacher.forward(ForwardInputs.for_tree(layout, L, bucket, teacher.max_len))


def decode_logits(teacher, cache, token):
    """Logits of ``token`` fed at row L (an aborted round: nothing is committed)."""
    L = cache.begin_round(1)
    out = teacher.forward(ForwardInputs.for_tree(TreeLayout.single(token), L, 1, teacher.max_len))
    cache.abort_round()
    return out.logits[0, -1]


def reference_rows_and_logits(teacher, cache, seq, next_token):
    """No speculation: reset, prefill ``seq`` causally, decode ``next_token``. -> (buffers[:len(seq)], logits)."""
    cache.reset()
    prefill_committed(teacher, cache, seq)
    rows = [b[:, :, :len(seq)] for b in buffers(cache.pairs)]
    return rows, decode_logits(teacher, cache, next_token)


def assert_rows_close(got, ref, n):
    if n == 0:
        return
    for i, (g, r) in enumerate(zip(got, ref)):
        err = np.abs(g[:, :, :n] - r[:, :, :n]).max()
        assert err <= TOL * max(1.0, np.abs(r[:, :, :n]).max()), f"buffer {i}: max |diff| {err}"


# ----- EAGLE-3 heads in the public layout, and the numpy reference head -------------------------------------


# A: the common layout (head as wide as the teacher, reduced draft vocabulary, a known-extra embedding copy).
# B: a head narrower than its teacher (own embeddings), full vocabulary, attention biases, explicit head_dim.
PUBLIC_CONFIGS = {
    "mapped": dict(architectures=["LlamaForCausalLMEagle3"], hidden_size=32, intermediate_size=48,
                   num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=1, rms_norm_eps=1e-5,
                   rope_theta=10000.0, vocab_size=60, draft_vocab_size=24, hidden_act="silu",
                   max_position_embeddings=64, tie_word_embeddings=False, bias=False),
    "wide_teacher": dict(architectures=["LlamaForCausalLMEagle3"], hidden_size=32, intermediate_size=40,
                         num_attention_heads=4, num_key_value_heads=1, head_dim=16, num_hidden_layers=1,
                         rms_norm_eps=1e-6, rope_theta=50000.0, vocab_size=60, draft_vocab_size=60,
                         target_hidden_size=40, attention_bias=True, hidden_act="silu"),
}


def public_tensors(c: dict, seed: int = 0, embed: bool = True) -> dict[str, np.ndarray]:
    """Random head tensors under the public names, HF orientation ``[out, in]``."""
    rng = np.random.default_rng(seed)
    h, inter, nh, nkv = c["hidden_size"], c["intermediate_size"], c["num_attention_heads"], c["num_key_value_heads"]
    d = c.get("head_dim") or h // nh
    ht = c.get("target_hidden_size") or h
    v, vd = c["vocab_size"], c.get("draft_vocab_size") or c["vocab_size"]
    bias = c.get("attention_bias", c.get("bias", False))

    def lin(out, inp):
        return (rng.standard_normal((out, inp)) / np.sqrt(inp) * 1.5).astype(np.float32)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    t = {
        "fc.weight": lin(h, 3 * ht),
        "midlayer.input_layernorm.weight": norm(h),
        "midlayer.hidden_norm.weight": norm(h),
        "midlayer.self_attn.q_proj.weight": lin(nh * d, 2 * h),
        "midlayer.self_attn.k_proj.weight": lin(nkv * d, 2 * h),
        "midlayer.self_attn.v_proj.weight": lin(nkv * d, 2 * h),
        "midlayer.self_attn.o_proj.weight": lin(h, nh * d),
        "midlayer.post_attention_layernorm.weight": norm(h),
        "midlayer.mlp.gate_proj.weight": lin(inter, h),
        "midlayer.mlp.up_proj.weight": lin(inter, h),
        "midlayer.mlp.down_proj.weight": lin(h, inter),
        "norm.weight": norm(h),
        "lm_head.weight": lin(vd, h) * 2,
    }
    if bias:
        for name, out in (("q_proj", nh * d), ("k_proj", nkv * d), ("v_proj", nkv * d), ("o_proj", h)):
            t[f"midlayer.self_attn.{name}.bias"] = (0.2 * rng.standard_normal(out)).astype(np.float32)
    ids = np.sort(rng.choice(v, vd, replace=False)) if vd < v else np.arange(v)
    t["d2t"] = (ids - np.arange(vd)).astype(np.int64)
    t2d = np.zeros(v, np.bool_)
    t2d[ids] = True
    t["t2d"] = t2d
    if embed:
        t["embed_tokens.weight"] = rng.standard_normal((v, h)).astype(np.float32)
    return t


def write_public_head(out_dir: str, c: dict, seed: int = 0, tensors: dict | None = None) -> dict[str, np.ndarray]:
    """Write ``config.json`` + ``model.safetensors`` as the public trainers do; return the tensors."""
    from safetensors.numpy import save_file

    os.makedirs(out_dir, exist_ok=True)
    tensors = public_tensors(c, seed) if tensors is None else tensors
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(c, f)
    save_file(tensors, os.path.join(out_dir, "model.safetensors"))
    return tensors


def np_rms(x, w, eps):
    return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps) * w


def np_rope(x, pos, theta):
    """x [T, heads, D] rotated by position (rotate-half: pairs (i, i + D/2))."""
    dim = x.shape[-1]
    inv = 1.0 / theta ** (np.arange(0, dim, 2) / dim)
    ang = np.asarray(pos, np.float64)[:, None] * inv[None, :]
    cos, sin = np.cos(np.concatenate([ang, ang], -1))[:, None], np.sin(np.concatenate([ang, ang], -1))[:, None]
    half = dim // 2
    rot = np.concatenate([-x[..., half:], x[..., :half]], -1)
    return x * cos + rot * sin


class NumpyHead:
    """The EAGLE-3 head from its description, on public tensors (``[out, in]``), in float64."""

    def __init__(self, tensors: dict, c: dict):
        self.w = {k: np.asarray(v, np.float64) for k, v in tensors.items() if k not in ("d2t", "t2d")}
        self.d2t = np.asarray(tensors["d2t"], np.int64)
        self.c = c
        self.nh, self.nkv = c["num_attention_heads"], c["num_key_value_heads"]
        self.d = c.get("head_dim") or c["hidden_size"] // self.nh
        self.eps, self.theta = c["rms_norm_eps"], c["rope_theta"]
        self.mapped = (c.get("draft_vocab_size") or c["vocab_size"]) < c["vocab_size"]

    def lin(self, x, name):
        y = x @ self.w[name + ".weight"].T
        return y + self.w[name + ".bias"] if name + ".bias" in self.w else y

    def fuse(self, features):
        return np.asarray(features, np.float64) @ self.w["fc.weight"].T

    def forward(self, embeds, hidden, positions, visible):
        """embeds, hidden [T, H]; visible [T, T] (query i may attend key j) -> recycled hidden [T, H]."""
        w, p = self.w, "midlayer."
        t = embeds.shape[0]
        x = np.concatenate([np_rms(embeds, w[p + "input_layernorm.weight"], self.eps),
                            np_rms(hidden, w[p + "hidden_norm.weight"], self.eps)], -1)  # embedding first
        q = np_rope(self.lin(x, p + "self_attn.q_proj").reshape(t, self.nh, self.d), positions, self.theta)
        k = np_rope(self.lin(x, p + "self_attn.k_proj").reshape(t, self.nkv, self.d), positions, self.theta)
        v = self.lin(x, p + "self_attn.v_proj").reshape(t, self.nkv, self.d)
        heads = []
        for hd in range(self.nh):
            g = hd // (self.nh // self.nkv)
            s = q[:, hd] @ k[:, g].T / np.sqrt(self.d)
            s = np.where(visible, s, -np.inf)
            a = np.exp(s - s.max(-1, keepdims=True))
            heads.append((a / a.sum(-1, keepdims=True)) @ v[:, g])
        h1 = hidden + self.lin(np.concatenate(heads, -1), p + "self_attn.o_proj")
        y = np_rms(h1, w[p + "post_attention_layernorm.weight"], self.eps)
        gate = self.lin(y, p + "mlp.gate_proj")
        return h1 + self.lin(gate / (1 + np.exp(-gate)) * self.lin(y, p + "mlp.up_proj"), p + "mlp.down_proj")

    def logits(self, out):
        return np_rms(out, self.w["norm.weight"], self.eps) @ self.w["lm_head.weight"].T

    def target(self, draft_ids):
        draft_ids = np.asarray(draft_ids, np.int64)
        return draft_ids + self.d2t[draft_ids] if self.mapped else draft_ids


def causal_visibility(n: int) -> np.ndarray:
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    return j <= i


# ----- a tiny teacher + head pair written with numpy (no torch: also the MindFormers environment's) -----------


TINY_PAIR = dict(vocab=101, hidden=64, inter=96, layers=2, heads=4, kv=2)  # head_dim 16: also fits the fused op


def mapped_head(root, max_len: int):
    """A public-format head of ``PUBLIC_CONFIGS["mapped"]`` (seed 2) written under ``root``, converted and loaded with
    a cache of ``max_len`` rows; with its numpy reference and a random embedding table (seed 11):
    ``(config, NumpyHead, Eagle3DraftHead, embed)``."""
    from ckpt_convert import convert_eagle3
    from mindspore_eagle.models.eagle3 import Eagle3DraftHead

    c = PUBLIC_CONFIGS["mapped"]
    tensors = write_public_head(os.path.join(str(root), "public"), c, seed=2)
    convert_eagle3(os.path.join(str(root), "public"), os.path.join(str(root), "ours"))
    head = Eagle3DraftHead.load(os.path.join(str(root), "ours"), max_len=max_len)
    embed = np.random.default_rng(11).standard_normal((c["vocab_size"], c["hidden_size"])).astype(np.float32)
    return c, NumpyHead(tensors, c), head, embed


def numpy_growth(ref: NumpyHead, embed: np.ndarray, tokens: np.ndarray, feats: np.ndarray, k: int, depth: int):
    """EAGLE growth recomputed branch by branch: every node's output from a fresh causal run over the
    context entries plus its own ancestors (hidden input = the previous entry's output)."""
    e_ctx = embed[tokens].astype(np.float64)
    h_ctx = ref.fuse(feats)

    def chain_output(chain):
        e, h = e_ctx, h_ctx
        out = ref.forward(e, h, np.arange(len(e)), causal_visibility(len(e)))
        for tok in chain:  # each chain entry's hidden input is the previous entry's output
            e = np.concatenate([e, embed[tok][None]])
            h = np.concatenate([h, out[-1:]])
            out = ref.forward(e, h, np.arange(len(e)), causal_visibility(len(e)))
        return out[-1]

    def log_softmax(x):
        x = x - x.max()
        return x - np.log(np.exp(x).sum())

    def top(lp):
        return np.argsort(-lp, kind="stable")[:k]

    lp = log_softmax(ref.logits(chain_output([])))
    best = top(lp)
    scores, toks, parents = [lp[best]], [ref.target(best)], [np.zeros(k, np.int64)]
    frontier = [([int(t)], float(s), i + 1) for i, (t, s) in enumerate(zip(ref.target(best), lp[best]))]
    for d in range(1, depth):
        base = 1 + k + (d - 1) * k * k
        lvl_s, lvl_t, lvl_p, lvl_chain = [], [], [], []
        for chain, s, fid in frontier:
            lp = log_softmax(ref.logits(chain_output(chain)))
            best = top(lp)
            for tok, ls in zip(ref.target(best), lp[best]):
                lvl_s.append(s + ls)
                lvl_t.append(int(tok))
                lvl_p.append(fid)
                lvl_chain.append(chain + [int(tok)])
        scores.append(np.array(lvl_s))
        toks.append(np.array(lvl_t))
        parents.append(np.array(lvl_p))
        sel = np.argsort(-np.array(lvl_s), kind="stable")[:k]
        frontier = [(lvl_chain[j], lvl_s[j], base + j) for j in sel]
    return np.concatenate(scores), np.concatenate(toks), np.concatenate(parents)


def write_tiny_teacher(out_dir: str, kind: str = "random", seed: int = 0) -> np.ndarray:
    """A Llama checkpoint (config.json + model.safetensors, HF names, ``[out, in]``); returns the embedding table."""
    from safetensors.numpy import save_file

    v, h, i, n, nh, nkv = (TINY_PAIR[k] for k in ("vocab", "hidden", "inter", "layers", "heads", "kv"))
    d = h // nh
    rng = np.random.default_rng(seed)
    out_scale = 0.05 if kind == "copy" else 1.5  # "copy": attention and MLP barely move the residual stream

    def lin(o, inp, scale=1.5):
        return (rng.standard_normal((o, inp)) / np.sqrt(inp) * scale).astype(np.float32)

    def norm(k):
        return (1.0 + 0.1 * rng.standard_normal(k)).astype(np.float32)

    embed = rng.standard_normal((v, h)).astype(np.float32)
    t = {"model.embed_tokens.weight": embed,
         "model.norm.weight": np.ones(h, np.float32) if kind == "copy" else norm(h)}
    if kind != "copy":
        t["lm_head.weight"] = lin(v, h)
    for layer in range(n):
        p = f"model.layers.{layer}."
        t[p + "input_layernorm.weight"] = norm(h)
        t[p + "post_attention_layernorm.weight"] = norm(h)
        t[p + "self_attn.q_proj.weight"] = lin(nh * d, h)
        t[p + "self_attn.k_proj.weight"] = lin(nkv * d, h)
        t[p + "self_attn.v_proj.weight"] = lin(nkv * d, h)
        t[p + "self_attn.o_proj.weight"] = lin(h, nh * d, out_scale)
        t[p + "mlp.gate_proj.weight"] = lin(i, h)
        t[p + "mlp.up_proj.weight"] = lin(i, h)
        t[p + "mlp.down_proj.weight"] = lin(h, i, out_scale)
    os.makedirs(out_dir, exist_ok=True)
    cfg = dict(architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=v, hidden_size=h,
               intermediate_size=i, num_hidden_layers=n, num_attention_heads=nh, num_key_value_heads=nkv,
               max_position_embeddings=256, rms_norm_eps=1e-5, rope_theta=10000.0, hidden_act="silu",
               tie_word_embeddings=kind == "copy", attention_bias=False)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f)
    save_file(t, os.path.join(out_dir, "model.safetensors"))
    return embed


def write_tiny_head(out_dir: str, embed: np.ndarray, kind: str = "random", seed: int = 1) -> None:
    """A public-layout EAGLE-3 head for the tiny teacher (full vocabulary, no d2t offsets)."""
    v, h = embed.shape
    c = dict(architectures=["LlamaForCausalLMEagle3"], hidden_size=h, intermediate_size=TINY_PAIR["inter"],
             num_attention_heads=TINY_PAIR["heads"], num_key_value_heads=TINY_PAIR["kv"], num_hidden_layers=1,
             rms_norm_eps=1e-5, rope_theta=10000.0, vocab_size=v, draft_vocab_size=v, hidden_act="silu",
             max_position_embeddings=256)
    t = public_tensors(c, seed, embed=False)
    if kind == "copy":
        t["fc.weight"] = np.concatenate([np.zeros((h, 2 * h)), np.eye(h)], 1).astype(np.float32)  # layer-0 tap
        t["lm_head.weight"] = embed.copy()
        t["norm.weight"] = np.ones(h, np.float32)
        t["midlayer.self_attn.o_proj.weight"] *= 0.03
        t["midlayer.mlp.down_proj.weight"] *= 0.03
    write_public_head(out_dir, c, tensors=t)


def make_tiny_pair(root: str, kind: str) -> tuple[str, str]:
    """(converted teacher dir, public head dir) under ``root``."""
    from ckpt_convert import convert_hf

    embed = write_tiny_teacher(os.path.join(root, "hf"), kind)
    convert_hf(os.path.join(root, "hf"), os.path.join(root, "teacher"), overwrite=True)
    write_tiny_head(os.path.join(root, "head"), embed, kind)
    return os.path.join(root, "teacher"), os.path.join(root, "head")


# ----- trees ------------------------------------------------------------------------------------------------


def tree_layouts(vocab, max_nodes=64, max_depth=12):
    """Hypothesis strategy of random real trees in the dummy-root layout: uniform parent choice (bushy) or among
    the newest nodes (deep, up to ``max_depth``). Hypothesis is imported here, not at module level: the MindFormers
    environment runs these helpers without it."""
    from hypothesis import strategies as st

    @st.composite
    def layouts(draw):
        n = draw(st.integers(1, max_nodes))
        deep = draw(st.booleans())
        parents, depth = [0], [0]
        for _ in range(1, n):
            eligible = [j for j in range(len(parents)) if depth[j] < max_depth]
            if deep:
                eligible = eligible[-2:]
            p = eligible[draw(st.integers(0, len(eligible) - 1))]
            parents.append(p)
            depth.append(depth[p] + 1)
        tokens = draw(st.lists(st.integers(0, vocab - 1), min_size=n, max_size=n))
        return TreeLayout.from_parents(tokens, parents)

    return layouts()


def path_to(layout, node: int) -> list[int]:
    """Node indices from the root down to ``node`` (a plain parent walk: the test's own reference)."""
    path = [int(node)]
    while path[-1] != 0:
        path.append(int(layout.parents[path[-1]]))
    return path[::-1]


# ----- scripted drafts ------------------------------------------------------------------------------------


class ScriptedProposer:
    """Test draft that knows the teacher's greedy continuation ``future`` and proposes from it.

    mode "oracle": a chain of the next ``depth`` true tokens (every level accepted);
    "wrong": a chain of tokens that are never the teacher's choice; "bushy": at every level a wrong sibling
    placed *before* the true child, so accepted paths are not in place (their rows are moved by the commit).
    """

    def __init__(self, vocab, depth, mode):
        self.vocab, self.depth, self.mode = vocab, depth, mode
        self.max_nodes = 2 * depth + 1 if mode == "bushy" else depth + 1
        self.future, self.pos = [], 0

    def begin(self, prompt, aux, first):
        self.pos = 1  # future[0] == first token (the root)
        assert aux.shape[0] == len(prompt)

    def propose(self, root):
        assert root == self.future[self.pos - 1]
        nxt = self.future[self.pos:self.pos + self.depth]
        wrong = [(t + 1) % self.vocab for t in nxt]
        if self.mode == "oracle":
            return TreeLayout.from_parents([root] + nxt, [0] + list(range(len(nxt))))
        if self.mode == "wrong":
            return TreeLayout.from_parents([root] + wrong, [0] + list(range(len(wrong))))
        tokens, parents, cur = [root], [0], 0
        for t, w in zip(nxt, wrong):
            tokens += [w, t]
            parents += [cur, cur]
            cur = len(tokens) - 1
        return TreeLayout.from_parents(tokens, parents)

    def accept(self, acc, aux):
        assert aux.shape[0] == len(acc.path)
        self.pos += len(acc.tokens)


# ----- the custom kernels ---------------------------------------------------------------------------------


def cpu_flags() -> set[str]:
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    return set()


def require_kernel(dtype: str) -> None:
    """The custom kernels must build and load on every x86-64 / AArch64 Linux machine (a generic path at least):
    a failure here is a failure, never a skip."""
    from mindspore_eagle.kernels import ops

    status = ops.kernel_status(dtype)
    assert status.library is not None, f"the custom {dtype} kernels are unavailable: {status.reason}"


# ----- GGUF files and trace records written by hand ------------------------------------------------------


def llama_cpp_permute(w, n_head):
    """llama.cpp's q/k row permutation (convert_hf_to_gguf.py's LlamaModel.permute), written out here as the
    reference the converter must invert: per head, rows (first half, second half) -> interleaved pairs."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_tiny_gguf(model, path, quantize_embeddings=False, tokenizer=False, linear_type=None):
    """Write a llama-architecture GGUF of a HF torch model with the gguf package (what llama.cpp does);
    ``tokenizer``: also a byte-level BPE tokenizer of single-letter tokens (enough for ``convert_gguf``);
    ``linear_type``: a GGML type name ("Q4_0", "Q4_1", "Q8_0", ...) every Linear weight is quantized to."""
    import gguf

    cfg = model.config
    w = gguf.GGUFWriter(path, "llama")
    if tokenizer:
        tokens = [chr(ord("!") + i) for i in range(cfg.vocab_size - 2)] + ['!"', "<|end|>"]
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("gpt-2")
        w.add_token_list(tokens)
        w.add_token_merges(['! "'])
        w.add_token_types([1] * (cfg.vocab_size - 1) + [3])
        w.add_eos_token_id(cfg.vocab_size - 1)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(TINY["rope_theta"])  # transformers 5 keeps it in rope_parameters
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    w.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    per_layer = {"input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
                 "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
                 "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
                 "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
                 "mlp.down_proj.weight": "ffn_down.weight"}
    for name, p in model.state_dict().items():
        arr = p.detach().float().numpy()
        if name.startswith("model.layers."):
            n, rest = name[len("model.layers."):].split(".", 1)
            gname = f"blk.{n}.{per_layer[rest]}"
            if rest == "self_attn.q_proj.weight":
                arr = llama_cpp_permute(arr, cfg.num_attention_heads)
            elif rest == "self_attn.k_proj.weight":
                arr = llama_cpp_permute(arr, cfg.num_key_value_heads)
        else:
            gname = names[name]
        if quantize_embeddings and gname == "token_embd.weight":
            q = gguf.quants.quantize(arr, gguf.GGMLQuantizationType.Q8_0)
            w.add_tensor(gname, q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        elif linear_type and arr.ndim == 2 and gname != "token_embd.weight":
            kind = gguf.GGMLQuantizationType[linear_type]
            w.add_tensor(gname, gguf.quants.quantize(np.ascontiguousarray(arr, np.float32), kind), raw_dtype=kind)
        else:
            w.add_tensor(gname, np.ascontiguousarray(arr, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def turn_record(tid, category, speedup, greedy_s, spec_s, cycles, emitted, lossless=True):
    """A summary line as the runner writes it: 12 tokens; teacher 80% and draft 10% of the spec time."""
    return {"record": "turn", "turn": tid, "category": category, "seed": 0, "rank": 0, "prompt_tokens": 5,
            "tokens": 12, "spec_tokens": 12, "stop_reason": "max_new_tokens", "greedy_s": greedy_s, "spec_s": spec_s,
            "greedy_ttft_s": 0.1, "spec_ttft_s": 0.1, "greedy_tok_s": 12 / greedy_s, "spec_tok_s": 12 / spec_s,
            "speedup": speedup, "cycles": cycles, "emitted": emitted, "tau": emitted / cycles,
            "spec_teacher_s": 0.8 * spec_s, "spec_draft_s": 0.1 * spec_s, "lossless": lossless,
            "output_ids": list(range(12)), "spec_ids": None if lossless else [0] * 12}


def legacy_step_record(tid, i, draft_ms):
    """A step line as traces were written before the phase split (results/eval-default holds such traces)."""
    return {"record": "step", "turn": tid, "step": i, "committed_len": 5 + i, "tree_nodes": 8, "bucket": 8,
            "depth": 3, "accepted_len": 1, "bonus": 4, "path": [0, 1], "tokens": [3, 4], "commit_mode": "length",
            "draft_ms": draft_ms, "verify_ms": 10.0, "commit_ms": 1.0, "teacher_ms": 9.0}


def write_bpe_gguf(path: Path, model: str = "gpt2", pre: str = "gpt-2") -> Path:
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tokenizer_model(model)
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(["a", "b", "ab", "<|end|>"])
    writer.add_token_merges(["a b"])
    writer.add_token_types([1, 1, 1, 3])
    writer.add_eos_token_id(3)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path

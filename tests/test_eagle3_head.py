"""The EAGLE-3 draft head computes what the published architecture computes.

A random head is saved in the public checkpoint format (SafeAILab EAGLE / SpecForge names and ``[out, in]``
shapes, ``d2t`` int64, ``t2d`` bool, ``config.json`` keys), imported with ``ckpt_convert``, and its outputs are
compared with a naive numpy implementation written from the description alone (RMSNorm, rotate-half RoPE,
grouped-query causal attention, SwiGLU, fc fusion, norm + lm_head, d2t). The numpy helpers here are also the
reference of ``test_tree_growth``.
"""

from __future__ import annotations

import json
import os

import mindspore as ms
import numpy as np
import pytest

from mindspore_eagle.draft_config import DraftConfig
from mindspore_eagle.models.eagle3 import Eagle3DraftHead, expected_head_shapes
from mindspore_eagle.teacher import setup_mindspore
from mindspore_eagle.tree.mask import causal_mask

setup_mindspore()

TOL = 1e-4
MAX_LEN = 32

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


# ----- public-format checkpoints -------------------------------------------------------------------------


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


# ----- the independent numpy reference -------------------------------------------------------------------


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


def causal_visibility(n: int, window: int | None = None) -> np.ndarray:
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    vis = j <= i
    return vis if window is None else vis & (j > i - window)


# ----- fixtures --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=sorted(PUBLIC_CONFIGS))
def converted(request, tmp_path_factory):
    """(config dict, public tensors, loaded head, its jitted forward, embedding table) per public config."""
    from ckpt_convert import convert_eagle3

    c = PUBLIC_CONFIGS[request.param]
    root = tmp_path_factory.mktemp(f"eagle3_{request.param}")
    tensors = write_public_head(str(root / "public"), c, seed=1)
    convert_eagle3(str(root / "public"), str(root / "ours"))
    head = Eagle3DraftHead.load(str(root / "ours"), max_len=MAX_LEN)
    if head.own_embedding:
        table = head.embed_tokens.weight
    else:  # the teacher's embeddings; any [vocab, H] table stands in for them here
        table = ms.Tensor(np.random.default_rng(7).standard_normal((c["vocab_size"], c["hidden_size"]))
                          .astype(np.float32))
    return c, tensors, head, ms.jit(head), table


# ----- tests -------------------------------------------------------------------------------------------------


def test_checkpoint_names_and_shapes_are_the_published_ones():
    c = PUBLIC_CONFIGS["mapped"]
    public = {k: v.shape for k, v in public_tensors(c).items()}
    # Written out literally from the published layout (H=32, 3*H_t=96, heads*D=32, kv*D=16, I=48, Vd=24, V=60).
    assert public == {
        "fc.weight": (32, 96),
        "midlayer.input_layernorm.weight": (32,),
        "midlayer.hidden_norm.weight": (32,),
        "midlayer.self_attn.q_proj.weight": (32, 64),
        "midlayer.self_attn.k_proj.weight": (16, 64),
        "midlayer.self_attn.v_proj.weight": (16, 64),
        "midlayer.self_attn.o_proj.weight": (32, 32),
        "midlayer.post_attention_layernorm.weight": (32,),
        "midlayer.mlp.gate_proj.weight": (48, 32),
        "midlayer.mlp.up_proj.weight": (48, 32),
        "midlayer.mlp.down_proj.weight": (32, 48),
        "norm.weight": (32,),
        "lm_head.weight": (24, 32),
        "d2t": (24,),
        "t2d": (60,),
        "embed_tokens.weight": (60, 32),
    }
    ours = expected_head_shapes(DraftConfig.from_hf_dict(c))
    for name, shape in ours.items():  # ours: the same names, Linear weights transposed to [in, out]
        assert shape == (public[name][::-1] if len(shape) == 2 else public[name]), name


def test_head_forward_equals_numpy_reference_across_two_cache_chunks(converted):
    """Entries 0..7 in one forward, then 5 more (padded to 8) that read the first 8 from the head's cache."""
    c, tensors, head, fn, table = converted
    ref = NumpyHead(tensors, c)
    rng = np.random.default_rng(3)
    n1, n2, bucket = 8, 5, 8
    ids = rng.integers(0, c["vocab_size"], n1 + n2)
    feats = rng.standard_normal((n1 + n2, 3 * (c.get("target_hidden_size") or c["hidden_size"]))).astype(np.float32)
    outs = []
    for start, n in ((0, n1), (n1, n2)):
        pad = bucket - n
        x_ids = np.concatenate([ids[start:start + n], np.zeros(pad, np.int64)])[None].astype(np.int32)
        x_f = np.concatenate([feats[start:start + n], np.zeros((pad, feats.shape[1]), np.float32)])[None]
        rows = (start + np.arange(bucket, dtype=np.int32))[None]
        out = fn(table, ms.Tensor(x_ids), ms.Tensor(x_f), ms.Tensor(rows),
                 ms.Tensor(causal_mask(start, bucket, MAX_LEN)), ms.Tensor(rows))
        outs.append(out.asnumpy()[0, :n])
    got = np.concatenate(outs)
    embeds = np.asarray(table.asnumpy(), np.float64)[ids]
    want = ref.forward(embeds, ref.fuse(feats), np.arange(n1 + n2), causal_visibility(n1 + n2))
    np.testing.assert_allclose(got, want, rtol=TOL, atol=TOL)
    logits = head.compute_logits(ms.Tensor(got)).asnumpy()  # [T, draft_vocab]
    assert logits.shape == (n1 + n2, c.get("draft_vocab_size") or c["vocab_size"])
    np.testing.assert_allclose(logits, ref.logits(want), rtol=TOL, atol=TOL)


def test_recycled_hidden_step_equals_numpy_reference(converted):
    """``decode`` with a hidden input that is a previous output (no fc): the step of every tree level."""
    c, tensors, head, _, table = converted
    ref = NumpyHead(tensors, c)
    rng = np.random.default_rng(5)
    t = 4
    ids = rng.integers(0, c["vocab_size"], t)
    hidden = rng.standard_normal((t, c["hidden_size"])).astype(np.float32)
    embeds = np.asarray(table.asnumpy())[ids]
    rows = (20 + np.arange(t, dtype=np.int32))[None]
    positions = np.array([[20, 21, 21, 22]], np.int32)  # a small tree: root, two siblings, a grandchild
    vis = np.array([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]], bool)
    full = np.zeros((1, 1, t, MAX_LEN), np.float32) - 1e9
    full[0, 0, :, 20:20 + t] = np.where(vis, 0.0, -1e9)
    got = head.decode(ms.Tensor(embeds[None]), ms.Tensor(hidden[None]), ms.Tensor(positions), ms.Tensor(full),
                      ms.Tensor(rows)).asnumpy()[0]
    want = ref.forward(embeds.astype(np.float64), hidden.astype(np.float64), positions[0], vis)
    np.testing.assert_allclose(got, want, rtol=TOL, atol=TOL)


def test_draft_ids_map_to_target_ids_through_d2t(converted):
    c, tensors, head, _, _ = converted
    vd = c.get("draft_vocab_size") or c["vocab_size"]
    draft_ids = np.arange(vd)
    want = draft_ids + tensors["d2t"] if vd < c["vocab_size"] else draft_ids
    np.testing.assert_array_equal(head.target_ids(draft_ids), want)
    got = head.to_target(ms.Tensor(draft_ids.astype(np.int32))).asnumpy()
    np.testing.assert_array_equal(got, want)
    assert head.t2d[want].all() and head.t2d.sum() == vd


def test_cache_parameters_are_one_pair_of_static_buffers(converted):
    c, _, head, _, _ = converted
    (k, v), = head.cache_parameters()
    d = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    assert tuple(k.shape) == tuple(v.shape) == (1, c["num_key_value_heads"], MAX_LEN, d)
    assert "k_cache" not in " ".join(head.weight_parameters())

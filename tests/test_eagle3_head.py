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
from mindspore_eagle.tree import ForwardInputs, TreeLayout
from tests.helpers import PUBLIC_CONFIGS, NumpyHead, causal_visibility, public_tensors, write_public_head

setup_mindspore()

TOL = 1e-4
MAX_LEN = 32


# ----- public-format checkpoints -------------------------------------------------------------------------


# ----- the independent numpy reference -------------------------------------------------------------------


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
        inputs = ForwardInputs.for_tree(TreeLayout.chain(ids[start:start + n]), start, bucket, MAX_LEN)
        x_f = np.concatenate([feats[start:start + n], np.zeros((pad, feats.shape[1]), np.float32)])[None]
        out = fn(table, ms.Tensor(inputs.ids), ms.Tensor(x_f), ms.Tensor(inputs.positions),
                 ms.Tensor(inputs.mask), ms.Tensor(inputs.rows))
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

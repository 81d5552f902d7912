"""The EAGLE-3 draft head: one decoder layer over [token embedding | hidden state], in the public checkpoint layout.

Layout (names as in SafeAILab EAGLE ``eagle/model/cnets.py`` ``Model`` / ``LlamaDecoderLayeremb`` and SpecForge
``specforge/modeling/draft/llama3_eagle.py`` ``LlamaForCausalLMEagle3``; checked against both):

    fc                      [3*H_t -> H], no bias: fuses the teacher's tapped hidden states low|mid|high
    midlayer.input_layernorm         RMSNorm on the token embedding
    midlayer.hidden_norm             RMSNorm on the hidden state
    midlayer.self_attn.{q,k,v}_proj  [2H -> heads*D], input = concat(embedding, hidden) (embedding first)
    midlayer.self_attn.o_proj        [heads*D -> H]          (q/k/v/o biases only when attention_bias)
    midlayer.post_attention_layernorm, midlayer.mlp.{gate,up,down}_proj   SwiGLU
    norm, lm_head           [H -> draft_vocab], no bias
    d2t [draft_vocab]       target_id = draft_id + d2t[draft_id]   (only when draft_vocab < vocab)

One step: ``h' = h + attn(cat(in_norm(e), hidden_norm(h)))``, ``out = h' + mlp(post_norm(h'))``. ``out``
(before ``norm``) is the *recycled hidden*: the hidden input of the next draft level. The first level's hidden
input is ``fc(teacher features)``; logits are ``lm_head(norm(out))`` over the draft vocabulary.

Token embeddings are the teacher's and are not part of the head checkpoint, so every forward takes the
embedding table as an explicit input (no copy, no shared Parameter whose name a wrapper could rename). The
one exception, as in the reference code: a head whose ``hidden_size`` differs from the teacher's
(``target_hidden_size``) cannot use the teacher's table and carries its own ``embed_tokens.weight [vocab, H]``.

Like the teacher, the head owns a static KV cache (``cache_parameters()``: one ``(k, v)`` pair
``[B, Hkv, max_len, D]``) that the cache machinery (``mindspore_eagle.cache``) manages, and receives positions,
mask and cache rows as arguments. Linear weights are stored ``[in, out]`` (the converter transposes HF's).
"""

from __future__ import annotations

import os

import numpy as np
from mindspore import Parameter, Tensor, nn, ops

from ..compute import ComputeChoice
from ..storage.checkpoint import CKPT_NAME, load_array, load_strict
from ..draft_config import DraftConfig
from ..errors import CheckpointError
from ..kernels import pack_weights
from .layers import CachedAttention, Embedding, Linear, RMSNorm, SwiGLU, rope_tables, write_index

D2T_FILE = "d2t.npy"
T2D_FILE = "t2d.npy"


class Eagle3Attention(CachedAttention):
    """``CachedAttention`` whose q/k/v projections read the 2H-wide [embedding | hidden] input (o_proj -> H)."""

    def __init__(self, cfg: DraftConfig, batch_size: int, max_len: int, compute: ComputeChoice):
        super().__init__(cfg, batch_size, max_len, compute, in_features=2 * cfg.hidden_size)


class Eagle3DecoderLayer(nn.Cell):
    """``midlayer``: attention over concat(input_layernorm(embeds), hidden_norm(hidden)), residual on hidden."""

    def __init__(self, cfg: DraftConfig, batch_size: int, max_len: int, compute: ComputeChoice):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Eagle3Attention(cfg, batch_size, max_len, compute)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size, compute.matmul, cfg.rms_norm_eps)

    def construct(self, embeds, hidden, cos, sin, mask, write_idx):
        x = ops.concat((self.input_layernorm(embeds), self.hidden_norm(hidden)), -1)  # [B, T, 2H]
        h = self.self_attn(x, cos, sin, mask, write_idx, None, hidden)  # hidden + attn(x)
        return self.mlp(h, self.post_attention_layernorm.weight, h)  # h + mlp(post_attention_layernorm(h))


class Eagle3DraftHead(nn.Cell):
    """Draft head Cell.

    ``construct(embed_table, input_ids, features, positions, mask, cache_rows) -> hidden_out [B, T, H]``: the
    context forward. ``features [B, T, 3*H_t]`` are teacher taps (fused by ``fc``); entry t pairs token
    ``input_ids[b, t]`` with the teacher features of the *previous* position (EAGLE's convention).
    ``positions, cache_rows [B, T]`` int; ``mask [B, 1, T, max_len]`` additive over the head's own cache.

    Pieces used by tree growth: ``decode`` (same step with an already-fused / recycled hidden),
    ``compute_logits`` (draft-vocabulary logits) and ``to_target`` (draft ids -> target ids).

    ``compute`` (``compute.ComputeChoice``: the teacher's, when drafting for one) chooses the attention core and the
    Linears' matmul (default primitives and MindSpore's MatMul, the one with a gradient: the trainer keeps it);
    custom kernels are packed by ``load`` (or ``kernels.pack_weights``) after loading.
    """

    def __init__(self, cfg: DraftConfig, batch_size: int = 1, max_len: int = 1024,
                 compute: ComputeChoice = ComputeChoice()):
        super().__init__()
        self.cfg = cfg
        self.batch_size = batch_size
        self.max_len = max_len
        self.hidden_size = cfg.hidden_size
        self.fc = Linear(3 * cfg.target_hidden_size, cfg.hidden_size, matmul=compute.matmul)
        self.midlayer = Eagle3DecoderLayer(cfg, batch_size, max_len, compute)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = Linear(cfg.hidden_size, cfg.draft_vocab_size, matmul=compute.matmul)
        self.own_embedding = cfg.target_hidden_size != cfg.hidden_size
        if self.own_embedding:
            self.embed_tokens = Embedding(cfg.vocab_size, cfg.hidden_size)
        self.has_vocab_map = cfg.has_vocab_map
        if self.has_vocab_map:
            self.d2t = Parameter(Tensor(np.zeros(cfg.draft_vocab_size, np.int32)), name="d2t", requires_grad=False)
        self.t2d = np.ones(cfg.vocab_size, np.bool_)  # host only: which target ids the draft can propose
        cos, sin = rope_tables(cfg, max(cfg.max_position_embeddings, max_len))
        self.cos_table = Tensor(cos)  # [P, D]
        self.sin_table = Tensor(sin)
        self.num_kv_heads = cfg.num_kv_heads

    def decode(self, embeds, hidden, positions, mask, cache_rows):
        """One midlayer step: ``embeds, hidden [B, T, H]`` -> recycled hidden ``[B, T, H]`` (K/V written)."""
        b, t = positions.shape
        cos = ops.gather(self.cos_table, positions, 0).reshape(b, 1, t, -1)  # [B, 1, T, D]
        sin = ops.gather(self.sin_table, positions, 0).reshape(b, 1, t, -1)
        return self.midlayer(embeds, hidden, cos, sin, mask, write_index(cache_rows, self.num_kv_heads))

    def compute_logits(self, hidden):
        """Draft-vocabulary logits ``lm_head(norm(hidden))``: ``[..., H] -> [..., draft_vocab]``."""
        return self.lm_head(self.norm(hidden))

    def to_target(self, draft_ids):
        """Draft-vocabulary ids -> target-vocabulary ids (``id + d2t[id]``; identity without a vocab map)."""
        if self.has_vocab_map:
            return draft_ids + ops.gather(self.d2t, draft_ids, 0)
        return draft_ids

    def construct(self, embed_table, input_ids, features, positions, mask, cache_rows):
        embeds = ops.gather(embed_table, input_ids, 0)  # [B, T, H]
        return self.decode(embeds, self.fc(features), positions, mask, cache_rows)

    # ---- host side -----------------------------------------------------------------------------------
    def weight_parameters(self) -> dict:
        """Name -> Parameter of every checkpointed weight (KV cache, vocabulary map, packed kernel copies excluded)."""
        return {p.name: p for p in self.get_parameters()
                if not p.name.endswith(("k_cache", "v_cache", "d2t", "packed_weight"))}

    def cache_parameters(self) -> list:
        """The head's ``(k_cache, v_cache)`` Parameter pair, as a one-layer list (same protocol as the teacher)."""
        attn = self.midlayer.self_attn
        return [(attn.k_cache, attn.v_cache)]

    def set_vocab_map(self, d2t: np.ndarray, t2d: np.ndarray) -> None:
        """Install the draft->target map (validated by ``check_vocab_map``). Call before the first forward:
        a compiled graph keeps its own view of a Parameter whose data is replaced afterwards."""
        check_vocab_map(self.cfg, d2t, t2d, "set_vocab_map")
        if self.has_vocab_map:
            self.d2t.set_data(Tensor(np.asarray(d2t, np.int32)))
        self.t2d = np.asarray(t2d, np.bool_).copy()

    def target_ids(self, draft_ids: np.ndarray) -> np.ndarray:
        """Host version of ``to_target``."""
        ids = np.asarray(draft_ids, np.int64)
        return ids + self.d2t.asnumpy()[ids] if self.has_vocab_map else ids

    @classmethod
    def load(cls, model_dir: str, batch_size: int = 1, max_len: int = 1024, compute: ComputeChoice | None = None
             ) -> "Eagle3DraftHead":
        """Load a converted head directory (``config.json``, ``weights.safetensors``, ``d2t.npy``/``t2d.npy``),
        strictly. ``compute``: default primitives and MindSpore's MatMul; a custom matmul that cannot run here falls
        back to MindSpore's with a message (``ComputeChoice.runnable``)."""
        cfg = DraftConfig.load(model_dir)
        head = cls(cfg, batch_size, max_len, (compute or ComputeChoice()).runnable())
        load_strict(head.weight_parameters(), os.path.join(model_dir, CKPT_NAME))
        pack_weights(head)
        if cfg.has_vocab_map:
            paths = [os.path.join(model_dir, f) for f in (D2T_FILE, T2D_FILE)]
            missing = [p for p in paths if not os.path.isfile(p)]
            if missing:
                raise CheckpointError(f"{model_dir}: draft_vocab_size={cfg.draft_vocab_size} < vocab_size="
                                      f"{cfg.vocab_size} but the vocabulary map is missing: {missing}")
            d2t = load_array(paths[0], "iu", (cfg.draft_vocab_size,), "integer offsets (int64)")
            t2d = load_array(paths[1], "b", (cfg.vocab_size,), "bool")
            check_vocab_map(cfg, d2t, t2d, model_dir)
            head.set_vocab_map(d2t, t2d)
        return head


def check_vocab_map(cfg: DraftConfig, d2t: np.ndarray, t2d: np.ndarray, source: str) -> None:
    """CheckpointError unless ``d2t [draft_vocab]`` / ``t2d [vocab]`` form a consistent map into the vocabulary.

    Rules: integer offsets, every ``i + d2t[i]`` a distinct id in ``[0, vocab)``, and ``t2d`` True exactly on
    those ids. Example: vocab 5, draft ids [0, 1] -> target [1, 4]: d2t = [1, 3], t2d = [F, T, F, F, T].
    """
    d2t, t2d = np.asarray(d2t), np.asarray(t2d)
    if d2t.shape != (cfg.draft_vocab_size,) or t2d.shape != (cfg.vocab_size,):
        raise CheckpointError(f"{source}: vocabulary map shapes d2t {d2t.shape}, t2d {t2d.shape}; expected "
                              f"({cfg.draft_vocab_size},) and ({cfg.vocab_size},)")
    if d2t.size and d2t.dtype.kind not in "iuf":
        raise CheckpointError(f"{source}: d2t has dtype {d2t.dtype}; expected integer offsets")
    if d2t.dtype.kind == "f" and not np.array_equal(d2t, np.round(d2t)):
        raise CheckpointError(f"{source}: d2t holds non-integer offsets")
    target = np.arange(cfg.draft_vocab_size) + d2t.astype(np.int64)
    if target.min() < 0 or target.max() >= cfg.vocab_size:
        bad = int(np.flatnonzero((target < 0) | (target >= cfg.vocab_size))[0])
        raise CheckpointError(f"{source}: d2t maps draft id {bad} to {int(target[bad])}, outside the vocabulary "
                              f"[0, {cfg.vocab_size})")
    if np.unique(target).size != target.size:
        raise CheckpointError(f"{source}: d2t maps two draft ids to the same target id")
    marked = np.zeros(cfg.vocab_size, np.bool_)
    marked[target] = True
    if not np.array_equal(marked, t2d.astype(np.bool_)):
        raise CheckpointError(f"{source}: t2d does not mark exactly the target ids of d2t "
                              f"({int(t2d.astype(bool).sum())} marked, {cfg.draft_vocab_size} mapped)")


def expected_head_shapes(cfg: DraftConfig) -> dict[str, tuple[int, ...]]:
    """Checkpoint names and shapes of a head (ours: Linear weights ``[in, out]``), from the config alone."""
    h, d, i = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    q_out, kv_out = cfg.num_heads * d, cfg.num_kv_heads * d
    shapes: dict[str, tuple[int, ...]] = {
        "fc.weight": (3 * cfg.target_hidden_size, h),
        "midlayer.input_layernorm.weight": (h,),
        "midlayer.hidden_norm.weight": (h,),
        "midlayer.self_attn.q_proj.weight": (2 * h, q_out),
        "midlayer.self_attn.k_proj.weight": (2 * h, kv_out),
        "midlayer.self_attn.v_proj.weight": (2 * h, kv_out),
        "midlayer.self_attn.o_proj.weight": (q_out, h),
        "midlayer.post_attention_layernorm.weight": (h,),
        "midlayer.mlp.gate_proj.weight": (h, i),
        "midlayer.mlp.up_proj.weight": (h, i),
        "midlayer.mlp.down_proj.weight": (i, h),
        "norm.weight": (h,),
        "lm_head.weight": (h, cfg.draft_vocab_size),
    }
    if cfg.attention_bias:
        for name, out in (("q_proj", q_out), ("k_proj", kv_out), ("v_proj", kv_out), ("o_proj", h)):
            shapes[f"midlayer.self_attn.{name}.bias"] = (out,)
    if cfg.target_hidden_size != cfg.hidden_size:
        shapes["embed_tokens.weight"] = (cfg.vocab_size, h)
    return shapes


__all__ = ["D2T_FILE", "Eagle3DraftHead", "T2D_FILE", "check_vocab_map", "expected_head_shapes"]

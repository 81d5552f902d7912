"""Name-map tables from foreign checkpoint layouts to ours.

Our parameter names are HuggingFace's (``model.layers.N.self_attn.q_proj.weight`` ...), so the HF map is
the identity; what differs is orientation: every Linear weight is stored ``[in, out]`` (see
``mindspore_eagle.models.layers.Linear``), so HF's ``[out, in]`` matrices are transposed.
GGUF names (llama.cpp's) map by the table below; llama.cpp also permutes the rows of ``attn_q``/``attn_k``
to its own rotary layout, which ``unpermute_rope_rows`` undoes.
"""

from __future__ import annotations

import re

import numpy as np

# Tensors found in real HF checkpoints that carry no weights we need (recomputed from the config).
HF_STALE_SUFFIXES = ("rotary_emb.inv_freq",)

# llama.cpp name -> HF/our name; "{n}" is the layer number.
GGUF_TO_OURS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "blk.{n}.attn_norm.weight": "model.layers.{n}.input_layernorm.weight",
    "blk.{n}.ffn_norm.weight": "model.layers.{n}.post_attention_layernorm.weight",
    "blk.{n}.attn_q.weight": "model.layers.{n}.self_attn.q_proj.weight",
    "blk.{n}.attn_k.weight": "model.layers.{n}.self_attn.k_proj.weight",
    "blk.{n}.attn_v.weight": "model.layers.{n}.self_attn.v_proj.weight",
    "blk.{n}.attn_output.weight": "model.layers.{n}.self_attn.o_proj.weight",
    "blk.{n}.attn_q.bias": "model.layers.{n}.self_attn.q_proj.bias",
    "blk.{n}.attn_k.bias": "model.layers.{n}.self_attn.k_proj.bias",
    "blk.{n}.attn_v.bias": "model.layers.{n}.self_attn.v_proj.bias",
    "blk.{n}.attn_output.bias": "model.layers.{n}.self_attn.o_proj.bias",
    "blk.{n}.ffn_gate.weight": "model.layers.{n}.mlp.gate_proj.weight",
    "blk.{n}.ffn_up.weight": "model.layers.{n}.mlp.up_proj.weight",
    "blk.{n}.ffn_down.weight": "model.layers.{n}.mlp.down_proj.weight",
}

_GGUF_PATTERNS = [
    (re.compile("^" + re.escape(src).replace(r"\{n\}", r"(\d+)") + "$"), dst) for src, dst in GGUF_TO_OURS.items()
]


def gguf_name_to_ours(name: str) -> str | None:
    """Map a llama.cpp tensor name to ours, or None when the table has no entry."""
    for pattern, dst in _GGUF_PATTERNS:
        m = pattern.match(name)
        if m:
            return dst.format(n=m.group(1)) if m.groups() else dst
    return None


def is_linear_weight(name: str) -> bool:
    """Linear weights are stored transposed ([in, out]); embeddings, norms and biases are not."""
    return name.endswith("_proj.weight") or name == "lm_head.weight" or name.endswith(".fc.weight")


def unpermute_rope_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation.

    llama.cpp's converter reorders each head's rows from HF's rotate-half layout (first half, second half)
    to interleaved pairs: per head, rows ``[a0, a1, ..., b0, b1, ...]`` become ``[a0, b0, a1, b1, ...]``.
    This reverses it. Example, one head of 4 rows: GGUF ``[r0, r1, r2, r3]`` -> HF ``[r0, r2, r1, r3]``.
    """
    rows = w.shape[0]
    half = rows // n_heads // 2
    return w.reshape(n_heads, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)

"""``TeacherConfig``: the teacher's architecture, from a HuggingFace ``config.json``, a GGUF header or our own saved
JSON, validated in ``__post_init__`` and never mutated (a bad file fails at load time, not inside a compiled graph).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any, Mapping


from .errors import CheckpointError, ConfigError
from .fields import (RopeScaling, field_bool, field_int, field_real, field_token_id, field_token_ids, hf_rope, is_int,
                     read_config_json, require_bool, require_finite, require_int_tuple, require_positive, saved_config)
from .storage.checkpoint import unconverted_hint

TEACHER_FORMAT = "mindspore_eagle.teacher"  # the "format" key of our saved TeacherConfig

# HF architecture name -> (qkv_bias, o_bias). openPangu-Embedded puts a bias on q, k, v and o (its
# config key ``bias``); Qwen2 on q, k, v only; Llama on none (unless ``attention_bias``).
_ARCHITECTURES = {
    "PanguEmbeddedForCausalLM": "pangu",
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
}


@dataclass(frozen=True)
class TeacherConfig:
    """Shape and numerics of a Llama-family decoder (openPangu-Embedded, Llama, Qwen2, SmolLM2).

    ``aux_layer_ids`` are the EAGLE-3 taps: the hidden states that are the *inputs* of these layers
    (default ``(2, n//2, n-3)``, low / mid / high) are returned next to the logits.
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int = 0  # 0 -> hidden_size // num_heads
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    architecture: str = "llama"
    aux_layer_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        require_positive(self, "vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                          "num_kv_heads", "max_position_embeddings")
        if self.head_dim == 0:
            if self.hidden_size % self.num_heads:
                raise ConfigError(f"TeacherConfig.hidden_size={self.hidden_size} is not divisible by "
                                  f"num_heads={self.num_heads}; give head_dim explicitly")
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_heads)
        require_positive(self, "head_dim")
        if self.head_dim % 2:
            raise ConfigError(f"TeacherConfig.head_dim={self.head_dim}: rotary embeddings need an even head_dim")
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(f"TeacherConfig.num_heads={self.num_heads} is not a multiple of "
                              f"num_kv_heads={self.num_kv_heads} (grouped-query attention)")
        require_finite(self, "rms_norm_eps", "rope_theta")
        if not self.rms_norm_eps > 0:
            raise ConfigError(f"TeacherConfig.rms_norm_eps={self.rms_norm_eps}: must be > 0")
        if not self.rope_theta > 0:
            raise ConfigError(f"TeacherConfig.rope_theta={self.rope_theta}: must be > 0")
        require_bool(self, "tie_word_embeddings", "qkv_bias", "o_bias")
        if self.rope_scaling is not None and not isinstance(self.rope_scaling, RopeScaling):
            raise ConfigError(f"TeacherConfig.rope_scaling={self.rope_scaling!r}: must be a RopeScaling or None")
        if self.architecture not in _ARCHITECTURES.values():
            raise ConfigError(f"TeacherConfig.architecture={self.architecture!r}: "
                              f"expected one of {sorted(set(_ARCHITECTURES.values()))}")
        if not self.aux_layer_ids:
            n = self.num_layers
            object.__setattr__(self, "aux_layer_ids", (min(2, n - 1), n // 2, max(n - 3, 0)))
        require_int_tuple(self, "aux_layer_ids")
        for i in self.aux_layer_ids:
            if not 0 <= i < self.num_layers:
                raise ConfigError(f"TeacherConfig.aux_layer_ids={self.aux_layer_ids}: layer {i} is outside "
                                  f"[0, {self.num_layers})")
        require_int_tuple(self, "eos_token_ids")
        if self.bos_token_id is not None and not is_int(self.bos_token_id):
            raise ConfigError(f"TeacherConfig.bos_token_id={self.bos_token_id!r}: must be an integer or null")
        for i in self.eos_token_ids + ((self.bos_token_id,) if self.bos_token_id is not None else ()):
            if not 0 <= i < self.vocab_size:
                raise ConfigError(f"TeacherConfig: special token id {i} is outside the vocabulary "
                                  f"[0, {self.vocab_size})")

    @property
    def num_kv_groups(self) -> int:
        return self.num_heads // self.num_kv_heads

    # ---- construction from the formats we accept -------------------------------------------------
    @classmethod
    def from_hf_dict(cls, d: Mapping[str, Any]) -> "TeacherConfig":
        """Build from a HuggingFace ``config.json`` (openPangu-Embedded, Llama or Qwen2)."""
        archs = d.get("architectures") or []
        arch = next((_ARCHITECTURES[a] for a in archs if a in _ARCHITECTURES), None)
        if arch is None:
            raise ConfigError(f"config.json architectures={archs!r}: unsupported; expected one of "
                              f"{sorted(_ARCHITECTURES)}")
        if d.get("hidden_act", "silu") != "silu":
            raise ConfigError(f"config.json hidden_act={d['hidden_act']!r}: only 'silu' (SwiGLU) is supported")
        if arch == "pangu":
            qkv_bias = o_bias = field_bool(d, "bias", True)
        elif arch == "qwen2":
            qkv_bias, o_bias = True, False
        else:
            qkv_bias = o_bias = field_bool(d, "attention_bias", False)
        heads = field_int(d, "num_attention_heads")
        rope_theta, rope_scaling = hf_rope(d)
        return cls(
            vocab_size=field_int(d, "vocab_size"),
            hidden_size=field_int(d, "hidden_size"),
            intermediate_size=field_int(d, "intermediate_size"),
            num_layers=field_int(d, "num_hidden_layers"),
            num_heads=heads,
            num_kv_heads=field_int(d, "num_key_value_heads", 0) or heads,
            head_dim=field_int(d, "head_dim", 0),
            rms_norm_eps=field_real(d, "rms_norm_eps", 1e-6),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            max_position_embeddings=field_int(d, "max_position_embeddings", 4096),
            tie_word_embeddings=field_bool(d, "tie_word_embeddings", False),
            qkv_bias=qkv_bias,
            o_bias=o_bias,
            architecture=arch,
            bos_token_id=field_token_id(d, "bos_token_id"),
            eos_token_ids=field_token_ids(d, "eos_token_id"),
        )

    @classmethod
    def from_gguf_metadata(cls, meta: Mapping[str, Any], tied: bool) -> "TeacherConfig":
        """Build from the ``llama.*`` keys of a GGUF header (``tied``: the file has no ``output.weight``)."""
        arch = meta.get("general.architecture")
        if arch != "llama":
            raise ConfigError(f"GGUF general.architecture={arch!r}: only 'llama' is supported")
        src = "GGUF header"
        heads = field_int(meta, "llama.attention.head_count", source=src)
        hidden = field_int(meta, "llama.embedding_length", source=src)
        vocab = field_int(meta, "llama.vocab_size", 0, src)
        if not vocab:
            tokens = meta.get("tokenizer.ggml.tokens")
            if not isinstance(tokens, (list, tuple)):
                raise ConfigError(f"{src} has neither llama.vocab_size nor a tokenizer.ggml.tokens list")
            vocab = len(tokens)
        return cls(
            vocab_size=vocab,
            hidden_size=hidden,
            intermediate_size=field_int(meta, "llama.feed_forward_length", source=src),
            num_layers=field_int(meta, "llama.block_count", source=src),
            num_heads=heads,
            num_kv_heads=field_int(meta, "llama.attention.head_count_kv", heads, src),
            head_dim=field_int(meta, "llama.rope.dimension_count", hidden // heads if heads else 0, src),
            rms_norm_eps=field_real(meta, "llama.attention.layer_norm_rms_epsilon", source=src),
            rope_theta=field_real(meta, "llama.rope.freq_base", 10000.0, src),
            max_position_embeddings=field_int(meta, "llama.context_length", 4096, src),
            tie_word_embeddings=tied,
            architecture="llama",
            bos_token_id=field_token_id(meta, "tokenizer.ggml.bos_token_id", src),
            eos_token_ids=field_token_ids(meta, "tokenizer.ggml.eos_token_id", src),
        )

    # ---- our own serialisation --------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["format"] = TEACHER_FORMAT
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "TeacherConfig":
        d = dict(d)
        if d.pop("format", None) != TEACHER_FORMAT:
            # A HuggingFace config.json: route it through the HF mapping.
            return cls.from_hf_dict(d)
        return saved_config(cls, d, tuple_keys=("aux_layer_ids", "eos_token_ids"))

    @classmethod
    def load(cls, path: str) -> "TeacherConfig":
        """The config of a converted model directory (or of a config.json file). A directory that holds a
        HuggingFace checkpoint instead is a CheckpointError saying to convert it, before any model is built."""
        d = read_config_json(path)
        if os.path.isdir(path) and d.get("format") != TEACHER_FORMAT:
            hint = unconverted_hint(path)
            if hint:
                raise CheckpointError(hint)
        return cls.from_dict(d)


def expected_weight_shapes(cfg: TeacherConfig) -> dict[str, tuple[int, ...]]:
    """Checkpoint names and shapes of a teacher, computed from the config alone (no Cell built).

    Linear weights are ``[in, out]``. Used by the converter to validate before anything is written, and by ``setup`` to check an
    installed model without importing MindSpore.
    """
    h, d, i = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    q_out, kv_out = cfg.num_heads * d, cfg.num_kv_heads * d
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (cfg.vocab_size, h), "model.norm.weight": (h,)}
    for n in range(cfg.num_layers):
        p = f"model.layers.{n}."
        shapes[p + "input_layernorm.weight"] = (h,)
        shapes[p + "post_attention_layernorm.weight"] = (h,)
        for name, out in (("q_proj", q_out), ("k_proj", kv_out), ("v_proj", kv_out)):
            shapes[p + f"self_attn.{name}.weight"] = (h, out)
            if cfg.qkv_bias:
                shapes[p + f"self_attn.{name}.bias"] = (out,)
        shapes[p + "self_attn.o_proj.weight"] = (q_out, h)
        if cfg.o_bias:
            shapes[p + "self_attn.o_proj.bias"] = (h,)
        shapes[p + "mlp.gate_proj.weight"] = (h, i)
        shapes[p + "mlp.up_proj.weight"] = (h, i)
        shapes[p + "mlp.down_proj.weight"] = (i, h)
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (h, cfg.vocab_size)
    return shapes

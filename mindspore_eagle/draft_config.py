"""Frozen configs of the draft side: ``DraftConfig`` (an EAGLE-3 head's shape) and ``TreeBudget`` (tree growth).

``DraftConfig`` is built from the ``config.json`` that the public EAGLE-3 trainers write (SafeAILab EAGLE's
``eagle/traineagle3/config.json``, SpecForge's ``configs/*-eagle3.json``; ``architectures`` is
``LlamaForCausalLMEagle3`` or ``LlamaForCausalLM``) or from our own saved JSON, and validated where it enters,
like ``TeacherConfig``. Keys read from the public file: ``hidden_size``, ``intermediate_size``,
``num_attention_heads``, ``num_key_value_heads``, ``rms_norm_eps``, ``rope_theta``, ``rope_scaling``,
``vocab_size``, ``draft_vocab_size``, optional ``target_hidden_size``, ``head_dim``, ``attention_bias`` /
``bias`` and ``eagle_config.eagle_aux_hidden_state_layer_ids``.

``TreeBudget`` says how big a speculative tree the draft may grow; every shape of the growth graph follows
from it, so one budget compiles one graph.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

from .fields import (RopeScaling, field_bool, field_int, field_object, field_real, hf_rope, read_config_json,
                     require_bool, require_finite, require_int_tuple, saved_config)

from .teacher_config import TEACHER_FORMAT, TeacherConfig
from .errors import ConfigError
DRAFT_FORMAT = "mindspore_eagle.eagle3"


def _require_int(obj: Any, name: str, low: int, high: int | None = None, why: str = "") -> None:
    value = getattr(obj, name)
    if not isinstance(value, int) or isinstance(value, bool) or value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ConfigError(f"{type(obj).__name__}.{name}={value!r}: must be an integer {bound}{why}")


@dataclass(frozen=True)
class DraftConfig:
    """Shape and numerics of an EAGLE-3 draft head (one decoder layer over [embedding | hidden]).

    ``target_hidden_size`` is the teacher's hidden size H_t (``fc`` maps ``3 * H_t -> hidden_size``); 0 means
    "same as hidden_size", as in the public configs that omit the key. ``draft_vocab_size < vocab_size`` means
    the head predicts over a reduced vocabulary and ``d2t`` maps it back; equal sizes mean no mapping.
    ``attention_bias`` puts a bias on q, k, v and o (HF Llama's ``attention_bias``; EAGLE's ``bias`` key).
    ``aux_layer_ids`` are the teacher layers the head was trained on, when the checkpoint says so (else ``()``).
    """

    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    vocab_size: int
    draft_vocab_size: int
    target_hidden_size: int = 0  # 0 -> hidden_size
    head_dim: int = 0  # 0 -> hidden_size // num_heads
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    max_position_embeddings: int = 2048
    attention_bias: bool = False
    aux_layer_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        for name in ("hidden_size", "intermediate_size", "num_heads", "num_kv_heads", "vocab_size",
                     "draft_vocab_size", "max_position_embeddings"):
            _require_int(self, name, 1)
        if self.target_hidden_size == 0:
            object.__setattr__(self, "target_hidden_size", self.hidden_size)
        _require_int(self, "target_hidden_size", 1)
        if self.head_dim == 0:
            if self.hidden_size % self.num_heads:
                raise ConfigError(f"DraftConfig.hidden_size={self.hidden_size} is not divisible by "
                                  f"num_heads={self.num_heads}; give head_dim explicitly")
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_heads)
        _require_int(self, "head_dim", 2)
        if self.head_dim % 2:
            raise ConfigError(f"DraftConfig.head_dim={self.head_dim}: rotary embeddings need an even head_dim")
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(f"DraftConfig.num_heads={self.num_heads} is not a multiple of "
                              f"num_kv_heads={self.num_kv_heads} (grouped-query attention)")
        _require_int(self, "draft_vocab_size", 1, self.vocab_size, " (the draft vocabulary is a subset of the "
                     "target vocabulary)")
        require_finite(self, "rms_norm_eps", "rope_theta")
        if not self.rms_norm_eps > 0:
            raise ConfigError(f"DraftConfig.rms_norm_eps={self.rms_norm_eps}: must be > 0")
        if not self.rope_theta > 0:
            raise ConfigError(f"DraftConfig.rope_theta={self.rope_theta}: must be > 0")
        require_bool(self, "attention_bias")
        if self.rope_scaling is not None and not isinstance(self.rope_scaling, RopeScaling):
            raise ConfigError(f"DraftConfig.rope_scaling={self.rope_scaling!r}: must be a RopeScaling or None")
        require_int_tuple(self, "aux_layer_ids")
        if self.aux_layer_ids and len(self.aux_layer_ids) != 3:
            raise ConfigError(f"DraftConfig.aux_layer_ids={self.aux_layer_ids}: EAGLE-3 taps exactly three layers")

    # Attribute names shared with TeacherConfig, so layers.CachedAttention / rope_tables accept a DraftConfig.
    @property
    def qkv_bias(self) -> bool:
        return self.attention_bias

    @property
    def o_bias(self) -> bool:
        return self.attention_bias

    @property
    def has_vocab_map(self) -> bool:
        """True when the head predicts over a reduced vocabulary (``d2t`` / ``t2d`` are used)."""
        return self.draft_vocab_size != self.vocab_size

    def check_teacher(self, teacher: TeacherConfig) -> None:
        """ConfigError unless this head can draft for ``teacher`` (vocabulary, tapped width, tap layers)."""
        if teacher.vocab_size != self.vocab_size:
            raise ConfigError(f"DraftConfig.vocab_size={self.vocab_size} differs from the teacher's "
                              f"vocab_size={teacher.vocab_size}: the head was trained for another tokenizer")
        if teacher.hidden_size != self.target_hidden_size:
            raise ConfigError(f"DraftConfig.target_hidden_size={self.target_hidden_size} differs from the teacher's "
                              f"hidden_size={teacher.hidden_size}: fc expects 3 * {self.target_hidden_size} features")
        if self.aux_layer_ids and tuple(self.aux_layer_ids) != tuple(teacher.aux_layer_ids):
            raise ConfigError(f"DraftConfig.aux_layer_ids={self.aux_layer_ids} (the head's training taps) differ "
                              f"from TeacherConfig.aux_layer_ids={teacher.aux_layer_ids}")

    # ---- construction ------------------------------------------------------------------------------
    @classmethod
    def from_hf_dict(cls, d: Mapping[str, Any]) -> "DraftConfig":
        """Build from a public EAGLE-3 ``config.json`` (SafeAILab EAGLE / SpecForge layout)."""
        if d.get("hidden_act", "silu") != "silu":
            raise ConfigError(f"config.json hidden_act={d['hidden_act']!r}: only 'silu' (SwiGLU) is supported")
        layers = d.get("num_hidden_layers", 1)
        if layers != 1:
            raise ConfigError(f"config.json num_hidden_layers={layers!r}: an EAGLE-3 head has exactly one "
                              "decoder layer (midlayer); is this the teacher's checkpoint rather than its draft "
                              "head?")
        if d.get("mlp_bias"):
            raise ConfigError("config.json mlp_bias=true: MLP biases are not part of the EAGLE-3 layout")
        if d.get("fc_norm"):
            raise ConfigError("config.json fc_norm=true: per-tap norms before fc (a SpecForge variant) are not "
                              "supported")
        if d.get("norm_output", True) is not True:
            raise ConfigError("config.json norm_output=false: heads whose logits skip the final norm are not "
                              "supported")
        eagle = field_object(d, "eagle_config") or {}
        taps = eagle.get("eagle_aux_hidden_state_layer_ids") or []
        if not isinstance(taps, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in taps):
            raise ConfigError(f"config.json eagle_config.eagle_aux_hidden_state_layer_ids={taps!r}: must be a list "
                              "of integers")
        vocab = field_int(d, "vocab_size")
        heads = field_int(d, "num_attention_heads")
        rope_theta, rope_scaling = hf_rope(d)
        bias = field_bool(d, "attention_bias", None)
        return cls(
            hidden_size=field_int(d, "hidden_size"),
            intermediate_size=field_int(d, "intermediate_size"),
            num_heads=heads,
            num_kv_heads=field_int(d, "num_key_value_heads", 0) or heads,
            vocab_size=vocab,
            draft_vocab_size=field_int(d, "draft_vocab_size", 0) or vocab,
            target_hidden_size=field_int(d, "target_hidden_size", 0),
            head_dim=field_int(d, "head_dim", 0),
            rms_norm_eps=field_real(d, "rms_norm_eps", 1e-6),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            max_position_embeddings=field_int(d, "max_position_embeddings", 2048),
            attention_bias=field_bool(d, "bias", False) if bias is None else bias,
            aux_layer_ids=tuple(taps),
        )

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["format"] = DRAFT_FORMAT
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "DraftConfig":
        d = dict(d)
        fmt = d.pop("format", None)
        if fmt == TEACHER_FORMAT:
            raise ConfigError(f"config format {TEACHER_FORMAT!r}: this is a teacher model directory, not a draft "
                              "head (pass it as the model; a head directory holds an EAGLE-3 config)")
        if fmt != DRAFT_FORMAT:
            return cls.from_hf_dict(d)
        return saved_config(cls, d, tuple_keys=("aux_layer_ids",))

    @classmethod
    def load(cls, path: str) -> "DraftConfig":
        return cls.from_dict(read_config_json(path))


@dataclass(frozen=True)
class TreeBudget:
    """How large a tree the draft grows each round (EAGLE-2/3 dynamic tree).

    ``max_nodes``  nodes in the emitted tree, root included (so at most ``max_nodes - 1`` drafts); a runtime
                   whose largest bucket cannot hold it refuses the budget when the proposer is built
                   (``RuntimeConfig.check_tree_size``).
    ``depth``      deepest draft level (the root is depth 0). EAGLE's ``depth=d`` argument grows ``d + 1``
                   levels, i.e. ``TreeBudget(depth=d + 1)``.
    ``top_k``      children expanded per frontier node, and frontier width, at every level.
    Growth proposes ``top_k + (depth - 1) * top_k**2`` candidates and keeps the best ``max_nodes - 1``.
    """

    max_nodes: int = 32
    depth: int = 6
    top_k: int = 8

    def __post_init__(self) -> None:
        _require_int(self, "max_nodes", 1)
        _require_int(self, "depth", 1)
        _require_int(self, "top_k", 1)

    @property
    def num_candidates(self) -> int:
        """Scored candidates per growth: ``top_k`` at level 1, ``top_k**2`` at each later level."""
        return self.top_k + (self.depth - 1) * self.top_k ** 2

    @property
    def tree_rows(self) -> int:
        """Draft-cache rows one growth writes above the committed context: ``top_k`` per fed level."""
        return (self.depth - 1) * self.top_k

    def check_vocab(self, draft_vocab_size: int) -> None:
        """ConfigError if ``top_k`` exceeds the draft vocabulary (top-k of fewer logits is undefined)."""
        if self.top_k > draft_vocab_size:
            raise ConfigError(f"TreeBudget.top_k={self.top_k}: must be <= the draft vocabulary size "
                              f"{draft_vocab_size}")


__all__ = ["DRAFT_FORMAT", "DraftConfig", "TreeBudget"]

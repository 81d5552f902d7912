"""Frozen configuration dataclasses, validated where they enter the system.

A config object is built once (from a HuggingFace ``config.json``, a GGUF header or our own saved JSON),
checked in ``__post_init__``, and never mutated. Every invalid value raises ``ConfigError`` naming the field,
so a bad file fails at load time and not inside a compiled graph.

Values read from foreign files go through the ``field_*`` readers, which check the JSON type and never coerce:
``num_attention_heads: 4.7`` is an error, not 4; ``"false"`` is not a bool; ``"2"`` is not a token id. The
``__post_init__`` checks repeat the type rules for configs built in code or from our own saved JSON.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import numbers
import os
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from .storage.checkpoint import unconverted_hint
from .errors import CacheCapacityError, CheckpointError, ConfigError

TEACHER_FORMAT = "mindspore_eagle.teacher"  # the "format" key of our saved TeacherConfig

# HF architecture name -> (qkv_bias, o_bias). openPangu-Embedded puts a bias on q, k, v and o (its
# config key ``bias``); Qwen2 on q, k, v only; Llama on none (unless ``attention_bias``).
_ARCHITECTURES = {
    "PanguEmbeddedForCausalLM": "pangu",
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
}


def read_config_json(path: str) -> dict[str, Any]:
    """The JSON object in ``path`` (or ``path/config.json``); ConfigError when missing, malformed or not an object."""
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise ConfigError(f"no config file at {path}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text ({exc})") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not valid JSON ({exc})") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({type(exc).__name__}: {exc})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def saved_config(cls: type, d: dict[str, Any], tuple_keys: tuple[str, ...]) -> Any:
    """Rebuild one of our frozen configs from its saved dict (``format`` key already removed): unknown keys are a
    ConfigError, ``rope_scaling`` becomes a ``RopeScaling`` and JSON lists in ``tuple_keys`` become tuples."""
    unknown = sorted(set(d) - {f.name for f in dataclasses.fields(cls)})
    if unknown:
        raise ConfigError(f"{cls.__name__}: unknown keys {unknown}")
    d = dict(d)
    if d.get("rope_scaling"):
        rs = d["rope_scaling"]
        if not isinstance(rs, dict):
            raise ConfigError(f"{cls.__name__}.rope_scaling={rs!r}: must be an object")
        unknown = sorted(set(rs) - {f.name for f in dataclasses.fields(RopeScaling)})
        if unknown or "kind" not in rs or "factor" not in rs:
            raise ConfigError(f"{cls.__name__}.rope_scaling={rs!r}: expected the keys of RopeScaling")
        d["rope_scaling"] = RopeScaling(**rs)
    for key in tuple_keys:
        if key in d:
            if not isinstance(d[key], (list, tuple)):
                raise ConfigError(f"{cls.__name__}.{key}={d[key]!r}: must be a list")
            d[key] = tuple(d[key])
    return cls(**d)


# ----- type checks of config fields (configs built in code or from our saved JSON) ----------------------------


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _require_positive(obj: Any, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        if not _is_int(value) or value < 1:
            raise ConfigError(f"{type(obj).__name__}.{name}={value!r}: must be an integer >= 1")


def require_finite(obj: Any, *names: str) -> None:
    """ConfigError unless each field is a finite real number (not a bool, not a string)."""
    for name in names:
        value = getattr(obj, name)
        if not _is_real(value) or not math.isfinite(value):
            raise ConfigError(f"{type(obj).__name__}.{name}={value!r}: must be a finite number")


def require_bool(obj: Any, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        if not isinstance(value, bool):
            raise ConfigError(f"{type(obj).__name__}.{name}={value!r}: must be a bool")


def require_int_tuple(obj: Any, name: str) -> None:
    """ConfigError unless the field is a sequence of integers; stores it as a tuple."""
    value = getattr(obj, name)
    if not isinstance(value, (list, tuple)) or not all(_is_int(i) for i in value):
        raise ConfigError(f"{type(obj).__name__}.{name}={value!r}: must be integers")
    object.__setattr__(obj, name, tuple(value))


# ----- readers of foreign config files (HF config.json, GGUF headers) -------------------------------------------

_REQUIRED = object()


def _absent(key: str, default: Any, source: str) -> Any:
    """The value of a missing key (or JSON null): ``default``, or a ConfigError when the key is required."""
    if default is _REQUIRED:
        raise ConfigError(f"{source} is missing required key {key!r}")
    return default


def field_int(d: Mapping[str, Any], key: str, default: Any = _REQUIRED, source: str = "config.json") -> Any:
    value = d.get(key)
    if value is None:
        return _absent(key, default, source)
    if not isinstance(value, numbers.Integral) or isinstance(value, bool):
        raise ConfigError(f"{source} {key}={value!r}: must be an integer")
    return int(value)


def field_real(d: Mapping[str, Any], key: str, default: Any = _REQUIRED, source: str = "config.json") -> Any:
    value = d.get(key)
    if value is None:
        return _absent(key, default, source)
    if not _is_real(value):
        raise ConfigError(f"{source} {key}={value!r}: must be a number")
    if not math.isfinite(value):
        raise ConfigError(f"{source} {key}={value!r}: must be a finite number")
    return float(value)


def field_bool(d: Mapping[str, Any], key: str, default: Any = _REQUIRED, source: str = "config.json") -> Any:
    value = d.get(key)
    if value is None:
        return _absent(key, default, source)
    if not isinstance(value, bool):
        raise ConfigError(f"{source} {key}={value!r}: must be true or false")
    return value


def field_object(d: Mapping[str, Any], key: str, source: str = "config.json") -> dict | None:
    value = d.get(key)
    if value is not None and not isinstance(value, dict):
        raise ConfigError(f"{source} {key}={value!r}: must be an object")
    return value


def field_token_ids(d: Mapping[str, Any], key: str, source: str = "config.json") -> tuple[int, ...]:
    """A token id or a list of them (HF's ``eos_token_id``); ``()`` when absent."""
    value = d.get(key)
    ids = [] if value is None else value if isinstance(value, list) else [value]
    if not all(isinstance(i, numbers.Integral) and not isinstance(i, bool) for i in ids):
        raise ConfigError(f"{source} {key}={value!r}: must be a token id (an integer) or a list of them")
    return tuple(int(i) for i in ids)


def field_token_id(d: Mapping[str, Any], key: str, source: str = "config.json") -> int | None:
    value = d.get(key)
    if value is not None and not (isinstance(value, numbers.Integral) and not isinstance(value, bool)):
        raise ConfigError(f"{source} {key}={value!r}: must be a token id (an integer)")
    return None if value is None else int(value)


def hf_rope(d: Mapping[str, Any], default_theta: float = 10000.0) -> tuple[float, "RopeScaling | None"]:
    """``(rope_theta, rope_scaling)`` of a HF config: the top-level keys of transformers 4, or the
    ``rope_parameters`` object transformers 5 writes instead (theta and scaling together); both must agree."""
    params = field_object(d, "rope_parameters")
    theta = field_real(d, "rope_theta", None)
    scaling = field_object(d, "rope_scaling")
    if params is not None:
        p_theta = field_real(params, "rope_theta", None, "config.json rope_parameters")
        if theta is not None and p_theta is not None and theta != p_theta:
            raise ConfigError(f"config.json rope_theta={theta} differs from rope_parameters.rope_theta={p_theta}")
        theta = p_theta if p_theta is not None else theta
        if scaling is None:
            scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    return (default_theta if theta is None else theta), RopeScaling.from_hf(scaling)


@dataclass(frozen=True)
class RopeScaling:
    """RoPE frequency scaling. ``kind`` is ``"linear"`` or ``"llama3"`` (Llama-3.x checkpoints)."""

    kind: str
    factor: float
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    def __post_init__(self) -> None:
        if self.kind not in ("linear", "llama3"):
            raise ConfigError(f"RopeScaling.kind={self.kind!r}: supported kinds are 'linear' and 'llama3'")
        require_finite(self, "factor", "low_freq_factor", "high_freq_factor")
        _require_positive(self, "original_max_position_embeddings")
        if not self.factor > 0:
            raise ConfigError(f"RopeScaling.factor={self.factor!r}: must be > 0")

    @classmethod
    def from_hf(cls, d: Mapping[str, Any] | None) -> "RopeScaling | None":
        if not d:
            return None
        kind = d.get("rope_type", d.get("type"))
        if kind == "default":
            return None
        src = "config.json rope_scaling"
        return cls(
            kind=kind,
            factor=field_real(d, "factor", source=src),
            low_freq_factor=field_real(d, "low_freq_factor", 1.0, src),
            high_freq_factor=field_real(d, "high_freq_factor", 4.0, src),
            original_max_position_embeddings=field_int(d, "original_max_position_embeddings", 8192, src),
        )


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
        _require_positive(self, "vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                          "num_kv_heads", "max_position_embeddings")
        if self.head_dim == 0:
            if self.hidden_size % self.num_heads:
                raise ConfigError(f"TeacherConfig.hidden_size={self.hidden_size} is not divisible by "
                                  f"num_heads={self.num_heads}; give head_dim explicitly")
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_heads)
        _require_positive(self, "head_dim")
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
        if self.bos_token_id is not None and not _is_int(self.bos_token_id):
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


class ExecMode(enum.Enum):
    """How Cells run: PERFORMANCE compiles them (``ms.jit``, one graph per input shape); REFERENCE runs them in
    PyNative and makes the engine cross-check every step (slow: for checking, never for serving)."""

    PERFORMANCE = "performance"
    REFERENCE = "reference"

    @classmethod
    def parse(cls, value: "ExecMode | str") -> "ExecMode":
        """An ExecMode from itself or its name ("performance" / "reference"); ConfigError otherwise."""
        if isinstance(value, cls):
            return value
        try:
            return cls(value)
        except ValueError:
            raise ConfigError(f"exec_mode={value!r}: expected one of {[m.value for m in cls]}") from None

    def compile(self, cell):
        """The callable that runs ``cell`` in this mode: the compiled graph, or the Cell itself."""
        import mindspore as ms

        return ms.jit(cell) if self is ExecMode.PERFORMANCE else cell


def parse_sizes(text: str, what: str) -> tuple[int, ...]:
    """Integers from a comma-separated list, the CLI's form of bucket lists: "1,8,16,64" -> (1, 8, 16, 64)."""
    try:
        return tuple(int(b) for b in str(text).split(","))
    except ValueError:
        raise ConfigError(f"{what}={text!r}: expected comma-separated integers, e.g. 1,8,16,64") from None


def smallest_holding(sizes, n: int, default: int | None = None) -> int | None:
    """The smallest of ``sizes`` that is >= ``n`` (``default`` when none is): the one bucket rule, for forward
    buckets, cost tables and training lengths alike."""
    return min((b for b in sizes if b >= n), default=default)


@dataclass(frozen=True)
class Buckets:
    """The static row counts a forward may have: each size compiles one graph, so every forward (prefill chunk,
    tree verification, draft context chunk, row-move list) is padded up to one of them.

    Rules, in one place: sizes are distinct positive integers, sorted, and include 1 (a decode step).
    ``fit(n)`` is the smallest size holding ``n`` rows. Example: sizes (1, 8, 16): fit(1) = 1, fit(5) = 8,
    fit(16) = 16, fit(17) raises ConfigError.
    """

    sizes: tuple[int, ...] = (1, 8, 16, 32, 64)

    def __post_init__(self) -> None:
        raw = tuple(self.sizes) if isinstance(self.sizes, (tuple, list)) else (self.sizes,)
        if not raw or any(isinstance(b, bool) or not isinstance(b, (int, np.integer)) or b < 1 for b in raw):
            raise ConfigError(f"buckets={self.sizes!r}: must be positive integers")
        sizes = tuple(sorted(set(int(b) for b in raw)))
        if sizes[0] != 1:
            raise ConfigError(f"buckets={sizes}: must contain 1 (the decode step)")
        object.__setattr__(self, "sizes", sizes)

    @classmethod
    def parse(cls, text: str) -> "Buckets":
        """From a comma-separated list, e.g. "1,8,16,64" (the CLI's form)."""
        return cls(parse_sizes(text, "buckets"))

    @property
    def largest(self) -> int:
        return self.sizes[-1]

    def fit(self, num_rows: int) -> int:
        """Smallest size >= ``num_rows`` (>= 1)."""
        b = smallest_holding(self.sizes, num_rows)
        if b is None:
            raise ConfigError(f"{num_rows} rows exceed the largest bucket {self.largest} (buckets={self.sizes})")
        return b

    def chunks(self, num_rows: int, max_chunk: int, room: int) -> list[tuple[int, int]]:
        """Split ``num_rows`` rows into ``(size, bucket)`` chunks of at most ``max_chunk`` real rows whose padded
        buckets, written one after the other, use at most ``room`` rows (the cache rows left).

        Near the end of the room a chunk shrinks to the largest bucket that still fits (then it has no padding).
        Example, sizes (1, 8, 16, 32, 64), 70 rows, chunk 64: room 1000 -> [(64, 64), (6, 8)]; room 70 ->
        [(64, 64)] + [(1, 1)] * 6 (a padded bucket of 8 would not fit the 6 rows left). CacheCapacityError when
        the rows do not fit the room at all.
        """
        if num_rows > room:
            raise CacheCapacityError(f"{num_rows} rows do not fit: {room} cache rows left")
        out, done = [], 0
        while done < num_rows:
            size = min(num_rows - done, max_chunk)
            bucket = self.fit(size)
            if bucket > room:
                fitting = [b for b in self.sizes if b <= min(size, room)]
                if not fitting:
                    raise CacheCapacityError(f"{num_rows - done} more rows do not fit: {room} cache rows left")
                bucket = size = fitting[-1]
            out.append((size, bucket))
            done += size
            room -= size
        return out


@dataclass(frozen=True)
class RuntimeConfig:
    """How a teacher runs: cache size, batch, execution mode and the static shape buckets.

    ``buckets`` (a ``Buckets``; a tuple is converted) are the row counts a forward may have, used by prefill
    chunks, tree verification, the draft's context chunks and cache row moves alike. ``prefill_chunk`` must be
    one of them. ``exec_mode`` is an ``ExecMode`` (its name is accepted and converted once, here).

    ``dtype`` is the compute dtype of every Linear of the teacher and the draft head: "float32" (the parity path
    against transformers) or "bfloat16" (bf16 weights and activations, fp32 sums: the Ascend-like regime; needs the
    custom kernel). ``matmul`` picks the Linear implementation: "auto" (the custom batch-invariant kernel of
    ``mindspore_eagle.kernels`` where this machine runs it, else MindSpore's MatMul, with a message), "custom"
    (the kernel or an error) or "mindspore". Speculative output equals greedy output *in the same dtype*.

    ``weights`` says which copy of a quantized checkpoint's weights the teacher's kernels read: "native" (the
    GGUF's own Q4_0 / Q4_1 / Q8_0 blocks, rebuilt in registers with the converter's arithmetic: the same fp32
    teacher bit for bit, reading ~6x fewer bytes; needs the custom kernels in float32 and a model converted with
    its blocks), "dense" (the dequantized fp32 weights), or "auto": native where the model has blocks and the
    run is custom float32, else dense.

    ``context_buckets`` are the mask widths (cache rows attended) a forward may have on the primitive attention
    path (``models.layers.CachedAttention``): a forward attends over the smallest one holding the committed rows
    plus its own, and each (bucket, context bucket) compiles one graph on first use. ``None`` (the default) means
    the powers of two from 128 below ``max_cache_len``, and ``max_cache_len``; given sizes must lie in
    ``[1, max_cache_len]``, and ``max_cache_len`` is always added (every forward fits it). ``(max_cache_len,)``
    turns context bucketing off. ``context_sizes`` is the resolved tuple. Example, max_cache_len 1024:
    (128, 256, 512, 1024); max_cache_len 160: (128, 160).

    ``greedy_output`` is what a greedy forward hands the host (``teacher`` module docstring): "argmax" (the
    logits reduced in the graph, int32 ids), "logits" (the host takes ``np.argmax``), or "auto": "argmax" on a
    device, "logits" on the CPU, where the host is the device and reducing in the graph is the dearer way
    (measured, [16, 49152] fp32: in-graph tie-safe argmax 10.8 ms, logits to numpy + ``np.argmax`` 0.86 ms).
    ``greedy_kind`` is the resolved choice.
    """

    max_cache_len: int = 1024
    batch_size: int = 1
    exec_mode: ExecMode = ExecMode.PERFORMANCE
    device: str = "CPU"
    buckets: Buckets = Buckets()
    prefill_chunk: int = 64
    dtype: str = "float32"
    matmul: str = "auto"
    context_buckets: tuple[int, ...] | None = None
    greedy_output: str = "auto"
    weights: str = "auto"

    def __post_init__(self) -> None:
        _require_positive(self, "max_cache_len", "batch_size", "prefill_chunk")
        if self.greedy_output not in ("auto", "argmax", "logits"):
            raise ConfigError(f"RuntimeConfig.greedy_output={self.greedy_output!r}: expected 'auto', 'argmax' or "
                              f"'logits'")
        if self.context_buckets is not None:
            raw = self.context_buckets
            if (not isinstance(raw, (tuple, list)) or not raw
                    or any(isinstance(c, bool) or not isinstance(c, (int, np.integer)) for c in raw)):
                raise ConfigError(f"RuntimeConfig.context_buckets={raw!r}: must be a non-empty sequence of integers")
            bad = [int(c) for c in raw if not 1 <= c <= self.max_cache_len]
            if bad:
                raise ConfigError(f"RuntimeConfig.context_buckets={tuple(raw)}: {bad} outside [1, max_cache_len="
                                  f"{self.max_cache_len}]")
            object.__setattr__(self, "context_buckets", tuple(sorted({int(c) for c in raw})))
        object.__setattr__(self, "exec_mode", ExecMode.parse(self.exec_mode))
        if self.device not in ("CPU", "Ascend"):
            raise ConfigError(f"RuntimeConfig.device={self.device!r}: expected 'CPU' or 'Ascend'")
        if not isinstance(self.buckets, Buckets):
            object.__setattr__(self, "buckets", Buckets(self.buckets))
        if self.prefill_chunk not in self.buckets.sizes:
            raise ConfigError(f"RuntimeConfig.prefill_chunk={self.prefill_chunk} must be one of the buckets "
                              f"{self.buckets.sizes}")
        if self.buckets.largest > self.max_cache_len:
            raise ConfigError(f"RuntimeConfig.buckets: largest bucket {self.buckets.largest} exceeds "
                              f"max_cache_len={self.max_cache_len}")
        if self.dtype not in ("float32", "bfloat16"):
            raise ConfigError(f"RuntimeConfig.dtype={self.dtype!r}: expected 'float32' or 'bfloat16'")
        if self.matmul not in ("auto", "custom", "mindspore"):
            raise ConfigError(f"RuntimeConfig.matmul={self.matmul!r}: expected 'auto', 'custom' or 'mindspore'")
        if self.weights not in ("auto", "dense", "native"):
            raise ConfigError(f"RuntimeConfig.weights={self.weights!r}: expected 'auto', 'dense' or 'native'")
        if self.weights == "native" and (self.dtype != "float32" or self.matmul == "mindspore"):
            raise ConfigError(f"RuntimeConfig(weights='native', dtype={self.dtype!r}, matmul={self.matmul!r}): the "
                              "quantized blocks are computed by the custom float32 kernels; use dtype='float32' with "
                              "matmul 'auto' or 'custom', or weights='dense'")
        if self.dtype == "bfloat16" and self.matmul == "mindspore":
            raise ConfigError("RuntimeConfig(dtype='bfloat16', matmul='mindspore'): MindSpore's CPU MatMul has no "
                              "bf16 kernel; use matmul='auto' or 'custom'")

    @property
    def reference(self) -> bool:
        return self.exec_mode is ExecMode.REFERENCE

    @property
    def greedy_kind(self) -> str:
        """``greedy_output`` resolved: "argmax" or "logits" (class docstring)."""
        if self.greedy_output != "auto":
            return self.greedy_output
        return "logits" if self.device == "CPU" else "argmax"

    @property
    def context_sizes(self) -> tuple[int, ...]:
        """The context buckets, resolved (see the class docstring), ascending, ending at ``max_cache_len``."""
        given = self.context_buckets
        if given is None:
            given = tuple(2 ** k for k in range(7, self.max_cache_len.bit_length()) if 2 ** k < self.max_cache_len)
        return tuple(sorted(set(given) | {self.max_cache_len}))

    def check_tree_size(self, max_nodes: int, what: str = "TreeBudget.max_nodes") -> int:
        """The verification bucket of a tree of ``max_nodes`` nodes; ConfigError naming both sides when no bucket
        holds it (checked when a proposer is built for this runtime, not at the first step)."""
        if max_nodes > self.buckets.largest:
            raise ConfigError(f"{what}={max_nodes} does not fit RuntimeConfig.buckets={self.buckets.sizes}: a tree "
                              f"is verified in one forward of at most {self.buckets.largest} rows; lower the tree "
                              f"budget or add a bucket >= {max_nodes} (--buckets)")
        return self.buckets.fit(max_nodes)


def replace(cfg: Any, **changes: Any) -> Any:
    """``dataclasses.replace`` that re-runs validation (frozen configs are rebuilt, never mutated)."""
    return dataclasses.replace(cfg, **changes)


__all__ = ["Buckets", "ExecMode", "smallest_holding", "TEACHER_FORMAT", "TeacherConfig", "RuntimeConfig", "RopeScaling", "field_bool",
           "field_int", "field_object", "field_real", "field_token_id", "field_token_ids", "hf_rope", "parse_sizes",
           "read_config_json", "replace", "require_bool", "require_finite", "require_int_tuple", "saved_config"]

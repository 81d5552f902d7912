"""Reading foreign config files without coercion: the ``field_*`` readers and the ``require_*`` checks that every
frozen config (teacher, runtime, draft head) uses where it enters.

Values read from foreign files go through the ``field_*`` readers, which check the JSON type and never coerce:
``num_attention_heads: 4.7`` is an error, not 4; ``"false"`` is not a bool; ``"2"`` is not a token id. The
``__post_init__`` checks repeat the type rules for configs built in code or from our own saved JSON.
"""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
import os
from dataclasses import dataclass
from typing import Any, Mapping


from .errors import ConfigError


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


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def require_positive(obj: Any, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        if not is_int(value) or value < 1:
            raise ConfigError(f"{type(obj).__name__}.{name}={value!r}: must be an integer >= 1")


def require_finite(obj: Any, *names: str) -> None:
    """ConfigError unless each field is a finite real number (not a bool, not a string)."""
    for name in names:
        value = getattr(obj, name)
        if not is_real(value) or not math.isfinite(value):
            raise ConfigError(f"{type(obj).__name__}.{name}={value!r}: must be a finite number")


def require_bool(obj: Any, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        if not isinstance(value, bool):
            raise ConfigError(f"{type(obj).__name__}.{name}={value!r}: must be a bool")


def require_int_tuple(obj: Any, name: str) -> None:
    """ConfigError unless the field is a sequence of integers; stores it as a tuple."""
    value = getattr(obj, name)
    if not isinstance(value, (list, tuple)) or not all(is_int(i) for i in value):
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
    if not is_real(value):
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
        require_positive(self, "original_max_position_embeddings")
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

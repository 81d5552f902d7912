"""Typed errors raised by mindspore_eagle.

Every failure a user can cause (a bad config, a bad checkpoint, an invalid tree, a prompt that does not
fit the cache) is reported by one of these, with a message that names the offending field, tensor, node
or length. They are raised on the host, before any graph runs, so nothing fails deep inside MindSpore and
nothing is left half-written.
"""


class EagleError(Exception):
    """Base class of every error raised on purpose by mindspore_eagle."""


class ConfigError(EagleError, ValueError):
    """A configuration value is invalid or unsupported (names the field and the value)."""


class CheckpointError(EagleError):
    """A checkpoint is missing tensors, has unexpected ones, wrong shapes, or is unreadable."""


class TreeInvariantError(EagleError):
    """A speculative tree breaks one of the layout invariants (names the node and the rule)."""


class CacheCapacityError(EagleError):
    """A write would run past the end of the static KV cache buffer."""


class TokenizerError(EagleError):
    """A tokenizer file is missing or malformed, or a chat format is unknown."""


class AssetError(EagleError):
    """A required offline asset (default model, evaluation data) is missing or corrupt."""


class DataError(EagleError):
    """A training-data directory or shard is unreadable, damaged, or inconsistent with its manifest."""


class IdentityError(EagleError):
    """A training run or data directory belongs to another teacher, data set or recipe than the command that would
    add to it, or records no identity at all (names the differing keys and what to do)."""

"""``TrainConfig`` and ``DataConfig``: one frozen object for a ``train-draft`` run and one for a data generation run
(``python -m mindspore_eagle.train.data``), the recipe's values as their defaults.

Where the values come from, later ones winning: the field defaults (the shipped head's recipe: 3 TTT steps, held-out
every 50 steps on 128 sequences, patience 4, prompt positions trained, ...; the synthetic prompt set answered at
B=128), then a recipe file (``--config FILE``, the same file for both commands; ``configs/train/`` holds the
recipes), then the command-line flags the user typed. Every field has one flag (``--ttt-steps`` for ``ttt_steps``;
booleans ``--prompt-loss`` / ``--no-prompt-loss``), generated from the fields, so a new field cannot be forgotten by
the parser.

A recipe file is a JSON object of two optional sections, ``"data"`` (DataConfig's fields) and ``"train"``
(TrainConfig's); keys starting with ``_`` are comments, and an unknown section or key is refused by name::

    {"_comment": "...", "data": {"prompts": "mix", "max_answer_tokens": 2200000}, "train": {"lr": 5e-5}}

Validation: TrainConfig's is the one ``check``: a value that would crash the run later (a zero evaluation interval,
no TTT step, a non-positive clip norm) or silently train garbage (a NaN or negative learning rate exports a NaN head)
is a ``ConfigError`` naming the flag, the value and what is allowed -- before anything is read, loaded or written.
DataConfig checks only its types here; its ranges are ``data.check_generation_args``'s, where the teacher is known
(top-k against its vocabulary, the caches against its positions and this machine's memory).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from ..fields import is_int, is_real, read_config_json


@dataclass(frozen=True)
class TrainConfig:
    """A training run (module docstring). Paths: ``out`` the exported head; ``data`` the data directory (default:
    the teacher's own, generated when missing); ``run_dir`` checkpoints and state (default
    ``OUT/../.train-run-NAME``)."""

    out: str = ""
    teacher: str | None = None
    data: str | None = None
    run_dir: str | None = None
    num_prompts: int = 600
    draft_vocab: int = 6144
    ttt_steps: int = 3
    epochs: float = 20.0
    max_steps: int | None = None
    lr: float = 2e-3
    warmup: int = 20
    clip: float = 0.5
    tokens_per_batch: int = 1024
    buckets: tuple[int, ...] = (128, 192, 256)
    heldout: float = 0.08
    heldout_max: int = 128
    train_eval_max: int = 0
    patience: int = 4
    min_delta: float = 0.003
    max_answer_tokens: int | None = None
    eval_every: int = 50
    ckpt_every: int = 25
    time_limit_min: float | None = None
    prompt_loss: bool = True
    dtype: str = "float16"
    seed: int = 0
    init_head: str | None = None
    head_intermediate: int | None = None
    vocab_from_head: bool = False
    export_only: bool = False
    overwrite: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.buckets, str):
            object.__setattr__(self, "buckets", parse_buckets(self.buckets))
        object.__setattr__(self, "buckets", tuple(self.buckets))
        self.check()

    def check(self) -> None:
        """ConfigError naming the flag for any value out of range (module docstring)."""
        if not isinstance(self.out, str) or not self.out:
            raise ConfigError("--out: the output head directory is required")
        ints = (("num_prompts", 1, ""), ("draft_vocab", 1, ""), ("ttt_steps", 1, " (draft steps trained per position)"),
                ("warmup", 0, ""), ("tokens_per_batch", 1, ""), ("heldout_max", 0, " (0: all)"),
                ("train_eval_max", 0, " (0: off)"), ("patience", 0, " (0: never)"),
                ("eval_every", 1, " (optimizer steps between evaluations)"),
                ("ckpt_every", 1, " (optimizer steps between checkpoints)"), ("seed", 0, ""),
                ("max_steps", 0, " (0: evaluate and export only)"), ("max_answer_tokens", 1, ""),
                ("head_intermediate", 1, ""))
        for name, low, note in ints:
            value = getattr(self, name)
            if value is None and name in OPTIONAL:
                continue
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"{flag(name)} {value!r}: must be an integer")
            if value < low:
                raise ConfigError(f"{flag(name)} {value}: must be >= {low}{note}")
        if not (_finite(self.lr) and self.lr > 0):
            raise ConfigError(f"--lr {self.lr}: must be a finite number > 0 (the peak learning rate, such as 2e-3)")
        if not (_finite(self.epochs) and self.epochs > 0):
            raise ConfigError(f"--epochs {self.epochs}: must be a finite number > 0 (fractions allowed; --max-steps 0 "
                              "evaluates and exports without training)")
        if not (_finite(self.clip) and self.clip > 0):
            raise ConfigError(f"--clip {self.clip}: must be a finite number > 0 (the cap on the gradients' global "
                              "norm; there is no 'off' value: a large one such as 1e9 never clips)")
        if not (_finite(self.heldout) and 0 < self.heldout < 1):
            raise ConfigError(f"--heldout {self.heldout}: must be a fraction strictly between 0 and 1 (the share of "
                              "conversations held out for evaluation)")
        if not (_finite(self.min_delta) and self.min_delta >= 0):
            raise ConfigError(f"--min-delta {self.min_delta}: must be a finite number >= 0")
        if self.time_limit_min is not None and not (_finite(self.time_limit_min) and self.time_limit_min > 0):
            raise ConfigError(f"--time-limit-min {self.time_limit_min}: must be a finite number of minutes > 0 (leave "
                              "it out for no time limit)")
        if self.dtype not in DTYPES:
            raise ConfigError(f"--dtype {self.dtype!r}: expected one of {DTYPES} (the exported weights' dtype)")
        if not self.buckets or any(b < 1 for b in self.buckets) or \
                any(x >= y for x, y in zip(self.buckets, self.buckets[1:])):
            raise ConfigError(f"--buckets {','.join(map(str, self.buckets))}: must be positive and strictly "
                              "increasing (entries per sequence, such as 128,192,256)")
        if self.vocab_from_head and not self.init_head:
            raise ConfigError("--vocab-from-head needs --init-head")

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> "TrainConfig":
        """Field defaults, then the ``"train"`` section of ``--config``'s file, then the flags given."""
        return config_from_args(cls, ns, "train")


TYPES = {"int": (is_int, "an integer"), "float": (is_real, "a number"),
         "bool": (lambda v: isinstance(v, bool), "true or false"), "str": (lambda v: isinstance(v, str), "a string")}


@dataclass(frozen=True)
class DataConfig:
    """A data generation run (module docstring). Paths: ``out`` the data directory (default: the teacher's own,
    ``data.default_data_dir``); ``teacher`` the converted teacher (default: the default teacher)."""

    out: str | None = None
    teacher: str | None = None
    prompts: str = "synthetic"
    sharegpt_fraction: float | None = None
    per_category: int = 2500
    second_turns: bool = True
    num_conversations: int | None = None
    max_answer_tokens: int | None = None
    time_limit: float | None = None
    batch_size: int = 128
    max_new_tokens: int = 192
    max_prompt_tokens: int = 160
    topk: int = 32
    skip_ledger: str | None = None
    from_ledger: str | None = None
    retarget: bool = False

    def __post_init__(self) -> None:
        """ConfigError naming the flag for a value of another type (a recipe file's ``"batch_size": "128"``), and
        for a generation setting given beside ``from_ledger`` (the ledger's own settings apply: a value given there
        would be silently ignored)."""
        for f in dataclasses.fields(self):
            value, kind = getattr(self, f.name), str(f.type)  # "int", "int | None", ...
            if value is None and kind.endswith("| None"):
                continue
            is_kind, what = TYPES[kind.split(" ")[0]]
            if not is_kind(value):
                raise ConfigError(f"{flag(f.name)} {value!r}: must be {what}")
        if self.retarget and self.from_ledger is None:
            raise ConfigError("--retarget applies to a rebuild from a ledger: give --from-ledger LEDGER, or leave it "
                              "out")
        if self.from_ledger is not None:
            given = [flag(f.name) for f in dataclasses.fields(self)
                     if f.name not in LEDGER_FIELDS and getattr(self, f.name) != f.default]
            if given:
                raise ConfigError(f"--from-ledger {self.from_ledger}: {', '.join(given)} cannot apply (a rebuild "
                                  "answers nothing anew: the ledger's own prompt and generation settings are its "
                                  "identity); leave them out, or generate without --from-ledger")

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> "DataConfig":
        """Field defaults, then the ``"data"`` section of ``--config``'s file, then the flags given."""
        return config_from_args(cls, ns, "data")


LEDGER_FIELDS = ("out", "teacher", "time_limit", "from_ledger", "retarget")
"""DataConfig's fields that apply to a rebuild from a ledger (``from_ledger``); the others are the ledger's."""


# ----- the command line and recipe files --------------------------------------------------------------------------
SECTIONS = {"data": DataConfig, "train": TrainConfig}  # a recipe file's sections (module docstring)


def read_recipe(path: str, section: str) -> dict[str, Any]:
    """The ``section`` of recipe file ``path`` (module docstring) as a dict of its config's fields, comments dropped;
    ConfigError naming the file for an unknown section or key."""
    recipe = _uncommented(read_config_json(path), path)
    unknown = sorted(set(recipe) - set(SECTIONS))
    if unknown:
        raise ConfigError(f"--config {path}: unknown section(s) {unknown}; a recipe file holds 'data' (the fields of "
                          "DataConfig: python -m mindspore_eagle.train.data --help) and 'train' (TrainConfig: "
                          "mindspore-eagle train-draft --help)")
    values = _uncommented(recipe.get(section, {}), f"{path} section '{section}'")
    cls = SECTIONS[section]
    unknown = sorted(set(values) - {f.name for f in dataclasses.fields(cls)})
    if unknown:
        raise ConfigError(f"--config {path}: unknown key(s) {unknown} in section '{section}'; its keys are "
                          f"{cls.__name__}'s fields")
    return values


def _uncommented(d: Any, where: str) -> dict[str, Any]:
    if not isinstance(d, dict):
        raise ConfigError(f"--config {where}: expected a JSON object, got {type(d).__name__}")
    return {k: v for k, v in d.items() if not k.startswith("_")}  # "_comment" keys


def config_from_args(cls, ns: argparse.Namespace, section: str):
    """``cls`` from the field defaults, then ``section`` of ``ns.config``'s file, then the flags given (argparse
    defaults are ``None``: a flag left out keeps the file's or the field's value)."""
    values = read_recipe(ns.config, section) if ns.config else {}
    given = {f.name: getattr(ns, f.name) for f in dataclasses.fields(cls) if getattr(ns, f.name) is not None}
    return cls(**{**values, **given})


DTYPES = ("float16", "float32")
OPTIONAL = {f.name for f in dataclasses.fields(TrainConfig) if f.default is None}
HELP = {
    "out": "output head directory (public EAGLE-3 format)",
    "teacher": "converted teacher directory (default: the default teacher)",
    "data": "training data directory (train.data); generated if missing",
    "run_dir": "checkpoints/logs (default: OUT/../.train-run-NAME)",
    "num_prompts": "prompts to generate when --data has none",
    "max_steps": "cap on optimizer steps (sets the LR schedule)",
    "buckets": "entries per sequence of the compiled train graphs, increasing (such as 128,192,256)",
    "heldout": "fraction of conversations held out",
    "heldout_max": "held-out sequences evaluated per prompt source (a fixed sample of the split; 0: all)",
    "train_eval_max": "also evaluate a fixed sample of this many training sequences at every evaluation (history "
                      "'train': the train/held-out gap tells memorisation from a capacity or compute limit; 0: off)",
    "patience": "stop when the trend (least-squares line) of the last PATIENCE + 1 held-out evaluations gains at most "
                "--min-delta tau across them (0: never)",
    "min_delta": "the held-out tau gain across the --patience window that keeps a run going",
    "max_answer_tokens": "train on the first sequences of the data holding this many answer tokens (scaling runs)",
    "time_limit_min": "training-time budget of the run, resumes included and pauses (SIGSTOP) left out (the LR decays "
                      "over it)",
    "prompt_loss": "also train on prompt positions (--no-prompt-loss: answers only)",
    "dtype": "exported weight dtype",
    "init_head": "start from this head (public EAGLE-3 directory); lm_head rows move to the new draft vocabulary by "
                 "target id, rows of ids it lacks start from the teacher's embedding plus the head's mean learned "
                 "shift",
    "head_intermediate": "the head's MLP width (default: --init-head's, else the teacher's); wider than "
                         "--init-head's widens it without changing its drafts (new units start with a zero "
                         "down-projection)",
    "vocab_from_head": "keep --init-head's draft vocabulary instead of building one from the data",
    "export_only": "export the best head of --run-dir and stop",
    "overwrite": "replace a non-empty --out that is not a head, and start afresh a --run-dir that belongs to another "
                 "run (only the trainer's own files there are removed)",
}

DATA_HELP = {
    "out": "data directory (default: HOME/train_data/<teacher name>-<its content fingerprint>)",
    "teacher": "converted teacher dir (default: the default teacher)",
    "prompts": "prompt set: synthetic, sharegpt (its user turns) or mix (see --sharegpt-fraction)",
    "sharegpt_fraction": "with --prompts mix: the share of ShareGPT conversations, in (0, 1) (default 0.75)",
    "per_category": "conversations per category in the synthetic set",
    "second_turns": "ask a conversation's second turn after the teacher's first answer (--no-second-turns: first "
                    "turns only)",
    "num_conversations": "first N of the set (default: all)",
    "max_answer_tokens": "stop (resumably) once the directory holds this many answer tokens",
    "time_limit": "stop (resumably) after this many seconds",
    "batch_size": "conversations generated at once (continuous batching slots)",
    "max_new_tokens": "answer tokens per turn at most",
    "max_prompt_tokens": "first turns longer than this are left out",
    "topk": "teacher logits stored per position (the soft target)",
    "skip_ledger": "answer ledger whose conversations are not generated again (the same identity): a fresh "
                   "directory continues the ledger without rebuilding it; export the new answers into it after",
    "from_ledger": "rebuild the features of this answer ledger's conversations instead of generating answers (as "
                   "`python -m mindspore_eagle.train.ledger rebuild`; with --out, --teacher, --time-limit, --retarget "
                   "only)",
    "retarget": "with --from-ledger: the ledger may name another conversion of this teacher (another fingerprint); "
                "every answer token is then checked against this teacher's greedy choice and the directory records "
                "this teacher (`ledger rebuild --retarget`)",
}

def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def parse_buckets(text: str) -> tuple[int, ...]:
    """``--buckets`` text as integers (``"128,192,256"``); ConfigError naming the value when it is not a list of
    integers. Their order and sign are ``TrainConfig.check``'s: a sequence goes to the first bucket that holds it
    and evaluation uses the last, so the order is the meaning."""
    try:
        return tuple(int(b) for b in str(text).split(","))
    except ValueError:
        raise ConfigError(f"--buckets {text!r}: expected comma-separated integers such as 128,192,256") from None


def build_parser() -> argparse.ArgumentParser:
    """``train-draft``'s parser: one flag per ``TrainConfig`` field, plus ``--config FILE``."""
    return _field_parser(TrainConfig, HELP, "mindspore-eagle train-draft",
                         "Train an EAGLE-3 draft head for a teacher (MindSpore, TTT objective). Values: the defaults "
                         "below, then the 'train' section of --config FILE, then the flags given.")


def build_data_parser() -> argparse.ArgumentParser:
    """The data generator's parser: one flag per ``DataConfig`` field, plus ``--config FILE``."""
    return _field_parser(DataConfig, DATA_HELP, "python -m mindspore_eagle.train.data",
                         "Generate teacher answers + features for draft-head training. Values: the defaults below, "
                         "then the 'data' section of --config FILE, then the flags given.")


def _field_parser(cls, helps: dict[str, str], prog: str, description: str) -> argparse.ArgumentParser:
    """One flag per field of ``cls`` (its default shown from the field, argparse default ``None``), plus
    ``--config FILE``."""
    ap = argparse.ArgumentParser(prog=prog, description=description)
    ap.add_argument("--config", default=None, help="recipe file (JSON: 'data' and 'train' sections; "
                                                   "configs/train/*.json)")
    for f in dataclasses.fields(cls):
        default = f.default
        shown = ",".join(map(str, default)) if isinstance(default, tuple) else default
        text = helps.get(f.name, "")
        if shown not in (None, ""):  # an unset default is described by the help text
            text = f"{text} (default {shown})" if text else f"default {shown}"
        if f.type in ("bool", bool):
            ap.add_argument(flag(f.name), dest=f.name, action=argparse.BooleanOptionalAction, default=None, help=text)
            continue
        kind = {"int": int, "int | None": int, "float": float, "float | None": float}.get(str(f.type), str)
        ap.add_argument(flag(f.name), dest=f.name, type=kind, default=None, help=text)
    return ap


def _finite(value) -> bool:
    return value is not None and not isinstance(value, bool) and isinstance(value, (int, float)) and \
        math.isfinite(value)


__all__ = ["DataConfig", "TrainConfig", "build_data_parser", "build_parser", "parse_buckets", "read_recipe"]

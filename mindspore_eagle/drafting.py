"""``DraftingConfig``: how a request is drafted -- which sources, which budget rule, and the bound every step obeys.

One frozen object, validated where it enters, is the only drafting input of the builder (``build.build``), the CLI,
the server (one per request, bounded by the server's), the deployment check and the MindFormers adapter (a YAML key
per field). Its defaults are the product's: hybrid drafting (the EAGLE-3 head and the suffix index in one tree),
the adaptive budget, the shipped suffix calibration, and a head growing ``depth`` 2 levels of ``top_k`` 4.

``max_nodes`` is the one bound: the nodes a step verifies, root included, in every mode -- the fixed budget
verifies that many (fewer when the candidates run out), the adaptive one picks at most that many, the head's own
tree keeps the best ``max_nodes``. Its bucket must exist (``RuntimeConfig.check_tree_size``) and, on Ascend, it
must fit the fused attention op's query-token limit (``deploy.check_plan``). The head's growth is bounded by its
own settings: ``depth`` levels of ``top_k`` children (``TreeBudget``), whatever ``max_nodes`` keeps of them.
The default bound was chosen by measurement (docs/drafting.md, "The bound"): a long suffix chain is where tau
comes from, so it is larger than the head's tree.

Like vLLM's ``SpeculativeConfig`` (one object: method, draft tokens, model) but for trees: the bound is a node
count, not a chain length, and "off" is ``max_nodes`` 1 (the root alone, plain decoding).
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from typing import Any, Mapping

from .errors import ConfigError


class Proposer(str, enum.Enum):
    """Draft sources: the EAGLE-3 head, model-free suffix matches over the conversation, or both in one tree."""

    EAGLE = "eagle"
    SUFFIX = "suffix"
    HYBRID = "hybrid"


class BudgetMode(str, enum.Enum):
    """FIXED: every step verifies ``max_nodes`` nodes. ADAPTIVE: each step picks its node count (hence its bucket)
    from the candidates' acceptance estimates and the measured verification costs (``draft.budget``)."""

    FIXED = "fixed"
    ADAPTIVE = "adaptive"


class CalibrationMode(str, enum.Enum):
    """How suffix candidates are scored: the shipped acceptance table (fitted on the default teacher), or that
    table corrected online by what the teacher accepts (for another teacher)."""

    SHIPPED = "shipped"
    ONLINE = "online"


ORACLES = ("oracle", "wrong")  # bounds for bench and eval, in place of a head: the teacher's own future tokens
DEFAULT_MAX_NODES = 32  # chosen by measurement: docs/drafting.md, "The bound"


def _enum(cls: type[enum.Enum], value: Any, field: str, flag: str):
    if isinstance(value, cls):
        return value
    try:
        return cls(value)
    except ValueError:
        raise ConfigError(f"DraftingConfig.{field}={value!r} ({flag}): expected one of "
                          f"{[m.value for m in cls]}") from None


def _int(value: Any, field: str, flag: str, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"DraftingConfig.{field}={value!r} ({flag}): must be an integer >= {low}")
    return value


@dataclass(frozen=True)
class DraftingConfig:
    """How to draft (module docstring). ``head``: an EAGLE-3 head directory (converted or public layout), None for
    the shipped head of the default teacher, or an oracle (``ORACLES``, bench and eval only: a ceiling and a
    floor, which replace the proposer)."""

    proposer: Proposer = Proposer.HYBRID
    budget: BudgetMode = BudgetMode.ADAPTIVE
    suffix_calibration: CalibrationMode = CalibrationMode.SHIPPED
    max_nodes: int = DEFAULT_MAX_NODES
    depth: int = 2
    top_k: int = 4
    head: str | None = None

    # CLI flag of each field, for messages that name what the user typed
    FLAGS = {"proposer": "--proposer", "budget": "--budget", "suffix_calibration": "--suffix-calibration",
             "max_nodes": "--max-nodes", "depth": "--depth", "top_k": "--top-k", "head": "--draft"}

    def __post_init__(self) -> None:
        f = self.FLAGS
        object.__setattr__(self, "proposer", _enum(Proposer, self.proposer, "proposer", f["proposer"]))
        object.__setattr__(self, "budget", _enum(BudgetMode, self.budget, "budget", f["budget"]))
        object.__setattr__(self, "suffix_calibration", _enum(CalibrationMode, self.suffix_calibration,
                                                             "suffix_calibration", f["suffix_calibration"]))
        for name in ("max_nodes", "depth", "top_k"):
            _int(getattr(self, name), name, f[name])
        if self.head is not None and (not isinstance(self.head, str) or not self.head):
            raise ConfigError(f"DraftingConfig.head={self.head!r} (--draft): a head directory, one of {ORACLES}, or "
                              "None for the shipped head")
        if self.oracle:
            return  # an oracle replaces the proposer: the source and budget settings do not apply
        if self.head is not None and self.proposer is Proposer.SUFFIX:
            raise ConfigError(f"DraftingConfig.head={self.head!r} (--draft): proposer 'suffix' uses no head; drop it "
                              "or use proposer 'hybrid' or 'eagle'")
        if self.suffix_calibration is CalibrationMode.ONLINE and self.proposer is Proposer.EAGLE:
            raise ConfigError("DraftingConfig.suffix_calibration='online' (--suffix-calibration): proposer 'eagle' "
                              "has no suffix source to calibrate; use proposer 'suffix' or 'hybrid'")

    # ----- what the parts read ------------------------------------------------------------------------------
    @property
    def oracle(self) -> bool:
        return self.head in ORACLES

    @property
    def uses_head(self) -> bool:
        """The EAGLE-3 head is loaded and grown (eagle and hybrid drafting)."""
        return not self.oracle and self.proposer is not Proposer.SUFFIX

    def tree_budget(self):
        """The head's growth (``TreeBudget``): ``depth`` levels of ``top_k``, its tree cut to ``max_nodes``; an
        oracle's chain is ``depth`` tokens long."""
        from .draft_config import TreeBudget

        return TreeBudget(max_nodes=self.max_nodes, depth=self.depth, top_k=self.top_k)

    @property
    def largest_tree(self) -> int:
        """The most nodes a step verifies, root included: ``max_nodes``, or an oracle's chain of ``depth + 1``."""
        return self.depth + 1 if self.oracle else self.max_nodes

    def check_fits(self, runtime) -> int:
        """The bucket of the largest tree, checked against ``runtime``'s buckets before any weight is read;
        ConfigError naming the flag and the buckets otherwise. A level deeper than the largest bucket could never
        be verified and would still cost its growth (``--depth 100000`` died of a numpy allocation), so the
        head's depth (an oracle's chain) is bounded too."""
        if self.oracle:
            return runtime.check_tree_size(self.largest_tree, "oracle chain of --depth + 1")
        bucket = runtime.check_tree_size(self.largest_tree, "--max-nodes")
        if self.uses_head:
            runtime.check_tree_size(self.depth + 1, "--depth + 1 (the root and one node per level)")
        return bucket

    def bounded(self, max_nodes: int | None) -> "DraftingConfig":
        """This config with its bound lowered to ``max_nodes`` (a request's own bound; None: unchanged). A bound
        is only ever lowered: a request cannot verify more than the engine was built for."""
        if max_nodes is None:
            return self
        _int(max_nodes, "max_nodes", "a request's bound")
        return dataclasses.replace(self, max_nodes=min(self.max_nodes, max_nodes))

    # ----- YAML / JSON ----------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {f.name: (v.value if isinstance(v, enum.Enum) else v)
                for f in dataclasses.fields(self) for v in (getattr(self, f.name),)}

    @classmethod
    def from_mapping(cls, d: Mapping[str, Any], where: str = "drafting") -> "DraftingConfig":
        """From YAML or JSON keys (the field names); an unknown key is refused by name, not ignored."""
        if not isinstance(d, Mapping):
            raise ConfigError(f"{where}: expected a mapping of {[f.name for f in dataclasses.fields(cls)]}, got "
                              f"{type(d).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(f"{where}: unknown key(s) {unknown}; expected some of {sorted(known)}")
        return cls(**dict(d))


# ----- the command line -----------------------------------------------------------------------------------------
FLAG_FIELDS = ("head", "proposer", "budget", "max_nodes", "depth", "top_k", "suffix_calibration")


def add_drafting_flags(p, fields: tuple[str, ...] = FLAG_FIELDS) -> None:
    """The drafting flags of every command that drafts (generate, bench, eval, deploy check; ``serve`` and
    ``bench-batch`` take ``max_nodes`` and ``suffix_calibration`` only), with the ``DraftingConfig`` defaults: one
    set of names, defaults and help."""
    d = DraftingConfig()
    unknown = set(fields) - set(FLAG_FIELDS)
    if unknown:
        raise ValueError(f"add_drafting_flags: no flag for {sorted(unknown)}")
    if "head" in fields:
        p.add_argument("--draft", default=None,
                       help="EAGLE-3 head directory (converted or public format; default: the shipped head for the "
                            "default teacher); bench and eval also accept 'oracle' (the teacher's own future tokens: "
                            "a ceiling) and 'wrong' (never accepted: a floor)")
    if "proposer" in fields:
        p.add_argument("--proposer", choices=PROPOSERS, default=d.proposer.value,
                       help="draft source: the EAGLE-3 head, model-free suffix matches over the conversation, or both "
                            f"in one tree (default {d.proposer.value})")
    if "budget" in fields:
        p.add_argument("--budget", dest="budget_mode", choices=[m.value for m in BudgetMode], default=d.budget.value,
                       help="fixed: every step verifies --max-nodes nodes; adaptive: each step picks at most "
                            "--max-nodes from the candidates' acceptance estimates and the measured verification "
                            f"costs (default {d.budget.value})")
    if "max_nodes" in fields:
        p.add_argument("--max-nodes", type=int, default=d.max_nodes,
                       help="the nodes one step verifies, root included, in every mode (serve: per request; a "
                            f"request may ask for fewer); 1 = no speculation (default {d.max_nodes})")
    if "depth" in fields:
        p.add_argument("--depth", type=int, default=d.depth, help=f"head growth: draft levels (default {d.depth})")
    if "top_k" in fields:
        p.add_argument("--top-k", type=int, default=d.top_k,
                       help=f"head growth: children per expanded node (default {d.top_k})")
    if "suffix_calibration" in fields:
        p.add_argument("--suffix-calibration", choices=[m.value for m in CalibrationMode],
                       default=d.suffix_calibration.value,
                       help="suffix and hybrid drafting: score suffix candidates with the shipped acceptance table "
                            "(fitted on the default teacher; the default) or correct it online by what the teacher "
                            "accepts (for another teacher)")


def drafting_from_args(args) -> DraftingConfig:
    """The ``DraftingConfig`` of parsed ``add_drafting_flags`` arguments (validated: ConfigError naming the flag)."""
    return DraftingConfig(proposer=args.proposer, budget=args.budget_mode, suffix_calibration=args.suffix_calibration,
                          max_nodes=args.max_nodes, depth=args.depth, top_k=args.top_k,
                          head=getattr(args, "draft", None))


PROPOSERS = tuple(m.value for m in Proposer)
"""The draft sources by name ("eagle", "suffix", "hybrid"): the CLI's choices and a server request's ``proposer``."""

SERVING_DRAFTING = DraftingConfig()
"""The batch engine's drafting unless told otherwise (``serve``, ``bench-batch``): the product's, hybrid (the shipped
head, one draft context per slot, and the suffix index), every request's candidates ranked across the batch by the
global budget, which also decides which heads grow (``serving.batch.plan_growth``). Measured against the suffix index
alone on a 2-vCPU Xeon (docs/serving.md, Results): level within noise at 1-8 requests (the rule leaves the head idle
from 4 requests on); kept for one drafting across ``generate`` and ``serve``, and for heads that draft better."""


__all__ = ["BudgetMode", "CalibrationMode", "DEFAULT_MAX_NODES", "DraftingConfig", "ORACLES", "Proposer",
           "PROPOSERS", "SERVING_DRAFTING",
           "add_drafting_flags", "drafting_from_args"]

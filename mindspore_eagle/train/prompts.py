"""The training prompt set: conversations like the ones users send, in nine categories, built offline.

Categories: the eight of MT-Bench (writing, roleplay, reasoning, math, coding, extraction, stem, humanities) and
``code_completion`` in HumanEval's style (a function signature and docstring to complete). Sources:

* templates over the word lists in ``train.prompt_words`` (subjects, topics, personas, forms, tones, audiences);
* programmatic problems with random numbers and names (math, reasoning, extraction records);
* the Python standard library on the machine: function source to explain or test (coding), signatures and
  docstrings as stubs to complete (code_completion), documentation passages to extract from or summarise.

About half of the conversations of each category get a *second turn*, a follow-up templated by category
("Rewrite it for children", "Add tests", "Explain step 2 ..."); it is asked after the teacher's own greedy
answer to the first turn (``train.batch_greedy``), as MT-Bench's second turns are.

Every conversation has a category and a stable id (SHA-1 of its first turn). First turns are deduplicated
exactly (``normalise``) and as near duplicates (Jaccard >= ``NEAR_DUP_JACCARD`` of word 3-gram sets, found with
MinHash banding and then checked exactly). Evaluation turns are never a source;
``tests/test_train_overlap.py`` checks every turn against all 240 evaluation turns.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import random
import re
import sys
import textwrap
import warnings
from typing import Callable, Iterator

import numpy as np

from ..evaluation.evalset import EvalItem
from . import prompt_words as W

CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities",
              "code_completion")
NEAR_DUP_JACCARD = 0.8
SHINGLE = 3

# Standard-library modules read for code and documentation (pure Python, importable without side effects).
STDLIB_MODULES = (
    "abc argparse ast base64 bisect calendar cmd codecs collections colorsys configparser contextlib copy csv "
    "dataclasses datetime decimal difflib dis email.utils enum filecmp fileinput fnmatch fractions ftplib functools "
    "getopt gettext glob gzip hashlib heapq hmac html html.parser http.cookies imaplib inspect io ipaddress "
    "itertools json keyword linecache locale logging mailbox mimetypes netrc numbers operator optparse os.path "
    "pathlib pickle pkgutil platform plistlib poplib pprint queue quopri random re reprlib sched secrets shelve "
    "shlex shutil smtplib socket sqlite3 statistics string stringprep struct subprocess sysconfig tarfile "
    "tempfile textwrap threading timeit tokenize trace traceback types typing unicodedata urllib.parse "
    "urllib.request uuid warnings wave weakref xml.dom.minidom zipfile zipimport"
).split()


def normalise(text: str) -> str:
    """Lower-case, punctuation-free, whitespace-collapsed text: the key for exact-duplicate checks."""
    return " ".join(re.sub(r"[^0-9a-z]+", " ", text.lower()).split())


def prompt_id(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8")).hexdigest()[:16]


# ---- standard-library material ------------------------------------------------------------------------
def _stdlib_functions() -> list[tuple[str, object]]:
    """``(qualified name, function)`` for documented pure-Python functions and methods, in a stable order."""
    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for modname in STDLIB_MODULES:
            try:
                mod = importlib.import_module(modname)
            except ImportError:
                continue
            for name in sorted(vars(mod)):
                obj = getattr(mod, name)
                if name.startswith("_") or getattr(obj, "__module__", None) != mod.__name__:
                    continue
                if inspect.isfunction(obj):
                    out.append((f"{modname}.{name}", obj))
                elif inspect.isclass(obj):
                    for mname in sorted(vars(obj)):
                        meth = vars(obj)[mname]
                        if inspect.isfunction(meth) and not mname.startswith("_"):
                            out.append((f"{modname}.{name}.{mname}", meth))
    return [(n, f) for n, f in out if len(inspect.getdoc(f) or "") >= 30]


def _source(fn, max_lines: int = 20) -> str | None:
    try:
        src = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):
        return None
    return src.rstrip() if 3 <= len(src.splitlines()) <= max_lines else None


def _stub(qualname: str, fn) -> str | None:
    """A HumanEval-style stub of ``fn``: ``def name(signature):`` and its docstring, body left to complete."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    doc = inspect.getdoc(fn) or ""
    if '"""' in doc or len(doc) > 500:
        return None
    params = [p.replace(annotation=inspect.Parameter.empty) for p in sig.parameters.values() if p.name != "self"]
    try:
        sig_text = str(sig.replace(parameters=params, return_annotation=inspect.Signature.empty))
    except ValueError:
        return None
    body = textwrap.indent(doc, "    ")
    return f"def {fn.__name__}{sig_text}:\n    \"\"\"{body.strip()}\n    \"\"\"\n"


def _passages() -> list[str]:
    paras = []
    for _, fn in _stdlib_functions():
        for p in (inspect.getdoc(fn) or "").split("\n\n"):
            p = " ".join(p.split())
            if 160 <= len(p) <= 360:
                paras.append(p)
    return sorted(set(paras))


# ---- per-category generators (each an endless deterministic stream of first turns) ---------------------
def _pick(rng: random.Random, seq):
    return seq[rng.randrange(len(seq))]


def _writing(rng: random.Random, _: dict) -> Iterator[str]:
    while True:
        w1, w2 = rng.sample(W.EXTRA_WORDS, 2)
        tmpl = _pick(rng, W.WRITING_ASKS)
        text = tmpl.format(form=_pick(rng, W.WRITING_FORMS), subject=_pick(rng, W.WRITING_SUBJECTS),
                           tone=_pick(rng, W.TONES), aud=_pick(rng, W.AUDIENCES), n=rng.choice((80, 120, 150, 200)),
                           w1=w1, w2=w2)
        yield text[0].upper() + text[1:]


def _roleplay(rng: random.Random, _: dict) -> Iterator[str]:
    while True:
        sit = _pick(rng, W.ROLEPLAY_SITUATIONS)
        yield _pick(rng, W.ROLEPLAY_ASKS).format(persona=_pick(rng, W.PERSONAS), situation=sit,
                                                 Situation=sit[0].upper() + sit[1:], tone=_pick(rng, W.TONES))


def _names(rng: random.Random, n: int) -> list[str]:
    return rng.sample(W.RECORD_FIRST, n)


def _reasoning(rng: random.Random, _: dict) -> Iterator[str]:
    traits = (("taller", "tallest"), ("older", "oldest"), ("faster", "fastest"), ("heavier", "heaviest"))
    days = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
    things = ("apples", "marbles", "stamps", "books", "coins", "pencils", "shells", "cards")
    while True:
        kind = rng.randrange(7)
        if kind == 0:
            a, b, c, d = _names(rng, 4)
            cmp, sup = _pick(rng, traits)
            yield (f"{a} is {cmp} than {b}. {c} is {cmp} than {a}, and {b} is {cmp} than {d}. Who is the {sup}, "
                   f"and who is the least? Explain your reasoning.")
        elif kind == 1:
            start, k = rng.randrange(7), rng.randrange(2, 400)
            yield f"Today is {days[start]}. What day of the week will it be in {k} days? Show how you worked it out."
        elif kind == 2:
            a, b, c = _names(rng, 3)
            x, y = rng.randrange(3, 20), rng.randrange(2, 9)
            t = _pick(rng, things)
            yield (f"{a} has {x} {t}. {b} has {y} more than {a}, and {c} has half as many as {b} rounded down. "
                   f"How many {t} do they have together? Reason step by step.")
        elif kind == 3:
            animals = rng.sample(("cats", "dogs", "birds", "fish", "rabbits", "horses", "owls", "foxes"), 3)
            yield (f"All {animals[0]} are {animals[1]}. Some {animals[1]} are {animals[2]}. Can we conclude that some "
                   f"{animals[0]} are {animals[2]}? Explain whether the argument is valid.")
        elif kind == 4:
            names = _names(rng, 3)
            jobs = rng.sample(W.JOB_TITLES, 3)
            yield (f"{names[0]}, {names[1]} and {names[2]} work as a {jobs[0]}, a {jobs[1]} and a {jobs[2]}, in some "
                   f"order. {names[0]} is not the {jobs[0]}. {names[1]} is neither the {jobs[0]} nor the {jobs[2]}. "
                   f"Who has which job? Explain each step.")
        elif kind == 5:
            n, m = rng.randrange(3, 12), rng.randrange(2, 6)
            yield (f"A room has {n} people, and each person shakes hands with every other person {m if m > 1 else 1} "
                   f"time{'s' if m > 1 else ''}. How many handshakes happen in total? Explain your reasoning.")
        else:
            a, b = _names(rng, 2)
            h, w = rng.randrange(2, 9), rng.randrange(2, 9)
            yield (f"{a} walks {h} km north, then {w} km east, then {h} km south. How far is {a} from the start, "
                   f"and in which direction? {b} says the answer is {h + w} km. Is {b} right?")


def _math(rng: random.Random, _: dict) -> Iterator[str]:
    shapes = ("rectangle", "right triangle", "circle", "trapezoid", "square")
    while True:
        kind = rng.randrange(9)
        r = rng.randrange
        if kind == 0:
            a, b, c = r(2, 15), r(-30, 30), r(-50, 50)
            yield f"Solve for x: {a}x + {b} = {c}. Show each step."
        elif kind == 1:
            p, q = r(-9, 10), r(-9, 10)
            yield f"Find the roots of x^2 {'-' if p + q >= 0 else '+'} {abs(p + q)}x {'+' if p * q >= 0 else '-'} {abs(p * q)} = 0 and check them."
        elif kind == 2:
            s = _pick(rng, shapes)
            a, b = r(2, 30), r(2, 30)
            dims = {"rectangle": f"sides {a} cm and {b} cm", "right triangle": f"legs {a} cm and {b} cm",
                    "circle": f"radius {a} cm", "trapezoid": f"parallel sides {a} cm and {b} cm and height {r(2, 12)} cm",
                    "square": f"side {a} cm"}[s]
            yield f"A {s} has {dims}. What are its area and perimeter? Explain the formulas you use."
        elif kind == 3:
            n, k = r(2, 5), r(2, 13)
            yield f"If you roll {n} fair six-sided dice, what is the probability that the sum is {k + n}? Show your work."
        elif kind == 4:
            price, pct = r(20, 500), r(5, 60)
            yield (f"A jacket costs ${price}. It is discounted by {pct}%, and then a sales tax of {r(3, 12)}% is added. "
                   f"What is the final price? Show the calculation.")
        elif kind == 5:
            a, d, n = r(1, 20), r(2, 9), r(10, 60)
            yield f"What is the sum of the first {n} terms of the arithmetic sequence {a}, {a + d}, {a + 2 * d}, ...?"
        elif kind == 6:
            a, b = r(12, 400), r(12, 400)
            yield f"Find the greatest common divisor and the least common multiple of {a} and {b}, step by step."
        elif kind == 7:
            c = [r(-6, 7) for _ in range(4)]
            poly = " + ".join(f"{v}x^{4 - i}" for i, v in enumerate(c) if v) or "x"
            yield f"Compute the derivative and an antiderivative of f(x) = {poly}."
        else:
            v, t = r(20, 120), r(2, 9)
            yield (f"A train travels {v} km/h for {t} hours, then {v + r(5, 40)} km/h for {r(1, 5)} hours. What is its "
                   f"average speed over the whole trip?")


def _coding(rng: random.Random, ctx: dict) -> Iterator[str]:
    funcs = ctx["functions"]
    while True:
        if rng.random() < 0.6:
            yield _pick(rng, W.CODE_ASKS).format(lang=_pick(rng, W.PROGRAMMING_LANGUAGES), task=_pick(rng, W.CODING_TASKS))
        else:
            name, fn = _pick(rng, funcs)
            src = _source(fn)
            if src:
                yield _pick(rng, W.CODE_SNIPPET_ASKS).format(code=src)


def _record(rng: random.Random) -> dict:
    first, last = _pick(rng, W.RECORD_FIRST), _pick(rng, W.RECORD_LAST)
    company = "".join(_pick(rng, part) + (" " if i == 1 else "") for i, part in enumerate(W.COMPANY_PARTS))
    return {"name": f"{first} {last}", "company": company, "city": _pick(rng, W.RECORD_CITIES),
            "job": _pick(rng, W.JOB_TITLES), "date": f"{rng.randrange(2015, 2026)}-{rng.randrange(1, 13):02d}-"
            f"{rng.randrange(1, 29):02d}", "amount": f"{rng.randrange(100, 99999)}.{rng.randrange(100):02d}",
            "product": _pick(rng, W.PRODUCTS), "qty": rng.randrange(1, 40),
            "email": f"{first.lower()}.{last.lower()}@{company.split()[0].lower()}.example"}


def _extraction(rng: random.Random, ctx: dict) -> Iterator[str]:
    passages = ctx["passages"]
    while True:
        kind = rng.randrange(5)
        if kind <= 1:
            recs = [_record(rng) for _ in range(rng.randrange(1, 4))]
            text = " ".join(
                _pick(rng, ("On {date}, {name}, a {job} at {company} in {city}, ordered {qty} units of {product} "
                            "for ${amount}.", "{name} ({email}) joined {company} as a {job} on {date} and is based "
                            "in {city}.", "Invoice dated {date}: {company} billed {name} ${amount} for {qty} x "
                            "{product}, shipped to {city}.")).format(**r) for r in recs)
            ask = _pick(rng, ("Extract every person, company, city and date from the text below as a JSON list.",
                              "From the following text, list each order with its date, customer and amount as a table.",
                              "Read the text and return a JSON object mapping each person to their company and city.",
                              "Identify all monetary amounts and dates in this text, and say who they belong to."))
            yield f"{ask}\n\n{text}"
        elif kind == 2:
            recs = [_record(rng) for _ in range(rng.randrange(3, 5))]
            rows = "\n".join(f"{r['name']}, {r['job']}, {r['city']}, {r['date']}" for r in recs)
            yield (f"Here are staff records (name, job, city, start date):\n{rows}\n\n"
                   + _pick(rng, ("Who started most recently?", "Group the people by city.",
                                 "Convert these records to JSON.", "Sort the records by start date, oldest first.")))
        else:
            p = _pick(rng, passages)
            yield _pick(rng, ("Extract the key terms and their meanings from this passage:\n\n{p}",
                              "Summarise the following documentation in three bullet points:\n\n{p}",
                              "List every function, parameter or value named in this text:\n\n{p}",
                              "Explain this passage in simpler words:\n\n{p}",
                              "What question does this passage answer? Give the question and the answer.\n\n{p}")).format(p=p)


def _topic_asks(topics, asks):
    def gen(rng: random.Random, _: dict) -> Iterator[str]:
        while True:
            t, t2 = rng.sample(topics, 2)
            text = _pick(rng, asks).format(t=t, t2=t2, aud=_pick(rng, W.AUDIENCES))
            yield text[0].upper() + text[1:]
    return gen


# HumanEval-style tasks: (name, signature, description, typing import needed)
_COMPLETION_TASKS = (
    ("count_{w}", "(items: List[str], {w}: str) -> int", "Return how many strings in items contain {w} as a substring."),
    ("longest_run_of_{w}", "(text: str) -> int", "Return the length of the longest run of consecutive '{c}' characters in text."),
    ("every_{n}th", "(values: List[int]) -> List[int]", "Return every {n}-th element of values, starting with the first."),
    ("sum_of_multiples_of_{n}", "(limit: int) -> int", "Return the sum of all positive multiples of {n} below limit."),
    ("pad_to_{n}", "(words: List[str]) -> List[str]", "Pad each word on the right with '.' to length {n}; longer words are cut to {n} characters."),
    ("top_{n}_scores", "(scores: Dict[str, int]) -> List[str]", "Return the names of the {n} highest scores, highest first; ties broken alphabetically."),
    ("rotate_left_by_{n}", "(s: str) -> str", "Rotate the string s left by {n} characters (wrapping around)."),
    ("is_{n}_smooth", "(x: int) -> bool", "Return True if no prime factor of x is greater than {n}."),
    ("window_max_{n}", "(values: List[int]) -> List[int]", "Return the maximum of every window of {n} consecutive values."),
    ("caesar_shift_{n}", "(text: str) -> str", "Shift every letter of text {n} places forward in the alphabet, keeping case; other characters are unchanged."),
    ("split_into_{n}_parts", "(values: List[int]) -> List[List[int]]", "Split values into {n} contiguous parts whose lengths differ by at most one."),
    ("digits_above_{n}", "(x: int) -> int", "Return how many decimal digits of x are greater than {n}."),
    ("words_longer_than_{n}", "(sentence: str) -> List[str]", "Return the words of sentence that have more than {n} letters, in order."),
    ("clamp_to_{n}", "(values: List[float]) -> List[float]", "Clamp every value to the range [-{n}, {n}]."),
    ("repeat_each_{n}_times", "(s: str) -> str", "Return s with every character repeated {n} times."),
    ("nearest_multiple_of_{n}", "(x: int) -> int", "Return the multiple of {n} closest to x; when two are equally close, return the larger."),
    ("chunk_sums_{n}", "(values: List[int]) -> List[int]", "Return the sums of consecutive chunks of {n} values (the last chunk may be shorter)."),
    ("has_{n}_distinct", "(values: List[int]) -> bool", "Return True if values contains at least {n} distinct numbers."),
    ("base_{n}_digits", "(x: int) -> List[int]", "Return the digits of the non-negative integer x written in base {n}, most significant first."),
    ("run_length_{w}", "(s: str) -> List[Tuple[str, int]]", "Run-length encode s as (character, count) pairs, but only count runs of '{c}'; other characters count 1 each."),
)


_COMPLETION_NOTES = (
    "The input may be empty.", "Do not modify the input.", "Negative numbers are allowed.",
    "Raise ValueError if the input is invalid.", "Do not use any imports.", "The result must be deterministic.",
    "Aim for linear time.", "Keep the original order where possible.", "Whitespace is ignored.",
    "Upper and lower case letters count as the same.", "Return an empty list when nothing matches.",
    "The function should not print anything.",
)
_ARG_TYPES = (("values", "List[int]"), ("items", "List[str]"), ("text", "str"), ("n", "int"), ("records", "List[dict]"),
              ("matrix", "List[List[int]]"), ("words", "List[str]"), ("pairs", "List[Tuple[int, int]]"))


def _snake(task: str) -> str:
    return "_".join(re.sub(r"[^a-z ]", "", task.lower()).split()[:4])


def _completion(rng: random.Random, ctx: dict) -> Iterator[str]:
    stubs = ctx["stubs"]
    while True:
        notes = " ".join(rng.sample(_COMPLETION_NOTES, rng.randrange(0, 3)))
        header = "from typing import Dict, List, Tuple\n\n\n" if rng.random() < 0.8 else ""
        u = rng.random()
        if u < 0.3 and stubs:
            yield _pick(rng, stubs)
            continue
        if u < 0.65:
            name, sig, desc = _pick(rng, _COMPLETION_TASKS)
            word = _pick(rng, W.EXTRA_WORDS)
            fill = dict(w=word, c=word[0], n=rng.randrange(2, 10))
            name, args, desc = name.format(**fill), sig.format(**fill), desc.format(**fill)
        else:
            task = _pick(rng, W.CODING_TASKS)
            arg, typ = _pick(rng, _ARG_TYPES)
            name, args, desc = _snake(task), f"({arg}: {typ})", f"Given {arg}, this function {task}."
        yield f"{header}def {name}{args}:\n    \"\"\" {desc}\n    {notes}\n    \"\"\"\n".replace("\n    \n", "\n")


GENERATORS: dict[str, Callable[[random.Random, dict], Iterator[str]]] = {
    "writing": _writing, "roleplay": _roleplay, "reasoning": _reasoning, "math": _math, "coding": _coding,
    "extraction": _extraction, "stem": _topic_asks(W.STEM_TOPICS, W.STEM_ASKS),
    "humanities": _topic_asks(W.HUMANITIES_TOPICS, W.HUMANITIES_ASKS), "code_completion": _completion,
}

FOLLOW_UPS = {
    "writing": ("Rewrite your answer in a {tone} tone.", "Now make it shorter: no more than {n} sentences.",
                "Rewrite it for {aud}.", "Give it a title and a one-sentence summary.", "Turn it into a short poem.",
                "Make it more formal.", "Now write a sequel of the same length."),
    "roleplay": ("Stay in character: what is the hardest part of your life?", "Now say the same thing to a small child.",
                 "I disagree with you. How do you respond, still in character?", "Still in character, give me one piece of advice.",
                 "Describe your favourite place, in character."),
    "reasoning": ("Explain step 2 of your reasoning in more detail.", "Check your answer by working backwards.",
                  "Could there be another answer? Explain.", "Explain your reasoning to a ten-year-old.",
                  "Solve it again a different way and compare."),
    "math": ("Explain step 2 in more detail.", "Verify your answer with a different method.",
             "Now solve the same problem with every number doubled.", "Write Python code that computes the answer.",
             "What is a common mistake people make on this kind of problem?"),
    "coding": ("Add tests for your code.", "Can you make it faster? Explain the change.", "Add error handling for invalid input.",
               "Explain your code line by line.", "Rewrite it in {lang}.", "What is the time and space complexity?"),
    "extraction": ("Now return the result as a CSV table.", "Return only the names, sorted alphabetically.",
                   "Summarise the text in one sentence.", "Which information did you find hardest to extract, and why?"),
    "stem": ("Now make your answer shorter.", "Explain it to a child.", "Give three concrete examples.",
             "Write three quiz questions about your answer, with answers.", "What is the most surprising fact about this?"),
    "humanities": ("Now make your answer shorter.", "Explain it to a teenager.", "Give three concrete examples.",
                   "What would a critic say about your answer?", "Write three quiz questions about your answer, with answers."),
    "code_completion": ("Add tests for this function.", "Explain your implementation step by step.",
                        "Make it handle invalid input gracefully.", "What is the time complexity of your solution?"),
}


def _follow_up(rng: random.Random, category: str) -> str:
    return _pick(rng, FOLLOW_UPS[category]).format(tone=_pick(rng, W.TONES), n=rng.randrange(2, 5),
                                                   aud=_pick(rng, W.AUDIENCES), lang=_pick(rng, W.PROGRAMMING_LANGUAGES))


# ---- near-duplicate detection ---------------------------------------------------------------------------
_PRIME = (1 << 61) - 1


class NearDupIndex:
    """MinHash banding over word 3-gram sets, then an exact Jaccard check of every candidate pair.

    ``add(text)`` returns False (and adds nothing) when ``text`` is a near duplicate of a text already added:
    Jaccard >= ``threshold`` of the two shingle sets. 100 hashes in 20 bands of 5 make a pair at Jaccard 0.8 a
    candidate with probability 1 - (1 - 0.8^5)^20 = 0.9997, one at 0.3 (templates sharing their frame) with 0.05,
    which keeps the exact checks few.
    """

    def __init__(self, threshold: float = NEAR_DUP_JACCARD, num_hashes: int = 100, band: int = 5, seed: int = 1):
        rng = np.random.default_rng(seed)
        self.a = rng.integers(1, _PRIME, num_hashes, dtype=np.uint64)
        self.b = rng.integers(0, _PRIME, num_hashes, dtype=np.uint64)
        self.threshold, self.band = threshold, band
        self.buckets: dict[tuple, list[int]] = {}
        self.sets: list[frozenset] = []

    @staticmethod
    def shingles(text: str) -> frozenset:
        words = normalise(text).split()
        if len(words) < SHINGLE:
            return frozenset([" ".join(words)])
        return frozenset(" ".join(words[i:i + SHINGLE]) for i in range(len(words) - SHINGLE + 1))

    def _signature(self, sh: frozenset) -> np.ndarray:
        x = np.array([int.from_bytes(hashlib.blake2b(s.encode(), digest_size=7).digest(), "little") for s in sh],
                     np.uint64)  # [n] < 2^56
        with np.errstate(over="ignore"):
            h = (x[:, None] * self.a[None, :] + self.b[None, :]) % np.uint64(_PRIME)  # [n, hashes], wraps mod 2^64
        return h.min(axis=0)

    def add(self, text: str) -> bool:
        sh = self.shingles(text)
        sig = self._signature(sh)
        keys = [(i, tuple(sig[i:i + self.band].tolist())) for i in range(0, len(sig), self.band)]
        for j in {j for k in keys for j in self.buckets.get(k, ())}:
            other = self.sets[j]
            if len(sh & other) / len(sh | other) >= self.threshold:
                return False
        idx = len(self.sets)
        self.sets.append(sh)
        for k in keys:
            self.buckets.setdefault(k, []).append(idx)
        return True


# ---- the set ------------------------------------------------------------------------------------------
def _context() -> dict:
    funcs = _stdlib_functions()
    stubs = sorted({s for s in (_stub(n, f) for n, f in funcs) if s})
    return {"functions": funcs, "stubs": stubs, "passages": _passages()}


def build_conversations(per_category: int = 2500, seed: int = 0, second_turn_fraction: float = 0.5,
                        max_tries: int = 20) -> list[dict]:
    """``per_category`` conversations of each category: dicts ``{id, category, turns}`` (one or two turns),
    unique by first turn (exact and near duplicates), in a stable shuffled order. A category whose generator
    cannot produce that many distinct prompts within ``max_tries * per_category`` draws yields fewer."""
    ctx = _context()
    index = NearDupIndex()
    seen: set[str] = set()
    out: list[dict] = []
    for category in CATEGORIES:
        rng = random.Random(f"{seed}:{category}")
        stream = GENERATORS[category](rng, ctx)
        kept = 0
        for _ in range(max_tries * per_category):
            if kept >= per_category:
                break
            text = next(stream)
            key = normalise(text)
            if key in seen or not index.add(text):
                continue
            seen.add(key)
            turns = [text]
            if rng.random() < second_turn_fraction:
                turns.append(_follow_up(rng, category))
            out.append({"id": prompt_id(text), "category": category, "turns": turns})
            kept += 1
    random.Random(seed).shuffle(out)
    return out


def as_items(conversations: list[dict]) -> list[EvalItem]:
    return [EvalItem(c["id"], c["category"], tuple(c["turns"])) for c in conversations]


def category_counts(conversations: list[dict]) -> dict[str, dict[str, int]]:
    counts = {c: {"conversations": 0, "second_turns": 0} for c in CATEGORIES}
    for conv in conversations:
        counts[conv["category"]]["conversations"] += 1
        counts[conv["category"]]["second_turns"] += len(conv["turns"]) - 1
    return counts


def main(argv: list[str] | None = None) -> int:
    import argparse
    import json

    ap = argparse.ArgumentParser(description="Print the training prompt set's category counts (or the set as JSONL)")
    ap.add_argument("--per-category", type=int, default=2500)
    ap.add_argument("--jsonl", action="store_true", help="write every conversation as one JSON line to stdout")
    a = ap.parse_args(argv)
    convs = build_conversations(a.per_category)
    if a.jsonl:
        for c in convs:
            sys.stdout.write(json.dumps(c) + "\n")
    else:
        print(json.dumps({"total": len(convs), "categories": category_counts(convs)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

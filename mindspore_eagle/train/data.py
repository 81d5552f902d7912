"""Training data for a draft head: an offline prompt set and the teacher's own greedy answers, as feature shards.

EAGLE's key lesson: a head must learn what *this* teacher outputs, so every answer is regenerated here by our
teacher (greedy, batched, static cache). Nothing is downloaded; prompts come from

* the Python standard library's docstrings ("Explain what ``json.dumps`` does", "Write an example using ..."),
* passages of those docstrings to summarise or continue,
* templated coding tasks ("Write a Python function that ...") and general instruction templates.

Evaluation turns (MT-Bench questions, HumanEval prompts) are never a source; ``tests/test_train_overlap.py``
checks exact and near-duplicate overlap. Each prompt has a stable id (SHA-1 of its text, ``prompt_id``).

Shards (``shard_XXXXX.npz`` in ``out_dir``, written atomically, then listed in ``manifest.jsonl``). For
sequence j with ``N_j`` tokens (prompt of ``P_j`` plus answer) the shard concatenates over sequences:

    tokens      int32   [sum N_j]          prompt + answer ids
    features    float16 [sum (N_j-1), 3H]  teacher aux hidden at positions 0..N_j-2 (the last token is never fed)
    topk_ids    int32   [sum (N_j-1), k]   teacher's top-k next-token ids at those positions (descending)
    topk_logits float16 [sum (N_j-1), k]
    lengths, prompt_lens int32 [n_seq];  ids: the prompt ids (str)

Logits at position p score token p + 1, so ``topk_ids[p, 0] == tokens[p + 1]`` on every answer position (greedy).
Storing top-k (default 32) instead of the 49k-wide logits keeps a token at ~3.6 KB; the soft target is the
softmax over the top-k entries that lie in the draft vocabulary (the mass outside the top-k is negligible
for a greedy teacher's distribution and is dropped).

Resume: a prompt listed in the manifest is never regenerated; an interrupted batch is redone.
"""

from __future__ import annotations

import builtins
import glob
import hashlib
import importlib
import inspect
import json
import os
import random
import re
import sys
import time
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from ..tree.inputs import ForwardInputs
from ..tree.mask import additive_from_bool

MANIFEST = "manifest.jsonl"
PROMPTS_FILE = "prompts.jsonl"

# Standard-library modules used as the source of docstrings (pure-Python, present everywhere, no side effects).
STDLIB_MODULES = (
    "abc argparse array base64 bisect calendar collections colorsys contextlib copy csv dataclasses datetime "
    "decimal difflib enum fnmatch fractions functools getopt glob gzip hashlib heapq hmac html inspect io "
    "ipaddress itertools json keyword linecache locale logging math mimetypes numbers operator os pathlib "
    "pickle pprint queue random re sched secrets shlex shutil signal socket sqlite3 statistics string struct "
    "subprocess tempfile textwrap threading time timeit tokenize traceback types typing unicodedata urllib.parse "
    "uuid warnings weakref zipfile zlib"
).split()

CODING_TASKS = (
    "reverses the words in a sentence", "checks whether a string is a palindrome", "counts the vowels in a string",
    "returns the n-th Fibonacci number", "merges two sorted lists", "removes duplicates from a list while keeping order",
    "flattens a nested list", "computes the factorial of a number", "finds the largest element in a list",
    "checks whether a number is prime", "converts Celsius to Fahrenheit", "computes the greatest common divisor",
    "counts word frequencies in a text", "transposes a matrix given as a list of lists", "rotates a list by k places",
    "validates an email address with a regular expression", "parses a CSV line into fields",
    "computes the mean and median of a list", "finds all anagrams of a word in a list", "implements binary search",
    "sorts a list of dictionaries by a key", "chunks a list into pieces of size n", "computes the running sum",
    "converts a Roman numeral to an integer", "converts an integer to binary without bin()",
    "checks whether brackets in a string are balanced", "returns the intersection of two lists",
    "capitalises the first letter of every word", "computes the dot product of two vectors",
    "reads a JSON file and returns a dictionary", "writes a list of rows to a CSV file", "implements a stack class",
    "implements a queue with two stacks", "computes the edit distance between two strings",
    "generates all permutations of a string", "generates all subsets of a list", "finds the longest common prefix",
    "counts the lines in a file", "finds the second largest number", "checks whether two strings are anagrams",
    "computes the power set size", "converts a dictionary to a list of tuples", "groups words by their first letter",
    "implements bubble sort", "implements quicksort", "implements merge sort", "finds the mode of a list",
    "computes the sum of digits of an integer", "checks whether a year is a leap year", "returns prime factors",
    "computes compound interest", "replaces all vowels with an asterisk", "finds missing numbers in a range",
    "zips two lists into a dictionary", "computes the area of a circle", "splits a string on several delimiters",
    "caches results of an expensive function", "measures the run time of a function with a decorator",
    "implements a linked list with append and remove", "computes the cumulative product of a list",
)

TOPICS = (
    "photosynthesis", "the water cycle", "how a compiler works", "recursion", "the French Revolution",
    "black holes", "machine learning", "the immune system", "climate change", "plate tectonics", "inflation",
    "the internet", "vaccines", "democracy", "renewable energy", "the Roman Empire", "DNA", "gravity",
    "supply and demand", "operating systems", "public key cryptography", "the printing press", "volcanoes",
    "sleep", "exercise", "time management", "healthy eating", "learning a new language", "version control",
    "databases", "unit testing", "electric cars", "the moon landing", "bees", "coral reefs", "earthquakes",
    "the stock market", "solar panels", "rainbows", "music theory", "chess openings", "coffee", "bread baking",
    "cloud computing", "hash tables", "sorting algorithms", "the scientific method", "memory in the brain",
)

GENERAL_TEMPLATES = (
    "Explain {t} to a ten-year-old.", "Write a short paragraph about {t}.", "What are three facts about {t}?",
    "Give me a brief overview of {t}.", "List the pros and cons of {t}.", "Why is {t} important?",
    "Write a haiku about {t}.", "Summarise the key ideas of {t} in a few sentences.",
)

DOC_TEMPLATES = (
    "Explain what `{name}` does in Python.", "Write a short example that uses `{name}`.",
    "When would I use `{name}` in Python?", "Describe the arguments of `{name}`.",
)

PASSAGE_TEMPLATES = (
    "Summarise the following documentation:\n\n{p}", "Explain this passage in simpler words:\n\n{p}",
    "Continue the following text:\n\n{p}",
)


def normalise(text: str) -> str:
    """Lower-case, punctuation-free, whitespace-collapsed text: the key for near-duplicate checks."""
    return " ".join(re.sub(r"[^0-9a-z]+", " ", text.lower()).split())


def prompt_id(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8")).hexdigest()[:16]


def _public_callables(mod) -> list[tuple[str, str]]:
    out = []
    for name in sorted(getattr(mod, "__all__", None) or dir(mod)):
        if name.startswith("_"):
            continue
        obj = getattr(mod, name, None)
        if (inspect.isfunction(obj) or inspect.isclass(obj) or inspect.isbuiltin(obj)) and inspect.getdoc(obj):
            out.append((f"{mod.__name__}.{name}", inspect.getdoc(obj)))
    return out


def _passages(doc: str, max_chars: int = 400) -> list[str]:
    paras = [p.strip() for p in doc.split("\n\n") if len(p.strip()) > 120]
    return [p[:max_chars] for p in paras]


def build_prompts(seed: int = 0) -> list[dict]:
    """The full deterministic prompt set: dicts ``{id, source, text}``, unique by normalised text."""
    rng = random.Random(seed)
    items: list[tuple[str, str]] = []
    names, passages = [], []
    for modname in STDLIB_MODULES:
        try:
            mod = importlib.import_module(modname)
        except ImportError:
            continue
        if inspect.getdoc(mod):
            passages += _passages(inspect.getdoc(mod))
        for name, doc in _public_callables(mod):
            names.append(name)
            passages += _passages(doc)
    for name in [n for n in dir(builtins) if not n.startswith("_")]:
        if inspect.getdoc(getattr(builtins, name)) and callable(getattr(builtins, name)):
            names.append(name)
    for name in names:
        items.append(("stdlib_doc", rng.choice(DOC_TEMPLATES).format(name=name)))
    for p in passages:
        items.append(("passage", rng.choice(PASSAGE_TEMPLATES).format(p=p)))
    for task in CODING_TASKS:
        items.append(("coding", f"Write a Python function that {task}."))
        items.append(("coding", f"Write a Python function that {task}, with a docstring and a short test."))
    for topic in TOPICS:
        for tmpl in rng.sample(GENERAL_TEMPLATES, 3):
            items.append(("general", tmpl.format(t=topic)))
    seen, out = set(), []
    for source, text in items:
        key = normalise(text)
        if key in seen:
            continue
        seen.add(key)
        out.append({"id": prompt_id(text), "source": source, "text": text})
    rng.shuffle(out)
    return out


def select_prompts(prompts: list[dict], n: int) -> list[dict]:
    """``n`` prompts mixing the sources round-robin (the set is shuffled, so this is a stable sample)."""
    by_source: dict[str, list[dict]] = {}
    for p in prompts:
        by_source.setdefault(p["source"], []).append(p)
    order, out = sorted(by_source), []
    while len(out) < min(n, len(prompts)):
        for s in order:
            if by_source[s] and len(out) < n:
                out.append(by_source[s].pop(0))
    return out


# ---- batched greedy generation ----------------------------------------------------------------------
@dataclass
class Sequence_:
    """One generated sequence with what training needs (see the module docstring for shapes)."""

    pid: str
    tokens: np.ndarray  # [N] int32
    prompt_len: int
    features: np.ndarray  # [N-1, 3H] fp16
    topk_ids: np.ndarray  # [N-1, k] int32
    topk_logits: np.ndarray  # [N-1, k] fp16


def _topk(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Row-wise top-k of ``[..., V]``, descending: (ids int32, values fp16)."""
    idx = np.argpartition(-logits, k - 1, axis=-1)[..., :k]
    vals = np.take_along_axis(logits, idx, -1)
    order = np.argsort(-vals, axis=-1, kind="stable")
    return np.take_along_axis(idx, order, -1).astype(np.int32), np.take_along_axis(vals, order, -1).astype(np.float16)


def batch_visibility(rows: np.ndarray, max_len: int) -> np.ndarray:
    """Additive ``[B, 1, T, max_len]`` for queries at cache rows ``rows [B, T]``: each sees rows ``<=`` its own.

    Example: rows [[3]] (one decode token at row 3) -> columns 0..3 visible, 4.. masked.
    """
    cols = np.arange(max_len)[None, None, :]
    return additive_from_bool(cols <= rows[:, :, None])[:, None]


def generate_batch(teacher, prompts: Sequence[Sequence[int]], max_new_tokens: int, eos_ids: Iterable[int],
                   topk: int = 32) -> list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """Greedy answers for up to ``teacher.runtime.batch_size`` prompts at once (short batches are padded).

    Prefill: all prompts left-aligned, run in chunks over ``max(P_b)`` positions; sequence b's positions
    beyond its own length are padding whose rows are later overwritten by its own decode writes before any
    of its queries can see them (a query at row r sees rows <= r, and rows are written in order).
    Decode: one token per sequence per step at its own row ``L_b``; finished sequences idle on their last row.
    Returns per prompt ``(tokens [N], features [N-1, 3H], topk_ids, topk_logits)``.
    """
    B, rt, eos = teacher.runtime.batch_size, teacher.runtime, set(int(e) for e in eos_ids)
    n = len(prompts)
    if not 1 <= n <= B:
        raise ValueError(f"generate_batch: {n} prompts for a teacher of batch_size {B} (pass 1..{B})")
    plist = [list(map(int, p)) for p in prompts] + [[0]] * (B - n)
    lens = np.array([len(p) for p in plist])
    pmax = int(lens.max())
    if pmax + max_new_tokens + rt.prefill_chunk > teacher.max_len:
        raise ValueError(f"prompt of {pmax} tokens + {max_new_tokens} new tokens do not fit max_cache_len="
                         f"{teacher.max_len}")
    ids = np.zeros((B, pmax), np.int64)
    for b, p in enumerate(plist):
        ids[b, :len(p)] = p
    feats = [[] for _ in range(B)]
    tk_ids = [[] for _ in range(B)]
    tk_val = [[] for _ in range(B)]
    first = np.zeros(B, np.int64)
    off = 0
    while off < pmax:
        size = min(pmax - off, rt.prefill_chunk)
        out = teacher.forward(ForwardInputs.for_chains(ids[:, off:off + size], off, rt.buckets.fit(size),
                                                       teacher.max_len))
        ti, tv = _topk(out.logits, topk)
        for b in range(B):
            real = max(0, min(size, lens[b] - off))
            feats[b].append(out.aux_hidden[b, :real].astype(np.float16))
            tk_ids[b].append(ti[b, :real])
            tk_val[b].append(tv[b, :real])
            if off <= lens[b] - 1 < off + size:
                first[b] = ti[b, lens[b] - 1 - off, 0]
        off += size
    answers = [[int(first[b])] for b in range(B)]
    done = np.array([first[b] in eos or b >= n for b in range(B)])
    L = lens.copy()  # row of the next token to feed, per sequence
    while not done.all():
        tok = np.array([[a[-1]] for a in answers], np.int64)
        rows = L[:, None].astype(np.int32)  # each sequence decodes at its own row (= position)
        out = teacher.forward(ForwardInputs(tok.astype(np.int32), rows, rows, batch_visibility(rows, teacher.max_len), 1))
        ti, tv = _topk(out.logits[:, 0], topk)
        for b in range(B):
            if done[b]:
                continue
            feats[b].append(out.aux_hidden[b, :1].astype(np.float16))
            tk_ids[b].append(ti[b:b + 1])
            tk_val[b].append(tv[b:b + 1])
            L[b] += 1
            nxt = int(ti[b, 0])
            answers[b].append(nxt)
            if nxt in eos or len(answers[b]) >= max_new_tokens:
                done[b] = True
    result = []
    for b in range(n):
        tokens = np.array(plist[b] + answers[b], np.int32)
        f = np.concatenate(feats[b])
        result.append((tokens, f, np.concatenate(tk_ids[b]), np.concatenate(tk_val[b])))
        assert f.shape[0] == tokens.shape[0] - 1, (f.shape, tokens.shape)
    return result


# ---- shards --------------------------------------------------------------------------------------------
def write_shard(out_dir: str, index: int, seqs: list[Sequence_]) -> str:
    """Write one shard atomically (tmp file + rename); returns its path."""
    path = os.path.join(out_dir, f"shard_{index:05d}.npz")
    tmp = path + ".tmp.npz"
    np.savez(tmp, tokens=np.concatenate([s.tokens for s in seqs]),
             features=np.concatenate([s.features for s in seqs]),
             topk_ids=np.concatenate([s.topk_ids for s in seqs]),
             topk_logits=np.concatenate([s.topk_logits for s in seqs]),
             lengths=np.array([len(s.tokens) for s in seqs], np.int32),
             prompt_lens=np.array([s.prompt_len for s in seqs], np.int32),
             ids=np.array([s.pid for s in seqs]))
    os.replace(tmp, path)
    return path


def read_manifest(out_dir: str) -> list[dict]:
    path = os.path.join(out_dir, MANIFEST)
    if not os.path.isfile(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def load_sequences(data_dir: str) -> list[Sequence_]:
    """Every finished sequence of a data directory (only shards listed in the manifest)."""
    out = []
    for rec in read_manifest(data_dir):
        # Each ``z[key]`` decompresses the whole array again, and a slice keeps its whole base alive: read
        # every array once per shard and copy each sequence's rows out (else memory grows ~16x per shard).
        with np.load(os.path.join(data_dir, rec["shard"])) as z:
            arrays = {k: z[k] for k in ("ids", "lengths", "prompt_lens", "tokens", "features", "topk_ids",
                                        "topk_logits")}
        t_off = f_off = 0
        for pid, n, p in zip(arrays["ids"], arrays["lengths"], arrays["prompt_lens"]):
            n, p = int(n), int(p)
            rows = slice(f_off, f_off + n - 1)
            out.append(Sequence_(str(pid), arrays["tokens"][t_off:t_off + n].copy(), p,
                                 arrays["features"][rows].copy(), arrays["topk_ids"][rows].copy(),
                                 arrays["topk_logits"][rows].copy()))
            t_off += n
            f_off += n - 1
    return out


def _progress(done: int, total: int, t0: float, tokens: int, extra: str = "") -> None:
    el = time.time() - t0
    rate = tokens / el if el > 0 else 0.0
    bar = "#" * int(30 * done / max(total, 1))
    print(f"\r[{bar:<30}] {done}/{total} prompts  {tokens} tok  {rate:.1f} tok/s  {el / 60:.1f} min {extra}",
          end="", file=sys.stderr, flush=True)


def generate_dataset(model_dir: str, out_dir: str, num_prompts: int, batch_size: int = 16,
                     max_new_tokens: int = 128, max_prompt_tokens: int = 128, topk: int = 32,
                     seed: int = 0, time_limit_s: float | None = None) -> int:
    """Generate (or resume) the dataset; returns the number of finished sequences."""
    from ..config import RuntimeConfig
    from ..teacher import Teacher
    from ..tokenizer import load_tokenizer

    os.makedirs(out_dir, exist_ok=True)
    for stale in glob.glob(os.path.join(out_dir, "*.tmp.npz")):
        os.remove(stale)
    tok = load_tokenizer(model_dir)
    prompts = select_prompts(build_prompts(seed), num_prompts)
    with open(os.path.join(out_dir, PROMPTS_FILE) + ".tmp", "w", encoding="utf-8") as f:
        for p in prompts:
            f.write(json.dumps(p) + "\n")
    os.replace(os.path.join(out_dir, PROMPTS_FILE) + ".tmp", os.path.join(out_dir, PROMPTS_FILE))
    manifest = read_manifest(out_dir)
    finished = {pid for rec in manifest for pid in rec["ids"]}
    todo = []
    for p in prompts:
        if p["id"] in finished:
            continue
        ids = tok.encode_chat([{"role": "user", "content": p["text"]}])
        if len(ids) <= max_prompt_tokens:
            todo.append((p["id"], ids))
    todo.sort(key=lambda x: len(x[1]))  # similar lengths per batch: less prefill padding ...
    batches = [todo[i:i + batch_size] for i in range(0, len(todo), batch_size)]
    random.Random(seed).shuffle(batches)  # ... but every source early on, so a time limit keeps the mix
    max_len = max_prompt_tokens + max_new_tokens + 64
    teacher = Teacher.load(model_dir, RuntimeConfig(max_cache_len=max_len, batch_size=batch_size,
                                                    buckets=(1, 8, 16, 32, 64), prefill_chunk=64))
    t0, n_tok = time.time(), 0
    shard = len(manifest)
    done = len(finished)
    total = done + len(todo)
    for chunk in batches:
        if time_limit_s is not None and time.time() - t0 > time_limit_s:
            print(f"\ntime limit {time_limit_s:.0f}s reached; rerun to resume", file=sys.stderr)
            break
        outs = generate_batch(teacher, [c[1] for c in chunk], max_new_tokens, tok.eos_token_ids, topk)
        seqs = [Sequence_(pid, t, len(ids), f, i, v) for (pid, ids), (t, f, i, v) in zip(chunk, outs)]
        name = os.path.basename(write_shard(out_dir, shard, seqs))
        with open(os.path.join(out_dir, MANIFEST), "a", encoding="utf-8") as f:
            f.write(json.dumps({"shard": name, "ids": [s.pid for s in seqs],
                                "tokens": int(sum(len(s.tokens) for s in seqs))}) + "\n")
        shard += 1
        done += len(seqs)
        n_tok += sum(len(s.tokens) - s.prompt_len for s in seqs)
        _progress(done, total, t0, n_tok)
    print(file=sys.stderr)
    return len({pid for rec in read_manifest(out_dir) for pid in rec["ids"]})


def main(argv: list[str] | None = None) -> int:
    import argparse

    from ..assets import default_model_dir, home

    ap = argparse.ArgumentParser(description="Generate teacher answers + features for draft-head training")
    ap.add_argument("--teacher", default=None, help="converted teacher dir (default: the default teacher)")
    ap.add_argument("--out", default=os.path.join(home(), "train_data", "smollm2-135m"))
    ap.add_argument("--num-prompts", type=int, default=600)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--max-prompt-tokens", type=int, default=128)
    ap.add_argument("--topk", type=int, default=32)
    ap.add_argument("--time-limit", type=float, default=None, help="stop (resumably) after this many seconds")
    a = ap.parse_args(argv)
    n = generate_dataset(a.teacher or default_model_dir(), a.out, a.num_prompts, a.batch_size, a.max_new_tokens,
                         a.max_prompt_tokens, a.topk, time_limit_s=a.time_limit)
    print(f"{n} sequences in {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

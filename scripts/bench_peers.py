"""Peer benchmark: our greedy and speculative decoding next to what a user would run instead on the same CPU.

Systems (rows), on the same prompts (``evalset:N``: the first turns of N conversations spread over the evaluation
set), the same weights (the default teacher's GGUF, dequantized; our converted directory holds the same numbers)
and the same input ids (our chat template and tokenizer: ``Tokenizer.encode_chat``):

* ``ours greedy`` / ``ours spec``: ``mindspore-eagle bench``'s own path (the CLI's parser and builder, then
  ``bench.run_bench``: warm-up, greedy then speculative per prompt) with the shipped head and the CLI's default
  drafting. fp32; bf16 once the CLI has ``--dtype`` (otherwise that row says why it did not run).
* ``hf greedy``: transformers ``generate(do_sample=False)`` from the GGUF, fp32 and bf16.
* ``hf pld K``: transformers prompt-lookup decoding ``generate(prompt_lookup_num_tokens=K)``, greedy, fp32 and bf16.
* ``eagle``: SafeAILab/EAGLE's reference ``EaModel.eagenerate`` with our shipped head, fp32 and bf16, from a patched
  copy of its source prepared at run time (``prepare_eagle_source``; never part of our package), on a HF directory
  written from the GGUF and a copy of the head whose config drops ``target_hidden_size`` when it equals
  ``hidden_size`` (EAGLE reads that key's presence as "the head holds its own embed_tokens" and otherwise keeps a
  random embedding). Its tree budget is ours: ``total_token = max_nodes``, ``depth = our depth - 1`` (EAGLE's depth d
  grows d + 1 levels), same ``top_k``.

Each row runs in its own process (MindSpore's thread pool slows torch in a process where graphs ran), one process at
a time, after an untimed warm-up on the first prompt. Per row: new tokens/s over the whole request (prefill
included), tau (tokens emitted per verification forward, the first token of the prefill not counted; 1 for
greedy), and on how many prompts its output equals our fp32 greedy output and transformers' fp32 greedy output
token for token (every output cut the same way: at most ``--max-new-tokens``, up to and including the first
end-of-turn token). ``x_hf`` is the row's tok/s over transformers fp32 greedy measured in the same run.
Prints a table; the last stdout line is one JSON object.

    python scripts/bench_peers.py [--prompts 8] [--max-new-tokens 64] [--eagle-src DIR] [--pld 3,5,10]
        [--dtypes float32,bfloat16] [--families ours,hf,pld,eagle] [--work-dir DIR]

``--eagle-src`` is a checkout or a bare git directory of https://github.com/SafeAILab/EAGLE; without it the EAGLE
rows report "not run". A full default run takes ~15-30 minutes on a 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

ROOT = Path(__file__).resolve().parents[1]
REFERENCE_OURS = "ours greedy float32"
REFERENCE_HF = "hf greedy float32"
SHORT_DTYPE = {"float32": "fp32", "bfloat16": "bf16"}

# ----- the patched copy of SafeAILab/EAGLE ---------------------------------------------------------------------------


class PatchError(Exception):
    """The EAGLE source is not the one these patches were written for (a snippet is missing or ambiguous)."""


@dataclass(frozen=True)
class SourcePatch:
    """Replace ``old`` (which must occur exactly once in ``path``) by ``new``; ``why`` is printed in the report."""

    path: str
    why: str
    old: str
    new: str


EAGLE_FILES_UNDER = ("eagle/__init__.py", "eagle/model/")

EAGLE_PATCHES = (
    SourcePatch(
        "eagle/model/ea_model.py",
        "the Mixtral/Qwen2/Qwen3 modules import names transformers 5 removed; only the Llama path is used here",
        """from .modeling_mixtral_kv import MixtralForCausalLM as KVMixtralForCausalLM
#from .modeling_qwen2_kv import LlamaForCausalLM as KVQwen2ForCausalLM
from .modeling_qwen2_kv import Qwen2ForCausalLM as KVQwen2ForCausalLM
from .modeling_qwen3_kv import Qwen3ForCausalLM as KVQwen3ForCausalLM
""",
        """try:
    from .modeling_mixtral_kv import MixtralForCausalLM as KVMixtralForCausalLM
except ImportError:
    KVMixtralForCausalLM = None
try:
    from .modeling_qwen2_kv import Qwen2ForCausalLM as KVQwen2ForCausalLM
except ImportError:
    KVQwen2ForCausalLM = None
try:
    from .modeling_qwen3_kv import Qwen3ForCausalLM as KVQwen3ForCausalLM
except ImportError:
    KVQwen3ForCausalLM = None
"""),
    SourcePatch(
        "eagle/model/ea_model.py",
        "transformers 5 builds the model on the meta device: the rotary inv_freq/cos/sin buffers (not in the "
        "checkpoint) come back uninitialised; rebuild them with the module's own constructor",
        """        configpath = os.path.join(ea_model_path, "config.json")
""",
        """        for _m in base_model.modules():
            if hasattr(_m, "_set_cos_sin_cache"):
                _kw = {"scaling_factor": _m.scaling_factor} if hasattr(_m, "scaling_factor") else {}
                _m.__init__(_m.dim, max_position_embeddings=_m.max_position_embeddings, base=_m.base, **_kw)
        configpath = os.path.join(ea_model_path, "config.json")
"""),
    SourcePatch(
        "eagle/model/modeling_llama_kv.py",
        "transformers 5 wants _tied_weights_keys as a mapping target -> source",
        """    _tied_weights_keys = ["lm_head.weight"]
""",
        """    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
"""),
    SourcePatch(
        "eagle/model/modeling_llama_kv.py",
        "transformers 5 keeps rope_theta in config.rope_parameters and reads a plain RoPE back as "
        "rope_scaling={'rope_type': 'default', ...} (the teacher would otherwise take the Llama-3.1 path)",
        """        if self.config.rope_scaling is None:
            self.rotary_emb = LlamaRotaryEmbedding(
                self.head_dim, max_position_embeddings=self.max_position_embeddings, base=self.config.rope_theta
            )
""",
        """        rope = getattr(self.config, "rope_parameters", None) or {}
        if self.config.rope_scaling is None or rope.get("rope_type") == "default":
            self.rotary_emb = LlamaRotaryEmbedding(
                self.head_dim, max_position_embeddings=self.max_position_embeddings,
                base=rope["rope_theta"] if "rope_theta" in rope else self.config.rope_theta
            )
"""),
    SourcePatch(
        "eagle/model/cnets.py",
        "the same for the draft head: without it the head crashes on rope_scaling['type'] (or, with rope_scaling "
        "None, silently uses base 10000 instead of the config's rope_theta)",
        """        if self.config.rope_scaling is None:
            if hasattr(self.config, "rope_theta"):
                self.rotary_emb = LlamaRotaryEmbedding(self.head_dim,
                                                       max_position_embeddings=self.max_position_embeddings,
                                                       base=self.config.rope_theta)
""",
        """        rope = getattr(self.config, "rope_parameters", None) or {}
        if self.config.rope_scaling is None or rope.get("rope_type") == "default":
            if "rope_theta" in rope or hasattr(self.config, "rope_theta"):
                self.rotary_emb = LlamaRotaryEmbedding(self.head_dim,
                                                       max_position_embeddings=self.max_position_embeddings,
                                                       base=rope["rope_theta"] if "rope_theta" in rope
                                                       else self.config.rope_theta)
"""),
)


def read_eagle_files(src: str) -> tuple[dict[str, str], str]:
    """The files of ``EAGLE_FILES_UNDER`` from a checkout or a bare git directory: ``({path: text}, revision)``."""
    src = os.path.abspath(src)
    if os.path.isdir(os.path.join(src, "eagle", "model")):
        files = {}
        for base in EAGLE_FILES_UNDER:
            full = os.path.join(src, base)
            paths = [full] if os.path.isfile(full) else sorted(
                os.path.join(full, n) for n in os.listdir(full) if n.endswith(".py"))
            for p in paths:
                files[os.path.relpath(p, src)] = Path(p).read_text(encoding="utf-8")
        rev = _git(src, "rev-parse", "HEAD", check=False) or "working tree"
        return files, rev
    if not os.path.isfile(os.path.join(src, "HEAD")):
        raise PatchError(f"--eagle-src {src}: neither a checkout (no eagle/model/) nor a git directory (no HEAD)")
    rev = _git(src, "rev-parse", "HEAD")
    names = _git(src, "ls-tree", "-r", "--name-only", "HEAD", "--", *EAGLE_FILES_UNDER).split("\n")
    files = {n: _git(src, "show", f"HEAD:{n}", strip=False) for n in names if n.endswith(".py")}
    if not any(n.startswith("eagle/model/") for n in files):
        raise PatchError(f"--eagle-src {src}: HEAD {rev[:12]} has no eagle/model/*.py")
    return files, rev


def _git(git_dir: str, *cmd: str, check: bool = True, strip: bool = True) -> str:
    flag = "--git-dir" if os.path.isfile(os.path.join(git_dir, "HEAD")) else "-C"
    proc = subprocess.run(["git", flag, git_dir, *cmd], capture_output=True, text=True)
    if proc.returncode != 0:
        if check:
            raise PatchError(f"git {' '.join(cmd)} in {git_dir} failed: {proc.stderr.strip()[-300:]}")
        return ""
    return proc.stdout.strip() if strip else proc.stdout


def apply_patches(files: dict[str, str], patches: Sequence[SourcePatch] = EAGLE_PATCHES) -> dict[str, str]:
    """``files`` with every patch applied; a PatchError names each snippet that is missing or ambiguous."""
    out = dict(files)
    problems = []
    for p in patches:
        text = out.get(p.path)
        n = 0 if text is None else text.count(p.old)
        if n != 1:
            where = "file missing" if text is None else f"snippet found {n} times"
            problems.append(f"{p.path}: {where} (patch: {p.why[:60]}...)")
            continue
        out[p.path] = text.replace(p.old, p.new)
    if problems:
        raise PatchError("EAGLE source differs from the one these patches were written for: " + "; ".join(problems))
    return out


def prepare_eagle_source(src: str, work_dir: str) -> tuple[str, str]:
    """Write the patched copy to ``work_dir/eagle-src-<rev12>`` (atomically, fresh each run): ``(dir, revision)``."""
    from mindspore_eagle.atomic import atomic_directory

    files, rev = read_eagle_files(src)
    patched = apply_patches(files)
    out = os.path.join(os.path.abspath(work_dir), f"eagle-src-{rev[:12].replace(' ', '-')}")
    with atomic_directory(out, True, PatchError) as tmp:
        for rel, text in patched.items():
            os.makedirs(os.path.join(tmp, os.path.dirname(rel)), exist_ok=True)
            Path(tmp, rel).write_text(text, encoding="utf-8")
    return out, rev


def prepare_head_copy(head_dir: str, out_dir: str) -> dict:
    """A copy of a public EAGLE-3 head whose config has no ``target_hidden_size`` when it equals ``hidden_size`` (see
    the module docstring). Returns the config written."""
    from mindspore_eagle.atomic import atomic_directory

    with open(os.path.join(head_dir, "config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    if cfg.get("target_hidden_size") == cfg.get("hidden_size"):
        cfg.pop("target_hidden_size", None)
    with atomic_directory(out_dir, True, PatchError) as tmp:
        with open(os.path.join(tmp, "config.json"), "w", encoding="utf-8") as f:
            json.dump(cfg, f, indent=2)
        for name in os.listdir(head_dir):
            if name != "config.json":
                shutil.copy2(os.path.join(head_dir, name), os.path.join(tmp, name))
    return cfg


# ----- results: one Run per row, assembled into the table and the JSON ------------------------------------------------


@dataclass(frozen=True)
class PromptRun:
    """One prompt of one system: its output (cut by ``clip``), wall seconds of the whole request, and the verification
    forwards after the prefill with the tokens they emitted (for tau; both raw, before the cut)."""

    tokens: tuple[int, ...]
    seconds: float
    cycles: int
    cycle_tokens: int


@dataclass(frozen=True)
class Run:
    """One row: a system in one precision. ``status`` "ok", "not run" or "failed" (then ``reason`` says why)."""

    name: str
    status: str = "ok"
    reason: str = ""
    prompts: tuple[PromptRun, ...] = ()
    info: dict = field(default_factory=dict)

    @property
    def tok_s(self) -> float:
        secs = sum(p.seconds for p in self.prompts)
        return sum(len(p.tokens) for p in self.prompts) / secs if secs > 0 else float("nan")

    @property
    def tau(self) -> float:
        cycles = sum(p.cycles for p in self.prompts)
        return sum(p.cycle_tokens for p in self.prompts) / cycles if cycles else float("nan")


def clip(tokens: Sequence[int], eos: Sequence[int], max_new_tokens: int) -> tuple[int, ...]:
    """The one stop rule applied to every system: at most ``max_new_tokens``, cut after the first end-of-turn token
    (kept). E.g. ``clip([5, 2, 7], eos=[2], 8) == (5, 2)``, ``clip([5, 6, 7], [2], 2) == (5, 6)``."""
    out = []
    for t in list(tokens)[:max_new_tokens]:
        out.append(int(t))
        if t in eos:
            break
    return tuple(out)


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first differing token (a length difference counts), None when equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def run_from_dict(d: dict) -> Run:
    return Run(d["name"], d.get("status", "ok"), d.get("reason", ""),
               tuple(PromptRun(tuple(p["tokens"]), p["seconds"], p["cycles"], p["cycle_tokens"])
                     for p in d.get("prompts", ())), d.get("info", {}))


def run_to_dict(r: Run) -> dict:
    return {"name": r.name, "status": r.status, "reason": r.reason, "info": r.info,
            "prompts": [{"tokens": list(p.tokens), "seconds": p.seconds, "cycles": p.cycles,
                         "cycle_tokens": p.cycle_tokens} for p in r.prompts]}


def _round(x: float, n: int = 3):
    return None if x != x else round(x, n)  # NaN -> null in the JSON


def summarize_runs(runs: Sequence[Run]) -> dict:
    """Per row: tok/s, ratio to transformers fp32 greedy, tau, and how many prompts equal our fp32 greedy and
    transformers' fp32 greedy (with the first differing index per prompt). Rows that did not run carry their reason."""
    by_name = {r.name: r for r in runs}
    refs = {key: by_name.get(name) for key, name in (("ours", REFERENCE_OURS), ("hf", REFERENCE_HF))}
    refs = {k: r for k, r in refs.items() if r is not None and r.status == "ok"}
    hf_tok_s = refs["hf"].tok_s if "hf" in refs else float("nan")
    rows = {}
    for r in runs:
        if r.status != "ok":
            rows[r.name] = {"status": r.status, "reason": r.reason}
            continue
        row = {"status": "ok", "prompts": len(r.prompts), "tokens": sum(len(p.tokens) for p in r.prompts),
               "tok_s": _round(r.tok_s, 2), "x_hf": _round(r.tok_s / hf_tok_s), "tau": _round(r.tau)}
        for key, ref in refs.items():
            if len(ref.prompts) != len(r.prompts):
                raise ValueError(f"{r.name}: {len(r.prompts)} prompts, reference {ref.name} has {len(ref.prompts)}")
            diffs = [first_difference(p.tokens, q.tokens) for p, q in zip(r.prompts, ref.prompts)]
            row[f"same_as_{key}_greedy"] = sum(d is None for d in diffs)
            row[f"first_diff_vs_{key}_greedy"] = diffs
        row.update(r.info)
        rows[r.name] = row
    return rows


def format_table(rows: dict) -> str:
    lines = [f"{'system':<24} {'tok/s':>7} {'x hf fp32':>9} {'tau':>6} {'=ours greedy':>12} {'=hf greedy':>10}"]
    for name, row in rows.items():
        if row["status"] != "ok":
            lines.append(f"{name:<24} {row['status'].upper()}: {row['reason']}")
            continue
        n = row["prompts"]

        def same(key):
            v = row.get(f"same_as_{key}_greedy")
            return "-" if v is None else f"{v}/{n}"

        def num(v, fmt):
            return "-" if v is None else format(v, fmt)

        lines.append(f"{name:<24} {num(row['tok_s'], '7.2f')} {num(row['x_hf'], '9.2f')} {num(row['tau'], '6.2f')} "
                     f"{same('ours'):>12} {same('hf'):>10}")
    return "\n".join(lines)


# ----- workers: each row in its own process ---------------------------------------------------------------------------


def _torch_dtype(name: str):
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[name]


def worker_ours(req: dict) -> list[Run]:
    """Greedy and speculative through the CLI's own parser and builder (so ``--dtype`` and the drafting defaults are the
    CLI's), then ``bench.run_bench``: the path of ``mindspore-eagle bench``."""
    from mindspore_eagle import cli
    from mindspore_eagle.bench import run_bench, summarize

    dtype, m = req["dtype"], req["max_new_tokens"]
    names = [f"ours greedy {dtype}", f"ours spec {dtype}"]
    argv = ["bench", "--max-new-tokens", str(m), *req.get("ours_flags", [])]
    parser = cli.build_parser()
    try:
        args = parser.parse_args([*argv, "--dtype", dtype])
    except SystemExit:
        if dtype != "float32":
            why = f"`mindspore-eagle bench` has no --dtype option yet (needed for {dtype}); run again once it lands"
            return [Run(n, "not run", why) for n in names]
        args = parser.parse_args(argv)  # fp32 is the only precision of a CLI without --dtype
    stack = cli._build(args)
    if set(stack.eos) != set(req["eos"]):
        raise RuntimeError(f"end-of-turn ids differ: the builder's {stack.eos} vs the request's {req['eos']}")
    results = run_bench(stack.engine, req["prompt_ids"], stack.proposer_for, m, stack.eos,
                        log=lambda s: print(s, file=sys.stderr))
    b = stack.budget
    info = {"budget": {"max_nodes": b.max_nodes, "depth": b.depth, "top_k": b.top_k}, "bench": summarize(results)}

    def prompt_run(g):  # a greedy step emits one token (a one-node tree: no draft, the bonus)
        return PromptRun(tuple(g.tokens), g.total_s, len(g.steps), sum(s.emitted for s in g.steps))

    return [Run(names[0], prompts=tuple(prompt_run(r.greedy) for r in results)),
            Run(names[1], prompts=tuple(prompt_run(r.spec) for r in results), info=info)]


def hf_prompt_ids(tokenizer, prompt: str) -> list[int]:
    """Transformers' own chat-template ids for one user turn (what a transformers user would feed)."""
    ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                        tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def load_hf_gguf(gguf: str, dtype: str):
    """The GGUF dequantized to fp32 by transformers, then cast to ``dtype``. Not ``from_pretrained(dtype=bfloat16)``:
    transformers 5.24 then keeps a GGUF forward path that casts every matmul to fp32 and back (measured here: ~1.2 s
    per decode step instead of ~0.05 s, and a different first token); the cast model has the same bf16 weights."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(os.path.dirname(gguf), gguf_file=os.path.basename(gguf),
                                                 dtype=torch.float32)
    return model.to(_torch_dtype(dtype)).eval()


def worker_hf(req: dict) -> list[Run]:
    """transformers ``generate``: greedy, or prompt-lookup decoding with ``pld`` tokens; forwards counted by a hook."""
    import torch

    dtype, m, k = req["dtype"], req["max_new_tokens"], req.get("pld", 0)
    name = f"hf pld{k} {dtype}" if k else f"hf greedy {dtype}"
    model = load_hf_gguf(req["gguf"], dtype)
    calls = [0]
    model.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    extra = {"prompt_lookup_num_tokens": k} if k else {}
    eos = list(req["eos"])

    def generate(ids):
        x = torch.tensor([ids])
        calls[0] = 0
        t = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=m, do_sample=False,
                                 eos_token_id=eos, pad_token_id=eos[-1], **extra)
        secs = time.perf_counter() - t
        raw = out[0, len(ids):].tolist()
        return PromptRun(clip(raw, eos, m), secs, calls[0] - 1, len(raw) - 1)

    generate(req["prompt_ids"][0])  # warm-up, untimed
    prompts = tuple(generate(ids) for ids in req["prompt_ids"])
    info = {"torch_threads": torch.get_num_threads(), "mindspore_imported": "mindspore" in sys.modules}
    if req.get("check_prompt_ids"):
        from transformers import AutoTokenizer

        g = req["gguf"]
        tok = AutoTokenizer.from_pretrained(os.path.dirname(g), gguf_file=os.path.basename(g))
        same = [hf_prompt_ids(tok, p) == ids for p, ids in zip(req["prompts"], req["prompt_ids"])]
        info["hf_template_ids_equal_ours"] = same
    return [Run(name, prompts=prompts, info=info)]


def prepare_hf_base(gguf: str, out_dir: str) -> str:
    """A HF model directory (config, one safetensors file plus the index EAGLE's embedding loader reads, tokenizer)
    written from the GGUF transformers loads, fp32; kept across runs (keyed by the GGUF's size and mtime)."""
    from safetensors.torch import save_file
    from transformers import AutoTokenizer

    from mindspore_eagle.atomic import atomic_directory

    st = os.stat(gguf)
    key = f"{os.path.abspath(gguf)} {st.st_size} {int(st.st_mtime)}"
    stamp = os.path.join(out_dir, "source.txt")
    if os.path.isfile(stamp) and Path(stamp).read_text() == key:
        return out_dir
    model = load_hf_gguf(gguf, "float32")
    tok = AutoTokenizer.from_pretrained(os.path.dirname(gguf), gguf_file=os.path.basename(gguf))
    tied = model.config.tie_word_embeddings
    state = {n: t.detach().contiguous() for n, t in model.state_dict().items() if not (tied and n == "lm_head.weight")}
    cfg = model.config.to_dict()
    for key_ in ("quantization_config", "_name_or_path", "_model_name_or_path"):
        cfg.pop(key_, None)
    cfg["architectures"] = [type(model).__name__]  # EAGLE dispatches on architectures[0]; GGUF configs leave it null
    cfg["dtype"] = "float32"
    with atomic_directory(out_dir, True, PatchError) as tmp:
        save_file(state, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
        with open(os.path.join(tmp, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {}, "weight_map": {n: "model.safetensors" for n in state}}, f)
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(cfg, f, indent=1)
        tok.save_pretrained(tmp)
        Path(tmp, "source.txt").write_text(key)
    return out_dir


def check_eagle_head_loaded(model, head_dir: str, base_dir: str) -> None:
    """EaModel loads the head with ``strict=False`` and ignores the result: check every tensor of the head file
    arrived, and that the embedding is the teacher's (not the random table a ``target_hidden_size`` config keeps)."""
    import torch
    from safetensors.torch import load_file

    state = model.ea_layer.state_dict()
    wrong = []
    for name, t in load_file(os.path.join(head_dir, "model.safetensors")).items():
        got = state.get(name)
        if got is None or got.shape != t.shape or not torch.equal(got, t.to(got.dtype)):
            wrong.append(name)
    emb = load_file(os.path.join(base_dir, "model.safetensors"))["model.embed_tokens.weight"]
    if not torch.equal(state["embed_tokens.weight"], emb.to(state["embed_tokens.weight"].dtype)):
        wrong.append("embed_tokens.weight (not the teacher's)")
    if wrong:
        raise RuntimeError(f"EAGLE did not load the head as given: {wrong}")


def worker_eagle(req: dict) -> list[Run]:
    """SafeAILab EAGLE's ``EaModel.eagenerate`` (greedy: temperature 0) from the patched copy."""
    import torch

    dtype, m, e = req["dtype"], req["max_new_tokens"], req["eagle"]
    base = prepare_hf_base(req["gguf"], e["base_dir"])
    sys.path.insert(0, e["src_dir"])
    from eagle.model.ea_model import EaModel

    b = e["budget"]
    model = EaModel.from_pretrained(use_eagle3=True, base_model_path=base, ea_model_path=e["head_dir"],
                                    total_token=b["max_nodes"], depth=b["depth"] - 1, top_k=b["top_k"],
                                    threshold=1.0, dtype=_torch_dtype(dtype)).eval()
    check_eagle_head_loaded(model, e["head_dir"], base)
    eos = list(req["eos"])

    def generate(ids):
        x = torch.tensor([ids])
        t = time.perf_counter()
        # Each cycle commits its root and accepted drafts (``committed`` counts them; the bonus becomes the next
        # root), and the loop stops once committed > max_new_tokens: m - 1 yields at least m tokens, cut by clip.
        out, committed, idx = model.eagenerate(x, temperature=0.0, max_new_tokens=m - 1, log=True)
        secs = time.perf_counter() - t
        return PromptRun(clip(out[0, len(ids):].tolist(), eos, m), secs, int(idx) + 1, int(committed))

    generate(req["prompt_ids"][0])  # warm-up, untimed
    prompts = tuple(generate(ids) for ids in req["prompt_ids"])
    info = {"eagle_revision": e["revision"], "eagle_args": {"total_token": b["max_nodes"], "depth": b["depth"] - 1,
                                                            "top_k": b["top_k"]},
            "torch_threads": torch.get_num_threads()}
    return [Run(f"eagle {dtype}", prompts=prompts, info=info)]


WORKERS = {"ours": worker_ours, "hf": worker_hf, "eagle": worker_eagle}


def worker_main(kind: str, request: str, out: str) -> int:
    with open(request, encoding="utf-8") as f:
        req = json.load(f)
    runs = WORKERS[kind](req)
    with open(out, "w", encoding="utf-8") as f:
        json.dump([run_to_dict(r) for r in runs], f)
    return 0


# ----- the driver -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Job:
    """One worker process: ``kind`` with request fields ``fields``, producing the rows ``names``."""

    kind: str
    names: tuple[str, ...]
    fields: dict


def plan_jobs(families: Sequence[str], dtypes: Sequence[str], pld: Sequence[int]) -> list[Job]:
    """Ours first (its budget configures EAGLE), transformers greedy fp32 next (the reference), then the rest."""
    jobs = []
    dtypes = sorted(dtypes, key=lambda d: d != "float32")  # the references are fp32
    for dtype in dtypes:
        if "ours" in families:
            jobs.append(Job("ours", (f"ours greedy {dtype}", f"ours spec {dtype}"), {"dtype": dtype}))
    for dtype in dtypes:
        if "hf" in families:
            jobs.append(Job("hf", (f"hf greedy {dtype}",), {"dtype": dtype, "check_prompt_ids": dtype == "float32"}))
        if "pld" in families:
            jobs += [Job("hf", (f"hf pld{k} {dtype}",), {"dtype": dtype, "pld": k}) for k in pld]
        if "eagle" in families:
            jobs.append(Job("eagle", (f"eagle {dtype}",), {"dtype": dtype}))
    return jobs


def worker_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env.update(GLOG_v="3", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    return env


def run_job(job: Job, base_req: dict, work_dir: str, timeout_s: float) -> list[Run]:
    """Run one worker process to completion; a failure becomes "failed" rows carrying the log's last lines."""
    tag = job.names[-1].replace(" ", "_")
    req_path, out_path = os.path.join(work_dir, f"{tag}.request.json"), os.path.join(work_dir, f"{tag}.out.json")
    log_path = os.path.join(work_dir, f"{tag}.log")
    with open(req_path, "w", encoding="utf-8") as f:
        json.dump({**base_req, **job.fields}, f)
    if os.path.exists(out_path):
        os.remove(out_path)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", job.kind, "--request", req_path,
           "--out", out_path]
    t = time.perf_counter()
    with open(log_path, "w", encoding="utf-8") as log:
        try:
            rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=worker_env(), cwd=work_dir,
                                timeout=timeout_s).returncode
        except subprocess.TimeoutExpired:
            rc = f"timeout after {timeout_s:.0f} s"
    print(f"[{', '.join(job.names)}: {time.perf_counter() - t:.0f} s, load average {os.getloadavg()[0]:.1f}]",
          file=sys.stderr)
    if rc == 0 and os.path.isfile(out_path):
        with open(out_path, encoding="utf-8") as f:
            return [run_from_dict(d) for d in json.load(f)]
    with open(log_path, encoding="utf-8", errors="replace") as f:
        tail = [ln.strip() for ln in f.read().splitlines() if ln.strip()][-3:]
    why = f"worker exit {rc}: {' | '.join(tail)[-400:]} (log: {log_path})"
    return [Run(n, "failed", why) for n in job.names]


def eagle_fields(args, work_dir: str, budget: dict | None) -> tuple[dict | None, str]:
    """The request part of the EAGLE rows, or None and the reason they cannot run."""
    from mindspore_eagle.draft import default_head_dir

    if not args.eagle_src:
        return None, "no --eagle-src given (a checkout or bare git directory of github.com/SafeAILab/EAGLE)"
    if budget is None:
        return None, "our speculative row did not run, so there is no tree budget to give EAGLE"
    try:
        src_dir, rev = prepare_eagle_source(args.eagle_src, work_dir)
    except PatchError as exc:
        return None, str(exc)
    head_dir = os.path.join(work_dir, "eagle-head")
    prepare_head_copy(default_head_dir(), head_dir)
    return {"src_dir": src_dir, "revision": rev, "head_dir": head_dir, "budget": budget,
            "base_dir": os.path.join(work_dir, "hf-base")}, ""


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=8, help="N first turns spread over the evaluation set")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--families", default="ours,hf,pld,eagle")
    ap.add_argument("--pld", default="3,5,10", help="prompt_lookup_num_tokens values")
    ap.add_argument("--eagle-src", default=None, help="checkout or bare git dir of SafeAILab/EAGLE")
    ap.add_argument("--ours-flags", default="", help="extra `mindspore-eagle bench` flags, e.g. '--max-nodes 16'")
    ap.add_argument("--work-dir", default=None, help="default: $MINDSPORE_EAGLE_HOME/peers")
    ap.add_argument("--worker-timeout", type=float, default=3600)
    ap.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    ap.add_argument("--request", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return args
    args.dtypes = [d for d in args.dtypes.split(",") if d]
    args.families = [f for f in args.families.split(",") if f]
    args.pld = [int(k) for k in args.pld.split(",") if k]
    bad = ([d for d in args.dtypes if d not in SHORT_DTYPE] + [f for f in args.families
                                                               if f not in ("ours", "hf", "pld", "eagle")])
    if bad or args.prompts < 1 or args.max_new_tokens < 2 or any(k < 1 for k in args.pld):
        ap.error(f"bad values {bad}; need --prompts >= 1, --max-new-tokens >= 2, --pld values >= 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker:
        return worker_main(args.worker, args.request, args.out)
    from mindspore_eagle.assets import default_gguf_path, home, require_default_model
    from mindspore_eagle.bench import load_prompts
    from mindspore_eagle.config import TeacherConfig
    from mindspore_eagle.tokenizer import load_tokenizer

    work_dir = os.path.abspath(args.work_dir or os.path.join(home(), "peers"))
    os.makedirs(work_dir, exist_ok=True)
    model_dir = require_default_model()
    gguf = default_gguf_path()
    tok = load_tokenizer(model_dir)
    prompts = load_prompts(f"evalset:{args.prompts}")
    eos = list(dict.fromkeys([*TeacherConfig.load(model_dir).eos_token_ids, *tok.eos_token_ids]))
    base_req = {"prompts": prompts, "prompt_ids": [tok.encode_chat([{"role": "user", "content": p}]) for p in prompts],
                "eos": eos, "max_new_tokens": args.max_new_tokens, "gguf": gguf,
                "ours_flags": args.ours_flags.split()}
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    runs: list[Run] = []
    budget = None
    for job in plan_jobs(args.families, args.dtypes, args.pld):
        if job.kind == "eagle":
            fields, why = eagle_fields(args, work_dir, budget)
            if fields is None:
                runs += [Run(n, "not run", why) for n in job.names]
                continue
            job = Job(job.kind, job.names, {**job.fields, "eagle": fields})
        got = run_job(job, base_req, work_dir, args.worker_timeout)
        runs += got
        for r in got:
            if r.name.startswith("ours spec") and r.status == "ok" and budget is None:
                budget = r.info["budget"]
    rows = summarize_runs(runs)
    print(format_table(rows))
    hf_ids = rows.get(REFERENCE_HF, {}).get("hf_template_ids_equal_ours")
    summary = {
        "prompts": f"evalset:{args.prompts}", "max_new_tokens": args.max_new_tokens, "input_ids": "ours (encode_chat)",
        "hf_template_ids_equal_ours": None if hf_ids is None else f"{sum(hf_ids)}/{len(hf_ids)}",
        "reference_tok_s": REFERENCE_HF, "machine": {"cpus": os.cpu_count(), "load_avg_before": load_before[0],
                                                     "load_avg_after": os.getloadavg()[0]},
        "wall_s": round(time.perf_counter() - t0, 1), "systems": rows,
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())

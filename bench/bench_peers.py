"""Peer benchmark: our greedy and speculative decoding next to what a user would run instead on the same CPU.

Systems (rows), on the same prompts (``evalset:N``: the first turns of N conversations spread over the evaluation
set; or ``--prompts-file``, e.g. prompts the repo does not contain), the same weights (the default teacher's GGUF, dequantized; our converted directory holds the same numbers)
and the same input ids (our chat template and tokenizer, ``Tokenizer.encode_chat``; the JSON says on how many
prompts transformers' own chat template gives the same ids):

* ``ours greedy`` / ``ours spec``: the CLI's own parser and builder (so the shipped head, the CLI's default drafting
  and its ``--dtype``), then ``harness.warm_up`` and ``harness.compare`` per prompt: the path of
  ``mindspore-eagle bench``, in fp32 and in bf16.
* ``hf greedy``: transformers ``generate(do_sample=False)`` on the GGUF loaded in fp32 (cast for bf16).
* ``hf pld K``: transformers prompt-lookup decoding, ``generate(prompt_lookup_num_tokens=K)``, greedy.
* ``eagle``: SafeAILab/EAGLE's reference ``EaModel.eagenerate`` with our shipped head, from a patched copy of its
  source prepared at run time (``prepare_eagle_source``; never part of our package), on a HF directory written from
  the GGUF and a copy of the head whose config drops ``target_hidden_size`` when it equals ``hidden_size`` (EAGLE reads
  that key's presence as "the head holds its own embed_tokens" and otherwise keeps a random embedding). Its tree
  budget is ours: ``total_token = max_nodes``, ``depth = our depth - 1`` (EAGLE's depth d grows d + 1 levels), same
  ``top_k``.
* ``llamacpp greedy F`` / ``llamacpp pldK F``: llama.cpp through llama-cpp-python's ``Llama.generate`` on our ids,
  greedy (``temp=0``, ``top_k=1``) or with its prompt lookup (``LlamaPromptLookupDecoding(num_pred_tokens=K)`` as
  ``draft_model``), ``n_threads=2``, on the shipped GGUF as is (``F`` = its file type, ``q4_1``) and on ``f32``, a GGUF
  of the same weights dequantized (``prepare_f32_gguf``: the values our converter and transformers compute with).
  Its worker runs under the interpreter of a separate venv (``--llamacpp-python``, default ``.venv-llamacpp/bin/python``
  as ``make bench-peers-setup`` builds it) and imports neither MindSpore nor torch; without that venv the rows report
  "not run". Its precision is the file's, so its rows are measured in the first pass only.

How it measures on a shared machine: every system runs in its own process (MindSpore's thread pool slows torch in a
process where graphs ran). The processes of one *pass* (one per precision: fp32, then bf16) are started one at a time
(each loads and warms up while the others wait), stay resident, and then take the prompts in turns: prompt i goes to
every system of the pass one after the other (the first to go rotates with i; ``--settle`` seconds between turns let
the previous process's threads go idle), so only one process ever computes and every system meets the same machine
load within seconds of the others. Every pass holds the speed reference, transformers fp32 greedy; ``x_hf`` is a
row's tok/s over the reference's in the same pass (``x_hf_mean``: the mean of the per-prompt ratios).

Per row: new tokens/s over the whole request (prefill included), tau (tokens emitted per verification forward, the
prefill's first token not counted; 1 for greedy), and on how many prompts its output equals our fp32 greedy, the
transformers fp32 greedy, and the greedy of the same library and precision (``own``), token for token; every output
is cut the same way (at most ``--max-new-tokens``, up to and including the first end-of-turn token). Prints a table;
the last stdout line is one JSON object.

    python bench/bench_peers.py [--prompts 8 | --prompts-file F.jsonl] [--max-new-tokens 64] [--eagle-src DIR] [--pld 3,5,10]
        [--dtypes float32,bfloat16] [--families ours,hf,pld,eagle,llamacpp] [--llamacpp-python PATH] [--repeats 1]
        [--work-dir DIR]

``--eagle-src`` is a checkout or a bare git directory of https://github.com/SafeAILab/EAGLE; without it the EAGLE
rows report "not run". A default run takes ~20-30 minutes on a 2-core machine and holds up to ~9 GB resident.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mindspore_eagle.errors import EagleError  # noqa: E402  (imports neither MindSpore nor torch)

REFERENCE_OURS = "ours greedy float32"
REFERENCE_HF = "hf greedy float32"
MARK = "@@peer "  # prefix of the worker's protocol lines on stdout; any other stdout line goes to its log
MIN_FREE_GIB = 2.0  # a worker is not started when less memory than this is available
FAMILIES = ("ours", "hf", "pld", "eagle", "llamacpp")
LLAMACPP_PYTHON = ROOT / ".venv-llamacpp" / "bin" / "python"  # what `make bench-peers-setup` builds
LLAMACPP_THREADS = 2

# ----- the patched copy of SafeAILab/EAGLE ---------------------------------------------------------------------------


class PatchError(EagleError):
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
    from mindspore_eagle.storage.atomic import atomic_directory

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
    from mindspore_eagle.storage.atomic import atomic_directory

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


# ----- the f32 GGUF llama.cpp computes on ----------------------------------------------------------------------------


def source_stamp(path: str) -> str:
    """What a file derived from ``path`` is kept for: its absolute path, size and mtime."""
    st = os.stat(path)
    return f"{os.path.abspath(path)} {st.st_size} {int(st.st_mtime)}"


def gguf_label(path: str) -> str:
    """A GGUF's declared file type as a row label: ``general.file_type`` 3 (MOSTLY_Q4_1) -> ``"q4_1"``, 0 (ALL_F32) ->
    ``"f32"``; ``"native"`` when the file does not say."""
    import gguf

    field = gguf.GGUFReader(path).fields.get(gguf.Keys.General.FILE_TYPE)
    if field is None:
        return "native"
    return gguf.LlamaFileType(int(field.contents())).name.split("_", 1)[1].lower()


def write_f32_gguf(src: str, dst: str) -> None:
    """``src`` with every tensor dequantized to float32 by ``gguf.quants.dequantize`` (the values our converter and
    transformers compute with), same names and shapes; every metadata field copied, ``general.file_type`` set to
    ALL_F32. Fields GGUFWriter writes itself (``GGUF.*``, ``general.architecture``) are not copied; the alignment is
    set as the writer's alignment, so the data follows it."""
    import gguf
    import numpy as np

    reader = gguf.GGUFReader(src)
    writer = gguf.GGUFWriter(dst, reader.fields[gguf.Keys.General.ARCHITECTURE].contents(),
                             endianess=reader.endianess)
    for f in reader.fields.values():
        if f.name.startswith("GGUF.") or f.name == gguf.Keys.General.ARCHITECTURE:
            continue
        if f.name == gguf.Keys.General.ALIGNMENT:
            writer.add_custom_alignment(int(f.contents()))
        elif f.name == gguf.Keys.General.FILE_TYPE:
            writer.add_file_type(gguf.LlamaFileType.ALL_F32)
        else:
            vtype = f.types[0]
            writer.add_key_value(f.name, f.contents(), vtype,
                                 sub_type=f.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None)
    for t in reader.tensors:
        shape = tuple(int(d) for d in reversed(t.shape))  # GGUF lists dims fastest-first; numpy's order is reversed
        arr = gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape)
        writer.add_tensor(t.name, np.ascontiguousarray(arr, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def prepare_f32_gguf(src: str, out_dir: str) -> str:
    """``out_dir/<name>.f32.gguf`` written by ``write_f32_gguf`` (atomically), kept across runs while ``src`` is
    unchanged (``source_stamp``). Returns its path."""
    from mindspore_eagle.storage.atomic import atomic_directory

    name = os.path.basename(src)[: -len(".gguf")] if src.endswith(".gguf") else os.path.basename(src)
    out = os.path.join(out_dir, f"{name}.f32.gguf")
    stamp = os.path.join(out_dir, "source.txt")
    key = source_stamp(src)
    if os.path.isfile(out) and os.path.isfile(stamp) and Path(stamp).read_text() == key:
        return out
    with atomic_directory(out_dir, True, EagleError) as tmp:
        write_f32_gguf(src, os.path.join(tmp, os.path.basename(out)))
        Path(tmp, "source.txt").write_text(key)
    return out


# ----- results: one Run per row, assembled into the table and the JSON ---------------------------------------------


@dataclass(frozen=True)
class PromptRun:
    """One prompt of one system: its output (cut by ``clip``), wall seconds of the whole request, and the verification
    forwards after the prefill with the tokens they emitted (for tau; both raw, before the cut)."""

    tokens: tuple[int, ...]
    seconds: float
    cycles: int
    cycle_tokens: int

    @classmethod
    def from_dict(cls, d: dict) -> "PromptRun":
        return cls(tuple(d["tokens"]), d["seconds"], d["cycles"], d["cycle_tokens"])


@dataclass(frozen=True)
class Run:
    """One row: a system in one precision, measured in pass ``group``. ``status`` "ok", "not run" or "failed" (then
    ``reason`` says why)."""

    name: str
    status: str = "ok"
    reason: str = ""
    prompts: tuple[PromptRun, ...] = ()
    info: dict = field(default_factory=dict)
    group: str = ""

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


def own_greedy(name: str) -> str | None:
    """The greedy row a speculative row must reproduce, same library family and precision: ``ours spec D`` -> ``ours
    greedy D``; ``hf pldK D`` and ``eagle D`` -> ``hf greedy D`` (EAGLE's teacher is transformers 4.31's Llama code on
    the same weights); ``llamacpp pldK F`` -> ``llamacpp greedy F``. None for greedy rows."""
    kind, dtype = name.rsplit(" ", 1)
    if kind == "ours spec":
        return f"ours greedy {dtype}"
    if kind.startswith("hf pld") or kind == "eagle":
        return f"hf greedy {dtype}"
    if kind.startswith("llamacpp pld"):
        return f"llamacpp greedy {dtype}"
    return None


def llamacpp_row(file_label: str, pld: int) -> str:
    """``llamacpp greedy q4_1`` (pld 0) or ``llamacpp pld3 f32``: the file's label takes the place of the dtype."""
    return f"llamacpp {f'pld{pld}' if pld else 'greedy'} {file_label}"


def _round(x: float, n: int = 3):
    return None if x != x else round(x, n)  # NaN -> null in the JSON


def summarize_runs(runs: Sequence[Run]) -> dict:
    """Per row: tok/s, the ratio to transformers fp32 greedy measured in the same pass (aggregate and mean per prompt),
    tau, and how many prompts equal our fp32 greedy, transformers' fp32 greedy and the row's own greedy (with the first
    differing index per prompt). Rows that did not run carry their reason. A reference measured again in a later
    pass is listed as ``NAME (GROUP pass)``."""
    first: dict[str, Run] = {}
    speed_ref: dict[str, Run] = {}
    for r in runs:
        if r.status == "ok":
            first.setdefault(r.name, r)
            if r.name == REFERENCE_HF:
                speed_ref.setdefault(r.group, r)
    rows = {}
    for r in runs:
        key = r.name if r.name not in rows else f"{r.name} ({r.group} pass)"
        if r.status != "ok":
            rows[key] = {"status": r.status, "reason": r.reason, "group": r.group}
            continue
        ref = speed_ref.get(r.group)
        row = {"status": "ok", "group": r.group, "prompts": len(r.prompts),
               "tokens": sum(len(p.tokens) for p in r.prompts), "tok_s": _round(r.tok_s, 2),
               "ref_tok_s": _round(ref.tok_s, 2) if ref else None,
               "x_hf": _round(r.tok_s / ref.tok_s) if ref else None, "x_hf_mean": None, "tau": _round(r.tau)}
        for label, name in (("ours", REFERENCE_OURS), ("hf", REFERENCE_HF), ("own", own_greedy(r.name))):
            other = first.get(name) if name else None
            if other is None:
                continue
            if len(other.prompts) != len(r.prompts):
                raise ValueError(f"{r.name}: {len(r.prompts)} prompts, reference {name} has {len(other.prompts)}")
            diffs = [first_difference(p.tokens, q.tokens) for p, q in zip(r.prompts, other.prompts)]
            row[f"same_as_{label}_greedy"] = sum(d is None for d in diffs)
            row[f"first_diff_vs_{label}_greedy"] = diffs
        if ref:
            if len(ref.prompts) != len(r.prompts):
                raise ValueError(f"{r.name}: {len(r.prompts)} prompts, reference {ref.name} has {len(ref.prompts)}")
            ratios = [(len(p.tokens) / p.seconds) / (len(q.tokens) / q.seconds) for p, q in zip(r.prompts, ref.prompts)]
            row["x_hf_mean"] = _round(sum(ratios) / len(ratios))
        row.update(r.info)
        rows[key] = row
    return rows


def format_table(rows: dict) -> str:
    head = (f"{'system':<34} {'tok/s':>7} {'x hf fp32':>9} {'tau':>5} {'=ours fp32':>10} {'=hf fp32':>8} "
            f"{'=own greedy':>11}")
    lines = [head]
    for name, row in rows.items():
        if row["status"] != "ok":
            lines.append(f"{name:<34} {row['status'].upper()}: {row['reason']}")
            continue
        n = row["prompts"]

        def same(label):
            v = row.get(f"same_as_{label}_greedy")
            return "-" if v is None else f"{v}/{n}"

        def num(v, fmt):
            return "-" if v is None else format(v, fmt)

        lines.append(f"{name:<34} {num(row['tok_s'], '7.2f')} {num(row['x_hf'], '9.2f')} {num(row['tau'], '5.2f')} "
                     f"{same('ours'):>10} {same('hf'):>8} {same('own'):>11}")
    return "\n".join(lines)


# ----- the systems, each inside its worker process ------------------------------------------------------------------


class NotRun(EagleError):
    """The system cannot run in this checkout (the reason is the row's)."""


def _torch_dtype(name: str):
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[name]


class OursSystem:
    """Greedy and speculative through the CLI's own parser and builder (so ``--dtype`` and the drafting defaults are
    the CLI's), warmed up and compared per prompt by ``harness``: the path of ``mindspore-eagle bench``."""

    def __init__(self, req: dict):
        from mindspore_eagle.app import cli
        from mindspore_eagle.app.harness import warm_up

        dtype, self.m = req["dtype"], req["max_new_tokens"]
        self.rows = [f"ours greedy {dtype}", f"ours spec {dtype}"]
        argv = ["bench", "--max-new-tokens", str(self.m), *req.get("ours_flags", [])]
        parser = cli.build_parser()
        args = parser.parse_args([*argv, "--dtype", dtype])
        self.stack = cli._build(args)
        if set(self.stack.eos) != set(req["eos"]):
            raise RuntimeError(f"end-of-turn ids differ: the builder's {self.stack.eos} vs the request's {req['eos']}")
        warm_up(self.stack.engine, self.stack.proposer_for, req["prompt_ids"][0], self.m, self.stack.eos)
        d = self.stack.drafting
        self.ready_info = {"budget": {"max_nodes": d.max_nodes, "depth": d.depth, "top_k": d.top_k,
                                      "proposer": d.proposer.value, "budget": d.budget.value}}
        self.results = []

    def run(self, ids) -> dict[str, PromptRun]:
        from mindspore_eagle.app.harness import compare

        r = compare(self.stack.engine, ids, self.stack.proposer_for, self.m, self.stack.eos)
        self.results.append(r)

        def prompt_run(g):  # a greedy step emits one token (a one-node tree: no draft, the bonus)
            return PromptRun(tuple(g.tokens), g.total_s, len(g.steps), sum(s.emitted for s in g.steps))

        return {self.rows[0]: prompt_run(r.greedy), self.rows[1]: prompt_run(r.spec)}

    def final_info(self) -> dict:
        from mindspore_eagle.app.bench import summarize

        return {self.rows[1]: {**self.ready_info, "bench": summarize(self.results)}}


def hf_prompt_ids(tokenizer, prompt: str) -> list[int]:
    """Transformers' own chat-template ids for one user turn (what a transformers user would feed)."""
    ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                        tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def load_hf_gguf(gguf: str, dtype: str):
    """The GGUF dequantized to fp32 by transformers, then cast to ``dtype``. Not ``from_pretrained(dtype=bfloat16)``:
    transformers 5.24 then keeps a GGUF forward path that casts every matmul to fp32 and back (measured here: ~1.2 s
    per decode step instead of ~0.05 s); the cast model holds the same bf16 weights."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(os.path.dirname(gguf), gguf_file=os.path.basename(gguf),
                                                 dtype=torch.float32)
    return model.to(_torch_dtype(dtype)).eval()


class HFSystem:
    """transformers ``generate``: greedy, or prompt-lookup decoding with ``pld`` tokens; forwards counted by a hook."""

    def __init__(self, req: dict):
        import torch

        dtype, self.m, k = req["dtype"], req["max_new_tokens"], req.get("pld", 0)
        self.rows = [f"hf pld{k} {dtype}" if k else f"hf greedy {dtype}"]
        self.model = load_hf_gguf(req["gguf"], dtype)
        self.calls = 0
        self.model.register_forward_hook(self._count)
        self.extra = {"prompt_lookup_num_tokens": k} if k else {}
        self.eos = list(req["eos"])
        self.info = {"torch_threads": torch.get_num_threads(), "mindspore_imported": "mindspore" in sys.modules}
        if req.get("check_prompt_ids"):
            from transformers import AutoTokenizer

            g = req["gguf"]
            tok = AutoTokenizer.from_pretrained(os.path.dirname(g), gguf_file=os.path.basename(g))
            self.info["hf_template_ids_equal_ours"] = [hf_prompt_ids(tok, p) == ids
                                                       for p, ids in zip(req["prompts"], req["prompt_ids"])]
        self.run(req["prompt_ids"][0])  # warm-up, untimed

    def _count(self, *_):
        self.calls += 1

    def run(self, ids) -> dict[str, PromptRun]:
        import torch

        x = torch.tensor([ids])
        self.calls = 0
        t = time.perf_counter()
        with torch.inference_mode():
            out = self.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=self.m, do_sample=False,
                                      eos_token_id=self.eos, pad_token_id=self.eos[-1], **self.extra)
        secs = time.perf_counter() - t
        raw = out[0, len(ids):].tolist()
        return {self.rows[0]: PromptRun(clip(raw, self.eos, self.m), secs, self.calls - 1, len(raw) - 1)}

    def final_info(self) -> dict:
        return {self.rows[0]: self.info}


def prepare_hf_base(gguf: str, out_dir: str) -> str:
    """A HF model directory (config, one safetensors file plus the index EAGLE's embedding loader reads, tokenizer)
    written from the GGUF transformers loads, fp32; kept across runs (keyed by the GGUF's path, size and mtime)."""
    from safetensors.torch import save_file
    from transformers import AutoTokenizer

    from mindspore_eagle.storage.atomic import atomic_directory

    key = source_stamp(gguf)
    stamp = os.path.join(out_dir, "source.txt")
    if os.path.isfile(stamp) and Path(stamp).read_text() == key:
        return out_dir
    model = load_hf_gguf(gguf, "float32")
    tok = AutoTokenizer.from_pretrained(os.path.dirname(gguf), gguf_file=os.path.basename(gguf))
    tied = model.config.tie_word_embeddings
    state = {n: t.detach().contiguous() for n, t in model.state_dict().items() if not (tied and n == "lm_head.weight")}
    cfg = model.config.to_dict()
    for name in ("quantization_config", "_name_or_path", "_model_name_or_path"):
        cfg.pop(name, None)
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


class EagleSystem:
    """SafeAILab EAGLE's ``EaModel.eagenerate`` (greedy: temperature 0) from the patched copy."""

    def __init__(self, req: dict):
        import torch

        dtype, self.m, e = req["dtype"], req["max_new_tokens"], req["eagle"]
        self.rows = [f"eagle {dtype}"]
        base = prepare_hf_base(req["gguf"], e["base_dir"])
        sys.path.insert(0, e["src_dir"])
        from eagle.model.ea_model import EaModel

        b = e["budget"]
        args = {"total_token": b["max_nodes"], "depth": b["depth"] - 1, "top_k": b["top_k"]}
        self.model = EaModel.from_pretrained(use_eagle3=True, base_model_path=base, ea_model_path=e["head_dir"],
                                             threshold=1.0, dtype=_torch_dtype(dtype), **args).eval()
        check_eagle_head_loaded(self.model, e["head_dir"], base)
        self.eos = list(req["eos"])
        self.info = {"eagle_revision": e["revision"], "eagle_args": args, "torch_threads": torch.get_num_threads()}
        self.run(req["prompt_ids"][0])  # warm-up, untimed

    def run(self, ids) -> dict[str, PromptRun]:
        import torch

        x = torch.tensor([ids])
        t = time.perf_counter()
        # Each cycle commits its root and accepted drafts (``committed`` counts them; the bonus becomes the next
        # root), and the loop stops once committed > max_new_tokens: m - 1 yields at least m tokens, cut by clip.
        out, committed, idx = self.model.eagenerate(x, temperature=0.0, max_new_tokens=self.m - 1, log=True)
        secs = time.perf_counter() - t
        tokens = clip(out[0, len(ids):].tolist(), self.eos, self.m)
        return {self.rows[0]: PromptRun(tokens, secs, int(idx) + 1, int(committed))}

    def final_info(self) -> dict:
        return {self.rows[0]: self.info}


class LlamaCppSystem:
    """llama.cpp through llama-cpp-python: ``Llama.generate`` on our ids, greedy (``temp=0``, ``top_k=1``; no repeat
    penalty), or with its prompt lookup ``LlamaPromptLookupDecoding(num_pred_tokens=pld)`` as ``draft_model``;
    ``LLAMACPP_THREADS`` threads for decode and prefill. The state is reset before every request (``generate`` would
    otherwise reuse the KV of the previous prompt's common prefix, a prefill no other system skips). Runs under the
    llama.cpp venv's interpreter: imports llama_cpp (numpy through it), never MindSpore or torch."""

    def __init__(self, req: dict):
        try:
            import llama_cpp
            from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
        except ImportError as exc:
            raise NotRun(f"{sys.executable} cannot import llama_cpp ({exc}); `make bench-peers-setup` builds it") \
                from None

        class CountingLlama(llama_cpp.Llama):
            """``eval`` is one forward: the prompt, or the last committed token with the drafts after it."""

            forwards = 0

            def eval(self, tokens):
                self.forwards += 1
                return super().eval(tokens)

        self.m, k = req["max_new_tokens"], req.get("pld", 0)
        self.rows = [llamacpp_row(req["file"], k)]
        self.eos = list(req["eos"])
        # room for the longest prompt, the output and one round of drafts (llama.cpp allocates its KV in 256s)
        n_ctx = -(-(max(len(ids) for ids in req["prompt_ids"]) + self.m + k + 1) // 256) * 256
        self.llm = CountingLlama(model_path=req["gguf"], n_ctx=n_ctx, n_threads=LLAMACPP_THREADS,
                                 n_threads_batch=LLAMACPP_THREADS, verbose=False,
                                 draft_model=LlamaPromptLookupDecoding(num_pred_tokens=k) if k else None)
        self.info = {"llama_cpp_version": llama_cpp.__version__, "gguf": req["gguf"], "n_threads": LLAMACPP_THREADS,
                     "n_ctx": n_ctx, "prompt_lookup_num_tokens": k}
        self.run(req["prompt_ids"][0])  # warm-up, untimed

    def run(self, ids) -> dict[str, PromptRun]:
        self.llm.reset()
        self.llm.forwards = 0
        out: list[int] = []
        t = time.perf_counter()
        for token in self.llm.generate(ids, top_k=1, temp=0.0, repeat_penalty=1.0):
            out.append(int(token))
            if len(out) >= self.m or out[-1] in self.eos:
                break  # the generator stops here: no forward past the stop rule
        secs = time.perf_counter() - t
        return {self.rows[0]: PromptRun(clip(out, self.eos, self.m), secs, self.llm.forwards - 1, len(out) - 1)}

    def final_info(self) -> dict:
        imported = {"mindspore_imported": "mindspore" in sys.modules, "torch_imported": "torch" in sys.modules}
        return {self.rows[0]: {**self.info, **imported}}


SYSTEMS = {"ours": OursSystem, "hf": HFSystem, "eagle": EagleSystem, "llamacpp": LlamaCppSystem}


def send(msg: dict) -> None:
    sys.stdout.write(MARK + json.dumps(msg) + "\n")
    sys.stdout.flush()


def worker_main(kind: str, request: str) -> int:
    """Load and warm up one system, say ready, then answer ``run I`` (prompt I) and ``quit`` read from stdin."""
    with open(request, encoding="utf-8") as f:
        req = json.load(f)
    try:
        system = SYSTEMS[kind](req)
    except NotRun as exc:
        send({"not_run": str(exc)})
        return 0
    send({"ready": system.rows, "info": getattr(system, "ready_info", {})})
    for line in iter(sys.stdin.readline, ""):
        cmd = line.split()
        if cmd and cmd[0] == "run":
            runs = system.run(req["prompt_ids"][int(cmd[1])])
            send({"runs": {name: asdict(p) for name, p in runs.items()}})
        elif cmd and cmd[0] == "quit":
            send({"info": system.final_info()})
            return 0
    return 1


# ----- the driver ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Job:
    """One worker process: ``kind`` with request fields ``fields``, producing the rows ``names``."""

    kind: str
    names: tuple[str, ...]
    fields: dict


def plan_passes(families: Sequence[str], dtypes: Sequence[str], pld: Sequence[int],
                llamacpp_files: Sequence[str] = ("q4_1", "f32")) -> list[tuple[str, list[Job]]]:
    """One pass per precision, fp32 first; each pass starts with the speed reference (transformers fp32 greedy), then
    ours (whose tree budget configures EAGLE), transformers greedy in that precision, prompt lookup, llama.cpp (first
    pass only: its precision is the file's, one of ``llamacpp_files``; greedy, then prompt lookup), EAGLE last."""
    passes = []
    for dtype in sorted(dtypes, key=lambda d: d != "float32"):
        jobs = [Job("hf", (REFERENCE_HF,), {"dtype": "float32", "check_prompt_ids": not passes})]
        if "ours" in families:
            jobs.append(Job("ours", (f"ours greedy {dtype}", f"ours spec {dtype}"), {"dtype": dtype}))
        if "hf" in families and dtype != "float32":
            jobs.append(Job("hf", (f"hf greedy {dtype}",), {"dtype": dtype}))
        if "pld" in families:
            jobs += [Job("hf", (f"hf pld{k} {dtype}",), {"dtype": dtype, "pld": k}) for k in pld]
        if "llamacpp" in families and not passes:
            jobs += [Job("llamacpp", (llamacpp_row(f, k),), {"file": f, "pld": k}) for f in llamacpp_files
                     for k in (0, *pld)]
        if "eagle" in families:
            jobs.append(Job("eagle", (f"eagle {dtype}",), {"dtype": dtype}))
        passes.append((dtype, jobs))
    return passes


def worker_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env.update(GLOG_v="3", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    return env


def available_gib() -> float:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2 ** 20
    return float("inf")


def turn_order(workers: Sequence, i: int) -> list:
    """Who computes prompt ``i``, in order: the list rotated by ``i``, so no system always goes first (right after the
    settle pause) or last. E.g. ``turn_order("abc", 1) == ["b", "c", "a"]``."""
    k = i % len(workers) if workers else 0
    return list(workers[k:]) + list(workers[:k])


class Worker:
    """One started worker process and what it has answered; ``status`` turns "failed" on a crash or timeout. ``cmd``
    replaces this script's ``--worker`` command (tests drive the protocol with a stand-in)."""

    def __init__(self, job: Job, req: dict, work_dir: str, timeout_s: float, tag: str,
                 cmd: Sequence[str] | None = None):
        self.job, self.timeout_s = job, timeout_s
        self.status, self.reason, self.ready_info, self.row_info = "ok", "", {}, {}
        self.prompts: dict[str, dict[int, PromptRun]] = {n: {} for n in job.names}
        self.log_path = os.path.join(work_dir, f"{tag}.log")
        req_path = os.path.join(work_dir, f"{tag}.request.json")
        with open(req_path, "w", encoding="utf-8") as f:
            json.dump(req, f)
        self.log = open(self.log_path, "w", encoding="utf-8")
        cmd = [*(cmd or [sys.executable, str(Path(__file__).resolve()), "--worker", job.kind]), "--request", req_path]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log,
                                     env=worker_env(), cwd=work_dir, bufsize=0)
        self.buffer = b""
        ready = self.read()
        if ready is not None and "not_run" in ready:
            self.status, self.reason = "not run", ready["not_run"]
        elif ready is not None:
            if tuple(ready["ready"]) != job.names:
                self.fail(f"worker rows {ready['ready']} differ from the plan's {list(job.names)}")
            self.ready_info = ready.get("info", {})

    def read(self) -> dict | None:
        """The next protocol message; other stdout lines go to the log. None (and the worker failed) on exit/timeout."""
        deadline = time.monotonic() + self.timeout_s
        fd = self.proc.stdout.fileno()
        while True:
            while b"\n" in self.buffer:
                line, self.buffer = self.buffer.split(b"\n", 1)
                text = line.decode("utf-8", errors="replace")
                if text.startswith(MARK):
                    return json.loads(text[len(MARK):])
                self.log.write(text + "\n")
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                self.fail(f"no answer within {self.timeout_s:.0f} s")
                return None
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                self.proc.wait()
                self.fail(f"worker exited with code {self.proc.returncode}")
                return None
            self.buffer += chunk

    def ask(self, command: str) -> dict | None:
        try:
            self.proc.stdin.write((command + "\n").encode())
            self.proc.stdin.flush()
        except BrokenPipeError:
            self.proc.wait()
            self.fail(f"worker exited with code {self.proc.returncode}")
            return None
        return self.read()

    def fail(self, why: str) -> None:
        if self.proc.poll() is None:
            self.proc.kill()  # the process this Worker started, by its handle
            self.proc.wait()
        self.log.flush()
        with open(self.log_path, encoding="utf-8", errors="replace") as f:
            tail = [ln.strip() for ln in f.read().splitlines() if ln.strip()][-3:]
        self.status, self.reason = "failed", f"{why}: {' | '.join(tail)[-400:]} (log: {self.log_path})"

    def close(self) -> None:
        if self.status == "ok":
            msg = self.ask("quit")
            if msg is not None:
                self.row_info = msg.get("info", {})
        if self.proc.poll() is None:
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()  # the process this Worker started, by its handle
                self.proc.wait()
        self.log.close()

    def runs(self, group: str, n_prompts: int) -> list[Run]:
        out = []
        for name in self.job.names:
            got = self.prompts[name]
            if self.status != "ok" or len(got) != n_prompts:
                reason = self.reason or f"answered {len(got)} of {n_prompts} prompts"
                out.append(Run(name, self.status if self.status != "ok" else "failed", reason, group=group))
                continue
            out.append(Run(name, prompts=tuple(got[i] for i in range(n_prompts)), info=self.row_info.get(name, {}),
                           group=group))
        return out


def run_pass(group: str, jobs: Sequence[Job], base_req: dict, args, work_dir: str, extra: dict) -> list[Run]:
    """Start the pass's workers one at a time, then give each prompt to every worker in turn (see the docstring)."""
    n = len(base_req["prompt_ids"])
    workers: list[Worker] = []
    skipped: list[Run] = []
    for job in jobs:
        fields, cmd = dict(job.fields), None
        if job.kind in ("eagle", "llamacpp") and extra.get(job.kind) is None:
            skipped += [Run(name, "not run", extra[f"{job.kind}_reason"], group=group) for name in job.names]
            continue
        if job.kind == "eagle":
            fields["eagle"] = extra["eagle"]
        if job.kind == "llamacpp":  # its own interpreter, on the file the row names
            fields["gguf"] = extra["llamacpp"]["files"][job.fields["file"]]
            cmd = [extra["llamacpp"]["python"], str(Path(__file__).resolve()), "--worker", job.kind]
        free = available_gib()
        if free < MIN_FREE_GIB:
            skipped += [Run(name, "not run", f"only {free:.1f} GiB of memory available when it was to start",
                            group=group) for name in job.names]
            continue
        t = time.perf_counter()
        tag = f"{group}-{job.names[-1].replace(' ', '_')}"
        w = Worker(job, {**base_req, **fields}, work_dir, args.worker_timeout, tag, cmd=cmd)
        print(f"[{group} pass: {', '.join(job.names)} {w.status} after {time.perf_counter() - t:.0f} s]",
              file=sys.stderr)
        workers.append(w)
        if job.kind == "ours" and w.status == "ok" and extra.get("budget") is None:
            extra["budget"] = w.ready_info["budget"]
            extra.update(eagle_fields(args, work_dir, extra["budget"]))
    for rep in range(args.repeats):
        for i in range(n):
            for w in turn_order([w for w in workers if w.status == "ok"], i):
                time.sleep(args.settle)
                msg = w.ask(f"run {i}")
                if msg is None:
                    continue
                for name, d in msg["runs"].items():
                    p, old = PromptRun.from_dict(d), w.prompts[name].get(i)
                    if old is not None and old.tokens != p.tokens:
                        w.fail(f"{name}: prompt {i} gave other tokens on repeat {rep}")
                    elif old is None or p.seconds < old.seconds:
                        w.prompts[name][i] = p  # the fastest of the repeats
        print(f"[{group} pass: round {rep + 1}/{args.repeats} done, load average {os.getloadavg()[0]:.1f}]",
              file=sys.stderr)
    runs = []
    for w in workers:
        w.close()
        runs += w.runs(group, n)
    return runs + skipped


def eagle_fields(args, work_dir: str, budget: dict | None) -> dict:
    """``{"eagle": request part of the EAGLE rows}``, or ``{"eagle": None, "eagle_reason": why they cannot run}``."""
    from mindspore_eagle.draft import default_head_dir

    if not args.eagle_src:
        return {"eagle": None, "eagle_reason": "no --eagle-src given (a checkout or bare git directory of "
                                               "github.com/SafeAILab/EAGLE)"}
    try:
        src_dir, rev = prepare_eagle_source(args.eagle_src, work_dir)
    except PatchError as exc:
        return {"eagle": None, "eagle_reason": str(exc)}
    head_dir = os.path.join(work_dir, "eagle-head")
    prepare_head_copy(default_head_dir(), head_dir)
    return {"eagle": {"src_dir": src_dir, "revision": rev, "head_dir": head_dir, "budget": budget,
                      "base_dir": os.path.join(work_dir, "hf-base")}}


def llamacpp_fields(python: str | None, gguf: str, work_dir: str) -> dict:
    """``{"llamacpp": {"python": interpreter, "files": {label: GGUF path}}}``: ``gguf`` under its ``gguf_label`` and,
    unless it is one already, the f32 GGUF of it (``prepare_f32_gguf``); or ``{"llamacpp": None, "llamacpp_reason":
    why the llama.cpp rows cannot run}``. ``python`` None: the venv ``make bench-peers-setup`` builds, if it exists."""
    if python is None:
        if not LLAMACPP_PYTHON.is_file():
            why = f"no {LLAMACPP_PYTHON}: `make bench-peers-setup` builds that venv, or pass --llamacpp-python"
            return {"llamacpp": None, "llamacpp_reason": why}
        python = str(LLAMACPP_PYTHON)  # not resolved: a venv's python is a symlink that finds the venv by its own path
    if not (os.path.isfile(python) and os.access(python, os.X_OK)):
        return {"llamacpp": None, "llamacpp_reason": f"--llamacpp-python {python}: not an executable file"}
    files = {gguf_label(gguf): gguf}
    if "f32" not in files:
        files["f32"] = prepare_f32_gguf(gguf, os.path.join(work_dir, "gguf-f32"))
    return {"llamacpp": {"python": python, "files": files}}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=8, help="N first turns spread over the evaluation set")
    ap.add_argument("--prompts-file", help="JSONL of {\"prompt\": ...} lines instead (e.g. prompts the repo does not "
                    "contain, to check a target is not tuned to the evaluation set); --prompts is then ignored")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--pld", default="3,5,10", help="prompt_lookup_num_tokens values")
    ap.add_argument("--eagle-src", default=None, help="checkout or bare git dir of SafeAILab/EAGLE")
    ap.add_argument("--llamacpp-python", default=None,
                    help=f"python with llama-cpp-python (default: {LLAMACPP_PYTHON.relative_to(ROOT)} if it exists)")
    ap.add_argument("--ours-flags", default="", help="extra `mindspore-eagle bench` flags, e.g. '--max-nodes 16'")
    ap.add_argument("--repeats", type=int, default=1, help="rounds over the prompts; the fastest of each is kept")
    ap.add_argument("--settle", type=float, default=0.5, help="seconds between two workers' turns")
    ap.add_argument("--work-dir", default=None, help="default: $MINDSPORE_EAGLE_HOME/peers")
    ap.add_argument("--worker-timeout", type=float, default=1800, help="seconds a worker may take to answer")
    ap.add_argument("--worker", choices=sorted(SYSTEMS), help=argparse.SUPPRESS)
    ap.add_argument("--request", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return args
    args.dtypes = [d for d in args.dtypes.split(",") if d]
    args.families = [f for f in args.families.split(",") if f]
    args.pld = [int(k) for k in args.pld.split(",") if k]
    bad = ([d for d in args.dtypes if d not in ("float32", "bfloat16")]
           + [f for f in args.families if f not in FAMILIES])
    if bad or args.prompts < 1 or args.max_new_tokens < 2 or args.repeats < 1 or any(k < 1 for k in args.pld):
        ap.error(f"bad values {bad}; need --prompts >= 1, --max-new-tokens >= 2, --repeats >= 1, --pld values >= 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker:
        return worker_main(args.worker, args.request)
    from mindspore_eagle.storage.assets import default_gguf_path, home, require_default_model
    from mindspore_eagle.app.bench import load_prompts
    from mindspore_eagle.teacher_config import TeacherConfig
    from mindspore_eagle.tokenizer import load_tokenizer

    work_dir = os.path.abspath(args.work_dir or os.path.join(home(), "peers"))
    os.makedirs(work_dir, exist_ok=True)
    model_dir = require_default_model()
    tok = load_tokenizer(model_dir)
    prompt_spec = args.prompts_file or f"evalset:{args.prompts}"
    prompts = load_prompts(prompt_spec)
    eos = list(dict.fromkeys([*TeacherConfig.load(model_dir).eos_token_ids, *tok.eos_token_ids]))
    base_req = {"prompts": prompts, "prompt_ids": [tok.encode_chat([{"role": "user", "content": p}]) for p in prompts],
                "eos": eos, "max_new_tokens": args.max_new_tokens, "gguf": default_gguf_path(),
                "ours_flags": args.ours_flags.split()}
    load_before, t0 = os.getloadavg(), time.perf_counter()
    extra = {"budget": None, "eagle": None,
             "eagle_reason": "our speculative row did not run, so there is no tree budget to give EAGLE"}
    llamacpp_files = tuple(dict.fromkeys((gguf_label(base_req["gguf"]), "f32")))  # the keys llamacpp_fields gives
    if "llamacpp" in args.families:
        extra.update(llamacpp_fields(args.llamacpp_python, base_req["gguf"], work_dir))
    runs: list[Run] = []
    for group, jobs in plan_passes(args.families, args.dtypes, args.pld, llamacpp_files):
        runs += run_pass(group, jobs, base_req, args, work_dir, extra)
    rows = summarize_runs(runs)
    print(format_table(rows))
    hf_ids = rows.get(REFERENCE_HF, {}).get("hf_template_ids_equal_ours")
    summary = {
        "prompts": prompt_spec, "max_new_tokens": args.max_new_tokens, "repeats": args.repeats,
        "input_ids": "ours (encode_chat)",
        "hf_template_ids_equal_ours": None if hf_ids is None else f"{sum(hf_ids)}/{len(hf_ids)}",
        "speed_reference": f"{REFERENCE_HF}, measured in every pass",
        "llamacpp": extra.get("llamacpp") or extra.get("llamacpp_reason"),
        "machine": {"cpus": os.cpu_count(), "load_avg_before": round(load_before[0], 2),
                    "load_avg_after": round(os.getloadavg()[0], 2)},
        "wall_s": round(time.perf_counter() - t0, 1), "systems": rows,
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Ascend deployment: the checks and settings that turn a runtime into a fused-attention graph deployment.

What ``--device Ascend`` means here (``attention`` holds the op's contract):

* **device** -- an Ascend NPU must be present and loadable by MindSpore. ``probe_ascend`` looks before
  MindSpore is asked (``/dev/davinci*`` nodes, the CANN toolkit, ``mindspore.hal.is_available("Ascend")``) and
  ``require_ascend`` raises one ``ConfigError`` naming the device and what was found -- never a crash deep in
  MindSpore's device loader.
* **graph mode only** -- ``exec_mode="performance"`` (the Teacher compiles with ``ms.jit``); the fused core is
  chosen only there (``compute.choose``). PyNative "reference" stays the CPU check path.
* **static shapes within the op's limits** -- every speculative round (tree verification, draft growth
  level) sends at most ``max_query_tokens`` query tokens (default 16, the limit vllm-ascend documents for the
  fused infer attention op in decode), so the bound on a step's tree (``DraftingConfig.max_nodes``), its
  bucket and the head's growth width (``top_k``) must fit; the head sizes must fit the op (D 16-aligned, <= 512;
  H <= 256; H / Hkv <= 64). Prefill chunks go through the op's full-inference branch and are not limited.
* **compile cache** (opt-in, ``compile_cache_path``) -- ``MS_COMPILER_CACHE_ENABLE=1`` and
  ``MS_COMPILER_CACHE_PATH`` persist compiled graphs across processes, one subdirectory per rank (one graph
  per bucket; clear the directory when model code changes).

``prepare`` does all of it and returns the ``compute.ComputeChoice`` (``compute.choose``: attention fused on Ascend,
primitives on CPU; the matmul) that ``mindspore_eagle.app.build`` passes to the teacher and the draft head.
``python -m mindspore_eagle.deploy check ...`` validates a plan (and, with ``--probe``, this machine).
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
from dataclasses import dataclass

from . import attention, compute
from .runtime import Buckets, RuntimeConfig
from .teacher_config import TeacherConfig
from .drafting import add_drafting_flags, drafting_from_args
from .errors import ConfigError, EagleError

DEFAULT_MAX_QUERY_TOKENS = 16
CANN_DIRS = ("/usr/local/Ascend/ascend-toolkit", "/usr/local/Ascend/cann", "/usr/local/Ascend")


def default_compile_cache() -> str:
    from .storage.assets import home

    return os.path.join(home(), "compile_cache")


@dataclass(frozen=True)
class AscendDeployment:
    """Deployment knobs for ``device="Ascend"``.

    ``max_query_tokens``    query tokens one speculative round may send to the fused op (tree bucket, top_k).
    ``compute_dtype``       the fused op's q/k/v dtype and the KV cache dtype: "float16" or "bfloat16".
    ``compile_cache_path``  directory for MindSpore's compile cache ("" = off, the default: a cache that outlives a
                            change of model code serves stale graphs; ``default_compile_cache()`` is a good place).
    ``device_id``           NPU index (None: MindSpore's default, or DEVICE_ID set by msrun).
    """

    max_query_tokens: int = DEFAULT_MAX_QUERY_TOKENS
    compute_dtype: str = "float16"
    compile_cache_path: str = ""
    device_id: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.max_query_tokens, bool) or not isinstance(self.max_query_tokens, int) \
                or self.max_query_tokens < 1:
            raise ConfigError(f"AscendDeployment.max_query_tokens={self.max_query_tokens!r}: must be an integer >= 1")
        if self.compute_dtype not in attention.COMPUTE_DTYPES:
            raise ConfigError(f"AscendDeployment.compute_dtype={self.compute_dtype!r}: expected one of "
                              f"{sorted(attention.COMPUTE_DTYPES)}")
        if self.device_id is not None and (not isinstance(self.device_id, int) or self.device_id < 0):
            raise ConfigError(f"AscendDeployment.device_id={self.device_id!r}: must be an integer >= 0")

# ----- the device ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AscendProbe:
    """What this machine offers for Ascend, found without initialising any device."""

    device_nodes: tuple[str, ...]  # /dev/davinci0 ... (not /dev/davinci_manager)
    cann_home: str | None  # ASCEND_HOME_PATH or the first CANN directory that exists
    mindspore_version: str
    mindspore_ascend: bool  # mindspore.hal.is_available("Ascend")

    @property
    def usable(self) -> bool:
        return bool(self.device_nodes) and self.mindspore_ascend

    def describe(self) -> str:
        nodes = ", ".join(self.device_nodes) if self.device_nodes else "none"
        cann = self.cann_home or f"not found (ASCEND_HOME_PATH unset; none of {', '.join(CANN_DIRS)} exists)"
        backend = ("loadable" if self.mindspore_ascend
                   else "not loadable (mindspore.hal.is_available('Ascend') is False)")
        return (f"NPU device nodes /dev/davinci*: {nodes}; CANN toolkit: {cann}; "
                f"MindSpore {self.mindspore_version} Ascend backend: {backend}")


def probe_ascend() -> AscendProbe:
    import mindspore as ms

    nodes = tuple(sorted(p for p in glob.glob("/dev/davinci*") if p[len("/dev/davinci"):].isdigit()))
    env_home = os.environ.get("ASCEND_HOME_PATH")
    cann = env_home if env_home and os.path.isdir(env_home) else next((d for d in CANN_DIRS if os.path.isdir(d)), None)
    try:
        available = bool(ms.hal.is_available("Ascend"))
    except Exception:  # an old MindSpore without hal, or a broken plugin: either way not usable
        available = False
    return AscendProbe(nodes, cann, ms.__version__, available)


def require_ascend(probe: AscendProbe | None = None) -> AscendProbe:
    """The probe, or ConfigError naming the device and everything that was (not) found."""
    probe = probe or probe_ascend()
    if not probe.usable:
        raise ConfigError(f"device 'Ascend' requested, but this machine has no usable Ascend NPU: "
                          f"{probe.describe()}. Use --device CPU here, or run on an Ascend host with CANN and "
                          "the Ascend build of MindSpore")
    return probe


# ----- the plan ------------------------------------------------------------------------------------------


def check_model(cfg, what: str) -> None:
    """ConfigError unless the attention shapes of ``cfg`` (teacher or draft config) fit the fused op."""
    h, hkv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    if d % 16 or d > 512:
        raise ConfigError(f"{what}.head_dim={d}: the fused attention op needs a head_dim that is a multiple of 16 "
                          "and at most 512 (float16/bfloat16, more than one query token)")
    if h > 256:
        raise ConfigError(f"{what}.num_heads={h}: the fused attention op supports at most 256 heads")
    if h // hkv > 64:
        raise ConfigError(f"{what}: num_heads / num_kv_heads = {h // hkv}; the fused attention op supports a "
                          "query group of at most 64")


def check_plan(runtime: RuntimeConfig, drafting=None, teacher_cfg: TeacherConfig | None = None,
               deployment: AscendDeployment = AscendDeployment(), draft_cfg=None) -> None:
    """Validate an Ascend plan without touching any device (CPU runtimes need nothing and pass). ``drafting``: the
    ``DraftingConfig`` (None: teacher only)."""
    if runtime.device != "Ascend":
        return
    if runtime.reference:
        raise ConfigError(f"RuntimeConfig.exec_mode={runtime.exec_mode.value!r} on device 'Ascend': the deployment is "
                          "graph mode only (exec_mode='performance'); PyNative reference mode is the CPU check path")
    limit = deployment.max_query_tokens
    if drafting is not None:
        nodes = drafting.largest_tree
        if nodes > limit:
            raise ConfigError(f"--max-nodes {nodes} (the nodes one step verifies) exceeds max_query_tokens={limit}, "
                              f"the query tokens one fused attention round may take; use --max-nodes <= {limit}")
        bucket = runtime.check_tree_size(nodes, "--max-nodes")
        if bucket > limit:
            raise ConfigError(f"tree bucket {bucket} (the smallest of RuntimeConfig.buckets={runtime.buckets.sizes} "
                              f"holding --max-nodes {nodes}) exceeds max_query_tokens={limit} of the fused attention "
                              f"op; add a bucket between {nodes} and {limit}")
        if drafting.uses_head and drafting.top_k > limit:
            raise ConfigError(f"--top-k {drafting.top_k}: each draft growth level sends top_k query tokens, more "
                              f"than max_query_tokens={limit}")
    if teacher_cfg is not None:
        check_model(teacher_cfg, "TeacherConfig")
    if draft_cfg is not None:
        check_model(draft_cfg, "DraftConfig")


def enable_compile_cache(path: str) -> str:
    """Persist compiled graphs under ``path`` (MindSpore reads these variables when it compiles).

    Each rank gets its own subdirectory ``rank_{RANK_ID}``: two processes writing one cache directory at once
    (msrun workers, which never call ``communication.init()``, all count as rank 0) corrupt it -- measured here
    (MindSpore 2.10, CPU): the next run that read it failed with "Parameter[2] has no default param" in the
    KV-cache commit graph. Idempotent for a path it already returned.
    """
    rank = os.environ.get("RANK_ID")
    if rank is not None and rank.isdigit() and os.path.basename(os.path.normpath(path)) != f"rank_{rank}":
        path = os.path.join(path, f"rank_{rank}")
    os.makedirs(path, exist_ok=True)
    os.environ["MS_COMPILER_CACHE_ENABLE"] = "1"
    os.environ["MS_COMPILER_CACHE_PATH"] = path
    return path


def prepare(runtime: RuntimeConfig, drafting=None, teacher_cfg: TeacherConfig | None = None,
            deployment: AscendDeployment | None = None, draft_cfg=None) -> compute.ComputeChoice:
    """Validate, set the device and compile cache, and return the ``ComputeChoice`` the Cells must be built with
    (``compute.choose``). The plan is checked before the device is looked for: a plan the op cannot run is wrong on
    any machine."""
    if runtime.device != "Ascend":
        return compute.choose(runtime)
    deployment = deployment or AscendDeployment()
    check_plan(runtime, drafting, teacher_cfg, deployment, draft_cfg)
    require_ascend()
    if deployment.compile_cache_path:
        enable_compile_cache(deployment.compile_cache_path)
    import mindspore as ms

    device_id = deployment.device_id
    if device_id is None and os.environ.get("DEVICE_ID", "").isdigit():
        device_id = int(os.environ["DEVICE_ID"])
    try:
        if device_id is None:
            ms.set_device("Ascend")
        else:
            ms.set_device("Ascend", device_id)
    except Exception as exc:
        raise ConfigError(f"device 'Ascend' (device_id={device_id}) could not be selected: {type(exc).__name__}: "
                          f"{str(exc).strip().splitlines()[0] if str(exc).strip() else ''}") from None
    return compute.choose(runtime, deployment)


# ----- command line ---------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mindspore_eagle.deploy",
                                description="Validate an Ascend deployment plan (buckets, tree budget, model shapes).")
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("check", help="validate a plan; --probe also checks this machine for an NPU")
    c.add_argument("--model", default=None, help="converted model directory (checks head sizes)")
    c.add_argument("--buckets", default="1,8,16,64", help="comma-separated token buckets (default 1,8,16,64)")
    c.add_argument("--prefill-chunk", type=int, default=64)
    c.add_argument("--max-cache-len", type=int, default=1024)
    add_drafting_flags(c)
    c.add_argument("--max-query-tokens", type=int, default=DEFAULT_MAX_QUERY_TOKENS)
    c.add_argument("--probe", action="store_true", help="also require a usable Ascend NPU on this machine")
    args = p.parse_args(argv)
    try:
        runtime = RuntimeConfig(max_cache_len=args.max_cache_len, device="Ascend", buckets=Buckets.parse(args.buckets),
                                prefill_chunk=args.prefill_chunk)
        drafting = drafting_from_args(args)
        cfg = TeacherConfig.load(args.model) if args.model else None
        check_plan(runtime, drafting, cfg, AscendDeployment(max_query_tokens=args.max_query_tokens))
        print(f"plan ok: buckets {runtime.buckets.sizes}, tree bucket {drafting.check_fits(runtime)}, "
              f"top_k {drafting.top_k} <= max_query_tokens {args.max_query_tokens}")
        if args.probe:
            print(f"Ascend ok: {require_ascend().describe()}")
    except (EagleError, ValueError) as exc:
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    return 0


__all__ = ["AscendDeployment", "AscendProbe", "DEFAULT_MAX_QUERY_TOKENS", "check_model", "check_plan",
           "default_compile_cache", "enable_compile_cache", "prepare", "probe_ascend", "require_ascend"]

if __name__ == "__main__":
    sys.exit(main())

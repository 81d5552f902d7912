"""MindFormers adapter: our teacher + EAGLE-3 draft as a MindFormers model, so its YAML configs, ``AutoModel``
and ``pipeline("text_generation")`` generate with lossless speculative decoding.

MindFormers (1.9.0, the release installable next to MindSpore 2.9) contributes the registry, the YAML layout and
the pipeline; the model itself stays ours -- MindFormers has no Pangu, EAGLE or tree code, and its own Llama
inference path needs Ascend-only kernels once the KV cache is on. Registered names:

    MindFormerModuleType.CONFIG  EagleSpeculativeConfig     (model.model_config.type in a YAML)
    MindFormerModuleType.MODELS  EagleSpeculativeForCausalLM (model.arch.type in a YAML)
    AutoConfig "eagle_speculative" -> EagleSpeculativeConfig; AutoModelForCausalLM: config -> model

Three ways in (``configs/mindformers/predict_eagle_speculative.yaml`` is the YAML example)::

    model = AutoModelForCausalLM.from_config("configs/mindformers/predict_eagle_speculative.yaml")
    model = build_network(MindFormerConfig(yaml).model)                  # what from_config does
    model = AutoModelForCausalLM.from_config(EagleSpeculativeConfig(teacher_dir=..., draft_dir=...))
    pipe = pipeline("text_generation", model=model, tokenizer=load_tokenizer(model.teacher_dir))
    pipe("Why is the sky blue?", max_new_tokens=64)  # [{'text_generation_text': [prompt + answer]}]

``generate`` is the hook MindFormers' TextGenerationPipeline calls. It runs ``SpeculativeEngine`` once per
prompt (batch size 1 inside; a padded batch is split and its padding -- ``pad_token_id`` of the generation
config, by default the teacher's EOS like ``load_tokenizer``'s pad token -- dropped from both ends) and returns
what MindFormers' own ``generate`` returns: ``GenerateOutput(sequences=[prompt + new tokens, ...])`` (int32
arrays), or the bare list without ``return_dict_in_generate``. ``do_sample=False`` (the default) is greedy:
token-for-token equal to ``mindspore_eagle``'s teacher-only greedy decoding. ``do_sample=True`` maps
temperature/top_p/top_k onto the engine's lossless speculative sampling. Weights come from ``teacher_dir`` /
``draft_dir``, not from MindFormers' ``checkpoint_name_or_path`` (leave it empty). ``last_generations`` keeps
the engine's ``Generation`` records (tau, timings) of the last call.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

try:
    from mindformers.generation.utils import GenerateOutput
    from mindformers.models.auto import AutoConfig, AutoModelForCausalLM
    from mindformers.models.configuration_utils import PretrainedConfig
    from mindformers.models.modeling_utils import PreTrainedModel
    from mindformers.tools.register import MindFormerModuleType, MindFormerRegister
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("mindspore_eagle.integrations.mindformers_adapter needs MindFormers (pip install "
                      "mindspore==2.9.0 mindformers==1.9.0, or `make test-mindformers`): " + str(exc)) from exc

from ..runtime import Buckets, RuntimeConfig
from ..drafting import DraftingConfig
from ..errors import ConfigError
from ..verify import SamplingParams

MODEL_TYPE = "eagle_speculative"
_DRAFTING = DraftingConfig()  # the product's drafting defaults, one per YAML key


@MindFormerRegister.register(MindFormerModuleType.CONFIG)
class EagleSpeculativeConfig(PretrainedConfig):
    """What to load and how to run it (every field is also a YAML key under ``model.model_config``).

    ``teacher_dir``   converted teacher directory (``mindspore-eagle convert``); "default" = the installed SmolLM2.
    ``draft_dir``     EAGLE-3 head directory (converted or public layout); None = the shipped default head.
    ``speculative``   False: teacher-only greedy/sampling through the same loop (the baseline).
    ``max_cache_len, buckets, prefill_chunk, exec_mode, device``   ``RuntimeConfig``.
    ``proposer, budget, suffix_calibration, max_nodes, depth, top_k``   ``DraftingConfig`` (with ``draft_dir`` as
                      its head; the product's defaults).
    ``max_query_tokens, compute_dtype, compile_cache_path``   Ascend only (``deploy.AscendDeployment``).
    """

    model_type = MODEL_TYPE

    def __init__(self, teacher_dir: str = "default", draft_dir: str | None = None, speculative: bool = True,
                 max_cache_len: int = 1024, buckets: Sequence[int] = Buckets().sizes, prefill_chunk: int = 64,
                 exec_mode: str = "performance", device: str = "CPU", proposer: str = _DRAFTING.proposer.value,
                 budget: str = _DRAFTING.budget.value, suffix_calibration: str = _DRAFTING.suffix_calibration.value,
                 max_nodes: int = _DRAFTING.max_nodes, depth: int = _DRAFTING.depth, top_k: int = _DRAFTING.top_k,
                 max_query_tokens: int = 16, compute_dtype: str = "float16", compile_cache_path: str = "",
                 **kwargs: Any):
        self.teacher_dir = teacher_dir
        self.draft_dir = draft_dir
        self.speculative = bool(speculative)
        self.max_cache_len = max_cache_len
        self.buckets = [int(b) for b in buckets]
        self.prefill_chunk = prefill_chunk
        self.exec_mode = exec_mode
        self.device = device
        self.proposer, self.budget, self.suffix_calibration = proposer, budget, suffix_calibration
        self.max_nodes, self.depth, self.top_k = max_nodes, depth, top_k
        self.max_query_tokens = max_query_tokens
        self.compute_dtype = compute_dtype
        self.compile_cache_path = compile_cache_path
        super().__init__(**kwargs)

    def runtime(self) -> RuntimeConfig:
        return RuntimeConfig(max_cache_len=self.max_cache_len, exec_mode=self.exec_mode, device=self.device,
                             buckets=tuple(self.buckets), prefill_chunk=self.prefill_chunk)

    def drafting(self) -> DraftingConfig | None:
        """The ``DraftingConfig`` of these keys (validated: a ConfigError names the key); None: teacher only."""
        if not self.speculative:
            return None
        return DraftingConfig(proposer=self.proposer, budget=self.budget, suffix_calibration=self.suffix_calibration,
                              max_nodes=self.max_nodes, depth=self.depth, top_k=self.top_k, head=self.draft_dir)


@MindFormerRegister.register(MindFormerModuleType.MODELS)
class EagleSpeculativeForCausalLM(PreTrainedModel):
    """A MindFormers ``PreTrainedModel`` whose ``generate`` is our speculative engine (see the module docstring)."""

    config_class = EagleSpeculativeConfig
    base_model_prefix = MODEL_TYPE

    def __init__(self, config: EagleSpeculativeConfig, *inputs: Any, **kwargs: Any):
        super().__init__(config, *inputs, **kwargs)
        from ..storage.assets import require_default_model
        from ..app.build import build
        from ..deploy import AscendDeployment

        teacher_dir = require_default_model() if config.teacher_dir in (None, "", "default") else config.teacher_dir
        if not os.path.isdir(teacher_dir):
            raise ConfigError(f"EagleSpeculativeConfig.teacher_dir={teacher_dir!r}: no such directory")
        deployment = AscendDeployment(max_query_tokens=config.max_query_tokens, compute_dtype=config.compute_dtype,
                                      compile_cache_path=config.compile_cache_path or "")
        self.teacher_dir = teacher_dir
        stack = build(teacher_dir, config.runtime(), config.drafting(), deployment=deployment, tokenizer=False)
        self.engine = stack.engine
        # one proposer for every request (begin() resets it); None: teacher only
        self.proposer = stack.proposer_for(None) if stack.proposer_for is not None else None
        cfg = self.engine.teacher.cfg
        if self.generation_config is not None and cfg.eos_token_ids:
            if self.generation_config.eos_token_id is None:
                self.generation_config.eos_token_id = list(cfg.eos_token_ids)
            if self.generation_config.pad_token_id is None:  # load_tokenizer pads with EOS too
                self.generation_config.pad_token_id = cfg.eos_token_ids[0]
        self.last_generations: list = []

    def construct(self, input_ids, positions, mask, cache_rows):
        """One teacher forward (logits, aux hidden); generation goes through ``generate``. The teacher Cell is
        held by the engine, not registered as a sub-cell, so its parameter names stay those of its checkpoint."""
        return self.engine.teacher.cell(input_ids, positions, mask, cache_rows)

    def prepare_inputs_for_generation(self, input_ids, **kwargs):
        return {"input_ids": input_ids}

    def generate(self, input_ids, generation_config=None, logits_processor=None, streamer=None, seed=None,
                 **kwargs):
        """MindFormers' ``generate`` contract: prompts in, ``prompt + new tokens`` out (see the module docstring)."""
        if logits_processor:
            raise ConfigError("EagleSpeculativeForCausalLM.generate: logits processors would change the teacher's "
                              "distribution; speculative decoding here is lossless only without them")
        gen = self._generation_settings(generation_config, kwargs, seed)
        prompts = _as_prompts(input_ids, gen.pad_token_id)
        outputs, self.last_generations = [], []
        for prompt in prompts:
            budget = gen.max_new_tokens if gen.max_new_tokens is not None else gen.max_length - len(prompt)
            if budget < 1:
                raise ConfigError(f"generate: max_length={gen.max_length} leaves no room after a "
                                  f"{len(prompt)}-token prompt; pass max_new_tokens")
            result = self.engine.generate(prompt, budget, gen.eos, gen.sampling, proposer=self.proposer,
                                          on_token=streamer.put if streamer is not None else None)
            self.last_generations.append(result)
            outputs.append(np.asarray(list(prompt) + list(result.tokens), np.int32))
        if streamer is not None:
            streamer.end()
        if gen.return_dict:
            return GenerateOutput(sequences=outputs)
        return outputs

    def _generation_settings(self, generation_config, kwargs: dict, seed: int | None) -> "_Settings":
        """Merge the model's GenerationConfig, an explicit one, and keyword overrides (MindFormers' precedence)."""
        base = generation_config if generation_config is not None else self.generation_config
        values = base.to_dict() if base is not None else {}
        values.update({k: v for k, v in kwargs.items() if v is not None})
        if int(values.get("num_beams", 1) or 1) != 1:
            raise ConfigError("generate: num_beams > 1 is not supported (speculative decoding follows one sequence)")
        eos = values.get("eos_token_id")
        eos = tuple(int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])) if eos is not None else ()
        if values.get("do_sample"):
            sampling = SamplingParams(float(values.get("temperature") or 1.0), float(values.get("top_p") or 1.0),
                                      int(values.get("top_k") or 0), int(seed or 0))
        else:
            sampling = SamplingParams()
        max_new = values.get("max_new_tokens")
        return _Settings(eos, sampling, values.get("pad_token_id"), int(max_new) if max_new is not None else None,
                         int(values.get("max_length") or 20), bool(values.get("return_dict_in_generate", False)))


@dataclass(frozen=True)
class _Settings:
    """One ``generate`` call's settings, merged from MindFormers' GenerationConfig and keyword overrides."""

    eos: tuple[int, ...]
    sampling: SamplingParams
    pad_token_id: int | None
    max_new_tokens: int | None
    max_length: int  # prompt + new tokens, used when max_new_tokens is None
    return_dict: bool


def _as_prompts(input_ids, pad_token_id) -> list[list[int]]:
    """One prompt (list of ids) or a batch (padded by the tokenizer) -> a list of unpadded prompts.

    Padding is removed from both ends of each row when the batch has more than one row (the tokenizer pads to
    the longest prompt, on either side). Example: pad 0, [[5, 6, 0], [7, 8, 9]] -> [[5, 6], [7, 8, 9]].
    """
    if hasattr(input_ids, "asnumpy"):
        input_ids = input_ids.asnumpy()
    if isinstance(input_ids, np.ndarray):
        input_ids = input_ids.tolist()
    if not input_ids or not isinstance(input_ids[0], (list, tuple)):
        return [[int(t) for t in input_ids]]
    rows = [[int(t) for t in row] for row in input_ids]
    if len(rows) > 1 and pad_token_id is not None:
        pad = int(pad_token_id)
        stripped = []
        for row in rows:
            lo, hi = 0, len(row)
            while lo < hi and row[lo] == pad:
                lo += 1
            while hi > lo and row[hi - 1] == pad:
                hi -= 1
            stripped.append(row[lo:hi])
        rows = stripped
    return rows


def load_tokenizer(model_dir: str, **kwargs: Any):
    """A MindFormers fast tokenizer over the model directory's ``tokenizer.json`` (what the pipeline needs).

    Special tokens come from ``tokenizer_config.json`` when present (``kwargs`` override them). The pipeline pads
    batches, so a tokenizer without a pad token pads with its EOS token (padding is dropped again in ``generate``).
    """
    import json

    from mindformers.models.tokenization_utils_fast import PreTrainedTokenizerFast

    path = os.path.join(model_dir, "tokenizer.json")
    if not os.path.isfile(path):
        raise ConfigError(f"{model_dir}: no tokenizer.json for the MindFormers pipeline")
    special: dict[str, Any] = {}
    config_path = os.path.join(model_dir, "tokenizer_config.json")
    if os.path.isfile(config_path):
        with open(config_path, encoding="utf-8") as f:
            config = json.load(f)
        for key in ("bos_token", "eos_token", "unk_token", "pad_token"):
            value = config.get(key)
            value = value.get("content") if isinstance(value, dict) else value
            if value:
                special[key] = value
    special.update(kwargs)
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=path, **special)
    if tokenizer.pad_token is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def register() -> None:
    """Register with MindFormers' Auto classes (the registry decorators above ran on import). Idempotent."""
    AutoConfig.register(MODEL_TYPE, EagleSpeculativeConfig, exist_ok=True)
    AutoModelForCausalLM.register(EagleSpeculativeConfig, EagleSpeculativeForCausalLM, exist_ok=True)


register()

__all__ = ["EagleSpeculativeConfig", "EagleSpeculativeForCausalLM", "MODEL_TYPE", "load_tokenizer", "register"]

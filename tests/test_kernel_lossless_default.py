"""The default SmolLM2 teacher with the custom kernels: speculative generation (scripted oracle chains and
bushy trees whose accepted paths are not in place) equals the same teacher's greedy output, in fp32 and in
bf16; and the fp32 kernel teacher still picks the greedy tokens of transformers on the same GGUF."""

from __future__ import annotations

import pytest

from mindspore_eagle.compute import ComputeChoice
from mindspore_eagle.runtime import RuntimeConfig
from mindspore_eagle.engine import SpeculativeEngine
from mindspore_eagle.kernels import MatmulChoice
from mindspore_eagle.oracle import OracleProposer
from mindspore_eagle.teacher import Teacher
from tests.helpers import DEFAULT_TEACHER_PROMPTS as PROMPTS, ScriptedProposer, default_model_or_skip, require_kernel

# In the default suite: about 45 s on 2 cores with the fused kernels (two 30-layer teachers, four graphs each).

NEW_TOKENS = 40


@pytest.fixture(scope="module")
def kernel_default_teacher():
    from mindspore_eagle.tokenizer import load_tokenizer

    model_dir = default_model_or_skip()
    made = {}

    def get(dtype):
        require_kernel(dtype)
        if dtype not in made:
            made[dtype] = Teacher.load(model_dir, RuntimeConfig(max_cache_len=512),
                                       ComputeChoice(matmul=MatmulChoice("custom", dtype)))
        return made[dtype], load_tokenizer(model_dir)

    return get


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_speculative_equals_greedy_on_default_teacher_with_kernels(kernel_default_teacher, dtype):
    teacher, tok = kernel_default_teacher(dtype)
    for text in PROMPTS:
        ids = tok.encode_chat([{"role": "user", "content": text}])
        greedy = list(SpeculativeEngine(teacher).generate(ids, NEW_TOKENS + 8).tokens)
        oracle = SpeculativeEngine(teacher).generate(ids, NEW_TOKENS,
                                                     proposer=OracleProposer(greedy, 4, teacher.cfg.vocab_size))
        assert list(oracle.tokens) == greedy[:NEW_TOKENS], (dtype, text)
        assert oracle.tau > 4.0  # every level accepted except where the run ends
        bushy = ScriptedProposer(teacher.cfg.vocab_size, depth=4, mode="bushy")
        bushy.future = greedy
        gen = SpeculativeEngine(teacher).generate(ids, NEW_TOKENS, proposer=bushy)
        assert list(gen.tokens) == greedy[:NEW_TOKENS], (dtype, text)
        assert any(s.path != tuple(range(len(s.path))) for s in gen.steps)  # rows were moved


def test_fp32_kernel_teacher_greedy_matches_transformers(kernel_default_teacher, hf_smollm2):
    import torch

    teacher, tok = kernel_default_teacher("float32")
    for text in PROMPTS:
        ids = tok.encode_chat([{"role": "user", "content": text}])
        ours = SpeculativeEngine(teacher).generate(ids, 24)
        with torch.no_grad():
            ref = hf_smollm2.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False,
                                      eos_token_id=None, pad_token_id=0)[0, len(ids):].tolist()
        assert list(ours.tokens) == ref, (text, tok.decode(ours.tokens), tok.decode(ref))

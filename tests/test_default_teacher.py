"""The default SmolLM2-135M-Instruct teacher, converted from its GGUF by us, picks the same greedy tokens as
HuggingFace transformers loading the very same GGUF file."""

import os

import numpy as np
import pytest

from tests.helpers import DEFAULT_TEACHER_PROMPTS


# slow: the MindSpore-MatMul teacher against transformers (~50 s with its fixture); the kernel teacher's comparison
# with transformers on the same GGUF stays in the default suite (test_kernel_lossless_default)
@pytest.mark.slow
def test_default_teacher_greedy_matches_transformers_on_same_gguf(default_teacher, hf_smollm2):
    import torch

    from mindspore_eagle.engine import greedy_generate

    teacher, tok = default_teacher
    for text in DEFAULT_TEACHER_PROMPTS:
        ids = tok.encode_chat([{"role": "user", "content": text}])
        ours = greedy_generate(teacher, ids, max_new_tokens=24)
        with torch.no_grad():
            ref = hf_smollm2.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False,
                                      eos_token_id=None, pad_token_id=0)[0, len(ids):].tolist()
        assert list(ours.tokens) == ref, (text, tok.decode(ours.tokens), tok.decode(ref))


def test_default_teacher_logits_close_to_transformers(default_teacher, hf_smollm2):
    import torch

    from mindspore_eagle.tree import ForwardInputs, TreeLayout

    teacher, tok = default_teacher
    ids = tok.encode_chat([{"role": "user", "content": DEFAULT_TEACHER_PROMPTS[0]}])
    bucket = teacher.runtime.buckets.fit(len(ids))  # one chunk: the prompt is shorter than the 64-token bucket
    ours = teacher.forward(ForwardInputs.for_tree(TreeLayout.chain(ids), 0, bucket, teacher.max_len)).logits[0, -1]
    with torch.no_grad():
        ref = hf_smollm2(torch.tensor([ids])).logits[0, -1].numpy()
    # 30 layers of fp32 with different summation orders: allow a little more than the tiny models' 1e-4.
    assert np.abs(ours - ref).max() < 2e-3, np.abs(ours - ref).max()

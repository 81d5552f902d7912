"""The teacher Cell computes what HuggingFace transformers computes, for openPangu, Llama and Qwen2 layouts,
in PyNative (reference) and graph (performance) mode, and cached decoding equals a full recompute."""

import numpy as np
import pytest

from mindspore_eagle.runtime import RuntimeConfig
from mindspore_eagle.engine import greedy_generate
from mindspore_eagle.teacher import Teacher
from mindspore_eagle.tree import ForwardInputs, TreeLayout
from tests.helpers import torch_greedy

KINDS = ["pangu", "llama", "qwen2"]
MODES = ["reference", "performance"]
RUNTIME = dict(max_cache_len=128, buckets=(1, 8, 16, 32), prefill_chunk=16)


@pytest.fixture(scope="module")
def teachers(hf_tiny):
    made = {}

    def get(kind, mode):
        if (kind, mode) not in made:
            _, ms_dir, torch_model = hf_tiny(kind)
            made[kind, mode] = (Teacher.load(ms_dir, RuntimeConfig(exec_mode=mode, **RUNTIME)), torch_model)
        return made[kind, mode]

    return get


def chunked_logits(teacher, seq):
    """Logits of every position of ``seq`` written from row 0 in prefill chunks (padding exercised)."""
    rows, off, rt = [], 0, teacher.runtime
    for size, bucket in rt.buckets.chunks(len(seq), rt.prefill_chunk, teacher.max_len):
        inputs = ForwardInputs.for_tree(TreeLayout.chain(seq[off:off + size]), off, bucket, teacher.max_len)
        rows.append(teacher.forward(inputs).logits[0])
        off += size
    return np.concatenate(rows, 0)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", KINDS)
def test_prefill_logits_match_transformers(teachers, kind, mode):
    import torch

    teacher, torch_model = teachers(kind, mode)
    prompt = [int(t) for t in np.random.default_rng(1).integers(0, teacher.cfg.vocab_size, 29)]
    ours = chunked_logits(teacher, prompt)  # 29 tokens: chunks of 16 and 13 (padded to 16)
    with torch.no_grad():
        ref = torch_model(torch.tensor([prompt])).logits[0].numpy()
    assert ours.shape == ref.shape
    assert np.abs(ours - ref).max() <= 1e-4, np.abs(ours - ref).max()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", KINDS)
def test_greedy_tokens_match_transformers(teachers, kind, mode):
    teacher, torch_model = teachers(kind, mode)
    prompt = [3, 17, 42, 5, 99, 8, 1]
    ours = greedy_generate(teacher, prompt, max_new_tokens=32)
    assert list(ours.tokens) == torch_greedy(torch_model, prompt, 32)


@pytest.mark.parametrize("mode", MODES)
def test_cached_decoding_equals_full_recompute(teachers, mode):
    teacher, _ = teachers("pangu", mode)
    prompt = [7, 8, 9, 10, 11]
    gen = greedy_generate(teacher, prompt, max_new_tokens=12)
    seq = list(prompt) + list(gen.tokens)
    # One recompute over the whole sequence (same cache buffers, rows overwritten from 0): the argmax of
    # every row from the last prompt token on must be the token the cached run produced next.
    argmax = chunked_logits(teacher, seq[:-1]).argmax(-1)
    assert [int(t) for t in argmax[len(prompt) - 1:]] == list(gen.tokens)


def test_aux_taps_are_the_inputs_of_the_configured_layers_in_order(hf_tiny):
    """EAGLE-3 features: the hidden states entering layers aux_layer_ids (repeats allowed), as transformers'
    output_hidden_states reports them (hidden_states[i] is the input of layer i)."""
    import torch

    from mindspore_eagle.runtime import replace

    from mindspore_eagle.teacher_config import TeacherConfig

    _, ms_dir, torch_model = hf_tiny("llama")
    cfg = replace(TeacherConfig.load(ms_dir), aux_layer_ids=(3, 1, 1))
    teacher = Teacher(cfg, RuntimeConfig(exec_mode="reference", **RUNTIME))
    from mindspore_eagle.storage.checkpoint import load_strict

    load_strict(teacher.cell.weight_parameters(), ms_dir + "/weights.safetensors")
    prompt = [4, 8, 15, 16, 23, 42]
    aux = teacher.forward(ForwardInputs.for_tree(TreeLayout.chain(prompt), 0, 8, teacher.max_len)).aux_hidden[0]
    with torch.no_grad():
        hs = torch_model(torch.tensor([prompt]), output_hidden_states=True).hidden_states
    ref = np.concatenate([hs[3][0].numpy(), hs[1][0].numpy(), hs[1][0].numpy()], -1)
    assert aux.shape == ref.shape
    assert np.abs(aux - ref).max() <= 1e-4

"""The MindFormers adapter (runs only in the MindFormers environment: ``make test-mindformers``).

A YAML in MindFormers' layout builds our speculative model through MindFormers' registry, and
``mindformers.pipeline("text_generation")`` generates with it token-for-token what our own teacher-only greedy
decoding generates, for a non-degenerate random pair (drafts mostly rejected) and a pair whose drafts are
accepted (several tokens per cycle), for single and padded-batch inputs.
"""

from __future__ import annotations

import os
import tempfile

import pytest

os.environ.setdefault("GLOG_v", "3")
os.environ.setdefault("LOCAL_DEFAULT_PATH", tempfile.mkdtemp(prefix="mindformers_log_"))  # MindFormers logs here
pytest.importorskip("mindformers")

from mindformers import AutoModelForCausalLM, pipeline  # noqa: E402
from mindformers.models.build_model import build_network  # noqa: E402
from mindformers.tools.register import MindFormerConfig, MindFormerModuleType, MindFormerRegister  # noqa: E402

from mindspore_eagle.engine import SpeculativeEngine  # noqa: E402
from mindspore_eagle.integrations.mindformers_adapter import (  # noqa: E402
    EagleSpeculativeConfig,
    EagleSpeculativeForCausalLM,
    load_tokenizer,
)
from tests.helpers import make_tiny_pair  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
YAML = os.path.join(ROOT, "configs", "mindformers", "predict_eagle_speculative.yaml")
SMALL = dict(max_cache_len=96, buckets=[1, 8, 16], prefill_chunk=8, max_nodes=8, depth=3, top_k=4,
             pad_token_id=0)  # the word tokenizer below pads with "t0"


def write_word_tokenizer(model_dir: str, vocab: int) -> None:
    """tokenizer.json mapping "t<i>" <-> id i (whitespace-separated), so text and ids convert exactly."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(os.path.join(model_dir, "tokenizer.json"))


def text(ids) -> str:
    return " ".join(f"t{i}" for i in ids)


@pytest.fixture(scope="module", params=["random", "copy"])
def pair(request, tmp_path_factory):
    teacher, head = make_tiny_pair(str(tmp_path_factory.mktemp(f"mf_{request.param}")), request.param)
    write_word_tokenizer(teacher, 101)
    return request.param, teacher, head


@pytest.fixture(scope="module")
def model(pair):
    kind, teacher, head = pair
    return kind, AutoModelForCausalLM.from_config(YAML, teacher_dir=teacher, draft_dir=head, **SMALL)


def greedy_ids(model, prompt, n):
    """Our teacher-only greedy decoding (the one-node-tree baseline) on the model's teacher."""
    return list(SpeculativeEngine(model.engine.teacher).generate(prompt, n).tokens)


def test_classes_are_registered_with_mindformers():
    assert MindFormerRegister.get_cls(MindFormerModuleType.MODELS, "EagleSpeculativeForCausalLM") \
        is EagleSpeculativeForCausalLM
    assert MindFormerRegister.get_cls(MindFormerModuleType.CONFIG, "EagleSpeculativeConfig") is EagleSpeculativeConfig


def test_yaml_build_paths_give_the_speculative_model(model, pair):
    kind, m = model
    _, teacher, head = pair
    assert isinstance(m, EagleSpeculativeForCausalLM) and m.config.max_nodes == 8 and m.proposer is not None
    cfg = MindFormerConfig(YAML)
    cfg.model.model_config.update(teacher_dir=teacher, draft_dir=head, **SMALL)
    assert isinstance(build_network(cfg.model), EagleSpeculativeForCausalLM)
    from_object = AutoModelForCausalLM.from_config(EagleSpeculativeConfig(teacher_dir=teacher, draft_dir=head, **SMALL))
    assert isinstance(from_object, EagleSpeculativeForCausalLM)


def test_pipeline_text_generation_equals_our_greedy(model):
    kind, m = model
    pipe = pipeline("text_generation", model=m, tokenizer=load_tokenizer(m.teacher_dir, pad_token="t0"))
    for prompt in ([3, 17, 42, 5], [60, 61, 62, 63, 64, 65, 66, 67, 68]):
        out = pipe(text(prompt), max_new_tokens=12, do_sample=False)
        want = greedy_ids(m, prompt, 12)
        assert out == [{"text_generation_text": [text(prompt + want)]}]
        (gen,) = m.last_generations
        assert list(gen.tokens) == want and list(gen.prompt_tokens) == prompt
        if kind == "copy":
            assert gen.tau > 2, gen.tau  # drafts accepted: several tokens per verification
    assert m.proposer is not None


def test_padded_batch_is_split_into_unpadded_prompts(model):
    kind, m = model
    pipe = pipeline("text_generation", model=m, tokenizer=load_tokenizer(m.teacher_dir, pad_token="t0"))
    prompts = [[9, 8, 7], [11, 22, 33, 44, 55]]
    out = pipe([text(p) for p in prompts], batch_size=2, max_new_tokens=6)
    assert out == [{"text_generation_text": [text(p + greedy_ids(m, p, 6)) for p in prompts]}]


def test_generate_returns_mindformers_output_layout(model):
    _, m = model
    res = m.generate([5, 6, 7], max_new_tokens=4, return_dict_in_generate=True)
    (seq,) = res["sequences"]
    assert seq.dtype.name == "int32" and list(seq[:3]) == [5, 6, 7] and len(seq) == 7
    assert [list(s) for s in m.generate([[5, 6, 7]], max_new_tokens=4)] == [list(seq)]

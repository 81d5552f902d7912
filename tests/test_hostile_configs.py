"""Hostile config files are refused where they are read, with a typed error naming the file and the key.

No silent coercion (``num_attention_heads: 4.7`` used to become 4, ``"false"`` became True, ``"2"`` became 2),
no library traceback (a config.json that is a list, a string where a number belongs, ``chat_template: 5``, a
template the sandbox blocks), and directories that are the wrong kind of thing say what they are: an
unconverted HuggingFace checkpoint given as a model, a teacher given as a draft head.
"""

from __future__ import annotations

import json
import shutil

import pytest

from mindspore_eagle.fields import read_config_json

from mindspore_eagle.teacher_config import TeacherConfig
from mindspore_eagle.draft_config import DraftConfig
from mindspore_eagle.errors import CheckpointError, ConfigError, TokenizerError
from tests.helpers import PUBLIC_CONFIGS
from tests.helpers import write_bpe_gguf

HF = {"architectures": ["LlamaForCausalLM"], "vocab_size": 100, "hidden_size": 64, "intermediate_size": 96,
      "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5,
      "rope_theta": 10000, "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": [2, 3]}
HEAD = PUBLIC_CONFIGS["mapped"]
SAVED = TeacherConfig.from_hf_dict(HF).to_dict()


@pytest.mark.parametrize("key, value, needle", [
    ("num_attention_heads", 4.7, "num_attention_heads=4.7: must be an integer"),
    ("hidden_size", "64", "hidden_size='64': must be an integer"),
    ("vocab_size", True, "vocab_size=True: must be an integer"),
    ("rms_norm_eps", "1e-5", "rms_norm_eps='1e-5': must be a number"),
    ("rope_theta", float("inf"), "rope_theta=inf: must be a finite number"),
    ("tie_word_embeddings", "false", "tie_word_embeddings='false': must be true or false"),
    ("attention_bias", 1, "attention_bias=1: must be true or false"),
    ("eos_token_id", "2", "eos_token_id='2': must be a token id"),
    ("eos_token_id", [2, 3.5], "eos_token_id=\\[2, 3.5\\]: must be a token id"),
    ("bos_token_id", "1", "bos_token_id='1': must be a token id"),
    ("rope_scaling", "linear", "rope_scaling='linear': must be an object"),
    ("rope_scaling", {"rope_type": "linear", "factor": "2"}, "factor='2': must be a number"),
])
def test_hf_teacher_config_values_of_the_wrong_type_are_named(key, value, needle):
    with pytest.raises(ConfigError, match=needle):
        TeacherConfig.from_hf_dict({**HF, key: value})


@pytest.mark.parametrize("key, value, needle", [
    ("num_attention_heads", 4.7, "num_attention_heads=4.7: must be an integer"),
    ("draft_vocab_size", "24", "draft_vocab_size='24': must be an integer"),
    ("bias", "no", "bias='no': must be true or false"),
    ("eagle_config", {"eagle_aux_hidden_state_layer_ids": [1, 2.5, 3]},
     "eagle_aux_hidden_state_layer_ids=\\[1, 2.5, 3\\]: must be a list of integers"),
    ("eagle_config", [1, 2, 3], "eagle_config=\\[1, 2, 3\\]: must be an object"),
])
def test_hf_head_config_values_of_the_wrong_type_are_named(key, value, needle):
    with pytest.raises(ConfigError, match=needle):
        DraftConfig.from_hf_dict({**HEAD, key: value})


@pytest.mark.parametrize("key, value, needle", [
    ("num_heads", 4.0, "num_heads=4.0: must be an integer"),
    ("rms_norm_eps", "tiny", "rms_norm_eps='tiny': must be a finite number"),
    ("tie_word_embeddings", "yes", "tie_word_embeddings='yes': must be a bool"),
    ("aux_layer_ids", [1.5, 2, 3], "aux_layer_ids=\\(1.5, 2, 3\\): must be integers"),
    ("eos_token_ids", ["2"], "eos_token_ids=\\('2',\\): must be integers"),
    ("bos_token_id", 1.0, "bos_token_id=1.0: must be an integer or null"),
    ("rope_scaling", [1, 2], "rope_scaling=\\[1, 2\\]: must be an object"),
])
def test_our_saved_teacher_config_with_wrong_types_is_refused(key, value, needle):
    with pytest.raises(ConfigError, match=needle):
        TeacherConfig.from_dict({**SAVED, key: value})


def test_gguf_metadata_of_the_wrong_type_is_named():
    meta = {"general.architecture": "llama", "llama.attention.head_count": 4.7, "llama.embedding_length": 64,
            "llama.feed_forward_length": 96, "llama.block_count": 2, "llama.vocab_size": 100,
            "llama.attention.layer_norm_rms_epsilon": 1e-5}
    with pytest.raises(ConfigError, match="llama.attention.head_count=4.7: must be an integer"):
        TeacherConfig.from_gguf_metadata(meta, tied=True)
    meta["llama.attention.head_count"] = 4
    assert TeacherConfig.from_gguf_metadata(meta, tied=True).num_heads == 4
    with pytest.raises(ConfigError, match="tokenizer.ggml.eos_token_id='x'"):
        TeacherConfig.from_gguf_metadata({**meta, "tokenizer.ggml.eos_token_id": "x"}, tied=True)


@pytest.mark.parametrize("content", ["[1, 2]", "\"a string\"", "null"])
def test_config_json_that_is_not_an_object_is_a_config_error(tmp_path, content):
    (tmp_path / "config.json").write_text(content)
    for load in (read_config_json, TeacherConfig.load, DraftConfig.load):
        with pytest.raises(ConfigError, match="config.json: expected a JSON object"):
            load(str(tmp_path))


def test_config_json_that_is_not_utf8_is_a_config_error(tmp_path):
    (tmp_path / "config.json").write_bytes(b'{"a": "\xff\xfe"}')
    with pytest.raises(ConfigError, match="config.json: not UTF-8"):
        read_config_json(str(tmp_path))


def test_converters_read_config_json_with_the_same_checks(tmp_path):
    from ckpt_convert import convert_eagle3, convert_hf

    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "config.json").write_text("[1, 2]")
    for convert in (convert_hf, convert_eagle3):
        with pytest.raises(ConfigError, match="expected a JSON object"):
            convert(str(tmp_path / "src"), str(tmp_path / "out"))


# ----- directories of the wrong kind ------------------------------------------------------------------------


def test_unconverted_hf_checkpoint_given_as_a_model_says_to_convert(hf_tiny, tmp_path):
    from mindspore_eagle.storage.checkpoint import load_strict
    from mindspore_eagle.runtime import RuntimeConfig
    from mindspore_eagle.teacher import Teacher

    hf_dir, _, _ = hf_tiny("llama")
    rt = RuntimeConfig(max_cache_len=64, exec_mode="reference", buckets=(1, 8), prefill_chunk=8)
    for load in (lambda: TeacherConfig.load(hf_dir), lambda: Teacher.load(hf_dir, rt),
                 lambda: load_strict({}, f"{hf_dir}/weights.safetensors")):
        with pytest.raises(CheckpointError, match="looks like a HuggingFace checkpoint.*mindspore-eagle convert"):
            load()


def test_teacher_directory_given_as_a_draft_head_says_so(hf_tiny, tmp_path):
    from mindspore_eagle.draft import load_head

    hf_dir, ms_dir, _ = hf_tiny("llama")
    for path in (ms_dir, hf_dir):
        with pytest.raises(ConfigError, match="teacher"):
            DraftConfig.load(path)
    with pytest.raises(ConfigError, match="is a teacher model directory, not a draft head"):
        load_head(ms_dir, max_len=16)


# ----- tokenizer config files -----------------------------------------------------------------------------


@pytest.fixture
def bpe_dir(tmp_path):
    from mindspore_eagle.tokenizer import export_gguf_tokenizer

    export_gguf_tokenizer(write_bpe_gguf(tmp_path / "t.gguf"), tmp_path / "tok")
    return tmp_path / "tok"


def _edit_config(model_dir, **changes):
    path = model_dir / "tokenizer_config.json"
    cfg = json.loads(path.read_text()) if path.is_file() else {}
    cfg.update(changes)
    path.write_text(json.dumps(cfg))


@pytest.mark.parametrize("changes, needle", [
    (dict(chat_template=5), "chat_template=5: must be a jinja template string"),
    (dict(chat_template=[{"name": "default", "template": 7}]), "chat_template.*must be a jinja template string"),
    (dict(add_bos_token="false"), "add_bos_token='false': must be true or false"),
    (dict(eos_token=3), "eos_token=3: must be the token's text"),
])
def test_tokenizer_config_values_of_the_wrong_type_are_named(bpe_dir, changes, needle):
    from mindspore_eagle.tokenizer import load_tokenizer

    _edit_config(bpe_dir, **changes)
    with pytest.raises(TokenizerError, match=needle):
        load_tokenizer(bpe_dir)


@pytest.mark.parametrize("eos", ["2", [2, "3"], 2.0, True, {"id": 2}])
def test_generation_config_eos_ids_must_be_integers(bpe_dir, eos):
    from mindspore_eagle.tokenizer import load_tokenizer

    (bpe_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))
    with pytest.raises(TokenizerError, match="generation_config.json: eos_token_id=.*must be a token id"):
        load_tokenizer(bpe_dir)


@pytest.mark.parametrize("template, needle", [
    ("{% for i in range(10**9) %}x{% endfor %}", "OverflowError"),  # the sandbox caps range()
    ("{{ messages + 1 }}", "TypeError"),
    ("{{ ''.__class__.__mro__ }}", "SecurityError|undefined|chat template failed"),
    ("{{ 1 / 0 }}", "ZeroDivisionError"),
    ("{% if %}", "TemplateSyntaxError"),
])
def test_chat_template_that_fails_to_render_is_a_tokenizer_error(processor, template, needle):  # noqa: F811
    from mindspore_eagle.tokenizer import SentencePieceTokenizer

    tok = SentencePieceTokenizer(processor, {}, "pangu", chat_format=template)
    with pytest.raises(TokenizerError, match=needle):
        tok.apply_chat_template([{"role": "user", "content": "a"}])


def test_a_copied_teacher_with_bad_generation_config_is_refused_on_load(hf_tiny, tmp_path):
    """The same check guards a model directory's tokenizer, not only a bare tokenizer directory."""
    from mindspore_eagle.tokenizer import export_gguf_tokenizer, load_tokenizer

    _, ms_dir, _ = hf_tiny("llama")
    shutil.copytree(ms_dir, tmp_path / "m")
    export_gguf_tokenizer(write_bpe_gguf(tmp_path / "t.gguf"), tmp_path / "m")
    (tmp_path / "m" / "generation_config.json").write_text(json.dumps({"eos_token_id": "2"}))
    with pytest.raises(TokenizerError, match="eos_token_id='2'"):
        load_tokenizer(tmp_path / "m")


def test_rope_parameters_written_by_transformers_5_are_read():
    """transformers 5 saves ``rope_theta`` and the scaling inside ``rope_parameters``; reading only the old
    top-level keys silently built a model with theta 10000 and no scaling."""
    import transformers

    rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 1024}
    hf = transformers.LlamaConfig(vocab_size=100, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                  num_attention_heads=4, max_position_embeddings=4096, rope_theta=500000.0,
                                  rope_scaling=rope).to_dict()
    assert "rope_parameters" in hf and "rope_theta" not in hf  # the layout this test is about
    cfg = TeacherConfig.from_hf_dict({**hf, "architectures": ["LlamaForCausalLM"]})
    assert cfg.rope_theta == 500000.0
    assert (cfg.rope_scaling.kind, cfg.rope_scaling.factor, cfg.rope_scaling.original_max_position_embeddings) == (
        "llama3", 8.0, 1024)
    old_style = {k: v for k, v in HEAD.items() if k != "rope_theta"}
    head = DraftConfig.from_hf_dict({**old_style, "rope_parameters": {"rope_type": "default", "rope_theta": 7.0}})
    assert head.rope_theta == 7.0 and head.rope_scaling is None
    with pytest.raises(ConfigError, match="rope_theta=1000.0 differs from rope_parameters.rope_theta=500000.0"):
        TeacherConfig.from_hf_dict({**hf, "architectures": ["LlamaForCausalLM"], "rope_theta": 1000.0})

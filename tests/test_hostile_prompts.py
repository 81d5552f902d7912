"""Hostile API inputs are refused where they enter, with a typed error naming the value.

* ``SamplingParams`` with a seed that is not a non-negative integer (``1.5``, ``-1``, ``"1"``) or a temperature /
  top-p / top-k of the wrong type: a ConfigError at construction, not a numpy crash at the first sampled token
  (``seed=-1`` crashed even for greedy requests).
* Text that is not valid Unicode (a lone surrogate, as ``surrogateescape`` decoding or a broken JSON ``\\ud800``
  escape produce) or not a string: a TokenizerError naming the position and the code point, from ``encode``
  and ``encode_chat`` of both tokenizers, instead of ``TextInputSequence must be str`` from ``tokenizers``.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from mindspore_eagle.errors import ConfigError, TokenizerError
from mindspore_eagle.tokenizer import BPETokenizer, SentencePieceTokenizer, load_tokenizer
from mindspore_eagle.verify import PositionNoise, SamplingParams, sample_token
from tests.helpers import write_bpe_gguf


@pytest.mark.parametrize("field, value, needle", [
    ("seed", 1.5, "seed=1.5: must be an integer >= 0"),
    ("seed", -1, "seed=-1: must be an integer >= 0"),
    ("seed", "1", "seed='1': must be an integer >= 0"),
    ("seed", True, "seed=True: must be an integer >= 0"),
    ("seed", None, "seed=None: must be an integer >= 0"),
    ("temperature", "0.7", "temperature='0.7': must be a finite number >= 0"),
    ("temperature", float("nan"), "temperature=nan: must be a finite number >= 0"),
    ("temperature", float("inf"), "temperature=inf: must be a finite number >= 0"),
    ("top_p", "0.9", "top_p='0.9': must be a number in \\(0, 1\\]"),
    ("top_k", 2.5, "top_k=2.5: must be an integer >= 0"),
    ("top_k", True, "top_k=True: must be an integer >= 0"),
])
def test_sampling_params_of_the_wrong_type_or_range_are_refused(field, value, needle):
    with pytest.raises(ConfigError, match=needle):
        SamplingParams(**{field: value})


@pytest.mark.parametrize("seed", [0, 7, 2**63, 2**64 + 5])
def test_every_accepted_seed_seeds_numpy(seed):
    params = SamplingParams(temperature=0.8, seed=seed)
    logits = np.linspace(-1.0, 1.0, 16)
    a = sample_token(logits, params, PositionNoise(params.seed), 3)
    b = sample_token(logits, params, PositionNoise(params.seed), 3)
    assert a == b and 0 <= a < 16


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory, sp_dir):  # noqa: F811
    bpe = BPETokenizer.from_gguf(write_bpe_gguf(tmp_path_factory.mktemp("bpe") / "t.gguf"))
    sp = load_tokenizer(sp_dir, chat_format="pangu")
    assert isinstance(sp, SentencePieceTokenizer)
    return {"bpe": bpe, "sentencepiece": sp}


@pytest.mark.parametrize("kind", ["bpe", "sentencepiece"])
@pytest.mark.parametrize("text, position, code", [("ab\ud800b", 2, "U+D800"), ("\udcff", 0, "U+DCFF"),
                                                  ("a" * 9 + "\udfffa", 9, "U+DFFF")])
def test_text_with_a_lone_surrogate_is_refused_naming_the_position(tokenizers, kind, text, position, code):
    with pytest.raises(TokenizerError, match=f"position {position}.*{re.escape(code)}"):
        tokenizers[kind].encode(text)


@pytest.mark.parametrize("kind", ["bpe", "sentencepiece"])
def test_chat_message_with_a_lone_surrogate_names_the_message(tokenizers, kind):
    tok = tokenizers[kind]
    if tok.chat_template is None:
        tok = BPETokenizer(tok.backend, tok.config, tok.source, chat_format="chatml")
    messages = [{"role": "user", "content": "ab"}, {"role": "assistant", "content": "b"},
                {"role": "user", "content": "a\udc80"}]
    with pytest.raises(TokenizerError, match="messages\\[2\\] content: .*position 1.*U\\+DC80"):
        tok.encode_chat(messages)


@pytest.mark.parametrize("kind", ["bpe", "sentencepiece"])
@pytest.mark.parametrize("text", [b"ab", 5, None, ["a"]])
def test_text_that_is_not_a_string_is_refused(tokenizers, kind, text):
    with pytest.raises(TokenizerError, match="text must be a str"):
        tokenizers[kind].encode(text)


@pytest.mark.parametrize("kind", ["bpe", "sentencepiece"])
def test_valid_unicode_still_encodes_and_round_trips(tokenizers, kind):
    tok = tokenizers[kind]
    text = "abba" if kind == "bpe" else "the quick fox 你好"
    assert tok.decode(tok.encode(text)).strip() == text

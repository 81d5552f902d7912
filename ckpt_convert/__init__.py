"""ckpt_convert: import HF safetensors, GGUF and EAGLE-3 checkpoints into mindspore_eagle model directories.

Usage: ``python -m ckpt_convert {hf,gguf,eagle3} SRC OUT_DIR [--overwrite]``.
"""

from .convert import CKPT_NAME, check_tensors, convert_gguf, convert_hf
from .eagle3 import convert_eagle3

__all__ = ["CKPT_NAME", "check_tensors", "convert_eagle3", "convert_gguf", "convert_hf"]

"""ckpt_convert: import HF safetensors, GGUF and EAGLE-3 checkpoints into mindspore_eagle model directories.

Usage: ``python -m ckpt_convert {hf,gguf} SRC OUT_DIR [--overwrite]``.
"""

from .convert import CKPT_NAME, check_tensors, convert_gguf, convert_hf

__all__ = ["CKPT_NAME", "check_tensors", "convert_gguf", "convert_hf"]

"""ckpt_convert: the command that imports HF safetensors, GGUF and EAGLE-3 checkpoints into mindspore_eagle model
directories; the conversion itself is ``mindspore_eagle.convert``.

Usage: ``python -m ckpt_convert {hf,gguf,eagle3} SRC OUT_DIR [--overwrite]``.
"""

from mindspore_eagle.convert import CKPT_NAME, check_tensors, convert_eagle3, convert_gguf, convert_hf

__all__ = ["CKPT_NAME", "check_tensors", "convert_eagle3", "convert_gguf", "convert_hf"]

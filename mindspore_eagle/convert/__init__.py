"""Checkpoint import: HF safetensors and GGUF teachers (``teacher``), published EAGLE-3 heads (``eagle3``), read
strictly (``readers``) through name maps (``name_map``), written as model directories atomically.

It lives inside the package because the runtime needs part of it -- ``mindspore-eagle setup`` converts the
default GGUF, and a public EAGLE-3 head directory loads in memory (``eagle3.load_public_head``) -- so nothing in
``mindspore_eagle`` imports the ``ckpt_convert`` command package, which is only the ``python -m ckpt_convert``
entry point over this one.
"""

from .eagle3 import convert_eagle3, load_public_head
from .teacher import CKPT_NAME, check_tensors, convert_gguf, convert_hf

__all__ = ["CKPT_NAME", "check_tensors", "convert_eagle3", "convert_gguf", "convert_hf", "load_public_head"]

"""mindspore_eagle: lossless EAGLE-3 tree speculative decoding for Pangu / Llama-family models in MindSpore."""

__version__ = "0.1.0"

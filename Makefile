# Two entry points on a fresh machine: `make demo` and `make test`.
# Each installs what it needs into a local venv first (torch pinned to the CPU 2.13.0 wheel).
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp

.PHONY: demo test install clean

install: $(STAMP)

# The genai extra, onnxruntime-genai (tests/emit/test_genai.py): the -cuda build, which declares onnxruntime-gpu (the
# runtime softsyn already depends on; plain onnxruntime-genai declares the CPU `onnxruntime`, whose files would
# overwrite onnxruntime-gpu's). Its CUDA provider loads only when a GPU is asked for; on the CPU it runs as the plain
# build.

$(STAMP): pyproject.toml Makefile
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip 'setuptools>=77.0.3'  # torch 2.13 declares setuptools>=77.0.3
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test,zoo,genai]'
	$(PY) -m pip check
	touch $(STAMP)

# Analyse the built-in default (a tiny Qwen3 decoder) against a CPU budget.
# Exit 1 means "timing violated", which is a result, not a failure of the demo.
demo: $(STAMP)
	$(VENV)/bin/softsyn analyze zoo:qwen3-tiny -c constraints/cpu-tiny.yaml -o out/qwen3-tiny || [ $$? -eq 1 ]
	@test -f out/qwen3-tiny/reports/report.html && echo "HTML report: $(CURDIR)/out/qwen3-tiny/reports/report.html"

# Two workers, one test file each at a time (module fixtures stay in one process): the suite fits its 10 minutes on
# 2 cores. The workers share one export cache (tests/conftest.py: each zoo model exported once a run).
test: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadfile

clean:
	rm -rf out .pytest_cache

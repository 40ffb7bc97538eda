# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
# Both create .venv when missing and install everything into it (torch first, pinned and overridable).
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEMO_DIR ?= cache-demo
# test files run on this many processes (pytest-xdist, one file per process at a time; 0: in this process)
TEST_WORKERS ?= 2

.PHONY: demo test lint bench install clean

$(STAMP): pyproject.toml Makefile setup.py niels_gpt/_native/gather.c
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(PY) -m pip install --quiet -e ".[dev,hf,cloud,train,tiktoken,corpus,plot]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) -m niels_gpt.demo --cache-dir $(DEMO_DIR)

test: $(STAMP)
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile

lint: $(STAMP)
	$(PY) -m ruff check niels_gpt tests bench

bench: $(STAMP)
	$(PY) bench/run_all.py

clean:
	rm -rf $(VENV) $(DEMO_DIR) .pytest_cache runs/demo

# Two commands do all the set-up:  `make demo` (main job, offline) and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
LINKER := $(VENV)/bin/linker
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: setup demo test

setup: $(VENV)/.installed

# torch first, pinned: it is the CPU build; sentence-transformers then installs nothing more of torch.
$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q torch==2.13.0
	$(VENV)/bin/pip install -q -e ".[dev]"
	touch $@

indexes/default.parquet: | setup
	$(LINKER) dict build --source default --out $@ --overwrite

indexes/default: indexes/default.parquet
	$(LINKER) index build --dict $< --kind tfidf --out $@ --overwrite

demo: indexes/default
	$(LINKER) normalize --index indexes/default --input examples/ae_spans.jsonl --format jsonl --output - --k 1

test: setup
	$(PY) -m pytest

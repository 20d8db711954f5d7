# Two commands do all the set-up:  `make demo` (main job, offline) and `make test`; `make docs` builds the site.
VENV ?= .venv
PY := $(VENV)/bin/python
LINKER := $(VENV)/bin/linker
DEFAULT_KIND ?= dense
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: setup demo test test-isa test-typer-floor docs models

setup: $(VENV)/.installed

# Everything (`all`: every extra but spark) with the tests' and the site's tools; `pip install -e .` alone is the
# light tf-idf install (docs/installation.md). torch first, pinned: it is the CPU build; sentence-transformers then
# installs nothing more of torch.
$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q torch==2.13.0
	$(VENV)/bin/pip install -q -e ".[all,dev,docs]"
	touch $@

LAY := linker/data/lay

# The open default dictionary (every name; the lay figures of eval/shipped/report.md are measured on the same recipe
# with the lay test phrases' names held out).
indexes/default.parquet: | setup
	$(LINKER) dict build --source default --out $@ --overwrite

# Rebuilt when the code that sets the index's defaults or the shipped encoder changes, so a checkout never keeps an
# index built with older defaults. Dense with the shipped linker-en (chosen on the lay development slice over the
# hybrid with tf-idf: Acc@1 64.7 against 28.2), then the default calibration, fitted on the development slice's lay
# synonyms with their own names masked out of the index, and 1,000 of the index's own names (an exact match, and one
# two concepts share): confidences and decisions (auto, review, no link) from the first command.
# Encoded in fp32 on every processor: `auto` would pick bf16 where the CPU multiplies it natively (AVX512-BF16, AMX),
# and the figures the README shows (scores, confidences, ECE) would move in the third decimal from one machine to
# the next. Your own indexes keep `--precision auto`.
# The shipped re-ranker, linker-rerank-en, is bound to it and re-scores the retriever's top 4 (on the development
# slice, Acc@1 67.9 at k = 4 and 68.0 at k = 32 for 10 times the time: eval/rerank/lay_dev_one_stage.md); the
# calibration records that k and runs the re-ranker in fp32, and links run it so.
indexes/default: indexes/default.parquet linker/index/tfidf.py linker/index/dense.py linker/text.py linker/models/linker-en/manifest.json linker/models/linker-rerank-en/manifest.json
	$(LINKER) index build --dict $< --kind $(DEFAULT_KIND) --encoder linker-en --precision fp32 --reranker linker-rerank-en --out $@ --overwrite
	$(LINKER) calibrate --index $@ --dataset lay:$(LAY)/lay_dev.tsv --exclude-names $(LAY)/dev_names.tsv --dictionary-names 1000 --origin default --rerank-k 4

demo: indexes/default
	$(LINKER) normalize --index indexes/default --input examples/ae_spans.jsonl --format jsonl --output - --k 1

# Retrain the shipped encoders and the re-ranker exactly as shipped (linker/models/*; ../shared/data beside the
# checkout; ~3.5 h on 2 CPU cores, minutes on a GPU: add DEVICE=cuda).
models: setup
	$(LINKER) train release linker-en $(if $(DEVICE),--device $(DEVICE))
	$(LINKER) train release linker-multi $(if $(DEVICE),--device $(DEVICE))
	$(LINKER) train release linker-rerank-en $(if $(DEVICE),--device $(DEVICE))

test: setup
	$(PY) -m pytest

# The numerics-sensitive tests again with every kernel family forced to its generic level (torch's ATen, FAISS's
# SIMD dispatch, OpenBLAS's core type): ties and printed figures must not hang on the last bit of a kernel, and the
# machines CI runs on change (AVX2, AVX-512, ARM). Ties are broken by exact rules; this target shows they hold.
ISA_GENERIC = ATEN_CPU_CAPABILITY=default FAISS_SIMD_LEVEL=NONE FAISS_OPT_LEVEL=generic OPENBLAS_CORETYPE=Prescott
ISA_TESTS = tests/test_dense.py tests/test_index_tfidf.py tests/test_index_hybrid.py tests/test_link.py \
	tests/test_confidence.py tests/test_rerank.py tests/test_encoders.py tests/test_precision.py tests/test_eval_metrics.py
test-isa: setup
	env $(ISA_GENERIC) $(PY) -m pytest -q -p no:cacheprovider $(ISA_TESTS)

# The documentation site (docs/, mkdocs.yml) into site/, strictly: a broken link, anchor or report fails it, and so
# does a CLI reference (docs/cli.md) that no longer matches the commands' --help (regenerate: python docs/gen_cli.py).
docs: setup
	$(PY) docs/gen_cli.py --check
	$(VENV)/bin/mkdocs build --strict -d site

# The CLI against the lowest typer pyproject allows (installed beside, not into, the venv).
TYPER_FLOOR = $(shell sed -n 's/.*"typer>=\([0-9.]*\)".*/\1/p' pyproject.toml)
test-typer-floor: setup
	rm -rf .typer-floor && $(VENV)/bin/pip install -q --no-deps --target .typer-floor "typer==$(TYPER_FLOOR).*"
	PYTHONPATH=.typer-floor $(PY) -c "import typer; print('CLI tests with typer', typer.__version__)"
	PYTHONPATH=.typer-floor $(PY) -m pytest -q -p no:cacheprovider tests/test_link.py tests/test_normalize.py tests/test_first_hour.py

# One target per benchmark or study whose report the README or the documentation cites: each reruns the `bench`
# module that wrote it under eval/<study>/ (real data from ../shared/data or $LINKER_SHARED_DATA; minutes to hours on
# 2 cores; each report names its command). The trained systems are recipes: `make eval-recipe-NAME` runs
# recipes/NAME.toml into out/recipes/NAME (resumable; `--device cuda` is used where a GPU exists).
.PHONY: bench-link bench-scale bench-dict bench-service bench-scaleout eval-accuracy eval-capabilities eval-extract eval-recipes-tfidf

bench-link: setup
	$(PY) -m bench.link --medic-dense

# Hours on 2 cores (a 5M-name dense build is most of it); eval/scale/report.md says what each row took.
bench-scale: setup
	$(PY) -m bench.scale tables
	$(PY) -m bench.scale run --sizes union,1m,2m,5m --kinds tfidf,dense,hybrid
	$(PY) -m bench.scale ray --size 100k --workers 1,2

bench-dict: setup
	$(PY) -m bench.dict_build

bench-service: indexes/default
	$(PY) -m bench.service_load --index indexes/default

# The sizes the committed report used (2 shared cores under heavy load); raise them on a quiet machine.
bench-scaleout: indexes/default
	$(PY) -m bench.scaleout --index indexes/default --tfidf-spans 2000 --dense-spans 600 --dense-names 2000 --shards 4 --runs 3 --dense-runs 1

eval-accuracy: setup
	$(PY) -m bench.accuracy --dense minilm

# Capability suites (eval/capabilities/): the indexes once, then the three reports.
eval-capabilities: setup
	$(PY) -m bench.capabilities --part default --sample 200
	$(PY) -m bench.capabilities --part medic --sample 50
	$(PY) -m bench.capabilities --part hpo --sample 50

# The adverse-event extractor (eval/extract/): TAC 2017 dev, PHEE test (scored once), assertion rules, capabilities.
eval-extract: setup
	$(PY) -m bench.extract

# The four tf-idf systems of the results table (under a minute each on 2 cores).
eval-recipes-tfidf: setup
	for recipe in ncbi-disease-tfidf cantemist-tfidf codiesp-d-tfidf mantra-tfidf; do \
	  $(LINKER) recipe run recipes/$$recipe.toml --out out/recipes/$$recipe || exit 1; done

# Any recipe, e.g. `make eval-recipe-ncbi-disease` (hours on a CPU; the committed runs trained on a lent GPU).
eval-recipe-%: setup
	$(LINKER) recipe run recipes/$*.toml --out out/recipes/$*

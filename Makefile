# Two commands do all the set-up:  `make demo` (main job, offline) and `make test`; `make docs` builds the site.
VENV ?= .venv
PY := $(VENV)/bin/python
LINKER := $(VENV)/bin/linker
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: setup demo test test-typer-floor docs

setup: $(VENV)/.installed

# Everything (`all`: every extra but spark) with the tests' and the site's tools; `pip install -e .` alone is the
# light tf-idf install (docs/installation.md). torch first, pinned: it is the CPU build; sentence-transformers then
# installs nothing more of torch.
$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q torch==2.13.0
	$(VENV)/bin/pip install -q -e ".[all,dev,docs]"
	touch $@

indexes/default.parquet: | setup
	$(LINKER) dict build --source default --out $@ --overwrite

# Rebuilt when the code that sets the index's defaults changes, so a checkout never keeps an index built with
# older defaults (the scale-out benchmark once measured a stale char 1-2 index that way).
indexes/default: indexes/default.parquet linker/index/tfidf.py linker/text.py
	$(LINKER) index build --dict $< --kind tfidf --out $@ --overwrite

demo: indexes/default
	$(LINKER) normalize --index indexes/default --input examples/ae_spans.jsonl --format jsonl --output - --k 1

test: setup
	$(PY) -m pytest

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

# One target per benchmark or accuracy table of the README: each reruns the script that wrote the table's
# report under eval/<study>/ (real data from ../shared/data; minutes to hours on 2 cores; see each report's command).
.PHONY: bench-link bench-dense bench-dict bench-service bench-scaleout eval-accuracy eval-ncbi-biosyn eval-ncbi-biosyn-sap eval-ncbi-biosyn-dev eval-multilingual eval-multilingual-full eval-cantemist-biosyn eval-codiesp-biosyn eval-rerank eval-mix-choice eval-capabilities eval-hybrid-tuning

bench-link: setup
	$(PY) scripts/bench_link.py --medic-dense

bench-dense: setup
	$(PY) scripts/bench_dense.py

bench-dict: setup
	$(PY) scripts/bench_mrconso.py

bench-service: indexes/default
	$(PY) scripts/load_test.py --index indexes/default

# The sizes the committed report used (2 shared cores under heavy load); raise them on a quiet machine.
bench-scaleout: indexes/default
	$(PY) scripts/bench_scaleout.py --index indexes/default --tfidf-spans 2000 --dense-spans 600 --dense-names 2000 --shards 4 --runs 3 --dense-runs 1

eval-accuracy: setup
	$(PY) scripts/eval_all.py --dense minilm

eval-ncbi-biosyn: setup
	$(PY) scripts/ncbi_biosyn.py --sap-pairs 0 --epochs 10 --report-name ncbi_biosyn_full

eval-ncbi-biosyn-sap: setup  # sap on every MEDIC synonym pair first (~50 + 28 min on 2 quiet cores)
	$(PY) scripts/ncbi_biosyn.py --sap-pairs all --epochs 10 --report-name ncbi_biosyn_sapall --work indexes/ncbi_biosyn_sapall

# BioSyn's lr, batch size and top-k chosen on dev (12 points, 10 epochs each), then train+dev: ~5 h on 2 cores, so the
# committed run did the grid and the final training on a lent GPU (scripts/gpu_ncbi_biosyn.sh) and the rest here.
eval-ncbi-biosyn-dev: setup
	$(PY) scripts/ncbi_biosyn.py --sap-pairs all --epochs 10 --report-name ncbi_biosyn_sapall_dev --work indexes/ncbi_biosyn_sapall --grid "topk=20,40 batch=16,32 lr=1e-5,2e-5,5e-5"
	# the epochs chosen on dev too (the same grid, its best epoch): ~16 min of BioSyn on 2 cores
	$(PY) scripts/ncbi_biosyn.py --sap-pairs all --epochs 10 --report-name ncbi_biosyn_sapall_devepochs --work indexes/ncbi_biosyn_sapall_devepochs --grid "topk=20,40 batch=16,32 lr=1e-5,2e-5,5e-5" --grid-report ncbi_biosyn_sapall_dev --choose-epochs

eval-multilingual: setup
	$(PY) scripts/train_multilingual.py cantemist --with-train-names --threads 2
	$(PY) scripts/train_multilingual.py mantra --threads 2
	$(PY) scripts/train_multilingual.py codiesp --threads 2

# Issue 13's multilingual runs at full size: cross-lingual sap of e5-small on all 242,729 synonym and translation
# pairs of HPO (en/es/fr/nl/de) + the Disease Ontology, then BioSyn from that model on every Cantemist and every
# CodiEsp-D train mention, 10 epochs each. The committed run trained on a lent H100 (scripts/gpu_multilingual.sh:
# 4 min of sap, 11 min of both BioSyn runs at once; hours on 2 cores) and built the indexes and scored here: each
# command skips the training it finds done.
eval-multilingual-full: setup
	$(PY) scripts/train_multilingual.py mantra --sap-pairs 0 --doid --sap-batch 256 --threads 2
	$(PY) scripts/train_multilingual.py codiesp --biosyn-queries 0 --sap-model models/mantra-e5-sap-all-doid --epochs 10 --threads 2
	$(PY) scripts/hybrid_tuning.py codiesp --encoder models/codiesp-e5-sap-biosyn-all
	$(PY) scripts/train_multilingual.py cantemist --biosyn-queries 0 --sap-model models/mantra-e5-sap-all-doid --epochs 10 --threads 2
	$(PY) scripts/hybrid_tuning.py cantemist --encoder models/cantemist-e5-sap-biosyn-all
	# the tf-idf-mined Cantemist re-ranker of eval-rerank above its retriever; then re-rankers started from these
	# encoders, each chosen on dev first (--heldin-only), then scored on test
	$(PY) scripts/rerank_confidence.py --datasets cantemist-sapbiosyn --systems reranked --rerank-k 16 --threads 2
	$(PY) scripts/rerank_confidence.py --datasets cantemist-mined-sapinit --systems reranked --rerank-k 16 --epochs 2 --train-seconds 3000 --threads 2 --heldin-only
	$(PY) scripts/rerank_confidence.py --datasets cantemist-mined-sapinit --systems reranked --rerank-k 16 --epochs 2 --train-seconds 3000 --threads 2
	# ...and that re-ranker above the sap + BioSyn dense retriever it started from (CodiEsp-D's below)
	$(PY) scripts/rerank_confidence.py --datasets cantemist-sapbiosyn-sapinit --systems reranked --rerank-k 16 --threads 2
	# ...and one started there with negatives mined by that dense retriever (dev1 first)
	$(PY) scripts/rerank_confidence.py --datasets cantemist-sapbiosyn-sapinit-mined --systems reranked --rerank-k 16 --train-seconds 3000 --threads 2 --heldin-only
	$(PY) scripts/rerank_confidence.py --datasets cantemist-sapbiosyn-sapinit-mined --systems reranked --rerank-k 16 --train-seconds 3000 --threads 2
	$(PY) scripts/rerank_confidence.py --datasets codiesp-mined-sapinit --systems reranked --rerank-k 16 --epochs 2 --train-seconds 4500 --threads 2 --heldin-only
	$(PY) scripts/rerank_confidence.py --datasets codiesp-mined-sapinit --systems reranked --rerank-k 16 --epochs 2 --train-seconds 4500 --threads 2
	$(PY) scripts/rerank_confidence.py --datasets codiesp-sapbiosyn-sapinit --systems reranked --rerank-k 16 --threads 2
	# the NCBI tie prior (index build --prior, the train split) under the two sap-initialised re-rankers above
	$(PY) scripts/rerank_confidence.py --datasets cantemist-mined-sapinit-prior --systems reranked --rerank-k 16 --threads 2
	$(PY) scripts/rerank_confidence.py --datasets codiesp-mined-sapinit-prior --systems reranked --rerank-k 16 --threads 2
	# NCBI-disease's re-ranker started from the sap e5-small above (~23 min on 2 cores), on dev only: it tied ncbi-sapinit
	$(PY) scripts/rerank_confidence.py --datasets ncbi-e5sapinit --systems reranked --rerank-k 16 --threads 2 --heldin-only

# BioSyn on every Cantemist train mention (resumes from its last epoch); the time budget is the committed run's, on
# 2 shared cores: raise --max-seconds (or drop it) on a quiet machine. Then dense / tf-idf / tuned hybrid with it.
eval-cantemist-biosyn: setup
	$(PY) scripts/train_multilingual.py cantemist --biosyn-queries 0 --epochs 3 --max-seconds 3600 --threads 2
	$(PY) scripts/hybrid_tuning.py cantemist --encoder models/cantemist-e5-biosyn-all

# BioSyn on every CodiEsp-D train mention against the English ICD-10-CM names (~16 min an epoch on 2 cores at load 2-3),
# then dense / tf-idf / tuned hybrid with it on ICD-10-CM + train mentions, then the CodiEsp-D re-ranker above it.
eval-codiesp-biosyn: setup
	$(PY) scripts/train_multilingual.py codiesp --biosyn-queries 0 --epochs 5 --threads 2
	$(PY) scripts/hybrid_tuning.py codiesp --encoder models/codiesp-e5-biosyn-all
	$(PY) scripts/rerank_confidence.py --datasets codiesp-mined,codiesp-biosyn --rerank-k 16 --epochs 2 --train-seconds 2700 --threads 2

eval-hybrid-tuning: setup
	$(PY) scripts/hybrid_tuning.py ncbi
	$(PY) scripts/hybrid_tuning.py cantemist
	$(PY) scripts/hybrid_tuning.py codiesp

eval-rerank: setup
	$(PY) scripts/rerank_confidence.py --datasets ncbi --rerank-k 16
	# the full system: needs models/ncbi-biosyn-minilm-biosyn (make eval-ncbi-biosyn) and the ncbi re-ranker above
	$(PY) scripts/rerank_confidence.py --datasets ncbi-biosyn --rerank-k 16
	$(PY) scripts/rerank_confidence.py --datasets ncbi-biosyn-protocol --systems reranked --rerank-k 16
	# a re-ranker started from the sap encoder (make eval-ncbi-biosyn-sap), chosen on dev first, then above the
	# dev-chosen sap + BioSyn retriever (make eval-ncbi-biosyn-dev)
	$(PY) scripts/rerank_confidence.py --datasets ncbi-sapinit --systems reranked --rerank-k 16 --threads 2 --heldin-only
	$(PY) scripts/rerank_confidence.py --datasets ncbi-sapinit --systems reranked --rerank-k 16 --threads 2
	$(PY) scripts/rerank_confidence.py --datasets ncbi-sapall-sapinit --systems reranked --rerank-k 16 --threads 2 --biosyn-model models/ncbi-biosyn-minilm-sap-all-biosyn-devgrid-epochs
	# ties between equally scored concepts broken by the train annotations (index build --prior): measured on dev
	# first (eval/ncbi_ties/ncbi_tie_prior.md), then both systems above on test with it
	$(PY) scripts/ncbi_tie_prior.py
	$(PY) scripts/rerank_confidence.py --datasets ncbi-sapinit-prior --systems reranked --rerank-k 16 --threads 2
	$(PY) scripts/rerank_confidence.py --datasets ncbi-sapall-sapinit-prior --systems reranked --rerank-k 16 --threads 2 --biosyn-model models/ncbi-biosyn-minilm-sap-all-biosyn-devgrid-epochs
	# the Cantemist recipe's start: sap + BioSyn on the train mentions alone (the dev-chosen settings, ~20 min on 2
	# cores), then the "ncbi" re-ranker from it, compared on dev first (~10 min)
	test -f models/ncbi-biosyn-minilm-sap-all-biosyn-train/train_metrics.json || $(PY) -m linker train biosyn \
	  --train "pubtator:../shared/data/ncbi_disease/NCBItrainset_corpus.txt#biosyn&typos=../shared/data/ncbi_disease/ncbi-spell-check.txt" \
	  --dict indexes/ncbi_biosyn_sapall_devepochs/medic.parquet --encoder models/ncbi-biosyn-minilm-sap-all \
	  --out models/ncbi-biosyn-minilm-sap-all-biosyn-train --epochs 4 --lr 1e-5 --batch-size 16 --topk 20 --threads 2
	$(PY) scripts/rerank_confidence.py --datasets ncbi-sapbiosyninit --systems reranked --rerank-k 16 --threads 2 --heldin-only
	# above the dense retriever: the sap start with negatives mined by that retriever (dev only, ~25 min)
	$(PY) scripts/rerank_confidence.py --datasets ncbi-sapall-sapinit-mined --systems reranked --rerank-k 16 --threads 2 --biosyn-model models/ncbi-biosyn-minilm-sap-all-biosyn-devgrid-epochs --heldin-only
	# larger recipes from the same start, compared on dev only: the committed figures came from scripts/gpu_rerank.sh on
	# a lent GPU (each stopped at 300 s, which cut q6k, q6k-mined and qall short); here whole, 10 to 40 min each on 2 cores;
	# then the ncbi-sapinit re-ranker re-scoring the top 8 or 32 (dev only, a few minutes)
	for recipe in ncbi-sapinit-q6k ncbi-sapinit-qall ncbi-sapinit-q6k-mined ncbi-sapinit-e4 ncbi-sapinit-n15 ncbi-sapinit-mentions \
	    ncbi-sapinit-k8 ncbi-sapinit-k32; do \
	  $(PY) scripts/rerank_confidence.py --datasets $$recipe --systems reranked --rerank-k 16 --threads 2 --checkpoint-every 200 --heldin-only || exit 1; done
	$(PY) scripts/rerank_confidence.py --datasets cantemist --rerank-k 16 --epochs 1 --train-seconds 3600
	# negatives mined by the retriever's own tf-idf, two epochs (~27 min on 2 cores)
	$(PY) scripts/rerank_confidence.py --datasets cantemist-mined --rerank-k 16 --epochs 2 --train-seconds 3000 --threads 2
	# the same for three epochs, compared with it on dev1 only (~36 min)
	$(PY) scripts/rerank_confidence.py --datasets cantemist-mined-e3 --systems reranked --rerank-k 16 --train-seconds 4200 --threads 2 --heldin-only
	$(PY) scripts/rerank_confidence.py --datasets codiesp --systems retriever

# How `linker calibrate` chooses a re-ranker's mix weight: rules compared by cross-fitting on the held-in sets of the
# six re-ranked systems that eval-rerank and eval-multilingual-full build (no test mention read; ~10 min on 2 cores)
eval-mix-choice: setup
	$(PY) scripts/mix_choice.py

# Capability suites (eval/capabilities/): the indexes once, then the reports and the suite-driven fix.
eval-capabilities: setup
	$(PY) scripts/capability_indexes.py
	$(PY) scripts/eval_capabilities.py --part default --sample 200
	$(PY) scripts/eval_capabilities.py --part medic --sample 50
	$(PY) scripts/eval_capabilities.py --part hpo --sample 50
	$(PY) scripts/capability_fix.py --sample 200

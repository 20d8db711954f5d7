"""linker: multilingual medical entity linking.

Terminology files -> concept table (parquet) -> index folder -> Linker -> CLI / service / eval.
"""

import os

__version__ = "0.1.0"

# OpenMP threads (torch's and FAISS's libgomp) that finish a parallel region spin ~300,000 times
# before sleeping. On a CPU shared with other processes a spinning thread holds a core that the
# other thread of its own team needs, so every operator of an encoder waits for a scheduler slice.
# Measured on 2 shared cores at load 12-28 (`scripts/bench_dense_build.py --sample 20|40 --no-full`
# with OMP_WAIT_POLICY unset / ACTIVE / PASSIVE): e5-small bf16 with 2 threads encoded 0.4 / 0.7 /
# 21 names/s; the dense service: eval/service/service_load_medic_dense_vs_tfidf.md. PASSIVE threads sleep
# at once. libgomp reads the setting when torch or faiss is first imported, hence here, before
# either; a value already in the environment wins.
if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"

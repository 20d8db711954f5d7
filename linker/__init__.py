"""linker: multilingual medical entity linking.

Terminology files -> concept table (parquet) -> index folder -> Linker -> CLI / service / eval.
"""

import os

__version__ = "0.1.0"

# OpenMP threads (torch's and FAISS's libgomp) that finish a parallel region spin ~300,000 times
# before sleeping. On a CPU shared with other processes a spinning thread holds a core the other
# thread of its own team needs, so every op of an encoder waits a scheduler slice: measured on 2
# shared cores (load 12-28), e5-small with 2 threads encoded 0.7 names/s spinning vs 21 passive,
# and a dense service answered 0.5-1.1 vs 8.5 mentions/s (scripts/bench_dense_build.py,
# scripts/load_test.py). PASSIVE threads sleep at once. libgomp reads it when torch or faiss is
# first imported, so it is set here, before either; a value already in the environment wins.
if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"

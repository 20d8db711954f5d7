"""linker: multilingual medical entity linking.

Terminology files -> concept table (parquet) -> index folder -> Linker -> CLI / service / eval.
"""

import os

__version__ = "0.1.0"

# OpenMP threads (torch's and FAISS's libgomp) that finish a parallel region spin ~300,000 times
# before sleeping. On a CPU shared with other processes a spinning thread holds a core that the
# other thread of its own team needs, so every operator of an encoder waits for a scheduler slice.
# Measured on 2 shared cores at load 12-28 (the retired bench_dense_build study, `--sample 20|40 --no-full`
# with OMP_WAIT_POLICY unset / ACTIVE / PASSIVE): e5-small bf16 with 2 threads encoded 0.4 / 0.7 /
# 21 names/s; the dense service: eval/service/service_load_medic_dense_vs_tfidf.md. PASSIVE threads sleep
# at once. libgomp reads the setting when torch or faiss is first imported, hence here, before
# either; a value already in the environment wins.
if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"

# oneDNN (torch's CPU kernels in bf16/int8) caches a compiled kernel per operator shape, 1,024 by default; encoding
# batches of every length fills it, and a 5M-name index build's memory grew by ~1 KB per name until it was full.
# 2,048 names at a time, 9 calls, compiled minilm bf16: +239 MB at 1,024 entries, +95 MB at 256 in the same 24 s,
# +68 MB at 64 but 5% slower (eval/scale/report.md). Read when oneDNN starts; a value already set wins.
os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "256")

"""Training dense encoders for linking.

- `linker.train.sap`: SapBERT-style self-alignment on a concept table's own synonym pairs.
- `linker.train.biosyn`: BioSyn fine-tuning on annotated mentions, candidates refreshed every epoch.

Both write a sentence-transformers folder that `linker index build --encoder PATH` takes.
"""

from linker.extras import check as _check_extra

# Every module of this package imports torch at its top: without the `train` extra, one line naming it.
_check_extra(("torch", "sentence_transformers", "safetensors"), extra="train", what="linker.train")

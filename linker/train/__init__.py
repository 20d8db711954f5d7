"""Training dense encoders for linking.

- `linker.train.sap`: SapBERT-style self-alignment on a concept table's own synonym pairs.
- `linker.train.biosyn`: BioSyn fine-tuning on annotated mentions, candidates refreshed every epoch.

Both write a sentence-transformers folder that `linker index build --encoder PATH` takes.
"""

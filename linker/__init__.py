"""linker: multilingual medical entity linking.

Terminology files -> concept table (parquet) -> index folder -> Linker -> CLI / service / eval.
"""

__version__ = "0.1.0"

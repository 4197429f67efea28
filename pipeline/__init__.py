"""normaudit: measure what the discarded norm of contrastive embeddings encodes."""

__version__ = "0.1.0"

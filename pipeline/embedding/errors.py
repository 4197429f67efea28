"""Errors of model resolution, shared by the registry (:mod:`pipeline.embedding.models`) and the hub."""


class ModelIntegrityError(RuntimeError):
    """A weight file's sha256 differs from the expected one (corrupt or tampered install)."""


class ModelNotFoundError(LookupError):
    """The model name, directory or package cannot be found; the message says what to pass instead."""

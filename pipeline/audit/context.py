"""The one value every step of an audit shares: :class:`AuditContext`.

An audit's steps all need the same few things: the settings, the model's label in storage, the release,
the run id, the resolved model and the store. They travel together as one frozen context instead of a
four-to-six-argument tuple, from the flow to each step, in the flow process or on a Dask worker.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from pipeline.embedding.models import ResolvedModel
from pipeline.settings import Settings
from pipeline.storage.store import Store, open_store


@dataclass(frozen=True)
class AuditContext:
    """Settings, model label, release, run id and resolved model of one audit, with its opened store.

    It pickles to Dask workers without its store (each process opens its own on first use, so no open
    connection or client crosses processes). Prefect records it as a flow parameter through its fields:
    the settings' credentials are excluded from every dump (:class:`pipeline.settings.Settings`).
    """

    settings: Settings
    model: str  # the model's label in storage
    release: str
    run_id: str
    resolved: ResolvedModel

    @cached_property
    def store(self) -> Store:
        """The store of ``settings.root``, opened once per process."""
        return open_store(self.settings)

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state.pop("store", None)  # opened again where it is unpickled
        return state

"""Settings: the only module that reads the environment.

Every other module receives a :class:`Settings` (or plain values taken from it). A flow takes them as a
parameter, which Prefect records: the credentials are left out of every dump, and the flow completes what
it received from its own environment (:func:`flow_settings`).
Environment variables use the ``NORMAUDIT_`` prefix, except the S3 endpoint and
credentials, which use the standard AWS names so that existing tooling works.
"""

from __future__ import annotations

import os
import sys
from typing import Literal

from pydantic import AliasChoices, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

# A size as DuckDB takes it (512MB, 2GiB): NORMAUDIT_ANALYSIS_MEMORY, and any memory limit a catalog is opened with
MEMORY_SIZE = r"\d+(\.\d+)?\s*(B|KB|MB|GB|TB|KiB|MiB|GiB|TiB)"

DEFAULT_ROOT = "./normaudit-data"  # the storage root when neither --root nor NORMAUDIT_ROOT names one


class Settings(BaseSettings):
    """Runtime settings for an audit, the SQL shell and the storage layer."""

    model_config = SettingsConfigDict(env_prefix="NORMAUDIT_", extra="forbid", populate_by_name=True)

    root: str = Field(DEFAULT_ROOT, description="fsspec URL of the storage root (file path or s3://bucket/prefix)")
    s3_endpoint_url: str | None = Field(
        None, validation_alias=AliasChoices("s3_endpoint_url", "NORMAUDIT_S3_ENDPOINT_URL", "AWS_ENDPOINT_URL")
    )
    # exclude: never in a dump, so never in a Prefect flow parameter (Prefect records those), not even masked
    aws_access_key_id: SecretStr | None = Field(
        None, validation_alias=AliasChoices("aws_access_key_id", "AWS_ACCESS_KEY_ID"), repr=False, exclude=True
    )
    aws_secret_access_key: SecretStr | None = Field(
        None, validation_alias=AliasChoices("aws_secret_access_key", "AWS_SECRET_ACCESS_KEY"), repr=False,
        exclude=True,
    )
    aws_region: str | None = Field(
        None, validation_alias=AliasChoices("aws_region", "AWS_DEFAULT_REGION", "AWS_REGION")
    )
    dask_address: str | None = Field(None, description="scheduler address; None starts a local cluster of processes")
    n_workers: int = Field(1, ge=1, description="worker processes of the local cluster")
    threads_per_worker: int | None = Field(
        None, ge=1, description="torch threads per worker; default: cores divided by workers"
    )
    device: Literal["auto", "cpu", "cuda", "mps"] = "auto"
    batch_tokens: int | None = Field(
        None, ge=64, description="padded tokens per forward batch; None: 4096 on CPU, 16384 on GPUs"
    )
    max_batch_size: int = Field(1024, ge=1, description="upper bound on texts per forward batch")
    shard_size: int | None = Field(
        None, ge=1, description="items per shard (one Parquet part, one Dask task); None: 4096, up to 65536 "
        "for large probe sets (131072 on GPUs) (pipeline.storage.shards.default_shard_size)")
    vector_dtype: Literal["float32", "float16"] = "float32"
    precision: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", description="dtype the model's forward pass runs in (pooling and norms stay float32/float64)"
    )
    lease_ttl_s: float = Field(
        600.0, gt=0, description="seconds a release's lease lives unrenewed; a live audit renews it every quarter "
        "of this, so it lapses only when its run is gone (pipeline/storage/lease.py)")
    probe_block_rows: int = Field(
        131072, ge=1, description="rows per block of a large probe file, prepared block by block on the workers "
        "(pipeline/probes/blocks.py)")
    analysis_memory: str = Field(
        "256MB", pattern=rf"(?i)^\s*{MEMORY_SIZE}\s*$",
        description="DuckDB's memory limit in the audit's analyses (e.g. 512MB, 2GiB): past it DuckDB spills to a "
        "temporary folder, so the worker running them stays flat at any number of items")
    model_cache: str | None = Field(
        None, description="folder where models shipped as split archives are unpacked; default: user cache dir"
    )

    @field_validator("root")
    @classmethod
    def _absolute_local_root(cls, value: str) -> str:
        # Dask workers and deployments may run elsewhere in the tree: pin a local root to one folder.
        if "://" in value:
            return value.removeprefix("file://") if value.startswith("file://") else value
        return os.path.abspath(os.path.expanduser(value))

    def storage_options(self) -> dict:
        """fsspec/s3fs options for the root; credentials stay inside, never logged."""
        if not self.root.startswith(("s3://", "s3a://")):
            return {}
        opts: dict = {}
        if self.s3_endpoint_url:
            opts["endpoint_url"] = self.s3_endpoint_url
        if self.aws_access_key_id:
            opts["key"] = self.aws_access_key_id.get_secret_value()
        if self.aws_secret_access_key:
            opts["secret"] = self.aws_secret_access_key.get_secret_value()
        if self.aws_region:
            opts["client_kwargs"] = {"region_name": self.aws_region}
        return opts

    def model_cache_dir(self) -> str:
        """``model_cache``, else ``normaudit/models`` in the platform's per-user cache folder."""
        if self.model_cache:
            return os.path.abspath(os.path.expanduser(self.model_cache))
        return os.path.join(user_cache_dir(), "models")

    def torch_threads(self) -> int:
        """Threads each worker gives torch, so workers never oversubscribe the cores."""
        if self.threads_per_worker:
            return self.threads_per_worker
        return max(1, (os.cpu_count() or 1) // self.n_workers)


def user_cache_dir() -> str:
    """normaudit's folder in the platform's per-user cache folder (models, the CLI's error logs)."""
    if os.name == "nt":
        base = os.environ.get("LOCALAPPDATA") or os.path.expanduser("~/AppData/Local")
    elif sys.platform == "darwin":
        base = os.path.expanduser("~/Library/Caches")
    else:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return os.path.join(base, "normaudit")


def default_root() -> str:
    """The root used when neither --root nor ``NORMAUDIT_ROOT`` names one: ``./normaudit-data``, made absolute."""
    return os.path.abspath(DEFAULT_ROOT)


def load_settings(**overrides) -> Settings:
    """Settings from the environment, with explicit (non-None) overrides from flags."""
    return Settings(**{k: v for k, v in overrides.items() if v is not None})


SECRET_FIELDS = ("aws_access_key_id", "aws_secret_access_key")


def flow_settings(settings: Settings | None = None) -> Settings:
    """The settings a flow runs with: the fields its caller gave, over this process's environment.

    A flow's ``settings`` parameter never carries credentials when it was recorded (a deployment's
    parameters, a flow run started again): they are excluded from dumps, and Prefect validates a
    deployment's JSON into :class:`Settings` without reading the environment. So the flow reads them
    here, where it runs, as :func:`load_settings` does. Credentials the caller's object holds are kept.
    """
    if settings is None:
        return load_settings()
    given = settings.model_dump(exclude_unset=True)
    given.update({k: getattr(settings, k) for k in SECRET_FIELDS if getattr(settings, k) is not None})
    return load_settings(**given)

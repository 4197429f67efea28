"""Watched models for scheduled audits: the ``audits.yaml`` schema and release discovery.

A watched model is a local folder of checkpoints (each sub-folder is a release; the
weights' fingerprint decides what is new) or a Hugging Face id (each new revision is a
release). Discovery only lists; the flow in flows/watch.py audits.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from pipeline.analysis.compare import AlertThresholds
from pipeline.embedding.models import fingerprint_dir
from pipeline.names import check_name

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


class WatchedModel(BaseModel):
    """One model to audit on a schedule."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="model label in storage and in the deployment name")
    checkpoints: str | None = Field(None, description="folder whose sub-folders are releases")
    hub: str | None = Field(None, description="Hugging Face id ORG/NAME; each new revision is a release")
    probes: list[str] = Field(min_length=1)
    cron: str = "0 3 * * *"
    limit: int | None = Field(None, ge=1)
    thresholds: AlertThresholds | None = None

    @field_validator("name")
    @classmethod
    def _safe_name(cls, value: str) -> str:
        return check_name(value, "watched model name")

    @model_validator(mode="after")
    def _one_source(self) -> WatchedModel:
        if (self.checkpoints is None) == (self.hub is None):
            raise ValueError(f"watched model {self.name!r}: give exactly one of 'checkpoints' or 'hub'")
        return self


class AuditsConfig(BaseModel):
    """The whole ``audits.yaml``: where results go, default thresholds, and the watched models.

    ``thresholds`` (and a watched model's own) is :class:`~pipeline.analysis.compare.AlertThresholds`:
    ``default``, ``per_statistic``, ``untracked`` and ``require_significant`` (true: a change alerts only
    when its paired 95% interval excludes 0 as well; false: the threshold alone decides).
    """

    model_config = ConfigDict(extra="forbid")

    root: str | None = None
    thresholds: AlertThresholds = Field(default_factory=AlertThresholds)
    watch: list[WatchedModel] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique_names(self) -> AuditsConfig:
        names = [w.name for w in self.watch]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"watched model names must be unique; repeated: {sorted(dup)}")
        return self


def load_audits_config(path: str | Path) -> AuditsConfig:
    """Read and validate ``audits.yaml``; errors name the file and the field."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"{path}: cannot read the audits config: {exc}") from exc
    try:
        return AuditsConfig.model_validate(raw or {})
    except Exception as exc:
        raise ValueError(f"{path}: invalid audits config: {exc}") from exc


def _natural_key(name: str) -> list:
    # step-900 before step-1000
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def checkpoint_dirs(folder: str | Path) -> list[Path]:
    """Sub-folders holding weight files, in natural name order (step-900 before step-1000)."""
    root = Path(folder)
    if not root.is_dir():
        raise FileNotFoundError(f"checkpoint folder {root} does not exist; fix 'checkpoints' in audits.yaml")
    out = [d for d in root.iterdir()
           if d.is_dir() and not d.name.startswith(".") and any(
               f.suffix in WEIGHT_SUFFIXES for f in d.rglob("*") if f.is_file())]
    return sorted(out, key=lambda d: _natural_key(d.name))


def release_label(name: str) -> str:
    """A release label from a folder or revision name (path-safe)."""
    label = re.sub(r"[^A-Za-z0-9._+@-]+", "-", name).strip("-.")[:128] or "release"
    return check_name(label, "release label")


def discover_releases(watched: WatchedModel, audited: set[str]) -> list[tuple[str, str]]:
    """New releases of ``watched`` as ``(release label, model reference for --model)``.

    ``audited`` holds the fingerprints and release labels of finished audits of this model.
    Checkpoint folders whose weights were already audited (same fingerprint, under any
    label) are skipped; a hub model's current revision is new unless its label was audited.
    """
    if watched.checkpoints is not None:
        return [(release_label(d.name), str(d)) for d in checkpoint_dirs(watched.checkpoints)
                if fingerprint_dir(d) not in audited]
    from huggingface_hub import HfApi

    sha = HfApi().model_info(watched.hub).sha
    label = release_label(sha[:12])
    return [(label, f"hf:{watched.hub}@{sha}")] if label not in audited else []

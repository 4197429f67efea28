"""The lab's configuration: one validated pydantic model (unknown keys are errors), read from YAML or JSON.

The defaults are the *default run*: sized to finish in a few minutes on 2 CPU cores (docs/theory.md has
the measured time). A config file only needs the keys it changes, e.g.::

    name: quick
    train: {steps: 1500}
    sweep: {lrs: [1.0], batch_sizes: [32], weight_decays: [0.002]}
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from pipeline.names import check_name
from pipeline.theory.encoder import TrainConfig
from pipeline.theory.identity import IdentityConfig
from pipeline.theory.world import WorldConfig

__all__ = ["CheckpointConfig", "LabConfig", "SweepConfig", "load_config"]


class SweepConfig(BaseModel):
    """The learning rate x batch size x weight decay grid, run for each model kind and both seeds."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    lrs: tuple[float, ...] = (0.5, 1.0)
    batch_sizes: tuple[int, ...] = (16, 64)
    weight_decays: tuple[float, ...] = (0.002, 0.004)
    kinds: tuple[Literal["table", "encoder"], ...] = ("table", "encoder")
    # Two seeds, so each one's estimates can predict the other's norms (docs/theory.md section 6).
    seeds: tuple[int, int] = (0, 1)

    @field_validator("lrs", "batch_sizes", "weight_decays", "kinds")
    @classmethod
    def _non_empty(cls, value: tuple) -> tuple:
        if not value:
            raise ValueError("give at least one value")
        return value

    @field_validator("weight_decays")
    @classmethod
    def _positive_decay(cls, value: tuple[float, ...]) -> tuple[float, ...]:
        if any(v <= 0 for v in value):
            raise ValueError("weight decays must be > 0: without decay there is no equilibrium norm "
                             "to predict")
        return value

    @field_validator("seeds")
    @classmethod
    def _distinct(cls, value: tuple[int, int]) -> tuple[int, int]:
        if value[0] == value[1]:
            raise ValueError("the two seeds must differ (one predicts the other)")
        return value


class CheckpointConfig(BaseModel):
    """Which steps of the base encoder run are saved as releases, and whether each is audited."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    count: int = Field(5, ge=1, le=50, description="evenly spaced from step 0 to the last step")
    steps: tuple[int, ...] | None = Field(None, description="explicit steps instead of count")
    audit: bool = True
    dir: str | None = Field(None, description="local folder (default: <root>/theory/<run>/checkpoints)")


class LabConfig(BaseModel):
    """Everything one lab run does: world, base training run, identity check, sweep and checkpoints."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = "default"
    world: WorldConfig = WorldConfig()
    train: TrainConfig = TrainConfig()
    identity: IdentityConfig = IdentityConfig()
    sweep: SweepConfig = SweepConfig()
    checkpoints: CheckpointConfig = CheckpointConfig()
    threads: int = Field(1, ge=1, description="torch threads (1 is fastest for these tiny models)")

    @field_validator("name")
    @classmethod
    def _path_safe(cls, value: str) -> str:
        return check_name(value, "lab run name")

    @model_validator(mode="after")
    def _checkpoints_in_range(self) -> LabConfig:
        bad = [s for s in self.checkpoints.steps or () if not 0 <= s <= self.train.steps]
        if bad:
            raise ValueError(f"checkpoint steps {bad} are outside 0..train.steps ({self.train.steps})")
        return self

    def digest(self) -> str:
        """8 hex digits of the config: same config, same run folder and model name (reruns are idempotent)."""
        return hashlib.sha256(self.model_dump_json().encode()).hexdigest()[:8]

    @property
    def run_name(self) -> str:
        return f"{self.name}-{self.digest()}"

    def base_run(self) -> TrainConfig:
        """The encoder run whose checkpoints become releases: the base settings with the first seed."""
        return self.train.model_copy(update={"kind": "encoder", "seed": self.sweep.seeds[0]})

    def checkpoint_steps(self) -> tuple[int, ...]:
        """Sorted steps to save (0 is the initial model)."""
        if self.checkpoints.steps is not None:
            return tuple(sorted(set(self.checkpoints.steps)))
        n, last = self.checkpoints.count, self.train.steps
        if n == 1:
            return (last,)
        return tuple(sorted({round(i * last / (n - 1)) for i in range(n)}))

    def grid(self) -> list[tuple[TrainConfig, TrainConfig]]:
        """One (seed A, seed B) pair of training configs per kind x lr x batch x decay point.

        The base encoder run is always included (added if the grid misses it), so its checkpoints come
        from a run that is also scored.
        """
        points = [(kind, lr, b, wd) for kind in self.sweep.kinds for lr in self.sweep.lrs
                  for b in self.sweep.batch_sizes for wd in self.sweep.weight_decays]
        base = self.base_run()
        if ("encoder", base.lr, base.batch_size, base.weight_decay) not in points:
            points.append(("encoder", base.lr, base.batch_size, base.weight_decay))
        out = []
        for kind, lr, b, wd in points:
            update = {"kind": kind, "lr": lr, "batch_size": b, "weight_decay": wd}
            out.append(tuple(self.train.model_copy(update={**update, "seed": s}) for s in self.sweep.seeds))
        return out


def load_config(path: str | Path | None) -> LabConfig:
    """The default config, or the one in ``path`` (``.yaml``/``.yml``/``.json``); errors name the file."""
    if path is None:
        return LabConfig()
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"lab config {path} does not exist; pass a .yaml or .json file")
    text = path.read_text()
    if path.suffix.lower() in (".yaml", ".yml"):
        try:
            raw = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ValueError(f"{path}: not valid YAML ({exc})") from exc
    elif path.suffix.lower() == ".json":
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not valid JSON ({exc})") from exc
    else:
        raise ValueError(f"{path}: unknown config type {path.suffix!r}; use .yaml, .yml or .json")
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: the config must be a mapping of keys to values")
    try:
        return LabConfig.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(top level)"
        raise ValueError(f"{path}: {where}: {first['msg']} ({exc.error_count()} error(s) in all)") from exc

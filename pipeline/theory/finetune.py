"""``normaudit theory finetune``: contrastive fine-tuning of a real encoder, with checkpoints and a trace.

Training is sentence-transformers' own: :class:`SentenceTransformerTrainer` with
:class:`MultipleNegativesRankingLoss` (in-batch negatives) on definition -> lemma pairs of the reverse
dictionary's **train** split (:mod:`pipeline.probes.splits`). One trainer callback saves a checkpoint
every ``checkpoint_every`` steps (``step-000000`` is the model before training) in the
sentence-transformers layout, so the folder is a ``checkpoints:`` source of ``audits.yaml``, and traces a
fixed probe sample (:mod:`pipeline.theory.trace`), writing the ``training_trace`` rows gated by their GX
suite at each checkpoint.

The learning rate is constant (no warm-up, no decay): the equilibrium of docs/theory.md section 4 is stated for
a fixed step size. ``sgd`` is plain SGD (no momentum) with weight decay, as the formula assumes; ``adamw``
is the decoupled weight decay practitioners use. Both use the trainer's parameter groups, which exempt
biases and LayerNorm weights from decay (docs/theory.md, "A real encoder", says what that does).

torch, transformers, sentence-transformers and datasets are imported inside the functions that use them:
seconds of start-up that ``normaudit --help`` and the audit's workers must not pay.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from pipeline.names import check_name
from pipeline.probes.splits import SPLIT_SEED, TEST_FRACTION, reverse_dictionary_pairs
from pipeline.quality.gates import gate_trace_part, trace_dir
from pipeline.settings import Settings
from pipeline.storage.store import Store
from pipeline.theory.trace import TRACE_KINDS, TraceRecorder, pooled_vectors, trace_sample

DEFAULT_LR = {"adamw": 5e-5, "sgd": 5e-2}
RUN_FILE = "run.json"  # beside the trace's parts: the run's configuration, for `normaudit theory formula`


def read_run(store: Store, run: str) -> dict:
    """The configuration a fine-tune run recorded beside its trace."""
    rel = f"{trace_dir(run)}/{RUN_FILE}"
    if not store.exists(rel):
        raise FileNotFoundError(f"no fine-tune run {run!r} under {store.url('training_trace')}: "
                                "list the runs with `normaudit sql \"select distinct run from training_trace\"`")
    return json.loads(store.read_bytes(rel))


class FinetuneConfig(BaseModel):
    """One fine-tuning run: the model, the optimizer, how often to checkpoint and trace."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field("minilm-l6", description="registry name or local sentence-transformers folder")
    run: str | None = Field(None, description="run label (default MODEL-OPTIMIZER-sSEED)")
    out: str | None = Field(None, description="checkpoint folder (default ./normaudit-checkpoints/RUN)")
    steps: int = Field(150, ge=1)
    batch_size: int = Field(32, ge=2, description="pairs per step; the other pairs are a pair's negatives")
    learning_rate: float | None = Field(None, gt=0, description="default: 5e-5 for adamw, 5e-2 for sgd")
    optimizer: Literal["adamw", "sgd"] = "adamw"
    weight_decay: float = Field(0.01, ge=0)
    checkpoint_every: int = Field(30, ge=1)
    trace_every: int = Field(1, ge=1, description="trace every s steps (1: docs/theory.md section 6)")
    trace_nouns: int = Field(300, ge=1)
    trace_definitions: int = Field(150, ge=1)
    max_seq_length: int = Field(64, ge=8, description="tokens per text while training (definitions are short)")
    seed: int = 0

    @property
    def lr(self) -> float:
        return self.learning_rate if self.learning_rate is not None else DEFAULT_LR[self.optimizer]

    def label(self) -> str:
        """The run's label: names its trace folder and, by default, its checkpoint folder."""
        if self.run is not None:
            return check_name(self.run, "run label")
        base = Path(self.model).name if "/" in self.model else self.model
        return check_name(f"{base}-{self.optimizer}-s{self.seed}", "run label")

    def checkpoint_folder(self) -> Path:
        return Path(self.out) if self.out else Path("normaudit-checkpoints") / self.label()


def check_fresh(store: Store, cfg: FinetuneConfig) -> None:
    """Refuse a run whose checkpoint folder or trace already holds something: nothing is mixed or overwritten."""
    out = cfg.checkpoint_folder()
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"checkpoint folder {out} is not empty: give another --out (or --run), or delete it")
    folder = trace_dir(cfg.label())
    if store.glob(f"{folder}/part-*.parquet"):
        raise FileExistsError(f"run {cfg.label()!r} already has a training trace in {store.url(folder)}: "
                              "give another --run")


def load_model(cfg: FinetuneConfig, device: str):
    """The model to train, from the registry (weights checked) or a local sentence-transformers folder."""
    from sentence_transformers import SentenceTransformer

    from pipeline.embedding.models import resolve_model

    resolved = resolve_model(cfg.model)
    if not resolved.is_sentence_transformers:
        raise ValueError(f"{cfg.model}: fine-tuning needs a sentence-transformers model folder (modules.json); "
                         "this one is a plain transformers model")
    model = SentenceTransformer(resolved.path, device=device, local_files_only=True)
    model.model_card_data.generate_widget_examples = False  # a pass over the data for a card nobody reads here
    model.max_seq_length = min(cfg.max_seq_length, model.max_seq_length or cfg.max_seq_length)
    return model


def _callback(cfg: FinetuneConfig, store: Store, run_id: str, recorder: TraceRecorder, out: Path, log: dict):
    from transformers import TrainerCallback

    class CheckpointAndTrace(TrainerCallback):
        """Trace every ``trace_every`` steps; every ``checkpoint_every`` save the model and write the trace."""

        lr = 0.0

        def _trace(self, step: int, model) -> None:
            t = time.perf_counter()
            recorder.record(step, pooled_vectors(model, recorder.texts), self.lr)
            log["trace_s"] += time.perf_counter() - t

        def _checkpoint(self, step: int, model) -> None:
            t = time.perf_counter()
            path = out / f"step-{step:06d}"
            model.save(str(path))
            log["checkpoints"].append(str(path))
            table = recorder.take()
            if table is not None:
                log["trace_parts"].append(gate_trace_part(store, table, cfg.label(), TRACE_KINDS, run_id))
                log["trace_rows"] += table.num_rows
            log["save_s"] += time.perf_counter() - t

        def on_train_begin(self, args, state, control, model=None, **kwargs):
            self._trace(0, model)
            self._checkpoint(0, model)

        def on_step_begin(self, args, state, control, optimizer=None, **kwargs):
            self.lr = float(optimizer.param_groups[0]["lr"])  # the rate this step runs with

        def on_step_end(self, args, state, control, model=None, **kwargs):
            step, last = state.global_step, state.global_step >= cfg.steps
            if step % cfg.trace_every == 0 or last:
                self._trace(step, model)
            if step % cfg.checkpoint_every == 0 or last:
                self._checkpoint(step, model)

    return CheckpointAndTrace()


def finetune(settings: Settings, store: Store, cfg: FinetuneConfig, run_id: str) -> dict:
    """Train ``cfg``; returns the run's label, checkpoints, trace parts and seconds."""
    import torch
    from datasets import Dataset
    from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
    from transformers import PrinterCallback
    from transformers.utils import logging as hf_logging

    from pipeline.embedding.devices import pick_device

    check_fresh(store, cfg)
    store.write_bytes_atomic(f"{trace_dir(cfg.label())}/{RUN_FILE}", json.dumps(
        {**cfg.model_dump(mode="json"), "run": cfg.label(), "learning_rate": cfg.lr, "run_id": run_id,
         "split": {"seed": SPLIT_SEED, "test_fraction": TEST_FRACTION}}, indent=1).encode())
    hf_logging.disable_progress_bar()  # loading and saving bars, once per checkpoint: the CLI reports progress
    torch.set_num_threads(settings.torch_threads())
    device = pick_device(settings.device)
    model = load_model(cfg, device)
    pairs = reverse_dictionary_pairs("train")
    data = Dataset.from_dict({"anchor": pairs["definition"].to_list(), "positive": pairs["word"].to_list()})
    recorder = TraceRecorder(cfg.label(), trace_sample(cfg.trace_nouns, cfg.trace_definitions, cfg.seed))
    out = cfg.checkpoint_folder()
    out.mkdir(parents=True, exist_ok=True)
    log = {"checkpoints": [], "trace_parts": [], "trace_rows": 0, "trace_s": 0.0, "save_s": 0.0}
    t = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="normaudit-trainer-") as scratch:  # the trainer's own output: unused
        args = SentenceTransformerTrainingArguments(
            output_dir=scratch, max_steps=cfg.steps, per_device_train_batch_size=cfg.batch_size,
            learning_rate=cfg.lr, weight_decay=cfg.weight_decay,
            optim="adamw_torch" if cfg.optimizer == "adamw" else "sgd",
            lr_scheduler_type="constant", warmup_steps=0, seed=cfg.seed, data_seed=cfg.seed,
            dataloader_drop_last=True, batch_sampler="no_duplicates",  # a duplicate would be its own negative
            save_strategy="no", eval_strategy="no", logging_strategy="no", report_to="none",
            disable_tqdm=True, use_cpu=device == "cpu",
        )
        trainer = SentenceTransformerTrainer(
            model=model, args=args, train_dataset=data, loss=MultipleNegativesRankingLoss(model),
            callbacks=[_callback(cfg, store, run_id, recorder, out, log)],
        )
        trainer.remove_callback(PrinterCallback)  # it prints the trainer's metrics dict; the summary has them
        result = trainer.train()
    total = time.perf_counter() - t
    return {
        "run": cfg.label(), "model": cfg.model, "optimizer": cfg.optimizer, "lr": cfg.lr,
        "weight_decay": cfg.weight_decay, "steps": cfg.steps, "batch_size": cfg.batch_size, "seed": cfg.seed,
        "split": {"seed": SPLIT_SEED, "test_fraction": TEST_FRACTION, "train_pairs": pairs.height},
        "train_loss": float(result.training_loss), "device": device, "folder": str(out),
        "checkpoints": log["checkpoints"], "trace_parts": log["trace_parts"], "trace_rows": log["trace_rows"],
        "seconds": {"total": total, "trace": log["trace_s"], "checkpoints": log["save_s"],
                    "train": total - log["trace_s"] - log["save_s"]},
    }

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
is the decoupled weight decay practitioners use. By default both use the trainer's parameter groups, which
exempt biases and LayerNorm weights from decay (docs/theory.md, "A real encoder", says what that does);
``decay_norms`` decays every parameter, LayerNorm weights and biases included, so the decay acts on the
parameters that set the output's scale (MiniLM's pooled output comes straight from its last LayerNorm).
It is done the way the trainer documents: a subclass overriding ``get_decay_parameter_names``.

``pairs="shuffled"`` is the control arm: the same definitions matched to a seeded permutation of the
lemmas, so the loss, the batches' texts and the optimizer are the same and only the semantics are gone.

The trace (:class:`~pipeline.theory.trace.TraceEncoder`) is one no-grad forward of the pre-tokenized,
length-bucketed sample after each traced step, in the training process; its seconds are reported so the
CLI can print its share of the wall time.

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
from pipeline.progress import step_reporter
from pipeline.quality.gates import gate_trace_part, trace_dir
from pipeline.settings import Settings
from pipeline.storage.store import Store
from pipeline.theory.trace import TRACE_KINDS, TraceEncoder, TraceRecorder, trace_sample

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
    # Sized to the cost: on a CPU one traced forward of N short texts costs about what a training step of N/4
    # pairs does (450 items: 0.95 s a step beside 1.05 s of training, 45% of the default run's wall time);
    # 180 items keep the trace near a quarter of it. Raise both for a GPU or a finer formula score.
    trace_nouns: int = Field(120, ge=1)
    trace_definitions: int = Field(60, ge=1)
    max_seq_length: int = Field(64, ge=8, description="tokens per text while training (definitions are short)")
    decay_norms: bool = Field(False, description="decay LayerNorm weights and biases too (default: the trainer's "
                                                 "groups, which exempt them)")
    pairs: Literal["semantic", "shuffled"] = Field(
        "semantic", description="shuffled: definitions matched to a seeded permutation of the lemmas (the control)")
    seed: int = 0

    @property
    def lr(self) -> float:
        return self.learning_rate if self.learning_rate is not None else DEFAULT_LR[self.optimizer]

    def label(self) -> str:
        """The run's label: names its trace folder and, by default, its checkpoint folder."""
        if self.run is not None:
            return check_name(self.run, "run label")
        base = Path(self.model).name if "/" in self.model else self.model
        tags = ("-decaynorms" if self.decay_norms else "") + ("-shuffled" if self.pairs == "shuffled" else "")
        return check_name(f"{base}-{self.optimizer}{tags}-s{self.seed}", "run label")

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


def training_pairs(cfg: FinetuneConfig):
    """``(definition, lemma)`` training pairs of the train split; permuted lemmas for ``pairs="shuffled"``."""
    import numpy as np
    import polars as pl

    pairs = reverse_dictionary_pairs("train")
    if cfg.pairs == "shuffled":  # same texts, same loss; which lemma goes with which definition is random
        perm = np.random.default_rng([cfg.seed, 20261204]).permutation(pairs.height)
        pairs = pairs.with_columns(pl.Series("word", pairs["word"].to_numpy()[perm]))
    return pairs


def _trainer_class(decay_norms: bool):
    """sentence-transformers' trainer, through the hooks it documents for subclasses.

    ``add_model_card_callback`` is a no-op: the model-card callback's only work here would be a pass over the
    training data for widget examples of a card nobody reads ("Computing widget examples"); checkpoints still
    get sentence-transformers' default card. With ``decay_norms`` every parameter is in the decayed group.
    """
    from sentence_transformers import SentenceTransformerTrainer

    class FinetuneTrainer(SentenceTransformerTrainer):
        def add_model_card_callback(self, default_args_dict):
            return None

        def get_decay_parameter_names(self, model):
            if decay_norms:
                return [name for name, _ in model.named_parameters()]
            return super().get_decay_parameter_names(model)

    return FinetuneTrainer


def _callback(cfg: FinetuneConfig, store: Store, run_id: str, recorder: TraceRecorder, encoder: TraceEncoder,
              out: Path, log: dict):
    from transformers import TrainerCallback

    progress = step_reporter()

    class CheckpointAndTrace(TrainerCallback):
        """Trace every ``trace_every`` steps; every ``checkpoint_every`` save the model and write the trace."""

        lr = 0.0

        def _trace(self, step: int, model) -> None:
            t = time.perf_counter()
            recorder.record(step, encoder.vectors(), self.lr)
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
            progress.start(f"fine-tune {cfg.label()}", cfg.steps)

        def on_step_begin(self, args, state, control, optimizer=None, **kwargs):
            self.lr = float(optimizer.param_groups[0]["lr"])  # the rate this step runs with

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:  # logged every step (after on_step_end): the loss of the step just taken
                progress.update(state.global_step, loss=float(logs["loss"]))

        def on_step_end(self, args, state, control, model=None, **kwargs):
            step, last = state.global_step, state.global_step >= cfg.steps
            if step % cfg.trace_every == 0 or last:
                self._trace(step, model)
            if step % cfg.checkpoint_every == 0 or last:
                self._checkpoint(step, model)

        def on_train_end(self, args, state, control, **kwargs):
            progress.finish()

    return CheckpointAndTrace()


def finetune(settings: Settings, store: Store, cfg: FinetuneConfig, run_id: str, callbacks: tuple = ()) -> dict:
    """Train ``cfg``; returns the run's label, checkpoints, trace parts, decay groups and seconds.

    ``callbacks``: further ``transformers.TrainerCallback`` instances for the trainer (e.g.
    :func:`pipeline.theory.rotational.module_norm_recorder`, which records every parameter's norm each step).

    ``seconds`` holds ``total`` (this function, model loading included), ``load``, ``train``, ``trace``
    (tokenizing the sample once and every traced forward) and ``checkpoints`` (saving and gating).
    """
    import torch
    from datasets import Dataset
    from sentence_transformers import SentenceTransformerTrainingArguments
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
    from transformers import PrinterCallback

    from pipeline.embedding.devices import pick_device

    t0 = time.perf_counter()
    check_fresh(store, cfg)
    store.write_bytes_atomic(f"{trace_dir(cfg.label())}/{RUN_FILE}", json.dumps(
        {**cfg.model_dump(mode="json"), "run": cfg.label(), "learning_rate": cfg.lr, "run_id": run_id,
         "split": {"seed": SPLIT_SEED, "test_fraction": TEST_FRACTION}}, indent=1).encode())
    torch.set_num_threads(settings.torch_threads())
    device = pick_device(settings.device)
    model = load_model(cfg, device)
    pairs = training_pairs(cfg)
    data = Dataset.from_dict({"anchor": pairs["definition"].to_list(), "positive": pairs["word"].to_list()})
    recorder = TraceRecorder(cfg.label(), trace_sample(cfg.trace_nouns, cfg.trace_definitions, cfg.seed))
    out = cfg.checkpoint_folder()
    out.mkdir(parents=True, exist_ok=True)
    log = {"checkpoints": [], "trace_parts": [], "trace_rows": 0, "trace_s": 0.0, "save_s": 0.0}
    t = time.perf_counter()
    encoder = TraceEncoder(model, recorder.texts)
    log["trace_s"] += time.perf_counter() - t
    load_s = t - t0
    with tempfile.TemporaryDirectory(prefix="normaudit-trainer-") as scratch:  # the trainer's own output: unused
        args = SentenceTransformerTrainingArguments(
            output_dir=scratch, max_steps=cfg.steps, per_device_train_batch_size=cfg.batch_size,
            learning_rate=cfg.lr, weight_decay=cfg.weight_decay,
            # fused: the same AdamW update in one kernel per step (on 22.7M parameters the per-tensor loop
            # took 0.15 s of CPU a step, a fifth of a small batch's step; fused 0.025 s)
            optim="adamw_torch_fused" if cfg.optimizer == "adamw" else "sgd",
            lr_scheduler_type="constant", warmup_steps=0, seed=cfg.seed, data_seed=cfg.seed,
            dataloader_drop_last=True, batch_sampler="no_duplicates",  # a duplicate would be its own negative
            save_strategy="no", eval_strategy="no", report_to="none",
            logging_strategy="steps", logging_steps=1,  # each step's loss reaches the callback (the progress bar)
            disable_tqdm=True, use_cpu=device == "cpu",
        )
        trainer = _trainer_class(cfg.decay_norms)(
            model=model, args=args, train_dataset=data, loss=MultipleNegativesRankingLoss(model),
            callbacks=[_callback(cfg, store, run_id, recorder, encoder, out, log), *callbacks],
        )
        trainer.remove_callback(PrinterCallback)  # it prints the trainer's metrics dict; the summary has them
        result = trainer.train()
        groups = trainer.optimizer.param_groups
        decay = {"decayed": sum(p.numel() for g in groups if g["weight_decay"] > 0 for p in g["params"]),
                 "exempt": sum(p.numel() for g in groups if g["weight_decay"] == 0 for p in g["params"])}
    total = time.perf_counter() - t0
    return {
        "run": cfg.label(), "model": cfg.model, "optimizer": cfg.optimizer, "lr": cfg.lr,
        "weight_decay": cfg.weight_decay, "decay_norms": cfg.decay_norms, "pairs": cfg.pairs, "steps": cfg.steps,
        "batch_size": cfg.batch_size, "seed": cfg.seed,
        "split": {"seed": SPLIT_SEED, "test_fraction": TEST_FRACTION, "train_pairs": pairs.height},
        "train_loss": float(result.training_loss), "device": device, "folder": str(out),
        "checkpoints": log["checkpoints"], "trace_parts": log["trace_parts"], "trace_rows": log["trace_rows"],
        "trace_tokens": encoder.padded_tokens, "decay_parameters": decay,
        "seconds": {"total": total, "load": load_s, "trace": log["trace_s"], "checkpoints": log["save_s"],
                    "train": total - load_s - log["trace_s"] - log["save_s"]},
    }

"""Stage 2: task fine-tuning of the whole (converted or softmax) model.

A plain ``accelerate`` training loop (one CPU, one GPU, or ``accelerate launch`` over many):
AdamW with a warmup/decay schedule, evaluation on the dev (selection) split after every epoch,
early stopping on the task's dev metric, the best weights kept on disk and restored at the end,
optional gradient accumulation, and an atomically written resumable checkpoint every N
optimizer steps and after every epoch (a run restarted with the same folder continues from it,
mid-epoch included, with the same result as an uninterrupted run).

Recipes (every field overridable):

- ``glue`` — LUNA §10.2 (BERT on GLUE): AdamW, batch 8, lr 1e-5, weight decay 0, up to 10
  epochs, early stopping with patience 3 on the dev metric.
- ``vit`` — LUNA §10.3 (ViT-B/16): AdamW, cosine schedule with warmup, weight decay 0.05; the
  training transforms carry the augmentation (``linearize.data.build_image_transforms``).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

from ..distill.stage1 import (_Throughput, _append_jsonl, _clear, _mean_over_processes, _micro_batches, _progress,
                              _scheduler, _truncate_jsonl, make_accelerator)
from ..distill.losses import logit_distillation
from ..errors import LinearizeError


@dataclass
class FinetuneConfig:
    """Stage-2 hyperparameters (defaults: the ``glue`` recipe)."""

    lr: float = field(default=1e-5, metadata={"help": "AdamW learning rate."})
    batch_size: int = field(default=8, metadata={"help": "Training batch size (per process)."})
    eval_batch_size: int = field(default=64, metadata={"help": "Evaluation batch size."})
    epochs: float = field(default=10.0, metadata={"help": "Maximum number of epochs."})
    max_steps: int | None = field(default=None, metadata={"help": "Stop after this many steps (overrides epochs)."})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay."})
    scheduler: str = field(default="linear", metadata={"help": "linear | cosine | constant."})
    warmup_ratio: float = field(default=0.0, metadata={"help": "Fraction of steps of linear warmup."})
    patience: int = field(default=3, metadata={"help": "Early stopping: epochs without dev improvement (0 = off)."})
    max_grad_norm: float = field(default=1.0, metadata={"help": "Gradient clipping norm (0 = off)."})
    seed: int = field(default=0, metadata={"help": "Random seed."})
    mixed_precision: str = field(default="no", metadata={"help": "no | fp16 (GPU only) | bf16 (accelerate)."})
    kd_weight: float = field(default=0.0, metadata={
        "help": "Weight a of a distillation term toward a teacher's outputs: loss = (1-a)*task + a*KD (0 = off)."})
    kd_temperature: float = field(default=2.0, metadata={"help": "Temperature of that distillation term."})
    gradient_accumulation_steps: int = field(default=1, metadata={
        "help": "Micro-batches per optimizer step (effective batch = batch size × this × processes)."})
    checkpoint_every: int = field(default=200, metadata={
        "help": "Save a resumable checkpoint every N optimizer steps (and at every epoch end; 0 = epoch ends only)."})

    def to_dict(self):
        return asdict(self)


RECIPES = {
    "glue": FinetuneConfig(),
    "vit": FinetuneConfig(lr=5e-5, batch_size=64, epochs=10, weight_decay=0.05, scheduler="cosine",
                          warmup_ratio=0.1, patience=3),
}


def recipe(name, **overrides):
    if name not in RECIPES:
        raise LinearizeError(f"unknown fine-tuning recipe {name!r}; valid: {', '.join(RECIPES)}")
    return replace(RECIPES[name], **overrides)


@torch.no_grad()
def predict(model, loader, device=None, max_batches=None, description=None):
    """``(logits [N, C], labels [N])`` of ``model`` over ``loader`` (numpy, float32/int); with a
    ``description``, a progress bar."""
    was_training = model.training
    model.eval()
    device = device or next(model.parameters()).device
    all_logits, all_labels = [], []
    total = len(loader) if max_batches is None else min(len(loader), max_batches)
    bar = _progress(total, 0, description, description is not None)
    for step, batch in enumerate(loader):
        if max_batches is not None and step >= max_batches:
            break
        labels = batch.get("labels", batch.get("label"))
        inputs = {k: v.to(device) for k, v in batch.items() if k not in ("labels", "label", "idx")}
        logits = model(**inputs).logits
        all_logits.append(logits.float().cpu())
        if labels is not None:
            all_labels.append(labels.cpu())
        bar.update(step + 1)
    bar.close()
    model.train(was_training)
    logits = torch.cat(all_logits).numpy() if all_logits else np.zeros((0, 0), np.float32)
    labels = torch.cat(all_labels).numpy() if all_labels else None
    return logits, labels


def evaluate(model, loader, task, device=None, max_batches=None, description=None):
    """The task's metrics (``linearize.metrics``) of ``model`` on one split (``description``: show
    a progress bar)."""
    from ..metrics import compute_metrics

    logits, labels = predict(model, loader, device, max_batches, description)
    if labels is None:
        raise LinearizeError("the evaluation split has no labels")
    return compute_metrics(task, logits, labels)


def finetune(model, train_loader, eval_loader, task, output_dir, *, config=None, resume=True, accelerator=None,
             teacher=None, progress=True, log=print):
    """Fine-tune ``model`` in place on ``train_loader``; select on ``eval_loader`` (the dev split).

    ``task``: a ``TaskSpec`` or task name (its primary metric is maximised). The best weights
    (by the dev metric) are restored before returning. ``output_dir`` holds the resumable state:
    a checkpoint every ``config.checkpoint_every`` optimizer steps and at every epoch end, the
    best weights (``best.pt``) and ``metrics.jsonl`` (one line per step and one per epoch). A run
    started with the same folder continues from its last checkpoint, mid-epoch included, exactly
    as an uninterrupted run would (``resume=False``: start afresh, clearing that state).
    ``teacher``: with ``config.kd_weight > 0``, a frozen model whose outputs on the same batch
    the loss also matches (:func:`linearize.distill.losses.logit_distillation`).
    Returns ``{best_metric, dev_metrics, history, epochs_run, steps, seconds, resumed, config}``.
    """
    from accelerate.utils import set_seed

    from ..metrics import is_regression, primary_metric

    config = config or FinetuneConfig()
    accelerator = accelerator or make_accelerator(config.mixed_precision, config.seed)
    set_seed(config.seed)
    primary = primary_metric(task)
    output_dir = Path(output_dir)
    best_path, meta_path = output_dir / "best.pt", output_dir / "progress.json"
    metrics_path = output_dir / "metrics.jsonl" if accelerator.is_main_process else None
    if not resume:
        _clear(accelerator, [meta_path, best_path, output_dir / "metrics.jsonl", *output_dir.glob("state*"),
                             *output_dir.glob(".state*")], log)

    if config.kd_weight and teacher is None:
        raise LinearizeError("kd_weight > 0 needs the softmax teacher to distil from (pass --teacher)")
    if config.kd_weight:
        teacher.to(accelerator.device).eval()
        regression = is_regression(task)
    for p in model.parameters():
        p.requires_grad_(True)
    loader = accelerator.prepare(train_loader)  # this process's share of the batches
    accumulation = max(1, config.gradient_accumulation_steps)
    steps_per_epoch = math.ceil(len(loader) / accumulation)
    total = config.max_steps or max(1, math.ceil(config.epochs * steps_per_epoch))
    epochs = math.ceil(total / steps_per_epoch)
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (no_decay if p.ndim < 2 or "norm" in name.lower() else decay).append(p)
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": config.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=config.lr)
    # not passed to prepare(): accelerate would step it once per process at every step
    scheduler = _scheduler(config.scheduler, optimizer, int(config.warmup_ratio * total), total)
    model, optimizer = accelerator.prepare(model, optimizer)
    accelerator.register_for_checkpointing(scheduler)

    # epoch = finished epochs; epoch_step and running = optimizer steps and their loss sum in the current one
    meta = {"epoch": 0, "step": 0, "epoch_step": 0, "running": 0.0, "best_metric": None, "best_epoch": None,
            "stale": 0, "history": [], "seconds": 0.0, "state": None}
    saved = json.loads(meta_path.read_text()) if meta_path.is_file() else None
    resumed = saved is not None and (output_dir / (saved.get("state") or "state")).is_dir()
    if resumed:
        meta.update(saved)
        accelerator.load_state(str(output_dir / (meta["state"] or "state")))  # "state": folders of older versions
        log(f"stage 2 resumed at step {meta['step']}/{total} (epoch {meta['epoch'] + 1}) from {output_dir}")
    _truncate_jsonl(metrics_path, meta["step"])  # lines of steps a killed run logged after its last checkpoint
    start = time.perf_counter() - meta["seconds"]
    bar = _progress(total, meta["step"], "fine-tuning", progress and accelerator.is_main_process)
    device = accelerator.device
    while meta["epoch"] < epochs and meta["step"] < total and not (config.patience and meta["stale"] >= config.patience):
        model.train()
        if hasattr(loader, "set_epoch"):
            loader.set_epoch(meta["epoch"])
        speed, step_loss = _Throughput(accelerator.num_processes), 0.0
        for batch, window, boundary in _micro_batches(accelerator, loader, accumulation, meta["epoch_step"]):
            # gradients are only all-reduced (several processes) on the step's last micro-batch
            with contextlib.nullcontext() if boundary else accelerator.no_sync(model):
                with accelerator.autocast():
                    outputs = model(**{k: v for k, v in batch.items() if k != "idx"})
                    loss = outputs.loss
                    if config.kd_weight:
                        with torch.no_grad():
                            target = teacher(**{k: v for k, v in batch.items()
                                                if k not in ("idx", "labels", "label")}).logits
                        loss = (1 - config.kd_weight) * loss + config.kd_weight * logit_distillation(
                            outputs.logits, target, config.kd_temperature, regression)
                accelerator.backward(loss / window)
            step_loss += loss.item() / window
            speed.add(batch)
            if not boundary:
                continue
            (step_loss,) = _mean_over_processes(accelerator, [step_loss])
            if not math.isfinite(step_loss):
                bar.close()
                raise LinearizeError(f"fine-tuning: the loss is {step_loss} at step {meta['step'] + 1}; stopped "
                                     f"before applying it (the last good checkpoint is kept in {output_dir}): "
                                     "lower --lr")
            if config.max_grad_norm:
                accelerator.clip_grad_norm_(model.parameters(), config.max_grad_norm)
            optimizer.step()
            if not optimizer.step_was_skipped:  # fp16: the scaler skipped a step with inf/NaN gradients
                scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            meta["step"] += 1
            meta["epoch_step"] += 1
            meta["running"] += step_loss
            _append_jsonl(metrics_path, {"step": meta["step"], "epoch": meta["epoch"] + 1, "loss": step_loss,
                                         "lr": scheduler.get_last_lr()[0], "examples_per_second": speed.rate()})
            bar.update(meta["step"], f"epoch {meta['epoch'] + 1} loss {meta['running'] / meta['epoch_step']:.4f}"
                                     f" · {speed.rate():.1f} ex/s")
            step_loss = 0.0
            if meta["step"] >= total:
                break
            if config.checkpoint_every and meta["step"] % config.checkpoint_every == 0 \
                    and meta["epoch_step"] < steps_per_epoch:  # the epoch's last step is saved below
                meta["seconds"] = time.perf_counter() - start
                _save_checkpoint(accelerator, output_dir, meta)
        meta["epoch"] += 1
        metrics = evaluate(accelerator.unwrap_model(model), eval_loader, task, device,
                           description="  dev evaluation" if progress and accelerator.is_main_process else None)
        entry = {"epoch": meta["epoch"], "step": meta["step"],
                 "train_loss": meta["running"] / max(meta["epoch_step"], 1), "lr": scheduler.get_last_lr()[0],
                 "examples_per_second": speed.rate(), **{f"dev_{k}": v for k, v in metrics.items()}}
        meta["history"].append(entry)
        meta.update(epoch_step=0, running=0.0)
        _append_jsonl(metrics_path, entry)
        score = metrics[primary]
        if meta["best_metric"] is None or score > meta["best_metric"]:
            meta.update(best_metric=score, best_epoch=meta["epoch"], stale=0)
            if accelerator.is_main_process:
                _atomic_torch_save(accelerator.unwrap_model(model).state_dict(), best_path)
        else:
            meta["stale"] += 1
        meta["seconds"] = time.perf_counter() - start
        _save_checkpoint(accelerator, output_dir, meta)
        log(f"epoch {meta['epoch']}: train loss {entry['train_loss']:.4f}, dev {primary} {score:.4f}"
            f" (best {meta['best_metric']:.4f} at epoch {meta['best_epoch']})")
    bar.close()
    accelerator.wait_for_everyone()
    unwrapped = accelerator.unwrap_model(model)
    if best_path.is_file():
        unwrapped.load_state_dict(torch.load(best_path, map_location=device, weights_only=True))
    dev = evaluate(unwrapped, eval_loader, task, device)
    return {"best_metric": meta["best_metric"], "best_epoch": meta["best_epoch"], "primary_metric": primary,
            "dev_metrics": dev, "history": meta["history"], "epochs_run": meta["epoch"], "steps": meta["step"],
            "seconds": time.perf_counter() - start, "resumed": resumed, "config": config.to_dict()}


def _save_checkpoint(accelerator, output_dir, meta):
    """Save the resumable state atomically (every process takes part).

    ``accelerator.save_state`` fills a temporary folder, which is renamed to
    ``state-<epoch>-<step>``; then ``progress.json`` (``meta``), replaced atomically, names it: that
    is the commit point. Older state folders are removed last, so a run killed at any moment
    leaves a ``progress.json`` naming a complete state.
    """
    from ..io import atomic_write_json

    name = f"state-{meta['epoch']}-{meta['step']}"
    tmp, final = output_dir / f".{name}.tmp", output_dir / name
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)  # left by a run killed while saving
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp))
    accelerator.wait_for_everyone()
    meta["state"] = name
    if accelerator.is_main_process:
        shutil.rmtree(final, ignore_errors=True)  # renamed but never committed by a killed run
        os.replace(tmp, final)
        atomic_write_json(output_dir / "progress.json", meta)
        for old in [*output_dir.glob("state*"), *output_dir.glob(".state*")]:
            if old.name != name:
                shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()


def _atomic_torch_save(obj, path):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(obj, tmp)
    tmp.replace(path)

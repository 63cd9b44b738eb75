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
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from ..config import FinetuneConfig  # the stage-2 settings live in linearize.config
from ..distill.losses import logit_distillation
from ..errors import LinearizeError
from ..evaluation import evaluate, predict
from ..report.results import StageResult
from ..training import Trainer, atomic_torch_save, make_accelerator, on_main_process


RECIPES = {
    "glue": FinetuneConfig(),
    "vit": FinetuneConfig(lr=5e-5, batch_size=64, epochs=10, weight_decay=0.05, scheduler="cosine",
                          warmup_ratio=0.1, patience=3),
}


def recipe(name, **overrides):
    if name not in RECIPES:
        raise LinearizeError(f"unknown fine-tuning recipe {name!r}; valid: {', '.join(RECIPES)}")
    return replace(RECIPES[name], **overrides)


BEST_FILE = "best.pt"  # the best weights so far (by the dev metric) in ``output_dir``
#: what a checkpoint keeps of a fine-tuning run beside the trainer's step, epoch, history and time
RUN_STATE = ("epoch_step", "running", "stale", "best_metric", "best_epoch", "initial_metric", "initial_margin")


def finetune(model, train_loader, eval_loader, task, output_dir, *, config=None, resume=True, accelerator=None,
             teacher=None, progress=True, log=print, initial_candidate=False, initial_metrics=None):
    """Fine-tune ``model`` in place on ``train_loader``; select on ``eval_loader`` (the dev split).

    ``task``: a ``TaskSpec`` or task name (its primary metric is maximised). The best weights
    (by the dev metric) are restored before returning. ``output_dir`` holds the resumable state:
    a checkpoint every ``config.checkpoint_every`` optimizer steps and at every epoch end, the
    best weights (``best.pt``) and ``metrics.jsonl`` (one line per step and one per epoch). A run
    started with the same folder continues from its last checkpoint, mid-epoch included, exactly
    as an uninterrupted run would (``resume=False``: start afresh, clearing that state).
    ``teacher``: with ``config.kd_weight > 0``, a frozen model whose outputs on the same batch
    the loss also matches (:func:`linearize.distill.losses.logit_distillation`).
    ``initial_candidate``: ``model`` as it is given (all of it, the head included; in the
    pipeline the stage-1 student) competes as epoch 0: it is scored on the dev split before the
    first step (``initial_metrics``: its dev metrics, already measured, reused for the score) and
    is the model returned unless an epoch scores above its score less a margin,
    ``config.stage1_margin`` standard errors of its dev metric (its dev predictions are taken for
    that; margin 0: an epoch must score strictly higher, a tie keeps the earlier candidate). Once
    an epoch is kept, later epochs must beat it outright; early stopping counts from epoch 0 too.
    Returns a :class:`~linearize.report.StageResult`: ``best_metric``, ``best_epoch`` (0: the
    initial model), ``initial_metric`` (its dev score, or None), ``history``, ``steps``,
    ``seconds``, and in ``extra`` ``primary_metric``, ``dev_metrics``, ``epochs_run``,
    ``resumed``, ``stage1_margin`` (the margin in the metric's units, or None) and ``config``.
    """
    from accelerate.utils import set_seed

    from ..metrics import primary_metric

    config = config or FinetuneConfig()
    accelerator = accelerator or make_accelerator(config.mixed_precision, config.seed, config.report_to, output_dir)
    set_seed(config.seed)
    primary = primary_metric(task)
    output_dir = Path(output_dir)
    best_path = output_dir / BEST_FILE
    task_loss = _task_loss(config, task, teacher, accelerator.device, train_loader)
    _freeze_all_but_trained(model, config.trainable)
    trainer = Trainer(accelerator, train_loader, config, loss_name="fine-tuning: the loss",
                      checkpoint_note=f" in {output_dir}")
    model = trainer.prepare(_optimizer(model, config), model)
    run = _FineTuning(model, trainer, task_loss, output_dir, log, resume)
    description = "  dev evaluation" if progress and accelerator.is_main_process else None
    if initial_candidate and not run.resumed:  # a resumed run keeps its candidate (its checkpoint, best.pt)
        with _rng_kept(accelerator.device):  # scoring it leaves the training's random draws as they were
            score, margin = _initial_candidate(accelerator.unwrap_model(model), eval_loader, task, primary, config,
                                               initial_metrics, accelerator.device, description)
        run.start(score, margin, primary)
    trainer.begin(run.meta["step"], run.meta["seconds"], "fine-tuning", progress, output_dir)
    while run.continues():
        run.train_epoch()
        metrics = evaluate(accelerator.unwrap_model(model), eval_loader, task, accelerator.device,
                           description=description)
        run.end_epoch(metrics, primary)
    trainer.close()
    unwrapped = accelerator.unwrap_model(model)
    unwrapped.requires_grad_(True)  # the model leaves as it came: every weight trainable
    if best_path.is_file():
        unwrapped.load_state_dict(torch.load(best_path, map_location="cpu", weights_only=True))
    dev = evaluate(unwrapped, eval_loader, task, accelerator.device)
    return _result(run, trainer.seconds, primary, dev, config)


def _initial_candidate(model, loader, task, primary, config, metrics, device, description):
    """``(score, margin)`` of ``model`` competing as epoch 0: its dev ``primary`` score (from
    ``metrics``, its dev metrics, when given; else measured) and the lead over an epoch it needs
    to be kept, ``config.stage1_margin`` standard errors of that score
    (:func:`linearize.metrics.standard_error` on its dev predictions, taken when the margin is on)."""
    from ..metrics import compute_metrics, standard_error

    if not config.stage1_margin:
        return (metrics or evaluate(model, loader, task, device, description=description))[primary], 0.0
    logits, labels = predict(model, loader, device, description=description, task=task)
    score = (metrics or compute_metrics(task, logits, labels))[primary]
    return score, config.stage1_margin * standard_error(task, logits, labels, primary)


def _result(run, seconds, primary, dev, config):
    """The :class:`StageResult` of a finished fine-tuning ``run`` (its best model restored, which
    scores ``dev`` on the dev split)."""
    meta = run.meta
    return StageResult(best_metric=meta["best_metric"], best_epoch=meta["best_epoch"],
                       initial_metric=meta.get("initial_metric"), history=meta["history"], steps=meta["step"],
                       seconds=seconds, extra={"primary_metric": primary, "dev_metrics": dev, "epochs_run": meta["epoch"],
                                               "resumed": run.resumed, "stage1_margin": meta.get("initial_margin"),
                                               "config": config.to_dict()})


def _rng_kept(device):
    """A context after which torch's random generators (CPU, and ``device``'s when a GPU) are as
    before it: a data loader draws its seed from them when it starts iterating."""
    return torch.random.fork_rng(devices=[device.index or 0] if device.type == "cuda" else [])


def _task_loss(config, task, teacher, device, train_loader=None):
    """``loss(model, batch)``: the model's own task loss; with ``config.kd_weight`` ``a``,
    ``(1-a)·task + a·KD`` toward ``teacher``'s outputs (moved to ``device``) on the same batch. An
    embedding task's loss is the distance of the embeddings to the teacher's (its labels): :func:`_embedding_loss`
    (``train_loader``: the training split, whose labels are the similarity term's anchors with
    ``similarity_anchors: train``). A term the task cannot take is a one-line error (``FinetuneConfig.check_task_loss``)."""
    is_embedding = getattr(task, "is_embedding", False)
    config.check_task_loss(is_embedding)
    if is_embedding:  # the labels are the teacher's embeddings
        anchors = None
        if config.similarity_weight and config.similarity_anchors == "train":
            anchors = torch.tensor(train_loader.dataset["label"][:], dtype=torch.float32, device=device)
        return _embedding_loss(config, task, anchors)
    if config.kd_weight and teacher is None:
        raise LinearizeError("kd_weight > 0 needs the softmax teacher to distil from (pass --teacher)")
    if not config.kd_weight:
        return lambda model, batch: model(**{k: v for k, v in batch.items() if k != "idx"}).loss
    from ..metrics import is_regression

    teacher.to(device).eval()
    regression = is_regression(task)

    def loss(model, batch):
        outputs = model(**{k: v for k, v in batch.items() if k != "idx"})
        with torch.no_grad():
            target = teacher(**{k: v for k, v in batch.items() if k not in ("idx", "labels", "label")}).logits
        return (1 - config.kd_weight) * outputs.loss + config.kd_weight * logit_distillation(
            outputs.logits, target, config.kd_temperature, regression)

    return loss


def _embedding_loss(config, task, anchors=None):
    """``loss(model, batch)`` of an embedding student: the MSE to the teacher's embeddings (the batch's labels),
    plus ``config.similarity_weight`` times the similarity term (:mod:`linearize.embeddings`) over ``anchors``
    (the training split's teacher embeddings; None: the batch's)."""
    from ..embeddings import distillation_loss, embed, similarity_distillation_loss

    def loss(model, batch):
        student = embed(model, batch, task.embedding)
        value = distillation_loss(student, batch["labels"])
        if config.similarity_weight:
            value = value + config.similarity_weight * similarity_distillation_loss(
                student, batch["labels"], config.similarity_temperature, anchors)
        return value

    return loss


def _freeze_all_but_trained(model, trainable):
    """Let only the parameters stage 2 trains require a gradient (``trainable``: all, or attention:
    the converted attention's own, :func:`~linearize.convert.feature_maps_of`). Attention on a
    model without converted attention is one line."""
    from ..convert import feature_maps_of

    model.requires_grad_(trainable == "all")
    if trainable == "all":
        return
    trained = [p for fm in feature_maps_of(model).values() for p in fm.parameters()]
    if not trained:
        raise LinearizeError("trainable=attention: the model has no converted attention with weights to train "
                             "(a softmax model, or a method without learnable feature maps); use trainable=all")
    for p in trained:
        p.requires_grad_(True)


def _reaching_trained_weights(loss, model):
    """``loss``, joined to the trained weights by a zero term when no trained weight took part in it: with
    ``trainable: attention`` a batch whose every sequence fits inside a hybrid window runs exact softmax in
    every layer, so no feature map is used. Its step then adds zero gradients (every process of a launcher
    still takes part in the gradients' all-reduce) instead of failing in ``backward``."""
    if loss.requires_grad:
        return loss
    return loss + sum(p.sum() for p in model.parameters() if p.requires_grad) * 0.0


def _optimizer(model, config):
    """AdamW over the parameters that require a gradient, with ``config.weight_decay`` on the
    weight matrices and none on biases and norms."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (no_decay if p.ndim < 2 or "norm" in name.lower() else decay).append(p)
    return torch.optim.AdamW([{"params": decay, "weight_decay": config.weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}], lr=config.lr)


class _FineTuning:
    """One fine-tuning run between its optimizer steps: the prepared ``model``, its ``trainer``
    and ``meta``, the run's own resumable progress, saved with every checkpoint of the trainer
    (``step``, ``epoch``: finished epochs, ``history`` and ``seconds`` as its own fields, the rest
    as its ``extra`` values: ``epoch_step`` and ``running``, the optimizer steps and their loss
    sum in the current epoch; ``stale``, epochs since the dev metric last improved;
    ``best_metric`` and ``best_epoch``; ``initial_metric``, the dev score of the model before any
    step when it competes, epoch 0, and ``initial_margin``, the lead it needs over an epoch).
    Built from the checkpoint in ``output_dir`` when there is one (``resumed``; ``resume=False``:
    it is deleted first, with the best weights)."""

    def __init__(self, model, trainer, task_loss, output_dir, log, resume=True):
        self.model, self.trainer, self.task_loss, self.output_dir, self.log = model, trainer, task_loss, output_dir, log
        if not resume:
            trainer.clear_checkpoint(output_dir, log, also=[BEST_FILE])
        self.meta = {"epoch": 0, "step": 0, "epoch_step": 0, "running": 0.0, "best_metric": None, "best_epoch": None,
                     "initial_metric": None, "initial_margin": None, "stale": 0, "history": [], "seconds": 0.0}
        saved = trainer.load_checkpoint(output_dir, log)
        self.resumed = saved is not None
        if self.resumed:
            self.meta.update(saved.extra, step=saved.step, epoch=saved.epoch, history=saved.history,
                             seconds=saved.seconds)
            log(f"fine-tuning resumed at step {self.meta['step']}/{trainer.total} (epoch {self.meta['epoch'] + 1}) "
                f"from {output_dir}")

    def start(self, score, margin, primary):
        """Make the model as it is now, before any step, candidate epoch 0 with dev ``score``: its
        weights become ``best.pt``, kept unless an epoch scores above ``score - margin``."""
        self.meta.update(best_metric=score, best_epoch=0, initial_metric=score, initial_margin=margin)
        accelerator = self.trainer.accelerator
        if accelerator.is_main_process:
            atomic_torch_save(accelerator.unwrap_model(self.model).state_dict(), self.output_dir / BEST_FILE)
        accelerator.wait_for_everyone()
        self.log(f"epoch 0 (the model before fine-tuning): dev {primary} {score:.4f}"
                 + (f"; an epoch above {score - margin:.4f} is kept over it (stage2.stage1_margin)" if margin else ""))

    def to_beat(self):
        """The dev score an epoch must exceed to become the best: the best so far, less the
        margin while the best is the initial model (None: no best yet)."""
        meta = self.meta
        if meta["best_metric"] is None:
            return None
        return meta["best_metric"] - ((meta.get("initial_margin") or 0.0) if meta["best_epoch"] == 0 else 0.0)

    def continues(self):
        """Steps and epochs are left and early stopping (``patience``) has not struck."""
        meta, trainer, patience = self.meta, self.trainer, self.trainer.config.patience
        return meta["epoch"] < trainer.epochs and meta["step"] < trainer.total and \
            not (patience and meta["stale"] >= patience)

    def train_epoch(self):
        """The current epoch's optimizer steps from ``meta["epoch_step"]`` on, with a checkpoint every
        ``checkpoint_every`` steps (the epoch's last step is saved by :meth:`end_epoch`)."""
        meta, trainer, accelerator = self.meta, self.trainer, self.trainer.accelerator
        self.model.train()
        trainer.speed.restart()  # stage 2 reports each epoch's throughput
        step_loss = 0.0
        for batch, window, boundary in trainer.epoch(meta["epoch"], meta["epoch_step"]):
            # gradients are only all-reduced (several processes) on the step's last micro-batch
            with contextlib.nullcontext() if boundary else accelerator.no_sync(self.model):
                with accelerator.autocast():
                    loss = _reaching_trained_weights(self.task_loss(self.model, batch), self.model)
                accelerator.backward(loss / window)
            step_loss += loss.item() / window
            if not boundary:
                continue
            (step_loss,) = trainer.finish_step([step_loss], meta["step"] + 1, self.model.parameters())
            meta["step"] += 1
            meta["epoch_step"] += 1
            meta["running"] += step_loss
            trainer.record({"step": meta["step"], "epoch": meta["epoch"] + 1, "loss": step_loss},
                           f"epoch {meta['epoch'] + 1} loss {meta['running'] / meta['epoch_step']:.4f}")
            step_loss = 0.0
            if meta["step"] >= trainer.total:
                break
            if trainer.config.checkpoint_every and meta["step"] % trainer.config.checkpoint_every == 0 \
                    and meta["epoch_step"] < trainer.steps_per_epoch:
                self.save()

    def end_epoch(self, metrics, primary):
        """Close the epoch on its dev ``metrics``: log it, keep the weights (``best.pt``) when
        the ``primary`` metric improved, and save a checkpoint."""
        meta, trainer, accelerator = self.meta, self.trainer, self.trainer.accelerator
        meta["epoch"] += 1
        entry = {"epoch": meta["epoch"], "step": meta["step"],
                 "train_loss": meta["running"] / max(meta["epoch_step"], 1), "lr": trainer.lr,
                 "examples_per_second": trainer.speed.rate(), **{f"dev_{k}": v for k, v in metrics.items()}}
        meta["history"].append(entry)
        meta.update(epoch_step=0, running=0.0)
        trainer.log(entry)
        score = metrics[primary]
        bar = self.to_beat()
        if bar is None or score > bar:
            meta.update(best_metric=score, best_epoch=meta["epoch"], stale=0)
            on_main_process(atomic_torch_save, accelerator.unwrap_model(self.model).state_dict(),
                            self.output_dir / BEST_FILE)
        else:
            meta["stale"] += 1
        self.save()
        self.log(f"epoch {meta['epoch']}: train loss {entry['train_loss']:.4f}, dev {primary} {score:.4f}"
                 f" (best {meta['best_metric']:.4f} at epoch {meta['best_epoch']})")

    def save(self):
        """Save a checkpoint of the run as it is now (the trainer's, with :data:`RUN_STATE` as its extra values)."""
        meta = self.meta
        self.trainer.save_checkpoint(self.output_dir, step=meta["step"], epoch=meta["epoch"], history=meta["history"],
                                     extra={key: meta[key] for key in RUN_STATE})

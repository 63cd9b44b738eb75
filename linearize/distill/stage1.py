"""Stage 1: attention-weight distillation (Hedgehog §4.1; LUNA §10.2; Flexformer Appendix A.3).

Every pretrained weight is frozen; only the feature maps train, on the cross-entropy between
the frozen softmax attention rows and the student's normalised kernel rows (plus, for a map
whose kernel can be negative, the negative-weight penalty of :mod:`linearize.distill.losses`,
weighted by ``DistillConfig.negative_weight_penalty``). Teacher and
student come from ONE forward pass of the converted model: while distillation runs, each
converted layer's ``attend`` is taken over by :class:`DistillRecorder`, which returns the exact
softmax output (so every layer is distilled on the teacher's inputs) and only uses the kernel
path for the loss. Each layer's loss is back-propagated inside the forward pass as soon as it
is computed (the feature maps of one layer only affect that layer's loss), so at most one
layer's N×N maps are alive at a time; a sequence longer than ``DistillConfig.block_size`` goes
block by block of query rows (:mod:`linearize.distill.blockwise`), so not even those.

Trained by :class:`linearize.training.Trainer` on ``accelerate``: one CPU, one GPU, or many
processes (``accelerate launch``). The model itself is not wrapped for data parallelism (its
graph ends inside each layer); the feature-map gradients are averaged across processes by hand
before each optimizer step. With gradient accumulation the gradients of ``k`` micro-batches (each
loss scaled by ``1/k``) add up before one optimizer step; ``step`` always counts optimizer steps.
"""

from __future__ import annotations

from collections import defaultdict
from contextlib import contextmanager

import torch

from ..attention.core import softmax_attention_weights
from ..config import DistillConfig  # the stage-1 settings live in linearize.config
from ..convert.api import feature_maps_of
from ..report.results import StageResult
from ..training import Trainer, make_accelerator
from .blockwise import blockwise_distillation_terms
from .losses import attention_cross_entropy, attention_entropy, negative_weight_mass, output_mse

#: the per-layer statistics of :meth:`DistillRecorder.per_layer`
LAYER_STATISTICS = ("ce", "kl", "teacher_entropy", "student_entropy", "negative_weight_mass")


class DistillRecorder:
    """The ``attend_hook`` of every converted layer during stage 1 (and KL measurement)."""

    def __init__(self, train=False, loss_scale=1.0, output_loss_weight=0.0, backward=None,
                 block_size=DistillConfig.block_size, negative_weight_penalty=0.0):
        self.train = train
        self.loss_scale = loss_scale
        self.output_loss_weight = output_loss_weight
        # λ of the negative-weight penalty; applied only to maps that are not ``nonnegative``
        self.negative_weight_penalty = negative_weight_penalty
        self.block_size = block_size  # longer query sequences go block by block (DistillConfig.block_size)
        # accelerate's backward in training: it scales the loss when fp16 keeps a gradient scaler
        self.backward = backward or torch.Tensor.backward
        self.reset()

    def reset(self):
        self.sums = defaultdict(lambda: defaultdict(float))

    def __call__(self, fm, q, k, v, key_padding_mask, scale, output_attentions):
        if self.block_size and q.shape[2] > self.block_size and not output_attentions:
            return self._blockwise(fm, q, k, v, key_padding_mask, scale), None
        with torch.no_grad():
            teacher = softmax_attention_weights(q, k, key_padding_mask, scale)
            out = (teacher @ v.float()).to(v.dtype)  # exact softmax attention feeds the next layer
        query_mask = key_padding_mask if q.shape[2] == k.shape[2] else None
        penalty = self.penalty_weight(fm)
        with torch.enable_grad() if self.train else torch.no_grad():
            student = fm.attention_weights(q.detach(), k.detach(), key_padding_mask, scale)
            ce = attention_cross_entropy(teacher, student, query_mask)
            mse = output_mse(student @ v.detach().float(), out, query_mask) if self.output_loss_weight else None
            negative = negative_weight_mass(student if penalty else student.detach(), query_mask)
            self._backward(ce, mse, negative, penalty)
        with torch.no_grad():
            h_teacher = attention_entropy(teacher, query_mask)
            h_student = attention_entropy(student.detach().clamp_min(0), query_mask)
        self._record(fm.layer_index, ce, h_teacher, h_student, negative)
        return out, (teacher if output_attentions else None)

    def penalty_weight(self, fm):
        """λ for ``fm``: ``negative_weight_penalty``, or 0 for a map whose weights cannot be negative."""
        return 0.0 if fm.nonnegative else float(self.negative_weight_penalty)

    def _blockwise(self, fm, q, k, v, key_padding_mask, scale):
        """The same loss, statistics and output over blocks of ``block_size`` query rows (memory
        O(block·N), see :mod:`linearize.distill.blockwise`); returns the exact softmax output."""
        penalty = self.penalty_weight(fm)
        with torch.enable_grad() if self.train else torch.no_grad():
            terms = blockwise_distillation_terms(q.detach(), k.detach(), v.detach(), fm, key_padding_mask, scale,
                                                 self.block_size, with_mse=bool(self.output_loss_weight),
                                                 with_negative_grad=bool(penalty))
            self._backward(terms.ce, terms.mse, terms.negative, penalty)
        self._record(fm.layer_index, terms.ce, terms.teacher_entropy, terms.student_entropy, terms.negative)
        return terms.out

    def _backward(self, ce, mse, negative, penalty):
        """In training, backpropagate this layer's loss: the CE, plus the weighted output MSE when on,
        plus ``penalty`` (λ) times the negative-weight mass when λ > 0."""
        loss = ce if mse is None else ce + self.output_loss_weight * mse
        if penalty:
            loss = loss + penalty * negative
        if self.train and loss.requires_grad:
            self.backward(loss * self.loss_scale)

    def _record(self, layer, ce, h_teacher, h_student, negative):
        stats = self.sums[layer]
        stats["ce"] += ce.item()
        stats["kl"] += ce.item() - h_teacher.item()
        stats["teacher_entropy"] += h_teacher.item()
        stats["student_entropy"] += h_student.item()
        stats["negative_weight_mass"] += negative.item()
        stats["count"] += 1

    def per_layer(self):
        """``{layer: {ce, kl, teacher_entropy, student_entropy, negative_weight_mass}}`` averaged over
        recorded calls (``negative_weight_mass``: the penalty term P, whether or not it is weighted)."""
        result = {}
        for layer, stats in sorted(self.sums.items()):
            count = max(stats["count"], 1)
            result[layer] = {key: stats[key] / count for key in LAYER_STATISTICS}
        return result


@contextmanager
def distillation_mode(model, recorder):
    """Route every converted layer's attention through ``recorder`` (restored on exit)."""
    maps = feature_maps_of(model)
    try:
        for index, fm in maps.items():
            fm.layer_index = index
            fm.attend_hook = recorder
        yield maps
    finally:
        for fm in maps.values():
            fm.__dict__.pop("attend_hook", None)


def model_inputs(batch):
    """The forward arguments of a batch (labels dropped: stage 1 needs none)."""
    return {k: v for k, v in batch.items() if k not in ("labels", "label", "idx")}


@torch.no_grad()
def attention_distances(model, loader, max_batches=None, device=None, block_size=DistillConfig.block_size):
    """Per-layer CE, KL and entropies of the student's attention against the teacher's
    (``block_size``: query rows per block for longer sequences, as in training)."""
    recorder = DistillRecorder(train=False, block_size=block_size)
    was_training = model.training
    model.eval()
    device = device or next(model.parameters()).device
    with distillation_mode(model, recorder):
        for step, batch in enumerate(loader):
            if max_batches is not None and step >= max_batches:
                break
            model(**{k: v.to(device) for k, v in model_inputs(batch).items()})
    model.train(was_training)
    return recorder.per_layer()


#: a mean attention KL (nats) at or below which the student's rows are the teacher's up to rounding: e.g. a hybrid
#: whose window covers every input (exact softmax), which stage 1 has nothing to teach
EXACT_KL = 1e-3


def stage1_warning(method, before, after):
    """A one-line warning when stage 1 left the mean attention KL (over layers) no lower than a
    positive start, i.e. the map did not learn the teacher's attention; ``None`` otherwise."""
    kl_before = [row["kl"] for row in before.values() if row.get("kl") is not None]
    kl_after = [row["kl"] for row in after.values() if row.get("kl") is not None]
    if not kl_before or not kl_after:
        return None
    b, a = sum(kl_before) / len(kl_before), sum(kl_after) / len(kl_after)
    if not (a >= b > EXACT_KL):  # None for NaN too, and for a start already at the teacher's attention
        return None
    return (f"stage 1 did not lower the attention KL ({b:.3f} -> {a:.3f}): {method}'s map did not learn this "
            "teacher's attention; try a lower --lr, more epochs, or another method")


def distill(model, train_loader, config=None, *, eval_loader=None, eval_batches=None, checkpoint_dir=None,
            resume=True, accelerator=None, progress=True, log=print):
    """Run stage 1 on a converted model in place; its :class:`~linearize.report.StageResult`.

    ``train_loader`` yields model input dicts (labels are ignored); under several processes
    every process gets its own share of its batches (``accelerator.prepare``), and a step is one
    optimizer step over ``config.gradient_accumulation_steps`` micro-batches of every process.
    ``eval_loader`` (default: the train loader) gives the per-layer CE/KL before and after.
    ``checkpoint_dir``: a resumable checkpoint (the Trainer's format, of the feature maps alone:
    :mod:`linearize.training.checkpoint`) is kept there every ``config.checkpoint_every`` steps
    and at the end, with ``metrics.jsonl`` (one line per step); a run started with the same
    folder resumes where the last one stopped (``resume=False``: start afresh, clearing both).
    """
    from accelerate.utils import set_seed

    config = config or DistillConfig()
    maps = feature_maps_of(model)
    params = [p for fm in maps.values() for p in fm.parameters()]
    method = next(iter(maps.values())).name if maps else None
    eval_loader = eval_loader if eval_loader is not None else train_loader
    accelerator = accelerator or make_accelerator(config.mixed_precision, config.seed, config.report_to, checkpoint_dir)
    set_seed(config.seed)
    model.to(accelerator.device)
    if not params:
        log(f"stage 1 skipped: method {method!r} has no learnable feature-map parameters")
        per_layer = attention_distances(model, eval_loader, eval_batches, accelerator.device, config.block_size)
        return StageResult(skipped=True, reason=f"{method} has no learnable parameters", method=method,
                           per_layer_before=per_layer, per_layer_after=per_layer, steps=0,
                           extra={"config": config.to_dict()})

    model.requires_grad_(False)
    for p in params:
        p.requires_grad_(True)
    before = attention_distances(model, eval_loader, eval_batches, accelerator.device, config.block_size)
    trainer = Trainer(accelerator, train_loader, config, loss_name="stage 1: the attention loss")
    # a checkpoint keeps the feature maps alone: every other weight is frozen
    trainer.prepare(torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay),
                    trained=torch.nn.ModuleDict({str(index): fm for index, fm in maps.items()}))
    step, history, seconds = _resume(trainer, checkpoint_dir, resume, log)
    trainer.begin(step, seconds, "stage 1: attention distillation", progress, checkpoint_dir)
    step = _train_feature_maps(model, maps, params, trainer, checkpoint_dir, step, history)
    seconds = trainer.seconds
    model.requires_grad_(True)
    after = attention_distances(model, eval_loader, eval_batches, accelerator.device, config.block_size)
    warning = stage1_warning(method, before, after)
    if warning:
        log(f"warning: {warning}")
    return StageResult(method=method, steps=step, seconds=seconds, history=history, per_layer_before=before,
                       per_layer_after=after, extra={"config": config.to_dict()})


def _resume(trainer, checkpoint_dir, resume, log):
    """``(step, history, seconds)`` of the checkpoint in ``checkpoint_dir`` (``None``: none kept),
    whose feature maps, optimizer and schedule the Trainer restores; ``(0, [], 0.0)`` without one
    (``resume=False``: the checkpoint and its ``metrics.jsonl`` are deleted first)."""
    if not resume:
        trainer.clear_checkpoint(checkpoint_dir, log)
    saved = trainer.load_checkpoint(checkpoint_dir, log)
    if saved is None:
        return 0, [], 0.0
    log(f"stage 1 resumed at step {saved.step}/{trainer.total} from {checkpoint_dir}")
    return saved.step, saved.history, saved.seconds


def _train_feature_maps(model, maps, params, trainer, checkpoint_dir, step, history):
    """Stage 1's optimizer steps from ``step`` on (``history`` gains one entry per step), with a
    checkpoint in ``checkpoint_dir`` (if any) every ``checkpoint_every`` steps and at the end;
    returns the last step."""
    config, accelerator = trainer.config, trainer.accelerator
    recorder = DistillRecorder(train=True, output_loss_weight=config.output_loss_weight,
                               backward=accelerator.backward, block_size=config.block_size,
                               negative_weight_penalty=config.negative_weight_penalty)
    signed = any(not fm.nonnegative for fm in maps.values())
    model.eval()  # dropout off: the teacher rows must be exact
    with distillation_mode(model, recorder):
        while step < trainer.total:
            epoch, done = divmod(step, trainer.steps_per_epoch)
            for batch, window, boundary in trainer.epoch(epoch, done):
                # each layer's loss is back-propagated inside the forward pass: scale it there
                recorder.loss_scale = 1.0 / (len(maps) * window)
                with accelerator.autocast():
                    model(**model_inputs(batch))
                if not boundary:
                    continue
                layers = recorder.per_layer()  # means over the step's micro-batches
                loss, kl, negative = trainer.finish_step(
                    [sum(v[key] for v in layers.values()) / len(layers) for key in ("ce", "kl", "negative_weight_mass")],
                    step + 1, params, average=True)
                recorder.reset()
                step += 1
                info = f"CE {loss:.3f} KL {kl:.3f}" + (f" negative {negative:.4f}" if signed else "")
                history.append(trainer.record({"step": step, "ce": loss, "kl": kl, "negative_weight_mass": negative},
                                              info))
                if step == trainer.total or config.checkpoint_every and step % config.checkpoint_every == 0:
                    trainer.save_checkpoint(checkpoint_dir, step=step, epoch=step // trainer.steps_per_epoch,
                                            history=history)
                if step >= trainer.total:
                    break
    trainer.close()
    return step


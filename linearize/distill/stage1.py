"""Stage 1: attention-weight distillation (Hedgehog §4.1; LUNA §10.2; Flexformer Appendix A.3).

Every pretrained weight is frozen; only the feature maps train, on the cross-entropy between
the frozen softmax attention rows and the student's normalised kernel rows. Teacher and
student come from ONE forward pass of the converted model: while distillation runs, each
converted layer's ``attend`` is taken over by :class:`DistillRecorder`, which returns the exact
softmax output (so every layer is distilled on the teacher's inputs) and only uses the kernel
path for the loss. Each layer's loss is back-propagated inside the forward pass as soon as it
is computed (the feature maps of one layer only affect that layer's loss), so at most one
layer's N×N maps are alive at a time.

Built on ``accelerate``: one CPU, one GPU, or many processes (``accelerate launch``). The model
itself is not wrapped for data parallelism (its graph ends inside each layer); the feature-map
gradients are averaged across processes by hand before each optimizer step. With gradient
accumulation the gradients of ``k`` micro-batches (each loss scaled by ``1/k``) add up before
one optimizer step; ``step`` always counts optimizer steps.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from ..attention.core import linear_attention_weights, softmax_attention_weights
from ..convert.api import feature_maps_of
from ..errors import LinearizeError
from .losses import attention_cross_entropy, attention_entropy, output_mse


@dataclass
class DistillConfig:
    """Stage-1 hyperparameters. Defaults: the papers' (AdamW, cosine, lr 1e-3, one epoch)."""

    lr: float = field(default=1e-3, metadata={"help": "AdamW learning rate of the feature maps."})
    epochs: float = field(default=1.0, metadata={"help": "Passes over the distillation text (fractions allowed)."})
    max_steps: int | None = field(default=None, metadata={"help": "Stop after this many steps (overrides epochs)."})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay."})
    warmup_ratio: float = field(default=0.0, metadata={"help": "Fraction of steps of linear warmup."})
    scheduler: str = field(default="cosine", metadata={"help": "cosine | linear | constant."})
    output_loss_weight: float = field(default=0.0, metadata={
        "help": "Weight of an attention-output MSE term beside the cross-entropy (LoLCATs); 0 = off."})
    max_grad_norm: float = field(default=1.0, metadata={"help": "Gradient clipping norm (0 = off)."})
    seed: int = field(default=0, metadata={"help": "Random seed."})
    checkpoint_every: int = field(default=100, metadata={
        "help": "Save a resumable checkpoint every N optimizer steps (and always at the end; 0 = only at the end)."})
    mixed_precision: str = field(default="no", metadata={"help": "no | fp16 (GPU only) | bf16 (accelerate)."})
    gradient_accumulation_steps: int = field(default=1, metadata={
        "help": "Micro-batches per optimizer step (effective batch = batch size × this × processes)."})

    def to_dict(self):
        return asdict(self)


class DistillRecorder:
    """The ``attend_hook`` of every converted layer during stage 1 (and KL measurement)."""

    def __init__(self, train=False, loss_scale=1.0, output_loss_weight=0.0, backward=None):
        self.train = train
        self.loss_scale = loss_scale
        self.output_loss_weight = output_loss_weight
        # accelerate's backward in training: it scales the loss when fp16 keeps a gradient scaler
        self.backward = backward or torch.Tensor.backward
        self.reset()

    def reset(self):
        self.sums = defaultdict(lambda: defaultdict(float))

    def __call__(self, fm, q, k, v, key_padding_mask, scale, output_attentions):
        with torch.no_grad():
            teacher = softmax_attention_weights(q, k, key_padding_mask, scale)
            out = (teacher @ v.float()).to(v.dtype)  # exact softmax attention feeds the next layer
        query_mask = key_padding_mask if q.shape[2] == k.shape[2] else None
        with torch.enable_grad() if self.train else torch.no_grad():
            student = linear_attention_weights(q.detach(), k.detach(), fm, key_padding_mask, scale)
            ce = attention_cross_entropy(teacher, student, query_mask)
            loss = ce
            if self.output_loss_weight:
                mse = output_mse(student @ v.detach().float(), out, query_mask)
                loss = loss + self.output_loss_weight * mse
            if self.train and loss.requires_grad:
                self.backward(loss * self.loss_scale)
        with torch.no_grad():
            h_teacher = attention_entropy(teacher, query_mask)
            h_student = attention_entropy(student.detach().clamp_min(0), query_mask)
        stats = self.sums[fm.layer_index]
        stats["ce"] += ce.item()
        stats["kl"] += ce.item() - h_teacher.item()
        stats["teacher_entropy"] += h_teacher.item()
        stats["student_entropy"] += h_student.item()
        stats["count"] += 1
        return out, (teacher if output_attentions else None)

    def per_layer(self):
        """``{layer: {ce, kl, teacher_entropy, student_entropy}}`` averaged over recorded calls."""
        result = {}
        for layer, stats in sorted(self.sums.items()):
            count = max(stats["count"], 1)
            result[layer] = {key: stats[key] / count for key in ("ce", "kl", "teacher_entropy", "student_entropy")}
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
def attention_distances(model, loader, max_batches=None, device=None):
    """Per-layer CE, KL and entropies of the student's attention against the teacher's."""
    recorder = DistillRecorder(train=False)
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


def stage1_warning(method, before, after):
    """A one-line warning when stage 1 left the mean attention KL (over layers) no lower than a
    positive start, i.e. the map did not learn the teacher's attention; ``None`` otherwise."""
    kl_before = [row["kl"] for row in before.values() if row.get("kl") is not None]
    kl_after = [row["kl"] for row in after.values() if row.get("kl") is not None]
    if not kl_before or not kl_after:
        return None
    b, a = sum(kl_before) / len(kl_before), sum(kl_after) / len(kl_after)
    if not (a >= b > 0):  # None for NaN too, and for a start already at the teacher's attention
        return None
    return (f"stage 1 did not lower the attention KL ({b:.3f} -> {a:.3f}): {method}'s map did not learn this "
            "teacher's attention; try a lower --lr, more epochs, or another method")


def _scheduler(name, optimizer, warmup, total):
    from transformers import get_constant_schedule_with_warmup, get_cosine_schedule_with_warmup, \
        get_linear_schedule_with_warmup

    if name == "cosine":
        return get_cosine_schedule_with_warmup(optimizer, warmup, total)
    if name == "linear":
        return get_linear_schedule_with_warmup(optimizer, warmup, total)
    if name == "constant":
        return get_constant_schedule_with_warmup(optimizer, warmup)
    raise LinearizeError(f"unknown scheduler {name!r}; valid: cosine, linear, constant")


def distill(model, train_loader, config=None, *, eval_loader=None, eval_batches=None, checkpoint_dir=None,
            resume=True, accelerator=None, progress=True, log=print):
    """Run stage 1 on a converted model in place; return a result dict.

    ``train_loader`` yields model input dicts (labels are ignored); under several processes
    every process gets its own share of its batches (``accelerator.prepare``), and a step is one
    optimizer step over ``config.gradient_accumulation_steps`` micro-batches of every process.
    ``eval_loader`` (default: the train loader) gives the per-layer CE/KL before and after.
    ``checkpoint_dir``: a resumable checkpoint is kept there every ``config.checkpoint_every``
    steps and at the end, with ``metrics.jsonl`` (one line per step); a run started with the same
    folder resumes where the last one stopped (``resume=False``: start afresh, clearing both).
    """
    from accelerate.utils import set_seed

    config = config or DistillConfig()
    maps = feature_maps_of(model)
    params = [p for fm in maps.values() for p in fm.parameters()]
    method = next(iter(maps.values())).name if maps else None
    eval_loader = eval_loader if eval_loader is not None else train_loader
    accelerator = accelerator or make_accelerator(config.mixed_precision, config.seed)
    set_seed(config.seed)
    model.to(accelerator.device)
    if not params:
        log(f"stage 1 skipped: method {method!r} has no learnable feature-map parameters")
        per_layer = attention_distances(model, eval_loader, eval_batches, accelerator.device)
        return {"skipped": True, "reason": f"{method} has no learnable parameters", "method": method,
                "per_layer_before": per_layer, "per_layer_after": per_layer, "history": [], "steps": 0,
                "seconds": 0.0, "config": config.to_dict()}

    for p in model.parameters():
        p.requires_grad_(False)
    for p in params:
        p.requires_grad_(True)
    before = attention_distances(model, eval_loader, eval_batches, accelerator.device)

    loader = accelerator.prepare(train_loader)  # this process's share of the batches
    accumulation = max(1, config.gradient_accumulation_steps)
    steps_per_epoch = math.ceil(len(loader) / accumulation)
    total = config.max_steps or max(1, math.ceil(config.epochs * steps_per_epoch))
    optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
    # not passed to prepare(): accelerate would step it once per process at every step
    scheduler = _scheduler(config.scheduler, optimizer, int(config.warmup_ratio * total), total)
    optimizer = accelerator.prepare(optimizer)

    checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir else None
    state_path = checkpoint_dir / "stage1_state.pt" if checkpoint_dir else None
    metrics_path = checkpoint_dir / "metrics.jsonl" if checkpoint_dir and accelerator.is_main_process else None
    if state_path is not None and not resume:
        _clear(accelerator, [state_path, checkpoint_dir / "metrics.jsonl"], log)
    step, history, elapsed = 0, [], 0.0
    if state_path is not None and state_path.is_file():
        state = torch.load(state_path, map_location=accelerator.device, weights_only=False)
        for index, fm in maps.items():
            fm.load_state_dict(state["maps"][index])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        step, history, elapsed = state["step"], state["history"], state["seconds"]
        log(f"stage 1 resumed at step {step}/{total} from {state_path}")
    _truncate_jsonl(metrics_path, step)  # lines of steps a killed run logged after its last checkpoint

    recorder = DistillRecorder(train=True, output_loss_weight=config.output_loss_weight,
                               backward=accelerator.backward)
    model.eval()  # dropout off: the teacher rows must be exact
    start = time.perf_counter() - elapsed
    speed = _Throughput(accelerator.num_processes)
    bar = _progress(total, step, "stage 1: attention distillation", progress and accelerator.is_main_process)
    with distillation_mode(model, recorder):
        while step < total:
            epoch, done = divmod(step, steps_per_epoch)
            if hasattr(loader, "set_epoch"):
                loader.set_epoch(epoch)
            for batch, window, boundary in _micro_batches(accelerator, loader, accumulation, done):
                # each layer's loss is back-propagated inside the forward pass: scale it there
                recorder.loss_scale = 1.0 / (len(maps) * window)
                with accelerator.autocast():
                    model(**model_inputs(batch))
                speed.add(batch)
                if not boundary:
                    continue
                layers = recorder.per_layer()  # means over the step's micro-batches
                loss, kl = _mean_over_processes(accelerator, [sum(v[key] for v in layers.values()) / len(layers)
                                                              for key in ("ce", "kl")])
                if not math.isfinite(loss):
                    bar.close()
                    raise LinearizeError(f"stage 1: the attention loss is {loss} at step {step + 1}; stopped before "
                                         "applying it (the last good checkpoint is kept): lower --lr")
                if accelerator.num_processes > 1:
                    for p in params:
                        if p.grad is not None:
                            p.grad = accelerator.reduce(p.grad, reduction="mean")
                if config.max_grad_norm:
                    accelerator.clip_grad_norm_(params, config.max_grad_norm)  # unscales fp16 gradients first
                optimizer.step()
                if not optimizer.step_was_skipped:  # fp16: the scaler skipped a step with inf/NaN gradients
                    scheduler.step()
                optimizer.zero_grad(set_to_none=True)
                recorder.reset()
                step += 1
                history.append({"step": step, "ce": loss, "kl": kl, "lr": scheduler.get_last_lr()[0],
                                "examples_per_second": speed.rate()})
                _append_jsonl(metrics_path, history[-1])
                bar.update(step, f"CE {loss:.3f} KL {kl:.3f} · {speed.rate():.1f} ex/s")
                if state_path is not None and (step == total or config.checkpoint_every
                                               and step % config.checkpoint_every == 0):
                    _save_state(state_path, maps, optimizer, scheduler, step, history,
                                time.perf_counter() - start, accelerator)
                if step >= total:
                    break
    bar.close()
    seconds = time.perf_counter() - start
    for p in model.parameters():
        p.requires_grad_(True)
    after = attention_distances(model, eval_loader, eval_batches, accelerator.device)
    warning = stage1_warning(method, before, after)
    if warning:
        log(f"warning: {warning}")
    return {"skipped": False, "method": method, "steps": step, "seconds": seconds, "history": history,
            "per_layer_before": before, "per_layer_after": after, "config": config.to_dict()}


def _micro_batches(accelerator, loader, accumulation, done_steps=0):
    """One epoch of ``loader`` grouped into optimizer steps of ``accumulation`` micro-batches,
    starting after ``done_steps`` steps (a resumed run skips them without loading them).

    Yields ``(batch, window, boundary)``: ``window`` is the number of micro-batches of this
    batch's step (``accumulation``; fewer for the epoch's last step when it does not divide the
    epoch), so a loss scaled by ``1 / window`` sums to the step's mean; ``boundary`` is true on
    the step's last micro-batch (time for the optimizer step).
    """
    count, first = len(loader), done_steps * accumulation
    batches = accelerator.skip_first_batches(loader, first) if first else loader
    for index, batch in enumerate(batches, first):
        window_start = index - index % accumulation
        window = min(accumulation, count - window_start)
        yield batch, window, index + 1 == window_start + window


def _mean_over_processes(accelerator, values):
    """``values`` (floats) averaged over all processes (as they are with one process)."""
    if accelerator.num_processes == 1:
        return values
    tensor = torch.tensor(values, dtype=torch.float64, device=accelerator.device)
    return accelerator.reduce(tensor, reduction="mean").tolist()


class _Throughput:
    """Training examples per second (all processes together) since this run or resumption started."""

    def __init__(self, num_processes=1):
        self.num_processes = num_processes
        self.examples = 0
        self.start = time.perf_counter()

    def add(self, batch):
        """Count one micro-batch of this process (its leading tensor dimension)."""
        first = next((v for v in batch.values() if torch.is_tensor(v)), None)
        self.examples += (first.shape[0] if first is not None and first.ndim else 0) * self.num_processes

    def rate(self):
        return self.examples / max(time.perf_counter() - self.start, 1e-9)


def _clear(accelerator, paths, log):
    """Delete earlier checkpoint files or folders (``resume=False``) on the main process; all wait."""
    import shutil

    existing = [Path(p) for p in paths if Path(p).exists()]
    if existing and accelerator.is_main_process:
        for path in existing:
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink()
        log(f"not resuming: removed the earlier checkpoint in {existing[0].parent}")
    accelerator.wait_for_everyone()


def _truncate_jsonl(path, step):
    """Keep only the ``metrics.jsonl`` lines of steps ``<= step`` (a resumed run logs the rest again)."""
    if path is None or not path.is_file():
        return
    import json

    from ..io import atomic_write_text

    lines = path.read_text(encoding="utf-8").splitlines()
    kept = [line for line in lines if line.strip() and json.loads(line).get("step", 0) <= step]
    if len(kept) != len(lines):
        atomic_write_text(path, "".join(line + "\n" for line in kept))


def _append_jsonl(path, entry):
    """One line per logged step (``metrics.jsonl``): the full log of a run."""
    if path is None:
        return
    import json

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(entry) + "\n")


def make_accelerator(mixed_precision="no", seed=0):
    """An ``Accelerator`` whose shuffling depends only on (seed, epoch): a resumed run sees
    exactly the batches an uninterrupted one would.

    Launched as several processes (``torchrun``, ``accelerate launch``) on a machine without an
    accelerator device, the processes train together on CPU over gloo (``MULTI_CPU``): accelerate
    only does that when asked (``cpu=True``); otherwise every process would train alone.
    """
    import os

    from accelerate import Accelerator
    from accelerate.utils import DataLoaderConfiguration

    has_device = torch.accelerator.is_available() if hasattr(torch, "accelerator") else torch.cuda.is_available()
    if mixed_precision == "fp16" and not has_device:
        raise LinearizeError("--mixed-precision fp16 needs a GPU (on CPU accelerate silently trains in float32): "
                             "use bf16 or no")
    cpu_processes = int(os.environ.get("WORLD_SIZE", "1")) > 1 and not has_device
    return Accelerator(mixed_precision=mixed_precision, cpu=cpu_processes,
                       dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True, data_seed=seed))


def _save_state(path, maps, optimizer, scheduler, step, history, seconds, accelerator):
    """Write the stage-1 checkpoint (main process) to a temporary file renamed over ``path``: a
    killed run leaves the previous checkpoint whole."""
    if not accelerator.is_main_process:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save({"maps": {i: fm.state_dict() for i, fm in maps.items()}, "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(), "step": step, "history": history, "seconds": seconds}, tmp)
    tmp.replace(path)


class _progress:
    """A rich progress bar (or nothing)."""

    def __init__(self, total, done, description, enabled):
        self.bar = None
        if enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, \
                TimeRemainingColumn

            self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                TimeElapsedColumn(), TimeRemainingColumn(), TextColumn("{task.fields[info]}"))
            self.bar.start()
            self.task = self.bar.add_task(description, total=total, completed=done, info="")

    def update(self, completed, info=""):
        if self.bar is not None:
            self.bar.update(self.task, completed=completed, info=info)

    def close(self):
        if self.bar is not None:
            self.bar.stop()

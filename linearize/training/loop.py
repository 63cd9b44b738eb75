"""The optimizer-step loop both stages run; the stage supplies the forward pass and the loss.

With gradient accumulation the gradients of ``k`` micro-batches (each loss scaled by ``1/k``)
add up before one optimizer step; ``step`` always counts optimizer steps.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

from ..errors import LinearizeError
from .accelerator import average_gradients, is_main_process, mean_over_processes
from .checkpoint import (OPTIMIZER_FILE, SCALER_FILE, SCHEDULER_FILE, WEIGHTS_FILE, TrainingProgress, clear_checkpoint,
                         read_checkpoint, write_checkpoint)
from .metrics_log import append_jsonl, truncate_jsonl
from ..trackers import loggable
from .progress import ProgressBar, Throughput
from .schedule import make_scheduler


def micro_batches(accelerator, loader, accumulation, done_steps=0):
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


class Trainer:
    """One stage's optimizer steps over ``train_loader`` under ``accelerator``.

    ``config`` (a stage config) gives ``gradient_accumulation_steps``, ``epochs``/``max_steps``,
    ``scheduler``/``warmup_ratio`` and ``max_grad_norm``. The loader is prepared at once (every
    process gets its own share of its batches), which fixes the plan: ``steps_per_epoch`` and
    ``total`` optimizer steps. Then :meth:`prepare` (the optimizer), :meth:`load_checkpoint` (or
    :meth:`clear_checkpoint`), :meth:`begin` (at step 0 or where the checkpoint left off), per
    epoch :meth:`epoch`'s micro-batches and, at each step's last one, :meth:`finish_step` and
    :meth:`record` (and now and then :meth:`save_checkpoint`); :meth:`close` at the end. Both
    stages' checkpoints are the Trainer's, in one format (:mod:`linearize.training.checkpoint`).
    ``loss_name`` and ``checkpoint_note`` word the error of a non-finite loss.
    """

    def __init__(self, accelerator, train_loader, config, *, loss_name, checkpoint_note=""):
        self.accelerator, self.config = accelerator, config
        self.loss_name, self.checkpoint_note = loss_name, checkpoint_note
        self.loader = accelerator.prepare(train_loader)  # this process's share of the batches
        self.accumulation = max(1, config.gradient_accumulation_steps)
        self.steps_per_epoch = math.ceil(len(self.loader) / self.accumulation)
        self.total = config.max_steps or max(1, math.ceil(config.epochs * self.steps_per_epoch))
        self.optimizer = self.scheduler = self.trained = self.bar = self.speed = self.metrics_path = None
        self.start = time.perf_counter()

    @property
    def epochs(self):
        """Epochs the planned steps reach into (the last one may be partial)."""
        return math.ceil(self.total / self.steps_per_epoch)

    @property
    def lr(self):
        return self.scheduler.get_last_lr()[0]

    @property
    def seconds(self):
        """Training time so far, the time before a resumption included."""
        return time.perf_counter() - self.start

    def prepare(self, optimizer, model=None, trained=None):
        """Give ``optimizer`` the config's schedule over the planned steps and prepare it (with
        ``model`` when given: then the prepared model is returned).

        ``trained``: the weights a checkpoint saves and restores (a module, or anything with
        ``state_dict`` and ``load_state_dict``): by default the whole ``model``; stage 1 gives its
        feature maps alone."""
        # not passed to prepare(): accelerate would step it once per process at every step
        self.scheduler = make_scheduler(self.config.scheduler, optimizer, int(self.config.warmup_ratio * self.total),
                                        self.total)
        if model is None:
            self.optimizer, self.trained = self.accelerator.prepare(optimizer), trained
            return None
        model, self.optimizer = self.accelerator.prepare(model, optimizer)
        self.trained = trained if trained is not None else self.accelerator.unwrap_model(model)
        return model

    def _checkpointed(self):
        """``{file name: object}`` of what a checkpoint's state folder holds but the random states."""
        parts = {WEIGHTS_FILE: self.trained, OPTIMIZER_FILE: self.optimizer, SCHEDULER_FILE: self.scheduler}
        if self.accelerator.scaler is not None:  # fp16
            parts[SCALER_FILE] = self.accelerator.scaler
        return parts

    def save_checkpoint(self, directory, *, step, epoch, history, extra=None):
        """Save a checkpoint in ``directory`` (nothing when it is ``None``): the trained weights,
        the optimizer, the schedule, the gradient scaler, every process's random states, and the
        progress: ``step`` optimizer steps done, ``epoch`` epochs finished, the training time so
        far, the stage's ``history`` and its ``extra`` values (JSON-able). Every process calls it."""
        if directory is None:
            return
        state = {file: part.state_dict() for file, part in self._checkpointed().items()}
        progress = TrainingProgress(step=step, epoch=epoch, seconds=self.seconds, history=history,
                                    extra=dict(extra or {}))
        write_checkpoint(self.accelerator, directory, state, progress)

    def load_checkpoint(self, directory, log=print):
        """The :class:`~linearize.training.checkpoint.TrainingProgress` of the checkpoint in
        ``directory``, whose weights, optimizer, schedule, gradient scaler and random states are
        restored; ``None`` without one (or for ``directory`` ``None``). Call it after
        :meth:`prepare`. A checkpoint of an earlier version is removed and ``log`` says so."""
        if directory is None:
            return None
        return read_checkpoint(self.accelerator, directory, self._checkpointed(), log)

    def clear_checkpoint(self, directory, log=print, also=()):
        """Delete the checkpoint in ``directory`` and its ``metrics.jsonl`` (``resume=False``), with
        the stage's own files named in ``also``; nothing for ``directory`` ``None``."""
        if directory is not None:
            clear_checkpoint(self.accelerator, directory, log, also)

    def begin(self, done_steps, seconds, description, progress, checkpoint_dir):
        """Start after ``done_steps`` steps that took ``seconds`` (0 and 0.0 for a fresh run): the
        ``metrics.jsonl`` in ``checkpoint_dir`` (if any) loses the lines of steps a killed run
        logged after its last checkpoint, and a progress bar (``progress``) starts."""
        main = is_main_process()  # the others keep no log
        self.metrics_path = Path(checkpoint_dir) / "metrics.jsonl" if checkpoint_dir and main else None
        truncate_jsonl(self.metrics_path, done_steps)
        self.start = time.perf_counter() - seconds
        self.speed = Throughput(self.accelerator.num_processes)
        self.bar = ProgressBar(self.total, done_steps, description, progress)
        if self.accelerator.log_with:  # experiment trackers (--report-to): the settings first
            self.accelerator.init_trackers(description.split(":")[0].replace(" ", "-"),
                                           config=loggable(self.config.to_dict()))

    def epoch(self, epoch, done_steps=0):
        """The micro-batches of ``epoch`` after its first ``done_steps`` steps, as
        :func:`micro_batches` yields them (each counted by the throughput)."""
        if hasattr(self.loader, "set_epoch"):
            self.loader.set_epoch(epoch)
        for batch, window, boundary in micro_batches(self.accelerator, self.loader, self.accumulation, done_steps):
            self.speed.add(batch)
            yield batch, window, boundary

    def finish_step(self, losses, step, parameters, average=False):
        """Apply optimizer step number ``step`` to the gradients accumulated in ``parameters`` and
        return ``losses`` (this process's means over the step) averaged over the processes.

        A non-finite first loss stops the run before the step is applied. ``average``: average
        the gradients over the processes first (a model not wrapped for data parallelism).
        """
        losses = mean_over_processes(self.accelerator, losses)
        if not math.isfinite(losses[0]):
            self.bar.close()
            raise LinearizeError(f"{self.loss_name} is {losses[0]} at step {step}; stopped before applying it "
                                 f"(the last good checkpoint is kept{self.checkpoint_note}): lower --lr")
        if average:
            average_gradients(self.accelerator, parameters)
        if self.config.max_grad_norm:
            self.accelerator.clip_grad_norm_(parameters, self.config.max_grad_norm)  # unscales fp16 gradients first
        self.optimizer.step()
        if not self.optimizer.step_was_skipped:  # fp16: the scaler skipped a step with inf/NaN gradients
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return losses

    def record(self, entry, info):
        """Log a finished step: ``entry`` (with ``step``) gains the learning rate and the throughput
        and goes to ``metrics.jsonl``; the progress bar moves to the step and shows ``info``."""
        entry.update(lr=self.lr, examples_per_second=self.speed.rate())
        self.log(entry)
        self.bar.update(entry["step"], f"{info} · {self.speed.rate():.1f} ex/s")
        return entry

    def log(self, entry):
        """``entry`` (with ``step``) to ``metrics.jsonl`` and to the experiment trackers."""
        append_jsonl(self.metrics_path, entry)
        if self.accelerator.log_with:
            self.accelerator.log(loggable({k: v for k, v in entry.items() if k != "step"}), step=entry["step"])

    def close(self):
        self.bar.close()
        if self.accelerator.log_with:
            self.accelerator.end_training()

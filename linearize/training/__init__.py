"""The training engine both stages share (stage 1 ``linearize.distill``, stage 2 ``linearize.finetune``).

A stage supplies what it trains and its loss; :class:`Trainer` runs the optimizer steps: the
step plan (gradient accumulation over micro-batches, epochs or ``max_steps``), the schedule, the
non-finite-loss guard, gradient clipping, the ``metrics.jsonl`` log, the progress bar and the
throughput. The pieces around it: the accelerator set-up (:func:`make_accelerator`), the mean
over processes, and the atomic checkpoint files a stage saves and resumes from.
"""

from .accelerator import average_gradients, make_accelerator, mean_over_processes
from .checkpoint import (PROGRESS_FILE, atomic_torch_save, clear_checkpoint, load_accelerator_checkpoint,
                         save_accelerator_checkpoint)
from .loop import Trainer, micro_batches
from .metrics_log import append_jsonl, truncate_jsonl
from .progress import ProgressBar, Throughput
from .schedule import make_scheduler

__all__ = ["PROGRESS_FILE", "ProgressBar", "Throughput", "Trainer", "append_jsonl", "atomic_torch_save",
           "average_gradients", "clear_checkpoint", "load_accelerator_checkpoint", "make_accelerator", "make_scheduler",
           "mean_over_processes", "micro_batches", "save_accelerator_checkpoint", "truncate_jsonl"]

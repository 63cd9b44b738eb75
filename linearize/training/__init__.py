"""The training engine both stages share (stage 1 ``linearize.distill``, stage 2 ``linearize.finetune``).

A stage supplies what it trains and its loss; :class:`Trainer` runs the optimizer steps: the
step plan (gradient accumulation over micro-batches, epochs or ``max_steps``), the schedule, the
non-finite-loss guard, gradient clipping, the ``metrics.jsonl`` log, the progress bar and the
throughput. The pieces around it: the accelerator set-up (:func:`make_accelerator`), the mean
over processes, which process writes (:mod:`.accelerator`: :func:`is_main_process`,
:func:`on_main_process`, ...; the one place that knows), and the one checkpoint format both
stages save and resume from (:mod:`.checkpoint`, through the Trainer's ``save_checkpoint`` /
``load_checkpoint``).
"""

from .accelerator import (average_gradients, evaluation_shards, has_device, is_main_process, launched_processes,
                          main_process_first, make_accelerator, mean_over_processes, on_main_process,
                          wait_for_everyone)
from .checkpoint import (CHECKPOINT_FILE, TrainingProgress, atomic_torch_save, check_process_count, clear_checkpoint,
                         read_checkpoint, write_checkpoint)
from .loop import Trainer, micro_batches
from .metrics_log import append_jsonl, truncate_jsonl
from .progress import ProgressBar, Throughput
from .schedule import make_scheduler

__all__ = ["CHECKPOINT_FILE", "ProgressBar", "Throughput", "Trainer", "TrainingProgress", "append_jsonl",
           "atomic_torch_save", "average_gradients", "check_process_count", "clear_checkpoint", "evaluation_shards",
           "has_device", "is_main_process", "launched_processes", "main_process_first", "make_accelerator",
           "make_scheduler", "mean_over_processes", "micro_batches", "on_main_process", "read_checkpoint",
           "truncate_jsonl", "wait_for_everyone", "write_checkpoint"]

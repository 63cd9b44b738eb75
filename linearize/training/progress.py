"""What a running stage shows: a progress bar and its training throughput."""

from __future__ import annotations

import time

import torch

from .accelerator import is_main_process


class ProgressBar:
    """A rich progress bar (or nothing, when not ``enabled`` or not on the main process)."""

    def __init__(self, total, done, description, enabled):
        self.bar = None
        if enabled and is_main_process():
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


class Throughput:
    """Training examples per second (all processes together) since it started (or restarted)."""

    def __init__(self, num_processes=1):
        self.num_processes = num_processes
        self.restart()

    def restart(self):
        self.examples = 0
        self.start = time.perf_counter()

    def add(self, batch):
        """Count one micro-batch of this process (its leading tensor dimension)."""
        first = next((v for v in batch.values() if torch.is_tensor(v)), None)
        self.examples += (first.shape[0] if first is not None and first.ndim else 0) * self.num_processes

    def rate(self):
        return self.examples / max(time.perf_counter() - self.start, 1e-9)

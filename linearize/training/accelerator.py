"""The ``accelerate`` set-up both stages train under, and averages over its processes."""

from __future__ import annotations

import os

import torch

from ..errors import LinearizeError


def make_accelerator(mixed_precision="no", seed=0):
    """An ``Accelerator`` whose shuffling depends only on (seed, epoch): a resumed run sees
    exactly the batches an uninterrupted one would.

    Launched as several processes (``torchrun``, ``accelerate launch``) on a machine without an
    accelerator device, the processes train together on CPU over gloo (``MULTI_CPU``): accelerate
    only does that when asked (``cpu=True``); otherwise every process would train alone.
    """
    from accelerate import Accelerator
    from accelerate.utils import DataLoaderConfiguration

    has_device = torch.accelerator.is_available() if hasattr(torch, "accelerator") else torch.cuda.is_available()
    if mixed_precision == "fp16" and not has_device:
        raise LinearizeError("--mixed-precision fp16 needs a GPU (on CPU accelerate silently trains in float32): "
                             "use bf16 or no")
    cpu_processes = int(os.environ.get("WORLD_SIZE", "1")) > 1 and not has_device
    return Accelerator(mixed_precision=mixed_precision, cpu=cpu_processes,
                       dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True, data_seed=seed))


def mean_over_processes(accelerator, values):
    """``values`` (floats) averaged over all processes (as they are with one process)."""
    if accelerator.num_processes == 1:
        return values
    tensor = torch.tensor(values, dtype=torch.float64, device=accelerator.device)
    return accelerator.reduce(tensor, reduction="mean").tolist()


def average_gradients(accelerator, parameters):
    """Average the gradients of ``parameters`` over all processes in place (for parameters of a
    model that is not wrapped for data parallelism); nothing to do with one process."""
    if accelerator.num_processes == 1:
        return
    for p in parameters:
        if p.grad is not None:
            p.grad = accelerator.reduce(p.grad, reduction="mean")

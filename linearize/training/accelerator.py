"""The ``accelerate`` set-up both stages train under, averages over its processes, and the one
place that knows which process does what.

Launched as several processes (``torchrun --nproc_per_node N``, ``accelerate launch
--num_processes N``, and their multi-node forms), every process runs the same command: each
trains on its own share of every batch and evaluates its share of every split, while only the
main process writes (folders, checkpoints, reports, metrics, progress bars) and the others wait
for it. Everything the rest of the package needs for that is here: :func:`is_main_process`,
:func:`wait_for_everyone`, :func:`main_process_first`, :func:`on_main_process` (a write done once,
its result shared) and :func:`evaluation_shards` (an evaluation split over the processes and
gathered back without duplicates). With one process they cost nothing and start no process group.
"""

from __future__ import annotations

import os
from contextlib import contextmanager, nullcontext

import torch

from ..errors import LinearizeError
from ..launcher import launched_processes
from ..trackers import tracking_arguments

def has_device():
    """Whether accelerate trains on an accelerator device (CUDA, XPU, MPS, ...) rather than the CPU."""
    return torch.accelerator.is_available() if hasattr(torch, "accelerator") else torch.cuda.is_available()


def check_mixed_precision(mixed_precision, where="--mixed-precision"):
    """fp16 without a GPU is a one-line error (on CPU accelerate silently trains in float32)."""
    if mixed_precision == "fp16" and not has_device():
        raise LinearizeError(f"{where} fp16 needs a GPU (on CPU accelerate silently trains in float32): use bf16 or no")


def _cpu_processes():
    """Several processes on a machine without an accelerator device train together on CPU over
    gloo (``MULTI_CPU``): accelerate only does that when asked (``cpu=True``); otherwise every
    process would train alone."""
    return launched_processes() > 1 and not has_device()


def make_accelerator(mixed_precision="no", seed=0, report_to="none", checkpoint_dir=None):
    """An ``Accelerator`` whose shuffling depends only on (seed, epoch): a resumed run sees
    exactly the batches an uninterrupted one would.

    ``mixed_precision`` ``"no"`` (the default) leaves it to the launcher: ``accelerate launch
    --mixed_precision bf16`` (or its ``accelerate config``) trains in bf16; ``bf16`` / ``fp16``
    ask for it whatever the launcher says. ``report_to``: experiment trackers
    (:mod:`linearize.trackers`), logging under ``checkpoint_dir``.
    """
    from accelerate import Accelerator
    from accelerate.utils import DataLoaderConfiguration

    check_mixed_precision(mixed_precision)
    _forget_other_precision(mixed_precision)
    return Accelerator(mixed_precision=None if mixed_precision == "no" else mixed_precision, cpu=_cpu_processes(),
                       dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True, data_seed=seed),
                       **tracking_arguments(report_to, checkpoint_dir))


def _forget_other_precision(mixed_precision):
    """accelerate keeps one mixed-precision setting per process and refuses another one later; a
    run whose stages differ (teacher in float32, stage 2 in bf16), or a library caller training
    twice, asks for another. Then its state is reset (the process group, kept in ``PartialState``,
    stays) so the new stage gets what it asked for; ``no`` means the launcher's setting."""
    from accelerate.state import AcceleratorState

    current = AcceleratorState._shared_state.get("_mixed_precision")
    wanted = mixed_precision if mixed_precision != "no" else os.environ.get("ACCELERATE_MIXED_PRECISION", "no")
    if current is not None and current != wanted:
        AcceleratorState._reset_state()


def process_state():
    """accelerate's ``PartialState`` of this process (under a launcher, joining its process group)."""
    from accelerate import PartialState

    return PartialState(cpu=_cpu_processes())


def is_main_process():
    """Whether this process writes the outputs (always, without a launcher)."""
    return launched_processes() == 1 or process_state().is_main_process


def wait_for_everyone():
    """Wait until every process gets here (nothing to wait for with one process)."""
    if launched_processes() > 1:
        process_state().wait_for_everyone()


def main_process_first():
    """A context in which the main process goes first and the others follow once it is done
    (a download or a cache filled once, then read by all)."""
    return process_state().main_process_first() if launched_processes() > 1 else nullcontext()


def on_main_process(function, *args, **kwargs):
    """``function(*args, **kwargs)`` called on the main process only; every process waits for it
    and gets its result (pickled to the others). What writes an output goes through here, so
    each output is written once, atomically as before, and nobody reads it before it is whole.

    Every process must make the call (it is a collective); an exception on the main process ends
    the run (the launcher stops the others).
    """
    if launched_processes() == 1:
        return function(*args, **kwargs)
    from accelerate.utils import broadcast_object_list

    result = [function(*args, **kwargs) if process_state().is_main_process else None]
    return broadcast_object_list(result)[0]


@contextmanager
def evaluation_shards(loader):
    """Yield ``(loader, gather)`` for one pass of an evaluation over ``loader``.

    With several processes every process gets its own share of the batches (the last global
    batch padded to equal shares, as accelerate does) and ``gather(tensors)`` returns the
    tensors of the whole global batch on every process, the padding dropped (accelerate's
    ``gather_for_metrics``): the predictions, in the loader's order and each example once, are
    those of one process. With one process: ``loader`` itself and no gathering.
    """
    if launched_processes() == 1:
        yield loader, lambda tensors: tensors
        return
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=_cpu_processes())  # the state the stages set, mixed precision included
    yield accelerator.prepare_data_loader(loader, device_placement=False), accelerator.gather_for_metrics


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

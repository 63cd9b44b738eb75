"""Stage-1 distillation under ``torchrun --nproc_per_node 2`` on CPU (gloo), for tests/test_distributed.py.

Usage: ``python -m torch.distributed.run --nproc_per_node 2 --standalone tests/distributed_distill.py OUT``.
Every process builds the same tiny random Hedgehog BERT and gets its own share of every global
batch (``accelerator.prepare``); rank 0 saves the trained feature-map weights to ``OUT``.

The test imports this module too: ``student``, ``loader`` and ``CONFIG`` make the single-process
reference run with ``PER_PROCESS_BATCH × 2`` examples per batch.
"""

from __future__ import annotations

import sys

import torch
from torch.utils.data import DataLoader

import linearize
from linearize.convert import feature_maps_of
from linearize.distill import DistillConfig, distill
from tiny_models import VOCAB, build

PER_PROCESS_BATCH = 2
EXAMPLES, SEQ = 16, 8
CONFIG = DistillConfig(lr=1e-2, epochs=2, seed=0)


def student():
    """The same tiny random BERT converted to Hedgehog on every process."""
    model = build("bert", seed=0)
    torch.manual_seed(1)
    return linearize.convert(model, "hedgehog")


def loader(batch_size):
    """A shuffled loader over fixed sequences of one length (no padding: a batch's mean loss is the
    mean of its halves' mean losses, so two half batches average to the whole batch exactly)."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, VOCAB, (EXAMPLES, SEQ), generator=g)
    examples = [{"input_ids": row, "attention_mask": torch.ones(SEQ, dtype=torch.long)} for row in ids]
    return DataLoader(examples, batch_size=batch_size, shuffle=True, generator=torch.Generator().manual_seed(0))


def feature_map_weights(model):
    """``{layer.name: tensor}`` of every learnable feature-map parameter."""
    return {f"{layer}.{name}": p.detach().clone() for layer, fm in feature_maps_of(model).items()
            for name, p in fm.named_parameters()}


def main(out):
    import torch.distributed as dist
    from accelerate import DistributedType

    from linearize.distill.stage1 import make_accelerator

    torch.set_num_threads(1)
    accelerator = make_accelerator(CONFIG.mixed_precision, CONFIG.seed)
    assert accelerator.num_processes == 2, accelerator.num_processes
    assert accelerator.distributed_type == DistributedType.MULTI_CPU, accelerator.distributed_type
    assert dist.get_backend() == "gloo", dist.get_backend()
    model = student()
    result = distill(model, loader(PER_PROCESS_BATCH), CONFIG, eval_batches=1, accelerator=accelerator,
                     progress=False, log=lambda *a, **k: None)
    if accelerator.is_main_process:
        torch.save({"weights": feature_map_weights(model), "steps": result.steps,
                    "ce": [entry["ce"] for entry in result.history]}, out)
    accelerator.wait_for_everyone()
    accelerator.end_training()


if __name__ == "__main__":
    main(sys.argv[1])

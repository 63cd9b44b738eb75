"""Stage-1 and stage-2 training steps under bf16 autocast on real geometries (random weights).

Each case converts a randomly initialised encoder of a real geometry (BERT-base at 512 tokens,
batch 8; MiniLM-L6 with positions extended to 4,096 tokens, batch 1, stage 1 blockwise), runs
``linearize.distill`` and ``linearize.finetune`` exactly as ``linearize run`` calls them, and
records the time per optimizer step and the peak memory of the device. Each stage runs three
times in fresh checkpoint folders: a warm-up run of 2 steps (kernel selection, allocator growth),
then runs of ``--steps`` and 4 × ``--steps`` steps; the time per step is their difference over the
extra steps, so the run's own setup (the per-layer losses before and after, the final checkpoint
of the whole model in stage 2) cancels.

    python docs/experiments/bench/gpu_steps.py --device cuda --out runs/gpu-steps
    python docs/experiments/bench/gpu_steps.py --device cpu --small --out /tmp/steps   # the same code, tiny

Writes ``steps.json`` and ``steps.md`` to ``--out``.
"""

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader
from transformers import BertConfig, BertForSequenceClassification

import linearize
from linearize.distill import DistillConfig, distill
from linearize.finetune import FinetuneConfig, finetune

#: (label, BertConfig fields, tokens, batch, methods with their convert options)
CASES = [
    ("BERT-base", {}, 512, 8, [("hedgehog", {}), ("luna", {})]),
    ("MiniLM-L6 at 4,096", {"hidden_size": 384, "num_hidden_layers": 6, "intermediate_size": 1536,
                            "max_position_embeddings": 4096}, 4096, 1,
     [("hedgehog", {}), ("luna", {}), ("hedgehog", {"window": 64, "sinks": "first"})]),
]
SMALL = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128,
         "max_position_embeddings": 256}


def loader(tokens, batch, steps, vocab, seed):
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(1000, vocab, (batch * steps, tokens), generator=generator)
    examples = [{"input_ids": row, "attention_mask": torch.ones_like(row), "labels": torch.tensor(i % 2)}
                for i, row in enumerate(ids)]
    return DataLoader(examples, batch_size=batch)


def timed(run):
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    result = run()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None
    return result, time.perf_counter() - start, peak


def stage_steps(stage, model, tokens, batch, steps, folder):
    quiet = {"progress": False, "log": lambda *a, **k: None}
    data = loader(tokens, batch, steps, model.config.vocab_size, seed=steps)
    if stage == 1:
        config = DistillConfig(max_steps=steps, mixed_precision="bf16", block_size=512)
        return timed(lambda: distill(model, data, config, eval_batches=1, checkpoint_dir=folder, **quiet))
    config = FinetuneConfig(max_steps=steps, batch_size=batch, patience=0, mixed_precision="bf16", epochs=1)
    eval_data = loader(tokens, batch, 1, model.config.vocab_size, seed=0)
    return timed(lambda: finetune(model, data, eval_data, "sst2", folder, config=config, **quiet))


def measure(label, fields, tokens, batch, method, options, steps, device):
    torch.manual_seed(0)
    teacher = BertForSequenceClassification(BertConfig(**fields, num_labels=2)).to(device)
    student = linearize.convert(teacher, method, **options)
    row = {"geometry": label, "tokens": tokens, "batch": batch, "method": method, "options": options}
    with tempfile.TemporaryDirectory() as tmp:
        for stage in (1, 2):
            stage_steps(stage, student, tokens, batch, 2, Path(tmp) / f"warm{stage}")
            short, short_seconds, _ = stage_steps(stage, student, tokens, batch, steps, Path(tmp) / f"short{stage}")
            result, seconds, peak = stage_steps(stage, student, tokens, batch, 4 * steps, Path(tmp) / f"long{stage}")
            losses = [entry.get("ce", entry.get("train_loss")) for entry in result.history
                      if entry.get("ce", entry.get("train_loss")) is not None]
            row[f"stage{stage}"] = {"steps": [short.steps, result.steps], "seconds": [short_seconds, seconds],
                                    "seconds_per_step": (seconds - short_seconds) / (result.steps - short.steps),
                                    "peak_gib": peak, "finite": all(torch.isfinite(torch.tensor(losses)).tolist()),
                                    "last_loss": losses[-1] if losses else None}
    return row


def markdown(rows, device):
    lines = [f"Device: {device}", "", "| geometry | tokens × batch | method | stage-1 s/step | stage-1 peak GiB "
             "| stage-2 s/step | stage-2 peak GiB | losses finite |", "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        s1, s2 = row["stage1"], row["stage2"]
        name = row["method"] + "".join(f" {k}={v}" for k, v in row["options"].items())
        gib = lambda x: "—" if x is None else f"{x:.2f}"  # noqa: E731
        lines.append(f"| {row['geometry']} | {row['tokens']} × {row['batch']} | {name} | {s1['seconds_per_step']:.3f} "
                     f"| {gib(s1['peak_gib'])} | {s2['seconds_per_step']:.3f} | {gib(s2['peak_gib'])} "
                     f"| {s1['finite'] and s2['finite']} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--small", action="store_true", help="tiny geometries at 128 tokens (a check of the code)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    device = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    rows = []
    for label, fields, tokens, batch, methods in CASES:
        fields, tokens = (SMALL, 128) if args.small else (fields, tokens)
        for method, options in methods:
            rows.append(measure(label, fields, tokens, batch, method, options, args.steps, args.device))
            print(json.dumps(rows[-1]), flush=True)
            (args.out / "steps.json").write_text(json.dumps({"device": device, "rows": rows}, indent=1))
    (args.out / "steps.md").write_text(markdown(rows, device))
    print(markdown(rows, device))


if __name__ == "__main__":
    main()

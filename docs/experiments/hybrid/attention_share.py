"""How much of a MiniLM forward attention is at all, by length: the model with SDPA against the same model with
an attention that costs nothing (each token's own value; the projections, feed-forward and norms unchanged).
``1 − free ÷ SDPA`` bounds what any converted attention can save: a student's time per input is at least the
free model's.

    PYTHONPATH=. python docs/experiments/hybrid/attention_share.py runs/lr-r32-first/seed0/full/teacher
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import AttentionInterface, AutoModel

from linearize.machine import machine_info


def free_attention(module, query, key, value, attention_mask, **kwargs):
    """Each query's own value: no scores, no softmax (a lower bound on any attention's cost)."""
    return value.transpose(1, 2), None


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="a saved softmax model folder with positions for the longest length")
    parser.add_argument("--seq-lens", default="256,512,851,1024,2048")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    AttentionInterface.register("free", free_attention)
    models = {name: AutoModel.from_pretrained(args.model, attn_implementation=name).eval() for name in ("sdpa", "free")}
    print(f"Machine: {machine_info()['cpu_model']}, {args.threads} threads, torch {torch.__version__}, fp32, batch 1; "
          f"medians of {args.rounds} interleaved forwards, ms.\n")
    print("| tokens | SDPA | attention free | attention's share | free ÷ SDPA |")
    print("|--:|--:|--:|--:|--:|")
    for seq in (int(n) for n in args.seq_lens.split(",")):
        ids = torch.randint(1000, 20000, (1, seq))
        times = {name: [] for name in models}
        with torch.inference_mode():
            for round_ in range(args.rounds + 1):
                for name, model in models.items():
                    start = time.perf_counter()
                    model(input_ids=ids, attention_mask=torch.ones_like(ids))
                    if round_:
                        times[name].append(time.perf_counter() - start)
        ms = {name: 1e3 * statistics.median(values) for name, values in times.items()}
        print(f"| {seq:,} | {ms['sdpa']:.1f} | {ms['free']:.1f} | {1 - ms['free'] / ms['sdpa']:.0%} | "
              f"{ms['free'] / ms['sdpa']:.2f} |", flush=True)


if __name__ == "__main__":
    main()

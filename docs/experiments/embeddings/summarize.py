"""The RESULTS.md table from the run folders of `linearize run minilm-embeddings --seed S --out runs/seedS`.

Usage: python docs/experiments/embeddings/summarize.py runs/seed0 runs/seed1 runs/seed2
"""

import json
import sys
from pathlib import Path

import numpy as np

ROWS = (("teacher", "softmax teacher (reference)"), ("student_stage1", "luna after stage 1"),
        ("student", "luna after stage 2 (saved)"))


def main(folders):
    reports = [json.loads((Path(folder) / "report.json").read_text()) for folder in folders]
    split = reports[0]["task"]["report_split"]
    metrics = reports[0]["task"]["metric_names"]
    print(f"| minilm-embeddings ({split}) | " + " | ".join(metrics) + " | recovery % (cosine) | seeds |")
    print("|:--|" + "--:|" * (len(metrics) + 2))
    for stage, label in ROWS:
        cells = []
        for metric in metrics:
            values = [r["scores"][stage][split][metric] for r in reports]
            cells.append(f"{np.mean(values):.4f} ± {np.std(values):.4f}")
        recovery = [100 * r["scores"][stage][split]["cosine"] / r["scores"]["teacher"][split]["cosine"]
                    for r in reports]
        cells.append(f"{np.mean(recovery):.1f} ± {np.std(recovery):.1f}")
        print(f"| {label} | " + " | ".join(cells) + f" | {len(reports)} |")
    print()
    print("| seed | cosine | top10_overlap | stage 1 KL before → after | stage 1 s | stage 2 s | total s |")
    print("|--:|--:|--:|--:|--:|--:|--:|")
    for r in reports:
        s, t, a = r["scores"]["student"][split], r["timing"], r["attention"]
        print(f"| {r['seeds']['seed']} | {s['cosine']:.4f} | {s['top10_overlap']:.4f} | "
              f"{a['mean_kl_before']:.3f} → {a['mean_kl_after']:.3f} | {t['stage1_seconds']:.0f} | "
              f"{t['stage2_seconds']:.0f} | {t['total_seconds']:.0f} |")


if __name__ == "__main__":
    main(sys.argv[1:])

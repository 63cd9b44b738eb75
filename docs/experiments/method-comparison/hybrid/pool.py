"""The method table of issue 34 (every method pure and hybrid, 3 seeds), pooled from two halves.

The first half's run folders were lost with the machine they ran on (the eighth session's host was replaced
before the ninth); what is left of them is their table, ``earlier/compare.json`` (``linearize compare``'s
rows: per row the number of seeds and the mean and sample standard deviation of the accuracy and of the
recovery). The runs made since keep each finished run's ``report.json`` in this folder
(``later/seed<N>/<run>/report.json``), so ``linearize compare ... --table-only --out
docs/experiments/method-comparison/hybrid/later`` tabulates them (``later/compare.json``) whatever happens to the
host. This script pools the two tables row by row: for n₁ runs with mean m₁, std s₁ and n₂ with m₂, s₂ the
pooled mean is (n₁m₁ + n₂m₂)/n and the sample variance

    ((n₁ − 1)s₁² + (n₂ − 1)s₂² + n₁(m₁ − m)² + n₂(m₂ − m)²) / (n − 1),

exactly what the n runs' own mean and standard deviation would be. The attention KL after stage 1 is
pooled as an n-weighted mean. A seed in both halves would be counted twice: the two halves' seeds are
listed and must not overlap (``--seeds-earlier``/``--seeds-later`` per row, from each table's ``missing``).

    python docs/experiments/method-comparison/hybrid/pool.py docs/experiments/method-comparison/hybrid
        writes pooled.md and pooled.json beside earlier/ and later/
"""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

STATS = ("metric", "recovery")


def seeds_of(table, planned):
    """``{row: set of seeds}`` a compare table holds: the planned seeds less those its ``missing`` lists."""
    missing = {}
    for entry in table.get("missing", []):
        seed, row = re.fullmatch(r"seed (\d+): (.+)", entry).groups()
        missing.setdefault(row, set()).add(int(seed))
    return {row["row"]: set(planned) - missing.get(row["row"], set()) for row in table["rows"]}


def pooled(first, second):
    """One row from two (``n``, ``{stat: (mean, std)}``, ``kl``) halves; either may be None."""
    halves = [half for half in (first, second) if half is not None]
    n = sum(h["n"] for h in halves)
    out = {"seeds": n}
    for stat in STATS:
        mean = sum(h["n"] * h[stat][0] for h in halves) / n
        square = sum((h["n"] - 1) * h[stat][1] ** 2 + h["n"] * (h[stat][0] - mean) ** 2 for h in halves)
        out[stat] = (mean, math.sqrt(square / (n - 1)) if n > 1 else 0.0)
    kls = [(h["n"], h["kl"]) for h in halves if h["kl"] is not None]
    out["kl"] = sum(n_ * kl for n_, kl in kls) / sum(n_ for n_, _ in kls) if kls else None
    return out


def halves_of(table, seeds):
    """``{row: half}`` of one table, the teacher's row included."""
    rows = {}
    for row in table["rows"]:
        teacher = row["row"] == "softmax (teacher)"  # its seeds: every seed with a finished run
        n = row["seeds"] if teacher else len(seeds[row["row"]])
        if n == 0 or row["metric_mean"] is None:
            continue
        assert n == row["seeds"], f"{row['row']}: {n} seeds planned and finished, the table says {row['seeds']}"
        rows[row["row"]] = {"n": n, "seeds": [] if teacher else sorted(seeds[row["row"]]),
                            "metric": (row["metric_mean"], row["metric_std"]),
                            "recovery": (row["recovery_mean"], row["recovery_std"]), "kl": row.get("kl_mean")}
    return rows


def main(folder):
    folder = Path(folder)
    earlier = json.loads((folder / "earlier" / "compare.json").read_text())
    later = json.loads((folder / "later" / "compare.json").read_text())
    first = halves_of(earlier, seeds_of(earlier, (0, 1, 2)))
    second = halves_of(later, seeds_of(later, (1, 2)))
    lines = ["| row | seeds | accuracy (test) | recovery % | attention KL after stage 1 |", "|:--|:--|--:|--:|--:|"]
    table = []
    for row in list(first) + [r for r in second if r not in first]:
        a, b = first.get(row), second.get(row)
        if row != "softmax (teacher)":
            overlap = set(a["seeds"] if a else ()) & set(b["seeds"] if b else ())
            assert not overlap, f"{row}: seeds {sorted(overlap)} are in both halves"
        # the teacher's row: every seed's teacher in the earlier half; the later half's teachers are the same
        # seeds fine-tuned again (listed beside it, not pooled)
        p = pooled(a, None) if row == "softmax (teacher)" else pooled(a, b)
        seeds = sorted(set(a["seeds"] if a else ()) | set(b["seeds"] if b else ())) if row != "softmax (teacher)" else []
        table.append({"row": row, **p, "seed_list": seeds})
        kl = "—" if p["kl"] is None or row == "softmax (teacher)" else f"{p['kl']:.3f}"
        lines.append(f"| {row} | {', '.join(map(str, seeds)) or p['seeds']} | {p['metric'][0]:.3f} ± {p['metric'][1]:.3f} "
                     f"| {p['recovery'][0]:.1f} ± {p['recovery'][1]:.1f} | {kl} |")
    if "softmax (teacher)" in second:
        t = second["softmax (teacher)"]
        again = sorted({s for r in second.values() for s in r["seeds"]})
        lines.append(f"\nThe later half's teachers (seeds {', '.join(map(str, again))}, fine-tuned again): "
                     f"{t['metric'][0]:.3f} ± {t['metric'][1]:.3f} over {t['n']}.")
    (folder / "pooled.md").write_text("\n".join(lines) + "\n")
    (folder / "pooled.json").write_text(json.dumps(table, indent=2) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent)

"""``bench.png``: log-log plots of the attention layer's time and memory against N, and bars of the
whole model's time against softmax's."""

from __future__ import annotations

import io

from .methods import EAGER, SDPA
from .tables import softmax_labels


def plot(result):
    """PNG bytes of the log-log plots: attention time and memory against N (and the model)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rows = result["attention"]
    has_memory = any("peak_extra_bytes" in e for row in rows for e in row["results"].values())
    model_rows = (result.get("model") or {}).get("rows") or []
    panels = 1 + has_memory + bool(model_rows)
    fig = Figure(figsize=(6.2 * panels, 5.2))
    FigureCanvasAgg(fig)
    axes = [fig.add_subplot(1, panels, i + 1) for i in range(panels)]
    _attention_panels(axes[: 1 + has_memory], rows, softmax_labels(rows) + result["methods"])
    if model_rows:
        _model_panel(axes[-1], model_rows, result["model"]["info"])
    cfg = result["config"]
    where = (cfg["placement"] if str(cfg.get("device", "cpu")).startswith("cuda") else
             f"{result['machine']['torch_threads']} threads, {result['machine']['cpu_model']}")
    fig.suptitle(f"linearize: batch {cfg['batch_size']}, {cfg['num_heads']} heads × {cfg['head_dim']}, {where}",
                 fontsize=9)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    return buffer.getvalue()


def _attention_panels(axes, rows, labels):
    """The attention layer's median latency (``axes[0]``) and, with a second axis, its peak extra
    memory against N, log-log, one line per label (softmax in black)."""
    styles = {SDPA: dict(color="black", linewidth=2.5), EAGER: dict(color="black", linewidth=2, linestyle="--")}
    for label in labels:
        points = [(row["seq_len"], row["results"][label]) for row in rows if label in row["results"]]
        if not points:
            continue
        style = styles.get(label, dict(linewidth=1.3, marker="o", markersize=3))
        axes[0].plot([n for n, _ in points], [e["median_ms"] for _, e in points], label=label, **style)
        if len(axes) > 1:
            axes[1].plot([n for n, _ in points], [max(e.get("peak_extra_bytes", 0), 1) / 2**20 for _, e in points],
                         label=label, **style)
    axes[0].set_title("attention layer: median latency")
    axes[0].set_ylabel("ms")
    if len(axes) > 1:
        axes[1].set_title("attention layer: peak extra memory")
        axes[1].set_ylabel("MiB")
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length N")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=7, ncol=2)


def _model_panel(ax, model_rows, info):
    """Bars of the whole model's time ÷ softmax's, one group per model, one bar per length."""
    labels = list(model_rows[0]["results"])
    width = 0.8 / max(len(model_rows), 1)
    for i, row in enumerate(model_rows):
        reference = row["results"][info["softmax_label"]]["median_ms"]
        ax.bar([j + i * width for j in range(len(labels))], [row["results"][m]["time_vs_softmax"] for m in labels],
               width=width, label=f"N={row['seq_len']} ({reference:.1f} ms = 1)")
    ax.axhline(1.0, color="black", linewidth=1)
    ax.set_xticks([j + width * (len(model_rows) - 1) / 2 for j in range(len(labels))])
    ax.set_xticklabels(labels, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel(f"median forward time / {info['softmax_label']}")
    ax.set_title(f"whole model forward: {info['architecture']}")
    ax.legend(fontsize=7)
    ax.grid(True, axis="y", alpha=0.3)

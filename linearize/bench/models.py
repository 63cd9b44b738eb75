"""Whole Hugging Face models timed side by side: their inputs, what they are, the memory softmax
would need at a length (and the cap that skips it), one row of measurements per length, and the
short whole-model part of :func:`linearize.bench.run_bench` (softmax against a converted copy per
method at the model's own lengths)."""

from __future__ import annotations

import copy
import os

import torch

from ..errors import LinearizeError
from ..machine import physical_memory
from .timing import CPU, measure_candidates


def load_model(model):
    """``model`` itself, or the sequence-classification model a name/folder/Hub id loads
    (:func:`linearize.convert.loading.load_source_model`)."""
    if not isinstance(model, (str, os.PathLike)):
        return model
    from ..convert.loading import load_source_model

    return load_source_model(str(model), head="sequence-classification", num_labels=2)


def model_inputs(model, batch_size, n, seed):
    """Random token ids (ordinary word pieces, past the special tokens) and a full attention mask
    of ``batch_size`` sequences of ``n`` tokens for ``model``."""
    config = model.config
    vocab = int(getattr(config, "vocab_size", 1000))
    generator = torch.Generator().manual_seed(seed + n)
    low = min(1000, max(vocab // 4, 1))  # ordinary word pieces, past the special tokens
    ids = torch.randint(low, vocab, (batch_size, n), generator=generator)
    return {"input_ids": ids, "attention_mask": torch.ones(batch_size, n, dtype=torch.long)}


def model_info(model, softmax_label):
    """What a benchmark records of a model: name, architecture, size, and its softmax label."""
    config = model.config
    return {"name": getattr(config, "_name_or_path", None) or type(model).__name__,
            "architecture": type(model).__name__, "model_type": getattr(config, "model_type", None),
            "num_layers": getattr(config, "num_hidden_layers", None),
            "hidden_size": getattr(config, "hidden_size", None),
            "num_heads": getattr(config, "num_attention_heads", None),
            "parameters": int(sum(p.numel() for p in model.parameters())), "softmax_label": softmax_label}


def learned_positions(model):
    """The length of a model's learned absolute position table, or None (rotary, sinusoidal, none)."""
    from ..convert.positions import max_positions

    try:
        return max_positions(model)
    except LinearizeError:
        return None


def accepted_length(model):
    """The longest input a model takes as it is: its learned positions, else its config's limit."""
    return learned_positions(model) or getattr(model.config, "max_position_embeddings", None)


def default_softmax_max_bytes(placement=CPU):
    """Half the GPU's memory on CUDA, else half the machine's physical memory (16 GiB where it
    cannot be read)."""
    if placement.is_cuda:
        return placement.memory_bytes() // 2
    memory = physical_memory()
    memory_gib = round(memory / 2**30, 1) if memory else 32  # to the 0.1 GiB bench-long.json's machine states
    return int(memory_gib / 2 * 2**30)


def softmax_bytes(model, batch_size, n):
    """``(bytes, what)``: the N×N memory one softmax attention layer of ``model`` needs at length ``n``.

    Eager attention holds the scores and the probabilities, ``2·batch·heads·N²·4`` bytes. SDPA on
    CPU runs PyTorch's fused kernel block by block (a one-layer BERT with 12 heads at N = 2,048
    allocated 15.6 MiB, against 384 MiB for the two matrices), so only the attention mask
    transformers may build remains, at most ``batch·N²·4`` bytes.
    """
    if getattr(model.config, "_attn_implementation", None) == "eager":
        heads = int(getattr(model.config, "num_attention_heads", 1))
        return 2 * batch_size * heads * n * n * 4, "eager attention's N×N scores and probabilities"
    return batch_size * n * n * 4, "SDPA's N×N attention mask"


def softmax_skip_reason(model, batch_size, n, max_bytes):
    """Why softmax is not run at length ``n`` (None: it is): :func:`softmax_bytes` exceeds ``max_bytes``."""
    need, what = softmax_bytes(model, batch_size, n)
    if need <= max_bytes:
        return None
    return f"{what} would take {_size(need)} > the cap of {_size(max_bytes)} (--softmax-max-gib)"


def _size(nbytes):
    return f"{nbytes / 2**30:.1f} GiB" if nbytes >= 2**29 else f"{nbytes / 2**20:.1f} MiB"


def measure_lengths(models, reference, seq_lens, *, batch_size=1, repeats=5, warmup=2, memory=True,
                    softmax_max_bytes=None, capped=None, seed=0, log=None, placement=CPU):
    """One row per length: every model of ``{label: model}`` timed (and profiled) side by side,
    ``time_vs_softmax`` against ``reference``'s label. The labels of ``capped`` (default: the
    reference; every model that keeps a softmax layer belongs there) are skipped, with the reason
    in ``skipped``, where :func:`softmax_skip_reason` says so. Models and inputs go to
    ``placement``'s device and dtype."""
    for model in models.values():
        placement.model(model)
    first = models[reference]
    capped = {reference} if capped is None else set(capped)
    rows = []
    for n in (int(n) for n in seq_lens):
        batch = placement.batch(model_inputs(first, batch_size, n, seed))
        reason = None if softmax_max_bytes is None else softmax_skip_reason(first, batch_size, n, softmax_max_bytes)
        skipped = {label: reason for label in models if reason and label in capped}
        candidates = {label: (lambda m: lambda: m(**batch))(m) for label, m in models.items() if label not in skipped}
        results = (measure_candidates(candidates, repeats, warmup, memory, reference, "time_vs_softmax", placement)
                   if candidates else {})
        rows.append({"seq_len": n, "results": results, "skipped": skipped})
        if log:
            parts = [f"{label} {entry['median_ms']:.1f}" for label, entry in results.items()]
            log(f"model N={n}: " + ", ".join(parts) + " ms (medians)" +
                (f"; skipped: {', '.join(skipped)}" if skipped else ""))
        del batch, candidates
    return rows


def _softmax_and_converted(base, specs, seed):
    """``(softmax label, {label: model})``: ``base`` under its own attention implementation, an
    eager deep copy where it has another, and a converted deep copy per method spec."""
    from ..convert import convert

    implementation = getattr(base.config, "_attn_implementation", None) or "default"
    softmax_label = f"softmax ({implementation})"
    models = {softmax_label: base}
    if implementation != "eager" and hasattr(base, "set_attn_implementation"):
        eager = copy.deepcopy(base)
        try:
            eager.set_attn_implementation("eager")
            models["softmax (eager)"] = eager.eval()
        except (ValueError, RuntimeError):
            pass
    for label, name, options in specs:
        converted = copy.deepcopy(base)
        torch.manual_seed(seed)
        models[label] = convert(converted, name, **options).eval()
    return softmax_label, models


def bench_model(model, specs, seq_lens, *, batch_size=1, repeats=5, warmup=2, memory=True, seed=0, log=None,
                placement=CPU):
    """Whole-model forward latency: softmax (own implementation and eager) against a converted copy
    per method, at each length the model accepts, every model on ``placement``'s device and dtype."""
    from ..convert.api import is_converted

    base = load_model(model).eval()
    if is_converted(base):
        raise LinearizeError("bench_model needs the softmax model: this one is already converted (linearize.revert it)")
    softmax_label, models = _softmax_and_converted(base, specs, seed)
    for candidate in models.values():
        placement.model(candidate)
    limit = getattr(base.config, "max_position_embeddings", None)
    rows = []
    for n in seq_lens:
        n = int(n)
        if limit is not None and n > int(limit):
            if log:
                log(f"model N={n}: skipped (longer than max_position_embeddings={limit})")
            continue
        batch = placement.batch(model_inputs(base, batch_size, n, seed))
        candidates = {label: (lambda m: lambda: m(**batch))(m) for label, m in models.items()}
        row = {"seq_len": n, "results": measure_candidates(candidates, repeats, warmup, memory, softmax_label,
                                                           "time_vs_softmax", placement)}
        rows.append(row)
        if log:
            parts = [f"{label} {entry['median_ms']:.2f}" for label, entry in row["results"].items()]
            log(f"model N={n}: " + ", ".join(parts) + " ms (medians)")
    return model_info(base, softmax_label), rows

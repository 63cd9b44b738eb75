"""What a run measures beyond training and its task scores (:mod:`linearize.evaluation`): forward
latency (bench's interleaved timer), the figure data of the feature maps and of CLS attention, the
data's hash (the machine it ran on: :func:`linearize.machine.environment`)."""

from __future__ import annotations

import copy
import hashlib
import json
import statistics

import numpy as np
import torch

from ..attention import FeatureMap
from ..convert import convert, feature_maps_of, revert


def with_other_load(measure, *args):
    """``measure(*args)`` (a dict, a list of dicts, or None), each dict with ``other_processes_cores``: how many
    cores other processes kept busy on average meanwhile (:func:`linearize.machine.other_processes_cores`), so a
    report can say when its timings were taken on a busy machine."""
    from ..machine import cpu_snapshot, other_processes_cores

    start = cpu_snapshot()
    result = measure(*args)
    other = other_processes_cores(start, cpu_snapshot())
    if isinstance(result, dict):
        return {**result, "other_processes_cores": other}
    if isinstance(result, list):
        return [{**row, "other_processes_cores": other} for row in result]
    return result


@torch.no_grad()
def latency(teacher, student, batch, repeats=10):
    """Median forward time (ms) of teacher and student on the same batch, interleaved (one warm-up
    round, then ``repeats`` timed rounds of :func:`linearize.bench.interleaved_times`)."""
    from ..bench import interleaved_times

    for model in (teacher, student):
        model.eval()
    batch = on_device(batch, teacher)  # a model trained on a GPU stays there
    times = interleaved_times({"teacher": lambda: teacher(**batch), "student": lambda: student(**batch)},
                              repeats=repeats, warmup=1, placement=placement_of(teacher))
    t, s = (1000 * statistics.median(times[name]) for name in ("teacher", "student"))
    return {"teacher_ms": t, "student_ms": s, "speedup": t / s if s else None, "repeats": repeats}


@torch.no_grad()
def latency_at_lengths(teacher, student, token_ids, lengths, repeats):
    """:func:`latency` at each of ``lengths`` (batch 1: ``token_ids [1, n]`` repeated to the length, all real):
    a list of ``{"seq_len", "teacher_ms", "student_ms", "speedup", "repeats"}``. A model with fewer learned
    positions than the longest length is timed on a copy with its table tiled to it (``linearize bench
    long``'s rule: softmax and the linear model get the same table)."""
    from ..bench.models import learned_positions
    from ..convert.positions import extend_positions

    longest = max(lengths)
    models = [extend_positions(copy.deepcopy(model), longest)
              if (learned_positions(model) or longest) < longest else model for model in (teacher, student)]
    rows = []
    for length in lengths:
        ids = token_ids.repeat(1, -(-length // token_ids.shape[1]))[:, :length]
        rows.append({"seq_len": length, **latency(*models, {"input_ids": ids, "attention_mask": torch.ones_like(ids)},
                                                  repeats)})
    return rows


@torch.no_grad()
def latency_per_example(teacher, student, loader, count):
    """Mean forward time (ms) per example of teacher and student over the first ``count`` examples of ``loader``
    (a text task's batches), each at its own length: its real tokens only, batch 1. The two models alternate,
    the first one of each example taking turns, after one untimed example (a warm-up). ``{"examples",
    "mean_tokens", "teacher_ms", "student_ms", "speedup"}``, or None when the loader has no example."""
    from ..bench import interleaved_times

    examples = list(_own_length_inputs(loader, count + 1, teacher))
    if len(examples) < 2:
        return None
    models, placement = {"teacher": teacher.eval(), "student": student.eval()}, placement_of(teacher)
    totals = {name: 0.0 for name in models}
    for index, inputs in enumerate(examples):
        order = list(models) if index % 2 else list(models)[::-1]
        calls = {name: lambda model=models[name]: model(**inputs) for name in order}
        for name, seconds in interleaved_times(calls, repeats=1, warmup=0, placement=placement).items():
            totals[name] += seconds[0] if index else 0.0  # example 0 warms up
    timed = len(examples) - 1
    teacher_ms, student_ms = (1000 * totals[name] / timed for name in models)
    tokens = sum(inputs["input_ids"].shape[1] for inputs in examples[1:]) / timed
    return {"examples": timed, "mean_tokens": tokens, "teacher_ms": teacher_ms, "student_ms": student_ms,
            "speedup": teacher_ms / student_ms if student_ms else None}


def _own_length_inputs(loader, count, model):
    """Up to ``count`` single-example inputs from ``loader``'s batches, each cut to its real tokens (its
    attention mask's ones), on ``model``'s device."""
    found = 0
    for batch in loader:
        if "input_ids" not in batch:  # not a single-text task (pairs of texts come as two inputs)
            return
        mask = batch.get("attention_mask", torch.ones_like(batch["input_ids"]))
        for ids, real in zip(batch["input_ids"], mask):
            ids = ids[real.bool()][None]
            yield on_device({"input_ids": ids, "attention_mask": torch.ones_like(ids)}, model)
            found += 1
            if found == count:
                return


def longer_lengths(config, spec, model, seq_len):
    """The lengths of ``eval.latency_lengths`` a run times beside its own ``seq_len``: text models only,
    longer than ``seq_len``, at most ``eval.latency_max_length`` and what the model's positions allow
    (learned positions can be tiled further; a rotary model's limit cannot)."""
    from ..bench.models import learned_positions

    if spec.kind != "text":
        return []
    limit = config.eval.latency_max_length
    if learned_positions(model) is None and getattr(model.config, "max_position_embeddings", None):
        limit = min(limit, model.config.max_position_embeddings)
    return sorted({n for n in config.eval.latency_lengths if seq_len < n <= limit})


def placement_of(model):
    """The benchmark placement of ``model``'s device: its timer waits for a GPU's queued kernels."""
    from ..bench import Placement

    return Placement(device=str(next(model.parameters()).device))


def on_device(batch, model):
    """``batch``'s tensors on ``model``'s device."""
    device = next(model.parameters()).device
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def latency_batch(config, spec, loader, model=None):
    """A batch of ``eval.latency_batch_size`` inputs at the run's sequence length (text:
    ``data.max_length`` real tokens, at most ``eval.latency_max_length``; image: the loader's image
    size, its sequence length the patch count + 1 from ``model``'s config); ``config``: the run's
    ``RunConfig``."""
    batch = next(iter(loader))
    size = config.eval.latency_batch_size
    if spec.kind == "image":  # the sequence length is the patch count (+ the class token)
        pixels = batch["pixel_values"][:size]
        patch = getattr(getattr(model, "config", None), "patch_size", None)
        tokens = (pixels.shape[-2] // patch) * (pixels.shape[-1] // patch) + 1 if patch else pixels.shape[-1]
        return {"pixel_values": pixels}, tokens
    length = min(config.data.max_length, config.eval.latency_max_length)
    ids = batch["input_ids"][:1]
    ids = ids.repeat(size, (length + ids.shape[1] - 1) // ids.shape[1])[:, :length]
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}, length


@torch.no_grad()
def luna_channels(student, loader):
    """The figure data of the first and last converted layer's feature map on one batch
    (:meth:`FeatureMap.probe`; LUNA's is its Fig. 3: ψ_ℓ(u) over the empirical u), or ``[]``
    when the method has none."""
    maps = feature_maps_of(student)
    chosen = sorted({min(maps), max(maps)}) if maps else []
    if all(type(maps[i]).probe is FeatureMap.probe for i in chosen):  # no figure: no forward pass either
        return []
    inputs = {i: [] for i in chosen}
    hooks = [maps[i].register_forward_pre_hook(lambda mod, args, kw, i=i: inputs[i].append(args[0]), with_kwargs=True)
             for i in chosen]
    batch = on_device(next(iter(loader)), student)
    try:
        student.eval()
        student(**{k: v for k, v in batch.items() if k not in ("labels", "label")})
    finally:
        for hook in hooks:
            hook.remove()
    # a layer whose map saw no input (a hybrid whose window covers the batch runs exact softmax) has no figure
    probes = [(i, maps[i].probe(inputs[i])) for i in chosen if inputs[i]]
    return [{"layer": i, **data} for i, data in probes if data is not None]


@torch.no_grad()
def cls_attention(teacher, student, loader, spec, processor, examples=3):
    """LUNA Fig. 4 data: CLS→token (or →patch) attention of the last layer, mean over heads."""
    batch = on_device(next(iter(loader)), teacher)
    inputs = {k: v[:examples] for k, v in batch.items() if k not in ("labels", "label")}
    convert(teacher, "softmax")  # exact softmax through linearize's path, which returns the weights
    try:
        teacher_attentions = teacher(**inputs, output_attentions=True).attentions
    finally:
        revert(teacher)
    t_att = teacher_attentions[-1].mean(1)[:, 0]
    s_att = student(**inputs, output_attentions=True).attentions[-1].mean(1)[:, 0]
    layer = len(teacher_attentions) - 1
    if spec.kind == "text":
        return [_text_attention(inputs, n, t_att, s_att, layer, processor) for n in range(t_att.shape[0])]
    return [_image_attention(inputs, n, t_att, s_att, layer) for n in range(t_att.shape[0])]


def _text_attention(inputs, n, t_att, s_att, layer, processor):
    """Example ``n``'s CLS→token attention over its real (unpadded) tokens."""
    real = int(inputs["attention_mask"][n].sum())
    ids = inputs["input_ids"][n, :real].tolist()
    return {"text": processor.decode(ids, skip_special_tokens=True), "tokens": processor.convert_ids_to_tokens(ids),
            "teacher": t_att[n, :real].tolist(), "student": s_att[n, :real].tolist(), "layer": layer}


def _image_attention(inputs, n, t_att, s_att, layer):
    """Image ``n``'s CLS→patch attention on its patch grid, with its grey pixels (0-255) to draw under it."""
    patches = t_att.shape[-1] - 1
    side = int(round(patches ** 0.5))
    pixels = inputs["pixel_values"][n].float().mean(0)
    pixels = (255 * (pixels - pixels.min()) / (pixels.max() - pixels.min() + 1e-8)).round().int()
    return {"image_index": n, "grid": [side, side], "teacher": t_att[n, 1:].tolist(), "student": s_att[n, 1:].tolist(),
            "layer": layer, "pixels": pixels.tolist()}


def data_hash(data):
    """sha256 over every split's labels and texts (text) or labels and a strided image sample."""
    digest = hashlib.sha256()
    for split in sorted(data):
        ds = data[split]
        digest.update(f"{split}:{len(ds)}".encode())
        for column in ds.column_names:
            if column == "image":
                step = max(1, len(ds) // 256)
                for i in range(0, len(ds), step):
                    digest.update(np.asarray(ds[i]["image"]).tobytes())
            else:
                digest.update(json.dumps(ds[column], default=str).encode())
    return "sha256:" + digest.hexdigest()

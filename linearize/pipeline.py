"""`linearize run`: the whole conversion in one command, driven by a recipe.

teacher (fine-tune the softmax model, unless it already is) → convert → stage 1 (attention
distillation) → stage 2 (fine-tuning) → evaluate teacher and student on the same splits with
the same metric → recovery report. Model selection (early stopping) only ever sees the
``validation`` split; recovery is reported on ``test`` (when the task has a labelled one).

A run folder holds each finished stage (``teacher/``, ``stage1/``, ``model/``) and a
``state.json``; running again with the same ``--out`` resumes after the last finished stage
(and inside a stage from its last checkpoint).
"""

from __future__ import annotations

import copy
import hashlib
import json
import platform
import statistics
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch

from .attention import FeatureMap
from .convert import convert, feature_maps_of, linearize_config, revert
from .distill import DistillConfig, attention_distances, distill
from .errors import LinearizeError
from .finetune import FinetuneConfig, evaluate, finetune
from .io import atomic_dir, atomic_write_json
from .report import (AttentionInfo, LayerDistance, Latency, ModelInfo, Report, StageResult, TaskInfo, Timing,
                     copy_report, save_report)


# ---- models -----------------------------------------------------------------------------------------

def build_source_model(recipe, spec):
    """The softmax starting point: a pretrained checkpoint with the task's head, or (``model:
    {config: ...}``) a model built from a config to be trained from scratch."""
    import transformers

    from .convert.heads import auto_class_for
    from .convert.loading import load_source_model

    head_kwargs = spec.model_config_kwargs()
    source = recipe["model"]
    if isinstance(source, dict):
        config_dict = dict(source.get("config") or {})
        model_type = config_dict.pop("model_type", None)
        if model_type is None:
            raise LinearizeError("recipe model.config needs a model_type (e.g. vit)")
        config = transformers.AutoConfig.for_model(model_type, **config_dict, **head_kwargs)
        cls = getattr(transformers, auto_class_for(recipe["head"]))
        torch.manual_seed(recipe["seed"])
        return cls.from_config(config), None
    model = load_source_model(source, head=recipe["head"], **head_kwargs)
    return model, source


def load_processor(recipe, spec):
    """Tokenizer (text) or image processor (image) of the source checkpoint, or None."""
    import transformers

    from .convert.loading import resolve_model_name

    if isinstance(recipe["model"], dict):
        return None
    source = resolve_model_name(recipe["model"])
    if (Path(source) / "config.json").is_file() and "linearize" in json.loads((Path(source) / "config.json").read_text()):
        from .convert.api import load_processor as load_saved_processor

        return load_saved_processor(source)
    auto = transformers.AutoTokenizer if spec.kind == "text" else transformers.AutoImageProcessor
    try:
        return auto.from_pretrained(source)
    except (OSError, ValueError) as error:
        raise LinearizeError(f"could not load the {'tokenizer' if spec.kind == 'text' else 'image processor'} of "
                             f"{recipe['model']}: {str(error).splitlines()[0]}") from None


# ---- data -------------------------------------------------------------------------------------------

def load_data(recipe):
    from .data import load_task_data

    d = recipe["data"]
    keys = ("data_dir", "data_file", "train_file", "validation_file", "test_file", "text_column",
            "text_pair_column", "label_column", "dev_fraction")
    data, spec = load_task_data(recipe["task"], seed=d["seed"], **{k: d[k] for k in keys if d[k] is not None})
    for split, limit in (("train", d["max_train_examples"]),):
        if limit and len(data[split]) > limit:
            data[split] = data[split].shuffle(seed=d["seed"]).select(range(limit))
    for split in list(data):
        if split != "train" and d["max_eval_examples"] and len(data[split]) > d["max_eval_examples"]:
            data[split] = data[split].shuffle(seed=d["seed"]).select(range(d["max_eval_examples"]))
    if "validation" not in data or len(data["validation"]) == 0:
        raise LinearizeError(f"task {recipe['task']!r} has no validation split to select on; set data.dev_fraction")
    return data, spec


def make_loaders(recipe, data, spec, processor, batch_size, seed):
    from .data import make_dataloaders

    d = recipe["data"]
    extra = {}
    if spec.kind == "image":
        extra = {"num_channels": d["num_channels"] or 3, "crop_scale": tuple(d["crop_scale"])}
        if processor is None:
            if not d["image_size"]:
                raise LinearizeError("a model trained from scratch needs data.image_size (and image_mean/std)")
            extra.update(size=d["image_size"], mean=d["image_mean"], std=d["image_std"])
        return make_dataloaders(data, spec, image_processor=processor, batch_size=batch_size,
                                eval_batch_size=recipe["eval"]["batch_size"], seed=seed, **extra)
    return make_dataloaders(data, spec, tokenizer=processor, batch_size=batch_size,
                            eval_batch_size=recipe["eval"]["batch_size"], max_length=d["max_length"], seed=seed)


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


# ---- measurements -----------------------------------------------------------------------------------

def scores(model, loaders, spec, splits, progress=False):
    """The task's metrics on each of ``splits`` (with progress bars if ``progress``)."""
    return {split: evaluate(model, loaders[split], spec, description=f"  evaluating on {split}" if progress else None)
            for split in splits if split in loaders}


@torch.no_grad()
def latency(teacher, student, batch, repeats=10):
    """Median forward time (ms) of teacher and student on the same batch, interleaved."""
    for model in (teacher, student):
        model.eval()
        model(**batch)
    times = {"teacher": [], "student": []}
    for _ in range(repeats):
        for name, model in (("teacher", teacher), ("student", student)):
            start = time.perf_counter()
            model(**batch)
            times[name].append(1000 * (time.perf_counter() - start))
    t, s = statistics.median(times["teacher"]), statistics.median(times["student"])
    return {"teacher_ms": t, "student_ms": s, "speedup": t / s if s else None, "repeats": repeats}


def latency_batch(recipe, spec, loader, model=None):
    """A batch at the run's sequence length (text: ``max_length`` real tokens; image: the
    loader's image size, its sequence length the patch count + 1 from ``model``'s config)."""
    batch = next(iter(loader))
    size = recipe["eval"]["latency_batch_size"]
    if spec.kind == "image":  # the sequence length is the patch count (+ the class token)
        pixels = batch["pixel_values"][:size]
        patch = getattr(getattr(model, "config", None), "patch_size", None)
        tokens = (pixels.shape[-2] // patch) * (pixels.shape[-1] // patch) + 1 if patch else pixels.shape[-1]
        return {"pixel_values": pixels}, tokens
    length = recipe["data"]["max_length"]
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
    batch = next(iter(loader))
    try:
        student.eval()
        student(**{k: v for k, v in batch.items() if k not in ("labels", "label")})
    finally:
        for hook in hooks:
            hook.remove()
    probes = [(i, maps[i].probe(inputs[i])) for i in chosen]
    return [{"layer": i, **data} for i, data in probes if data is not None]


@torch.no_grad()
def cls_attention(teacher, student, loader, spec, processor, examples=3):
    """LUNA Fig. 4 data: CLS→token (or →patch) attention of the last layer, mean over heads."""
    batch = next(iter(loader))
    inputs = {k: v[:examples] for k, v in batch.items() if k not in ("labels", "label")}
    convert(teacher, "softmax")  # exact softmax through linearize's path, which returns the weights
    try:
        teacher_attentions = teacher(**inputs, output_attentions=True).attentions
    finally:
        revert(teacher)
    t_att = teacher_attentions[-1].mean(1)[:, 0]
    s_att = student(**inputs, output_attentions=True).attentions[-1].mean(1)[:, 0]
    layer = len(teacher_attentions) - 1
    out = []
    for n in range(t_att.shape[0]):
        if spec.kind == "text":
            real = int(inputs["attention_mask"][n].sum())
            ids = inputs["input_ids"][n, :real].tolist()
            out.append({"text": processor.decode(ids, skip_special_tokens=True),
                        "tokens": processor.convert_ids_to_tokens(ids), "teacher": t_att[n, :real].tolist(),
                        "student": s_att[n, :real].tolist(), "layer": layer})
        else:
            patches = t_att.shape[-1] - 1
            side = int(round(patches ** 0.5))
            pixels = inputs["pixel_values"][n].float().mean(0)
            pixels = (255 * (pixels - pixels.min()) / (pixels.max() - pixels.min() + 1e-8)).round().int()
            out.append({"image_index": n, "grid": [side, side], "teacher": t_att[n, 1:].tolist(),
                        "student": s_att[n, 1:].tolist(), "layer": layer, "pixels": pixels.tolist()})
    return out


def environment():
    import transformers

    from . import __version__

    from .bench import cpu_model

    cpu = cpu_model()
    return {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
            "linearize": __version__, "platform": platform.platform(), "cpu": cpu, "threads": torch.get_num_threads()}


# ---- the run ----------------------------------------------------------------------------------------

class RunState:
    """``state.json`` of a run folder: which stages are finished, with their results."""

    def __init__(self, out_dir, recipe):
        self.path = Path(out_dir) / "state.json"
        self.data = json.loads(self.path.read_text()) if self.path.is_file() else {}
        if recipe is not None and self.data:
            difference = recipe_difference(self.data.get("recipe") or {}, _comparable(recipe))
            if difference is not None:
                raise LinearizeError(f"{out_dir} holds a run of a different recipe ({difference}); choose another "
                                     "--out or pass --overwrite to start over")
            self.data["recipe"] = _comparable(recipe)  # keys added since, at their defaults
        self.data.setdefault("recipe", _comparable(recipe))
        self.data.setdefault("stages", {})

    def done(self, stage):
        return stage in self.data["stages"]

    def get(self, stage):
        return self.data["stages"][stage]

    def finish(self, stage, result):
        self.data["stages"][stage] = result
        atomic_write_json(self.path, self.data)


def recipe_difference(saved, current, defaults=None, path=""):
    """The first setting in which two resolved recipes differ, as ``"key: saved -> current"``, or
    None. A key missing from ``saved`` (a run folder written before the key existed) counts as
    its default (:data:`linearize.recipes.DEFAULTS`); so does a feature-map option missing from
    the run's ``options`` (the method's own default: ``{}`` and ``{"shared_projections": True}``
    are the same LUNA)."""
    from .recipes import DEFAULTS

    defaults = DEFAULTS if defaults is None else defaults
    for key in sorted(set(saved) | set(current), key=str):
        default = defaults.get(key) if isinstance(defaults, dict) else None
        old, new = saved.get(key, default), current.get(key, default)
        if key == "options" and not path and isinstance(old, dict) and isinstance(new, dict):
            method_defaults = _option_defaults(current.get("method"))
            old, new = {**method_defaults, **old}, {**method_defaults, **new}
            for option in sorted(set(old) | set(new), key=str):
                if old.get(option) != new.get(option):
                    return f"options.{option}: {old.get(option)!r} -> {new.get(option)!r}"
            continue
        if isinstance(old, dict) and isinstance(new, dict) and key != "quick":
            found = recipe_difference(old, new, default if isinstance(default, dict) else {}, f"{path}{key}.")
            if found is not None:
                return found
        elif old != new:
            return f"{path}{key}: {old!r} -> {new!r}"
    return None


def _option_defaults(method):
    """``{option: default}`` of ``method`` as a recipe records them, or ``{}`` (no such method)."""
    from .attention import method_options

    try:
        return _comparable(method_options(method))
    except (ValueError, TypeError):
        return {}


def _comparable(recipe):
    return json.loads(json.dumps(recipe, default=str))


def _drop_resume_checkpoints(work_dir):
    """Delete a finished stage's resume checkpoints (weights, optimizer state): once ``state.json``
    records the stage and its model is saved they serve nothing, and they are most of a run's disk
    (~350 MB for MiniLM's stage 2). Its ``metrics.jsonl`` (the training curve) stays."""
    import shutil

    work_dir = Path(work_dir)
    if not work_dir.is_dir():
        return
    for path in work_dir.iterdir():
        if path.name == "metrics.jsonl":
            continue
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()


def _link_or_copy(source, target):
    import shutil

    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(source, target, copy_function=_hardlink_or_copy)


def _hardlink_or_copy(src, dst):
    import os
    import shutil

    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _save_model(model, processor, directory, results=None):
    """Write model, processor and ``{file name: result dict}`` JSON files into ``directory`` atomically."""
    with atomic_dir(directory) as tmp:
        model.save_pretrained(tmp)
        if processor is not None:
            processor.save_pretrained(tmp)
        for name, result in (results or {}).items():
            atomic_write_json(Path(tmp) / name, _comparable(result))


def _load_saved(directory, converted):
    import transformers

    import linearize

    if converted:
        return linearize.load(directory)
    config = transformers.AutoConfig.from_pretrained(directory)
    cls = getattr(transformers, config.architectures[0])
    return cls.from_pretrained(directory, use_safetensors=True).eval()


def run(recipe, out_dir, *, overwrite=False, progress=True, log=print, teacher_from=None):
    """Run the whole pipeline of ``recipe`` (a dict from ``load_recipe``) into ``out_dir``.

    ``teacher_from``: a finished run folder of the same model, task, data and seed whose teacher
    is reused instead of fine-tuning another (``linearize compare`` shares one per seed).
    """
    import shutil

    from accelerate.utils import set_seed

    from .recipes import options_for

    # the run keeps (and compares with its folder) the options its own method is converted with
    recipe = dict(recipe, options=options_for(recipe["method"], recipe["options"]))
    out_dir = Path(out_dir)
    if overwrite and out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    state = RunState(out_dir, recipe)
    seed = recipe["seed"]
    set_seed(seed)
    started = time.perf_counter()

    log(f"[1/6] data: {recipe['task']}")
    data, spec = load_data(recipe)
    processor = load_processor(recipe, spec)
    report_split = "test" if "test" in data and len(data["test"]) else "validation"
    splits = ["validation"] + ([report_split] if report_split != "validation" else [])
    eval_loaders = make_loaders(recipe, data, spec, processor, recipe["eval"]["batch_size"], seed)

    # teacher
    teacher_dir = out_dir / "teacher"
    if teacher_from is not None and not state.done("teacher"):
        shared = RunState(teacher_from, None)
        if not shared.done("teacher"):
            raise LinearizeError(f"{teacher_from} has no finished teacher to share")
        theirs, ours = shared.data.get("recipe") or {}, _comparable(recipe)
        keys = ("model", "head", "task", "data", "teacher", "seed")
        difference = recipe_difference({k: theirs.get(k) for k in keys}, {k: ours.get(k) for k in keys})
        if difference is not None:
            raise LinearizeError(f"{teacher_from}'s teacher was made with another recipe ({difference}); match it, "
                                 "or drop --teacher-from (--teachers-from), or compare into another --out")
        _link_or_copy(Path(teacher_from) / "teacher", teacher_dir)
        state.finish("teacher", shared.get("teacher"))
    reused_stages = {stage for stage in ("teacher", "stage1", "stage2") if state.done(stage)}
    if state.done("teacher"):
        log("[2/6] teacher: reusing the finished teacher")
        teacher = _load_saved(teacher_dir, converted=False)
        teacher_result = state.get("teacher")
    else:
        teacher, source = build_source_model(recipe, spec)
        teacher_result = {"seconds": 0.0, "history": [], "finetuned": False}
        if recipe["teacher"]["finetune"]:
            log(f"[2/6] teacher: fine-tuning softmax {recipe['model'] if source else 'model from scratch'}")
            cfg = _stage_config(FinetuneConfig, recipe["teacher"], seed)
            loaders = make_loaders(recipe, data, spec, processor, cfg.batch_size, seed)
            teacher_result = finetune(teacher, loaders["train"], eval_loaders["validation"], spec,
                                      out_dir / "work" / "teacher", config=cfg, progress=progress, log=log)
            teacher_result["finetuned"] = True
        else:
            log("[2/6] teacher: using the checkpoint as it is (teacher.finetune: false)")
            check_head(teacher, spec, recipe["model"])
        teacher.eval()
        _save_model(teacher, processor, teacher_dir)
        teacher_result["scores"] = scores(teacher, eval_loaders, spec, splits, progress)
        state.finish("teacher", _comparable(teacher_result))
        _drop_resume_checkpoints(out_dir / "work" / "teacher")
    teacher.eval()

    # convert + stage 1
    stage1_dir = out_dir / "stage1"
    if state.done("stage1"):
        log("[3/6] stage 1: reusing the distilled student")
        student = _load_saved(stage1_dir, converted=True)
        stage1_result = state.get("stage1")
    else:
        log(f"[3/6] convert to {recipe['method']}; stage 1: attention distillation")
        student = copy.deepcopy(teacher)
        convert(student, recipe["method"], layers=recipe["layers"], source=str(recipe["model"]), **recipe["options"])
        s1 = recipe["stage1"]
        cfg = _stage_config(DistillConfig, s1, seed)
        loaders = make_loaders(recipe, data, spec, processor, s1["batch_size"], seed)
        if s1["enabled"]:
            stage1_result = distill(student, loaders["train"], cfg, eval_loader=eval_loaders["validation"],
                                    eval_batches=s1["eval_batches"], checkpoint_dir=out_dir / "work" / "stage1",
                                    progress=progress, log=log)
        else:
            per_layer = attention_distances(student, eval_loaders["validation"], s1["eval_batches"])
            stage1_result = {"skipped": True, "reason": "stage1.enabled is false", "per_layer_before": per_layer,
                             "per_layer_after": per_layer, "history": [], "seconds": 0.0, "steps": 0}
        student.eval()
        stage1_result["scores"] = scores(student, eval_loaders, spec, splits, progress)
        _save_model(student, processor, stage1_dir)
        state.finish("stage1", _comparable(stage1_result))
        _drop_resume_checkpoints(out_dir / "work" / "stage1")

    # stage 2
    model_dir = out_dir / "model"
    if state.done("stage2"):
        log("[4/6] stage 2: reusing the fine-tuned student")
        student = _load_saved(model_dir, converted=True)
        stage2_result = state.get("stage2")
    elif recipe["stage2"]["enabled"]:
        log("[4/6] stage 2: fine-tuning the student")
        cfg = _stage_config(FinetuneConfig, recipe["stage2"], seed)
        loaders = make_loaders(recipe, data, spec, processor, cfg.batch_size, seed)
        stage2_result = finetune(student, loaders["train"], eval_loaders["validation"], spec,
                                 out_dir / "work" / "stage2", config=cfg, teacher=teacher, progress=progress, log=log)
        student.eval()
        stage2_result["scores"] = scores(student, eval_loaders, spec, splits, progress)
        _save_model(student, processor, model_dir)
        state.finish("stage2", _comparable(stage2_result))
        _drop_resume_checkpoints(out_dir / "work" / "stage2")
    else:
        stage2_result = {"skipped": True, "seconds": 0.0, "history": [], "scores": stage1_result["scores"]}
        _save_model(student, processor, model_dir)
        state.finish("stage2", stage2_result)

    log("[5/6] measuring latency and attention")
    batch, seq_len = latency_batch(recipe, spec, eval_loaders[report_split], teacher)
    if not state.done("latency"):  # measured once: a resumed run keeps the figure of its own run
        state.finish("latency", latency(teacher, student, batch, recipe["eval"]["latency_repeats"]))
    timing = state.get("latency")
    visuals = {"luna_channels": luna_channels(student, eval_loaders["validation"]),
               "cls_attention": cls_attention(teacher, student, eval_loaders[report_split], spec, processor,
                                              recipe["eval"]["examples"])}

    log("[6/6] writing the report")
    # total: this call's wall time plus the stages it reused from earlier calls (or a shared teacher)
    reused = sum(state.get(stage).get("seconds", 0.0) for stage in ("teacher", "stage1", "stage2")
                 if stage in reused_stages)
    report = build_report(recipe, spec, data, student, teacher_result, stage1_result, stage2_result, report_split,
                          timing, seq_len, batch, visuals, time.perf_counter() - started + reused)
    return write_run_report(report, out_dir)


def _stage_config(config_class, section, seed):
    """A stage's config (``DistillConfig``/``FinetuneConfig``) from its recipe section: every
    field the section sets (the section's other keys, e.g. ``enabled``, are the pipeline's)."""
    import dataclasses

    names = {f.name for f in dataclasses.fields(config_class)} - {"seed"}
    return config_class(seed=seed, **{k: v for k, v in section.items() if k in names})


def build_report(recipe, spec, data, student, teacher_result, stage1_result, stage2_result, report_split, timing,
                 seq_len, batch, visuals, total_seconds):
    """The run's :class:`~linearize.report.Report`, built once: the report files, ``linearize
    push``'s model card and ``linearize compare``'s table all read this object. The stage results
    are :class:`~linearize.report.StageResult` or the dicts the stages return."""
    teacher, stage1, stage2 = (StageResult.from_dict(r) for r in (teacher_result, stage1_result, stage2_result))
    block = linearize_config(student) or {}
    base = block.get("parameters_base") or 0
    added = block.get("parameters_added") or 0
    model = ModelInfo(source=str(recipe["model"]) if not isinstance(recipe["model"], dict) else "from scratch",
                      architecture=block.get("architecture"), method=block.get("method"),
                      options=block.get("options", {}), layers=block.get("layers"),
                      num_attention_layers=block.get("num_attention_layers"), parameters_base=base,
                      parameters_added=added, parameters_added_percent=100.0 * added / base if base else 0.0)
    return Report(
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"), recipe=_comparable(recipe),
        task=TaskInfo(name=spec.name, kind=spec.kind, metric_names=tuple(spec.metric_names),
                      primary_metric=spec.primary_metric, selection_split="validation", report_split=report_split,
                      num_examples={split: len(ds) for split, ds in data.items()}),
        model=model, scores={"teacher": teacher.scores, "student_stage1": stage1.scores, "student": stage2.scores},
        attention=_attention(stage1),
        timing=Timing(teacher_seconds=teacher.seconds, stage1_seconds=stage1.seconds, stage2_seconds=stage2.seconds,
                      total_seconds=total_seconds),
        latency=Latency(seq_len=seq_len, batch_size=int(next(iter(batch.values())).shape[0]), **timing),
        curves={"teacher": teacher.history, "stage1": stage1.history, "stage2": stage2.history}, visuals=visuals,
        seeds={"seed": recipe["seed"], "data_seed": recipe["data"]["seed"]}, environment=environment(),
        data_hash=data_hash(data))


def _attention(stage1):
    """Stage 1's attention distances per layer, before and after, and their means."""
    before, after = stage1.per_layer_before, stage1.per_layer_after
    rows = tuple(LayerDistance(layer=int(layer), ce_before=before.get(layer, {}).get("ce"),
                               kl_before=before.get(layer, {}).get("kl"), ce_after=after[layer]["ce"],
                               kl_after=after[layer]["kl"], teacher_entropy=after[layer]["teacher_entropy"],
                               student_entropy=after[layer]["student_entropy"]) for layer in sorted(after, key=int))

    def mean(key):
        values = [getattr(row, key) for row in rows if getattr(row, key) is not None]
        return float(np.mean(values)) if values else None

    return AttentionInfo(per_layer=rows, mean_kl_before=mean("kl_before"), mean_kl_after=mean("kl_after"),
                         stage1_skipped=stage1.skipped)


def write_run_report(report, out_dir):
    """report.json, report.md and figures in the run folder (drawn once), and a copy of them inside
    ``model/`` (what ``linearize push`` of the model folder uploads). Returns the report with its figures."""
    report = save_report(report, out_dir)
    copy_report(out_dir, Path(out_dir) / "model")
    return report


# ---- the single stages (what `linearize distill / finetune / eval` call) ----------------------------------

def stage_recipe(model, task, *, data=None, **top):
    """A recipe dict for a single stage: the defaults with ``model``, ``task`` and ``data`` options."""
    from .recipes import DEFAULTS, merge

    data = {k: v for k, v in (data or {}).items() if v is not None}
    return merge(DEFAULTS, {"name": "stage", "model": model, "task": task, "data": data, **top})


def load_model_for_task(model, spec, head=None):
    """A converted folder (``linearize.load``) or a softmax checkpoint with the task's head."""
    from .convert.loading import load_source_model, resolve_model_name

    path = Path(resolve_model_name(model)) if isinstance(model, str) else None
    if path is not None and (path / "config.json").is_file():
        config = json.loads((path / "config.json").read_text())
        if config.get("linearize"):
            import linearize

            return linearize.load(path), True
    default_head = "image-classification" if spec.kind == "image" else "sequence-classification"
    return load_source_model(model, head=head or default_head, **spec.model_config_kwargs()), False


def check_head(model, spec, name):
    """A model used as it is must have the task's number of outputs."""
    labels = getattr(model.config, "num_labels", None)
    if labels is not None and labels != spec.num_labels:
        raise LinearizeError(f"{name} has {labels} labels but task {spec.name} has {spec.num_labels}: its head "
                             "cannot serve this task; fine-tune a checkpoint with a new head instead")


def _stage_inputs(model, task, data, head=None):
    recipe = stage_recipe(model, task, data=data)
    loaded, spec = load_data(recipe)
    net, converted = load_model_for_task(model, spec, head)
    if converted:
        check_head(net, spec, model)
    processor = load_processor(recipe, spec)
    return recipe, loaded, spec, net, converted, processor


def distill_model(model, task, out, *, method=None, options=None, layers=None, config=None, batch_size=32,
                  eval_batches=10, data=None, overwrite=False, resume=True, progress=True, log=print):
    """Stage 1 alone: distill a converted model (or convert ``model`` with ``method`` first), save it.

    Checkpoints go to ``<out>.work``; an interrupted run resumes from there unless ``resume=False``
    (which clears them and starts afresh)."""
    from .io import prepare_output_dir

    prepare_output_dir(out, overwrite=overwrite)
    recipe, loaded, spec, net, converted, processor = _stage_inputs(model, task, data)
    if not converted:
        if method is None:
            raise LinearizeError(f"{model} is not a converted model: pass --method to convert it first")
        convert(net, method, layers=layers, source=str(model), **(options or {}))
    if not any(p.numel() for fm in feature_maps_of(net).values() for p in fm.parameters()):
        method_name = linearize_config(net)["method"]
        raise LinearizeError(f"{method_name} has no learnable feature-map parameters: stage 1 has nothing to "
                             "train; fine-tune it directly with `linearize finetune`")
    config = config or DistillConfig()
    loaders = make_loaders(recipe, loaded, spec, processor, batch_size, config.seed)
    result = distill(net, loaders["train"], config, eval_loader=loaders["validation"], eval_batches=eval_batches,
                     checkpoint_dir=Path(out).with_name(Path(out).name + ".work"), resume=resume, progress=progress,
                     log=log)
    _save_model(net, processor, out, {"distill.json": result})
    return result


def finetune_model(model, task, out, *, config=None, head=None, data=None, overwrite=False, resume=True,
                   teacher=None, progress=True, log=print):
    """Stage 2 alone (or making a softmax teacher): fine-tune, keep the best dev checkpoint, save it.

    ``teacher`` (a folder or checkpoint with the task's head): the model whose outputs the
    ``config.kd_weight`` term distils from.

    Checkpoints go to ``<out>.work``; an interrupted run resumes from there unless ``resume=False``
    (which clears them and starts afresh)."""
    from .io import prepare_output_dir

    prepare_output_dir(out, overwrite=overwrite)
    recipe, loaded, spec, net, converted, processor = _stage_inputs(model, task, data, head)
    config = config or FinetuneConfig()
    if teacher is not None:
        teacher, _ = load_model_for_task(teacher, spec, head)
        check_head(teacher, spec, "the teacher")
    loaders = make_loaders(recipe, loaded, spec, processor, config.batch_size, config.seed)
    result = finetune(net, loaders["train"], loaders["validation"], spec,
                      Path(out).with_name(Path(out).name + ".work"), config=config, resume=resume, teacher=teacher,
                      progress=progress, log=log)
    splits = [s for s in loaded if s != "train"]
    result["scores"] = scores(net, loaders, spec, splits, progress)
    _save_model(net, processor, out, {"finetune.json": result})
    return result


def evaluate_model(model, task, *, data=None, head=None, batch_size=64, progress=False):
    """``{split: metrics}`` of a model (converted or not) on every labelled non-train split."""
    recipe, loaded, spec, net, converted, processor = _stage_inputs(model, task, data, head)
    check_head(net, spec, model)
    recipe["eval"]["batch_size"] = batch_size
    loaders = make_loaders(recipe, loaded, spec, processor, batch_size, 0)
    splits = [s for s in loaded if s != "train"]
    return {"task": spec.name, "converted": converted, "primary_metric": spec.primary_metric,
            "scores": scores(net, loaders, spec, splits, progress)}

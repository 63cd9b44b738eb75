"""The Hub model card (``README.md``) of a converted model, built on ``huggingface_hub``'s
``ModelCard``/``ModelCardData``/``EvalResult``.

The metadata: the license inherited from the source model when known, ``base_model``, tags,
datasets, the pipeline tag and a ``model-index`` with the student's and the teacher's scores on
the report split. The text: the method, the recovery table (from the run's
:class:`~linearize.report.Report`), the figures, a usage snippet that loads the model with
``trust_remote_code=True``, the training recipe and the limitations.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from ..attention.feature_maps import method_notes
from ..convert.heads import head_for_class
from ..convert.record import ConversionRecord
from ..errors import LinearizeError
from ..machine import busy_warning
from ..markdown import markdown_table
from .markdown import selection_note
from .results import REPORT_JSON, as_report

README = "README.md"
#: the order of the card's metadata keys (``model-index`` comes last)
METADATA_ORDER = ("license", "library_name", "base_model", "tags", "datasets", "pipeline_tag")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json")
IMAGE_PROCESSOR_FILES = ("preprocessor_config.json", "image_processor_config.json")
HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")

#: ``linearize convert`` aliases whose Hub id differs from what the alias resolves to
_SOURCE_HUB_IDS = {"minilm": "sentence-transformers/all-MiniLM-L6-v2",
                   "minilm-l6-v2": "sentence-transformers/all-MiniLM-L6-v2"}

#: non-GLUE task name -> (Hub dataset id or None, display name)
_KNOWN_DATASETS = {
    "fashion-mnist": ("zalando-datasets/fashion_mnist", "Fashion-MNIST"),
    "fashion_mnist": ("zalando-datasets/fashion_mnist", "Fashion-MNIST"),
    "moviereviews": (None, "Movie-review sentence polarity (Pang & Lee, 2005)"),
    "moviereviews-long": (None, "Whole movie reviews, polarity v2.0 (Pang & Lee, 2004)"),
}

LINEAR_ATTENTION = (
    "Softmax attention compares every token with every other one, so its cost grows with the square "
    "of the sequence length N. Linear attention replaces the kernel exp(qᵀk/√d) by a dot product of "
    "feature maps φ(q)ᵀφ(k); attention is then computed as φ(Q)(φ(K)ᵀV), normalised by φ(Q)(φ(K)ᵀ1), "
    "which costs O(N) in time and memory. The pretrained query, key, value and output weights are "
    "kept as they were; only the feature map's own parameters (if any) are new."
)

#: method family -> (methods, paragraph): every feature map's ``card_note``
METHOD_NOTES = method_notes()




def source_info(source):
    """``(Hub id or None, license or None)`` of the model a conversion started from.

    The license is read from the README front matter of the source folder when the source is a
    local folder (or the packaged MiniLM), else from a README in the local Hugging Face cache;
    nothing is fetched.
    """
    if not source:
        return None, None
    source = str(source)
    hub_id, folder = None, None
    from ..convert.loading import ALIASES

    name = ALIASES.get(source, source)
    if source in _SOURCE_HUB_IDS or name in _SOURCE_HUB_IDS:
        hub_id = _SOURCE_HUB_IDS.get(source) or _SOURCE_HUB_IDS[name]
        try:
            from ..convert.loading import minilm_path

            folder = Path(minilm_path())
        except LinearizeError:
            folder = None
    elif Path(source).expanduser().is_dir():
        folder = Path(source).expanduser()
    elif HUB_ID.match(name) and "--" not in name and ".." not in name:
        hub_id = name
    readme = None
    if folder is not None and (folder / README).is_file():
        readme = folder / README
    elif hub_id is not None:
        try:
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(hub_id, README)
            readme = Path(cached) if isinstance(cached, str) else None
        except Exception:  # noqa: BLE001 - the cache is a best-effort source of the license
            readme = None
    license_ = None
    if readme is not None:
        import yaml
        from huggingface_hub import metadata_load

        try:
            license_ = (metadata_load(readme) or {}).get("license")
        except (OSError, UnicodeDecodeError, ValueError, yaml.YAMLError):  # no license to inherit
            license_ = None
    if license_ is not None and not isinstance(license_, str):
        license_ = None
    return hub_id, license_


def head_of(architecture, base_model_type=None, config=None):
    """``(pipeline tag, task display name)`` for a model class name (base models: feature extraction)."""
    head = head_for_class(architecture)
    if head is not None:
        return head.pipeline_tag, head.task_name
    if base_model_type == "timm" and ((config or {}).get("timm_kwargs") or {}).get("num_classes", 1000) != 0:
        return "image-classification", "Image Classification"
    vision = base_model_type == "timm" or bool(config and "image_size" in config)
    if vision:
        return "image-feature-extraction", "Image Feature Extraction"
    return "feature-extraction", "Feature Extraction"


def dataset_of(task_name):
    """``(Hub dataset id or None, config or None, display name)`` of a report's task, or None."""
    if not task_name:
        return None
    from ..data.glue import GLUE_TASKS, HUB_ID as GLUE_HUB_ID, glue_task_name

    glue = glue_task_name(task_name)
    if glue is not None:
        return GLUE_HUB_ID, glue, f"GLUE {GLUE_TASKS[glue].folder}"
    key = str(task_name).strip().lower()
    if key in _KNOWN_DATASETS:
        hub, display = _KNOWN_DATASETS[key]
        return hub, None, display
    if HUB_ID.match(str(task_name)):
        return str(task_name), None, str(task_name)
    return None, None, str(task_name)



def _auto_class(config, architecture):
    """The Auto class whose ``auto_map`` entry is the model's own class, or None."""
    auto_map = config.get("auto_map") or {}
    for auto, target in auto_map.items():
        if auto != "AutoConfig" and str(target).rsplit(".", 1)[-1] == f"Linearize{architecture}":
            return auto
    return None


def conversion_record_of(config):
    """The :class:`ConversionRecord` of a config.json's content; a config without one reads as a
    conversion of unknown method (the card still renders)."""
    return ConversionRecord.from_config(config) or ConversionRecord(method="unknown")


def usage_snippet(repo_id, config, record, files):
    """Python code that downloads and runs the model (``trust_remote_code=True``); ``record``: its
    :class:`ConversionRecord`."""
    architecture = record.architecture or ""
    if record.sentence_transformers_files:  # a sentence-transformers model: how most people use it
        return _sentence_transformers_snippet(repo_id)
    if record.is_timm:
        return _timm_snippet(repo_id)
    auto = _auto_class(config, architecture)
    if auto is None:  # a head no Auto class maps to (DeiT's with-teacher head): load the encoder
        auto, architecture = "AutoModel", ""
    has_tokenizer = any(name in files for name in TOKENIZER_FILES)
    has_images = any(name in files for name in IMAGE_PROCESSOR_FILES)
    vision = "image_size" in config
    masked_lm = architecture.endswith("ForMaskedLM")
    imports = ["import torch", f"from transformers import {auto}"]
    lines = []
    if has_images:
        imports[1] = f"from transformers import AutoImageProcessor, {auto}"
        imports.insert(1, "from PIL import Image")
        lines += ["processor = AutoImageProcessor.from_pretrained(repo_id, trust_remote_code=True)"]
    elif has_tokenizer and not vision:
        imports[1] = f"from transformers import AutoTokenizer, {auto}"
        lines += ["tokenizer = AutoTokenizer.from_pretrained(repo_id, trust_remote_code=True)"]
    lines += [f"model = {auto}.from_pretrained(repo_id, trust_remote_code=True).eval()", ""]
    if has_images:
        lines += ['image = Image.new("RGB", (224, 224), "white")  # your image: Image.open("photo.jpg").convert("RGB")',
                  'inputs = processor(images=image, return_tensors="pt")']
    elif vision:
        lines += ["size, channels = model.config.image_size, model.config.num_channels",
                  "inputs = {\"pixel_values\": torch.randn(1, channels, size, size)}  # your preprocessed images"]
    elif has_tokenizer:
        text = ('f"Linear attention makes long documents {tokenizer.mask_token} to read."' if masked_lm
                else '"An engrossing, beautifully acted film."')
        lines += [f"inputs = tokenizer([{text}], return_tensors=\"pt\")"]
    else:
        lines += ["inputs = {\"input_ids\": torch.tensor([[2, 5, 7, 11, 3]])}  # your token ids"]
    lines += ["with torch.no_grad():", "    outputs = model(**inputs)"]
    lines += _print_lines(config, architecture, masked_lm and has_tokenizer and not vision)
    return "\n".join(imports + ["", f"repo_id = {json.dumps(repo_id)}"] + lines)


def _sentence_transformers_snippet(repo_id):
    return "\n".join([
        "from sentence_transformers import SentenceTransformer",
        "",
        f"model = SentenceTransformer({json.dumps(repo_id)}, trust_remote_code=True)",
        'embeddings = model.encode(["An engrossing, beautifully acted film.", "A dull, overlong mess."])',
        "print(embeddings.shape, model.similarity(embeddings, embeddings))",
    ])


def _timm_snippet(repo_id):
    return "\n".join([
        "import torch",
        "from huggingface_hub import snapshot_download",
        "import linearize  # timm models load through linearize: pip install linearize",
        "",
        f"repo_id = {json.dumps(repo_id)}",
        "model = linearize.load(snapshot_download(repo_id))",
        "images = torch.randn(1, model.patch_embed.proj.in_channels, *model.patch_embed.img_size)  # your images",
        "with torch.no_grad():",
        "    print(model(images).shape)",
    ])


def _print_lines(config, architecture, fills_masks):
    """The snippet's last lines: what the head's output means (a label, tags, the filled mask, a shape)."""
    if architecture.endswith(("ForSequenceClassification", "ForImageClassification",
                              "ForImageClassificationWithTeacher")):
        if config.get("num_labels", len(config.get("id2label") or {}) or 2) == 1:
            return ["print(float(outputs.logits[0, 0]))  # the regression score"]
        return ["print(model.config.id2label[int(outputs.logits.argmax(-1)[0])])"]
    if architecture.endswith("ForTokenClassification"):
        return ["print([model.config.id2label[int(i)] for i in outputs.logits.argmax(-1)[0]])"]
    if fills_masks:
        return ['masked = inputs["input_ids"][0] == tokenizer.mask_token_id',
                "print(tokenizer.decode(outputs.logits[0, masked].argmax(-1)))"]
    if head_for_class(architecture) is None:
        return ["print(outputs.last_hidden_state.shape)  # (batch, tokens, hidden size)"]
    return ["print(outputs[0].shape)"]




# ---- the card ------------------------------------------------------------------------------------

def eval_results(report, pipeline_tag, task_display, dataset):
    """The ``model-index`` results as ``EvalResult``: per metric of the report split, the
    student's score and the teacher's (``teacher_<metric>``)."""
    from huggingface_hub import EvalResult

    hub_id, config, display = dataset or (None, None, report.task.name or "unknown")
    common = {"task_type": pipeline_tag or "other", "task_name": task_display or "Other", "dataset_name": display,
              "dataset_type": hub_id or str(report.task.name or "unknown"), "dataset_config": config,
              "dataset_split": report.split}
    student, teacher = report.scores_of("student"), report.scores_of("teacher")
    results = []
    for metric in report.metric_names:
        for prefix, scores, who in (("", student, "linear-attention student, this model"),
                                    ("teacher_", teacher, "softmax teacher, for reference")):
            if scores.get(metric) is not None:
                results.append(EvalResult(**common, metric_type=f"{prefix}{metric}",
                                          metric_value=float(scores[metric]), metric_name=f"{metric} ({who})"))
    return results


def card_data(repo_id, config, report=None):
    """The card's ``ModelCardData`` (the README's YAML metadata)."""
    from huggingface_hub import ModelCardData

    record = conversion_record_of(config)
    hub_id, license_ = source_info(record.source)
    pipeline_tag, task_display = head_of(record.architecture or "", record.base_model_type, config)
    dataset = dataset_of(report.task.name) if report else None
    results = eval_results(report, pipeline_tag, task_display, dataset) if report else []
    return ModelCardData(license=license_, library_name=None if record.is_timm else "transformers",
                         base_model=hub_id, tags=["linear-attention", record.method, "linearize"] +
                         (["sentence-transformers"] if record.sentence_transformers_files else []),
                         datasets=[dataset[0]] if dataset and dataset[0] else None, pipeline_tag=pipeline_tag,
                         model_name=repo_id.split("/")[-1] if results else None, eval_results=results or None)


def _fmt(value, digits=4):
    return "–" if value is None else f"{value:.{digits}f}"


def _recovery_section(report, figures):
    """The card's "Recovery" section: the scores table, the facts (attention fidelity, timings), the figures."""
    lines = ["## Recovery", ""] + _scores_lines(report)
    facts = _attention_facts(report.attention) + _timing_facts(report.latency)
    if facts:
        lines += facts + [""]
    if figures:
        lines += ["### Figures", ""]
        for name in figures:
            lines += [f"![{Path(name).stem.replace('_', ' ').replace('-', ' ')}]({name})", ""]
    return lines + [f"The full report is in [`{REPORT_JSON}`]({REPORT_JSON}).", ""]


def _scores_lines(report):
    """What the scores mean, the teacher / stage-1 / student table with each metric's recovery, and the
    model selection."""
    split, names = report.split, report.metric_names
    teacher, student = report.scores_of("teacher"), report.scores_of("student")
    stage1 = report.scores_of("student_stage1")
    if not (names and (teacher or student)):
        return ["The report has no scores.", ""]
    if report.task.embedding:
        lines = [f"Agreement with the softmax teacher's sentence embeddings on the held-out **{split}** "
                 "sentences: mean cosine between the two embeddings of each sentence (the score; the teacher's "
                 "own is 1), top-10 retrieval overlap (each sentence as a query against the others) and, with "
                 "a labelled similarity set, Spearman correlation (sts_spearman) with its scores.", ""]
    else:
        lines = [f"Scores on the **{split}** split: the softmax teacher (the source model fine-tuned on the "
                 "task) against this linear-attention student. Recovery is the student's score as a "
                 "percentage of the teacher's.", ""]
    recovery = report.recovery()
    header = ["Metric", "Softmax teacher"] + (["Student after distillation (stage 1)"] if stage1 else []) + \
             ["Linear student", "Recovery"]
    rows = []
    for metric in names:
        rec = recovery.per_metric.get(metric)
        cells = [metric, _fmt(teacher.get(metric))] + ([_fmt(stage1.get(metric))] if stage1 else [])
        rows.append(cells + [_fmt(student.get(metric)), "–" if rec is None else f"{rec:.1f} %"])
    lines.append(markdown_table(header, rows, align=["none"] + ["---:"] * (len(header) - 1)))
    if recovery.average is not None:
        what = f"Recovery ({report.primary_metric})" if report.task.embedding else "Average recovery"
        lines += ["", f"{what}: **{recovery.average:.1f} %**."]
    if selection_note(report):
        lines += ["", f"Model selection: {selection_note(report)}"]
    return lines + [""]


def _attention_facts(attention):
    """The attention KL before and after distillation, and the layers kept softmax."""
    if attention.mean_kl_before is None or attention.mean_kl_after is None:
        return []
    over = f" over the {len(attention.converted_rows)} layers still converted" if attention.softmax_kept else ""
    kept = (f" Layer{'s' if len(attention.softmax_kept) > 1 else ''} "
            f"{', '.join(map(str, attention.softmax_kept))} keep softmax attention (the highest KL after "
            "distillation)." if attention.softmax_kept else "")
    return [f"- Attention fidelity: mean KL divergence from the teacher's attention weights{over} "
            f"{attention.mean_kl_before:.3f} before distillation, {attention.mean_kl_after:.3f} after.{kept}"]


def _timing_facts(latency):
    """The run's latency at the task's length, at the longer lengths and at the task's own lengths, where
    they were measured, and a warning when the cores were busy."""
    facts = []
    if latency.teacher_ms is not None and latency.student_ms is not None:
        speed = f" ({latency.speedup:.2f}× speed-up)" if latency.speedup is not None else ""
        seq = f" at sequence length {latency.seq_len}" if latency.seq_len else ""
        facts.append(f"- Latency{seq}: teacher {latency.teacher_ms:.1f} ms, student {latency.student_ms:.1f} ms{speed}.")
    longer = [f"{row.speedup:.2f}× at {row.seq_len:,} tokens" for row in latency.at_lengths if row.speedup is not None]
    if longer:
        facts.append(f"- Whole-model speed against the softmax teacher (batch 1): {', '.join(longer)}.")
    own = latency.own_lengths
    if own is not None and own.teacher_ms is not None and own.student_ms is not None:
        facts.append(f"- Time per example at the task's own lengths ({own.examples:,} examples, {own.mean_tokens:,.0f} "
                     f"tokens on average, batch 1): teacher {own.teacher_ms:.1f} ms, student {own.student_ms:.1f} ms.")
    if latency.teacher_ms is not None or longer:
        facts.append("- These timings come from the `linearize` run's own process; `linearize bench folder DIR "
                     "--processes 5` times the folder as a user's process loads it.")
    busy = busy_warning(latency.busy_cores())  # recorded only beside a timing
    if busy:
        facts.append(f"- Warning on these timings: {busy}.")
    return facts


def _about(repo_id, record, report):
    """The title, what the model is, and the method's paragraph."""
    method, source = record.method, record.source
    hub_id, _ = source_info(source)
    architecture = record.architecture or ""
    layers = list(record.layers)
    total = record.num_attention_layers or len(layers)
    added, base = record.parameters_added or 0, record.parameters_base or 0
    source_text = f"[{hub_id}](https://huggingface.co/{hub_id})" if hub_id else (f"`{source}`" if source else
                                                                                 "a pretrained encoder")
    scope = ("every attention layer" if total and len(layers) == total
             else f"attention layers {layers} of {total} (the others keep softmax attention)")
    options = record.options
    lines = [f"# {repo_id.split('/')[-1]}", "",
             f"{source_text} ({architecture or 'encoder'}) with its softmax self-attention replaced by "
             f"**{method}** linear attention in {scope}, converted with linearize.", "",
             f"- Method: `{method}`" + (" with " + ", ".join(f"`{k}={v}`" for k, v in options.items())
                                        if options else " (default options)")]
    if record.hybrid:
        from ..attention.hybrid import describe

        lines.append(f"- Attention: {describe(method, record.window, record.sinks, record.hybrid_layers)}, mixed by a learned weight per "
                     "head in one normalisation (LoLCATs-style)")
    if base:
        lines.append(f"- Parameters: {base:,} pretrained + {added:,} added by the feature maps "
                     f"({record.parameters_added_percent:.3f} %)")
    if report and report.task.name:
        dataset = dataset_of(report.task.name)
        lines.append(f"- Task: {dataset[2] if dataset else report.task.name}")
    lines += ["", "## Method", "", LINEAR_ATTENTION, ""]
    for methods, paragraph in METHOD_NOTES.values():
        if method in methods:
            lines += [paragraph, ""]
            break
    return lines


def _usage(repo_id, config, record, files):
    """The usage section: how to load the model, and a snippet that runs it."""
    lines = ["## Usage", ""]
    if record.is_timm:
        lines += ["This is a converted timm Vision Transformer; it loads through linearize.", ""]
    else:
        lines += ["The linear attention lives in `modeling_linearize.py`, which is self-contained (torch and "
                  "transformers only): load the model with `trust_remote_code=True`; linearize itself is not "
                  "needed.", ""]
    return lines + ["```python", usage_snippet(repo_id, config, record, set(files)), "```", ""]


def _speed_section(speed):
    """The measured crossover against softmax (``linearize bench folder DIR``'s ``bench.json``)."""
    from ..bench import FOLDER_BENCH_JSON, folder_speed_lines

    lines = folder_speed_lines(speed)
    return ["## Speed", "",
            f"Measured with `linearize bench folder DIR` (float32, whole model forward, medians; the full "
            f"record is [`{FOLDER_BENCH_JSON}`]({FOLDER_BENCH_JSON})). Speed depends on the machine: this is "
            "the machine it was measured on.", "",
            f"- Crossover: {lines['crossover']}.", f"- Time ÷ softmax time: {lines['time ÷ softmax']}.",
            f"- Measured on: {lines['measured on']}.", ""]


def _stage2_trained(recipe):
    """What stage 2 of the run with ``recipe`` (a report's resolved recipe) trained, in the card's words."""
    if (recipe.get("stage2") or {}).get("trainable", "all") == "attention":
        return "only the feature maps (every pretrained weight and the head frozen)"
    return "the whole student"


def _similarity_term(recipe):
    """The card's words for stage 2's similarity term of an embedding student (``stage2.similarity_weight``), or ""."""
    from ..config import FinetuneConfig

    stage2 = recipe.get("stage2") or {}
    if not stage2.get("similarity_weight"):
        return ""
    temperature = stage2.get("similarity_temperature", FinetuneConfig.similarity_temperature)  # a recipe may leave it out
    anchors = stage2.get("similarity_anchors", FinetuneConfig.similarity_anchors)
    others = "every other training text" if anchors == "train" else "the other texts of its batch"
    return (f" and how each text ranks {others} (CompRess, Abbasi Koohpayegani et al. 2020: weight "
            f"{stage2['similarity_weight']:g}, temperature {temperature:g})")


def build_card(repo_id, config, report=None, figures=(), files=(), speed=None):
    """The ``README.md`` model card as a ``huggingface_hub.ModelCard``.

    ``config``: the model's config.json as a dict (with its ``linearize`` block); ``report``: the
    run's :class:`~linearize.report.Report` (or ``report.json``'s content) or None; ``figures``:
    the figure paths in the repo; ``files``: the names of the uploaded model files (to pick the
    usage snippet's inputs); ``speed``: the model folder's ``bench.json`` (its measured crossover
    against softmax) or None.
    """
    import yaml
    from huggingface_hub import ModelCard

    report = as_report(report) if report is not None else None
    record = conversion_record_of(config)
    lines = _about(repo_id, record, report)
    if report:
        trained = _stage2_trained(report.recipe)
        if report.task.embedding:
            lines += ["The softmax teacher (the source model as it is) trained this student without labels, in two "
                      "stages: stage 1 distils the feature maps to reproduce the teacher's attention weights, stage 2 "
                      f"trains {trained} to match the teacher's pooled, normalised sentence embeddings (mean squared "
                      f"error, Reimers & Gurevych 2020, eq. 1){_similarity_term(report.recipe)}.", ""]
        elif "student_stage1" in report.scores or "stage1" in report.recipe:
            lines += ["The softmax teacher (the source model fine-tuned on the task) trained this student in two "
                      "stages: stage 1 distils the feature maps to reproduce the teacher's attention weights, "
                      f"stage 2 fine-tunes {trained} on the task.", ""]
        lines += _recovery_section(report, list(figures))
    else:
        lines += ["## Recovery", "", "This model was pushed without a recovery report.", ""]
    if speed:
        lines += _speed_section(speed)
    lines += _usage(repo_id, config, record, files)
    if report and report.recipe:
        lines += ["## Training recipe", "", "```yaml",
                  yaml.safe_dump(report.recipe, sort_keys=False, allow_unicode=True).rstrip(), "```", ""]
    lines += ["## Limitations", "",
              "Linear attention approximates the softmax attention of the source model; check the recovery "
              "on your own data before relying on it. The converted model inherits the source model's "
              "limitations and biases.", ""]
    metadata = card_data(repo_id, config, report).to_yaml(original_order=list(METADATA_ORDER))
    return ModelCard("\n".join(["---", metadata, "---", ""] + lines))

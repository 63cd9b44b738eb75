"""Publish a converted model to the Hugging Face Hub with a model card carrying its recovery report.

``push(path, repo_id)`` takes a run folder (written by ``linearize run``: the converted model in
``model/`` plus ``report.json`` and ``figures/``) or a converted model folder, and uploads

- the model: ``config.json``, the safetensors weights, ``modeling_linearize.py`` (the
  self-contained remote code) and the tokenizer or image-processor files;
- the report: ``report.json`` and ``figures/*.png``;
- a generated ``README.md`` model card (``model_card``): YAML metadata (license inherited from
  the source when known, ``base_model``, tags, datasets, pipeline tag, ``model-index`` with the
  student's and the teacher's scores), the method, the recovery table, the figures and a usage
  snippet that loads the model with ``trust_remote_code=True``.

The files are gathered in a temporary staging folder (links or copies: the user's folder is
never modified) and sent with ``huggingface_hub`` (``HfApi.create_repo(exist_ok=True)``, then
``upload_folder``). The endpoint is ``HF_ENDPOINT`` as set when ``push`` is called (a private Hub
mirror works); the token is ``token``, else ``HF_TOKEN``, else the cached ``hf auth login``, and
it is never printed. Every failure is a one-line ``LinearizeError``; success is only reported
after the commit went through.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import Path

from .attention.feature_maps import method_notes
from .errors import LinearizeError

README = "README.md"
REPORT = "report.json"
FIGURES = "figures"
MODELING_FILE = "modeling_linearize.py"

#: the files of a converted model folder that are uploaded (glob patterns, top level only)
MODEL_PATTERNS = (
    "config.json", "generation_config.json", MODELING_FILE,
    "model.safetensors", "model-*-of-*.safetensors", "model.safetensors.index.json",
    # tokenizers (WordPiece, BPE, SentencePiece) and processors
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "vocab.txt", "vocab.json", "merges.txt", "*.model", "spm.*",
    "preprocessor_config.json", "processor_config.json", "image_processor_config.json",
    "feature_extractor_config.json", "video_preprocessor_config.json",
)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json")
IMAGE_PROCESSOR_FILES = ("preprocessor_config.json", "image_processor_config.json")
HOW_TO_LOG_IN = "run `hf auth login`, set HF_TOKEN, or pass --token"
HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")

#: ``linearize convert`` aliases whose Hub id differs from what the alias resolves to
_SOURCE_HUB_IDS = {"minilm": "sentence-transformers/all-MiniLM-L6-v2",
                   "minilm-l6-v2": "sentence-transformers/all-MiniLM-L6-v2"}

#: architecture suffix -> (pipeline tag, model-index task name); checked in order
_HEADS = (
    ("ForSequenceClassification", "text-classification", "Text Classification"),
    ("ForImageClassificationWithTeacher", "image-classification", "Image Classification"),
    ("ForImageClassification", "image-classification", "Image Classification"),
    ("ForMaskedLM", "fill-mask", "Fill-Mask"),
    ("ForTokenClassification", "token-classification", "Token Classification"),
    ("ForQuestionAnswering", "question-answering", "Question Answering"),
    ("ForMaskedImageModeling", None, None),
    ("ForMultipleChoice", None, None),
)

#: non-GLUE task name -> (Hub dataset id or None, display name)
_KNOWN_DATASETS = {
    "fashion-mnist": ("zalando-datasets/fashion_mnist", "Fashion-MNIST"),
    "fashion_mnist": ("zalando-datasets/fashion_mnist", "Fashion-MNIST"),
    "moviereviews": (None, "Movie-review sentence polarity (Pang & Lee, 2005)"),
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


@dataclass
class PushPlan:
    """What ``push`` sends: ``files`` maps each path in the repo to its local file (README.md
    to None: it is ``card``)."""

    repo_id: str
    revision: str
    private: bool
    endpoint: str
    model_dir: Path
    report_path: Path | None
    card: str
    method: str = "linear-attention"
    files: dict = field(default_factory=dict)

    def sizes(self):
        """``[(path in repo, size in bytes)]``, sorted by path."""
        return sorted((name, len(self.card.encode("utf-8")) if src is None else src.stat().st_size)
                      for name, src in self.files.items())


# ---- finding the model and its report -----------------------------------------------------------

def hub_endpoint():
    """The endpoint to push to: ``HF_ENDPOINT`` as set now, else huggingface_hub's default."""
    from huggingface_hub import constants

    return (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")


def locate(path, *, no_report=False):
    """``(model folder, report.json path or None)`` for a run folder or a model folder.

    A run folder's own report is preferred to the copy inside its ``model/``. Without a report
    this refuses unless ``no_report``; with ``no_report`` no report is used even if present.
    """
    from .convert.api import read_linearize_block

    path = Path(path)
    if not path.exists():
        raise LinearizeError(f"{path} does not exist; pass a run folder (from `linearize run`) or a converted "
                             "model folder")
    if not path.is_dir():
        raise LinearizeError(f"{path} is not a folder; pass a run folder or a converted model folder")
    if (path / "config.json").is_file():
        model_dir, candidates = path, [path / REPORT]
    elif (path / "model" / "config.json").is_file():
        model_dir, candidates = path / "model", [path / REPORT, path / "model" / REPORT]
    else:
        raise LinearizeError(f"{path} is not a converted model folder (no config.json) nor a run folder (no "
                             "model/config.json); convert a model with `linearize convert` or `linearize run`")
    read_linearize_block(model_dir)  # raises if it is not a linearize-converted model
    if no_report:
        return model_dir, None
    for candidate in candidates:
        if candidate.is_file():
            return model_dir, candidate
    raise LinearizeError(f"no {REPORT} in {path}: the model card's recovery table comes from the report of "
                         "`linearize run`; push a run folder, or pass --no-report to push the model without one")


def read_report(path):
    """The report as a dict, or a LinearizeError if it is not a linearize report."""
    try:
        report = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise LinearizeError(f"{path} is not readable JSON ({error}); re-run `linearize run` or pass "
                             "--no-report") from None
    if not isinstance(report, dict) or report.get("schema") != "linearize.report":
        raise LinearizeError(f"{path} is not a linearize report (no \"schema\": \"linearize.report\"); pass "
                             "--no-report to push without it")
    return report


def model_files(model_dir):
    """``{path in repo: local file}`` of the model folder's files to upload (or a LinearizeError
    naming what is missing)."""
    model_dir = Path(model_dir)
    files = {p.name: p for p in sorted(model_dir.iterdir())
             if p.is_file() and any(fnmatch(p.name, pattern) for pattern in MODEL_PATTERNS)}
    data = json.loads((model_dir / "config.json").read_text())
    timm = data.get("linearize", {}).get("base_model_type") == "timm"
    missing = []
    if "model.safetensors" not in files and "model.safetensors.index.json" not in files:
        missing.append("model.safetensors")
    if not timm and MODELING_FILE not in files:
        missing.append(MODELING_FILE)
    index = model_dir / "model.safetensors.index.json"
    if "model.safetensors" not in files and index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text()).get("weight_map", {}).values()))
        except (ValueError, AttributeError):
            shards = []
        missing += [shard for shard in shards if shard not in files]
    if missing:
        raise LinearizeError(f"{model_dir} is an incomplete converted model (missing {', '.join(missing)}); "
                             "save it again with model.save_pretrained or `linearize convert`")
    return files


def figure_files(report_dir):
    folder = Path(report_dir) / FIGURES
    if not folder.is_dir():
        return {}
    return {f"{FIGURES}/{p.name}": p for p in sorted(folder.iterdir()) if p.is_file() and p.suffix.lower() == ".png"}


# ---- the model card ------------------------------------------------------------------------------

def _front_matter(text):
    """The YAML metadata block at the top of a README, as a dict ({} if none or invalid)."""
    import yaml

    match = re.match(r"^---\s*\n(.*?)\n---\s*(\n|$)", text, re.S)
    if not match:
        return {}
    try:
        data = yaml.safe_load(match.group(1))
    except yaml.YAMLError:
        return {}
    return data if isinstance(data, dict) else {}


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
    from .convert.loading import ALIASES

    name = ALIASES.get(source, source)
    if source in _SOURCE_HUB_IDS or name in _SOURCE_HUB_IDS:
        hub_id = _SOURCE_HUB_IDS.get(source) or _SOURCE_HUB_IDS[name]
        try:
            from .convert.loading import minilm_path

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
        try:
            license_ = _front_matter(readme.read_text(encoding="utf-8")).get("license")
        except (OSError, UnicodeDecodeError):
            license_ = None
    if license_ is not None and not isinstance(license_, str):
        license_ = None
    return hub_id, license_


def head_of(architecture, base_model_type=None, config=None):
    """``(pipeline tag, task display name)`` for a model class name (base models: feature extraction)."""
    for suffix, tag, name in _HEADS:
        if architecture and architecture.endswith(suffix):
            return tag, name
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
    from .data.glue import GLUE_TASKS, HUB_ID as GLUE_HUB_ID, glue_task_name

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


def _scores(report, who, split):
    scores = (report.get("scores") or {}).get(who) or {}
    value = scores.get(split)
    return value if isinstance(value, dict) else {}


def _number(value, digits=4):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "–"
    return f"{value:.{digits}f}"


def _report_split(report):
    return ((report.get("recovery") or {}).get("split") or (report.get("task") or {}).get("report_split")
            or "test")


def _metric_names(report, split):
    task = report.get("task") or {}
    names = list(task.get("metric_names") or [])
    for who in ("student", "teacher"):
        names += [name for name in _scores(report, who, split) if name not in names]
    return names


def model_index(report, name, pipeline_tag, task_display, dataset):
    """The ``model-index`` metadata: the student's and the teacher's metrics on the report split."""
    split = _report_split(report)
    student, teacher = _scores(report, "student", split), _scores(report, "teacher", split)
    metrics = []
    for metric in _metric_names(report, split):
        if isinstance(student.get(metric), (int, float)):
            metrics.append({"type": metric, "value": float(student[metric]),
                            "name": f"{metric} (linear-attention student, this model)"})
        if isinstance(teacher.get(metric), (int, float)):
            metrics.append({"type": f"teacher_{metric}", "value": float(teacher[metric]),
                            "name": f"{metric} (softmax teacher, for reference)"})
    if not metrics:
        return None
    hub_id, config, display = dataset or (None, None, (report.get("task") or {}).get("name") or "unknown")
    data = {"name": display, "type": hub_id or str((report.get("task") or {}).get("name") or "unknown")}
    if config:
        data["config"] = config
    data["split"] = split
    task = {"type": pipeline_tag or "other", "name": task_display or "Other"}
    return [{"name": name, "results": [{"task": task, "dataset": data, "metrics": metrics}]}]


def _auto_class(config, architecture):
    """The Auto class whose ``auto_map`` entry is the model's own class, or None."""
    auto_map = config.get("auto_map") or {}
    for auto, target in auto_map.items():
        if auto != "AutoConfig" and str(target).rsplit(".", 1)[-1] == f"Linearize{architecture}":
            return auto
    return None


def usage_snippet(repo_id, config, block, files):
    """Python code that downloads and runs the model (``trust_remote_code=True``)."""
    architecture = block.get("architecture") or ""
    if block.get("base_model_type") == "timm":
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
    if architecture.endswith(("ForSequenceClassification", "ForImageClassification",
                              "ForImageClassificationWithTeacher")):
        if config.get("num_labels", len(config.get("id2label") or {}) or 2) == 1:
            lines += ["print(float(outputs.logits[0, 0]))  # the regression score"]
        else:
            lines += ["print(model.config.id2label[int(outputs.logits.argmax(-1)[0])])"]
    elif architecture.endswith("ForTokenClassification"):
        lines += ["print([model.config.id2label[int(i)] for i in outputs.logits.argmax(-1)[0]])"]
    elif masked_lm and has_tokenizer and not vision:
        lines += ['masked = inputs["input_ids"][0] == tokenizer.mask_token_id',
                  "print(tokenizer.decode(outputs.logits[0, masked].argmax(-1)))"]
    elif not any(architecture.endswith(suffix) for suffix, _, _ in _HEADS):
        lines += ["print(outputs.last_hidden_state.shape)  # (batch, tokens, hidden size)"]
    else:
        lines += ["print(outputs[0].shape)"]
    return "\n".join(imports + ["", f"repo_id = {json.dumps(repo_id)}"] + lines)


def _recovery_section(report, figures):
    split = _report_split(report)
    teacher, student = _scores(report, "teacher", split), _scores(report, "student", split)
    stage1 = _scores(report, "student_stage1", split)
    recovery = (report.get("recovery") or {}).get("per_metric") or {}
    lines = ["## Recovery", ""]
    names = _metric_names(report, split)
    if names and (teacher or student):
        lines += [f"Scores on the **{split}** split: the softmax teacher (the source model fine-tuned on the "
                  "task) against this linear-attention student. Recovery is the student's score as a "
                  "percentage of the teacher's.", ""]
        header = ["Metric", "Softmax teacher"] + (["Student after distillation (stage 1)"] if stage1 else []) + \
                 ["Linear student", "Recovery"]
        lines += ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|"]
        for metric in names:
            cells = [metric, _number(teacher.get(metric))] + ([_number(stage1.get(metric))] if stage1 else [])
            rec = recovery.get(metric)
            if not isinstance(rec, (int, float)) and isinstance(teacher.get(metric), (int, float)) \
                    and isinstance(student.get(metric), (int, float)) and teacher[metric]:
                rec = 100.0 * student[metric] / teacher[metric]
            cells += [_number(student.get(metric)), f"{_number(rec, 1)} %" if isinstance(rec, (int, float)) else "–"]
            lines.append("| " + " | ".join(cells) + " |")
        average = (report.get("recovery") or {}).get("average")
        if isinstance(average, (int, float)):
            lines += ["", f"Average recovery: **{average:.1f} %**."]
        lines.append("")
    else:
        lines += ["The report has no scores.", ""]
    facts = []
    attention = report.get("attention") or {}
    if isinstance(attention.get("mean_kl_before"), (int, float)) and isinstance(attention.get("mean_kl_after"),
                                                                                 (int, float)):
        facts.append(f"- Attention fidelity: mean KL divergence from the teacher's attention weights "
                     f"{attention['mean_kl_before']:.3f} before distillation, {attention['mean_kl_after']:.3f} after.")
    latency = report.get("latency") or {}
    if all(isinstance(latency.get(k), (int, float)) for k in ("teacher_ms", "student_ms")):
        speed = f" ({latency['speedup']:.2f}× speed-up)" if isinstance(latency.get("speedup"), (int, float)) else ""
        seq = f" at sequence length {latency['seq_len']}" if latency.get("seq_len") else ""
        facts.append(f"- Latency{seq}: teacher {latency['teacher_ms']:.1f} ms, student "
                     f"{latency['student_ms']:.1f} ms{speed}.")
    if facts:
        lines += facts + [""]
    if figures:
        lines += ["### Figures", ""]
        for name in figures:
            title = Path(name).stem.replace("_", " ").replace("-", " ")
            lines += [f"![{title}]({name})", ""]
    lines += [f"The full report is in [`{REPORT}`]({REPORT}).", ""]
    return lines


def model_card(repo_id, config, report=None, figures=(), files=()):
    """The README.md text: YAML metadata, method, recovery table, figures, usage snippet.

    ``config``: the model's config.json as a dict (with its ``linearize`` block); ``report``: the
    run's report.json as a dict or None; ``figures``: the figure paths in the repo;
    ``files``: the names of the uploaded model files (to pick the usage snippet's inputs).
    """
    import yaml

    block = config.get("linearize") or {}
    method = block.get("method", "unknown")
    source = block.get("source")
    hub_id, license_ = source_info(source)
    architecture = block.get("architecture") or ""
    pipeline_tag, task_display = head_of(architecture, block.get("base_model_type"), config)
    task = (report or {}).get("task") or {}
    dataset = dataset_of(task.get("name")) if report else None
    name = repo_id.split("/")[-1]
    timm = block.get("base_model_type") == "timm"

    meta = {}
    if license_:
        meta["license"] = license_
    if not timm:
        meta["library_name"] = "transformers"
    if hub_id:
        meta["base_model"] = hub_id
    meta["tags"] = ["linear-attention", method, "linearize"]
    if dataset and dataset[0]:
        meta["datasets"] = [dataset[0]]
    if pipeline_tag:
        meta["pipeline_tag"] = pipeline_tag
    if report:
        index = model_index(report, name, pipeline_tag, task_display, dataset)
        if index:
            meta["model-index"] = index

    layers = list(block.get("layers") or [])
    total = block.get("num_attention_layers") or len(layers)
    added, base = block.get("parameters_added", 0) or 0, block.get("parameters_base", 0) or 0
    source_text = f"[{hub_id}](https://huggingface.co/{hub_id})" if hub_id else (f"`{source}`" if source else
                                                                                 "a pretrained encoder")
    scope = ("every attention layer" if total and len(layers) == total
             else f"attention layers {layers} of {total} (the others keep softmax attention)")
    options = block.get("options") or {}
    lines = ["---", yaml.safe_dump(meta, sort_keys=False, allow_unicode=True).rstrip(), "---", "",
             f"# {name}", "",
             f"{source_text} ({architecture or 'encoder'}) with its softmax self-attention replaced by "
             f"**{method}** linear attention in {scope}, converted with linearize.", ""]
    facts = [f"- Method: `{method}`" + (" with " + ", ".join(f"`{k}={v}`" for k, v in options.items())
                                        if options else " (default options)")]
    if base:
        facts.append(f"- Parameters: {base:,} pretrained + {added:,} added by the feature maps "
                     f"({100.0 * added / base:.3f} %)")
    if task.get("name"):
        facts.append(f"- Task: {dataset[2] if dataset else task['name']}")
    lines += facts + ["", "## Method", "", LINEAR_ATTENTION, ""]
    for methods, paragraph in METHOD_NOTES.values():
        if method in methods:
            lines += [paragraph, ""]
            break
    if report:
        recipe = report.get("recipe") or {}
        if "student_stage1" in (report.get("scores") or {}) or "stage1" in recipe:
            lines += ["The softmax teacher (the source model fine-tuned on the task) trained this student in two "
                      "stages: stage 1 distils the feature maps to reproduce the teacher's attention weights, "
                      "stage 2 fine-tunes the whole student on the task.", ""]
        lines += _recovery_section(report, list(figures))
    else:
        lines += ["## Recovery", "", "This model was pushed without a recovery report.", ""]
    file_names = set(files)
    snippet = usage_snippet(repo_id, config, block, file_names)
    lines += ["## Usage", ""]
    if timm:
        lines += ["This is a converted timm Vision Transformer; it loads through linearize.", ""]
    else:
        lines += ["The linear attention lives in `modeling_linearize.py`, which is self-contained (torch and "
                  "transformers only): load the model with `trust_remote_code=True`; linearize itself is not "
                  "needed.", ""]
    lines += ["```python", snippet, "```", ""]
    if report and report.get("recipe"):
        lines += ["## Training recipe", "", "```yaml",
                  yaml.safe_dump(report["recipe"], sort_keys=False, allow_unicode=True).rstrip(), "```", ""]
    lines += ["## Limitations", "",
              "Linear attention approximates the softmax attention of the source model; check the recovery "
              "on your own data before relying on it. The converted model inherits the source model's "
              "limitations and biases.", ""]
    return "\n".join(lines)


# ---- the push ------------------------------------------------------------------------------------

def plan(path, repo_id, *, revision=None, private=False, no_report=False):
    """Everything ``push`` would send (nothing is uploaded): a ``PushPlan``."""
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(repo_id)
    except ValueError as error:
        raise LinearizeError(f"--repo-id {repo_id!r} is not a Hub repo id (expected user/name): "
                             f"{str(error).splitlines()[0]}") from None
    model_dir, report_path = locate(path, no_report=no_report)
    files = model_files(model_dir)
    report, figures = None, {}
    if report_path is not None:
        report = read_report(report_path)
        figures = figure_files(report_path.parent)
        listed = [f for f in (report.get("figures") or []) if f in figures]
        order = listed + [f for f in figures if f not in listed]
        figures = {name: figures[name] for name in order}
        files[REPORT] = report_path
    files.update(figures)
    config = json.loads((model_dir / "config.json").read_text())
    card = model_card(repo_id, config, report, figures=list(figures), files=list(files))
    files[README] = None
    return PushPlan(repo_id=repo_id, revision=revision or "main", private=bool(private), endpoint=hub_endpoint(),
                    model_dir=model_dir, report_path=report_path, card=card,
                    method=(config.get("linearize") or {}).get("method", "linear-attention"), files=files)


def stage(push_plan, directory):
    """Write the files to upload into ``directory``: links to (or copies of) the user's files and
    the generated README.md. The user's folder is only read."""
    directory = Path(directory)
    for name, src in push_plan.files.items():
        target = directory / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if src is None:
            target.write_text(push_plan.card, encoding="utf-8")
            continue
        try:
            os.symlink(src.resolve(), target)
        except OSError:
            shutil.copy2(src, target)
    return directory


def resolve_token(token=None):
    """``token``, else ``HF_TOKEN``, else the cached login; a LinearizeError saying how to log in."""
    if token:
        return token
    from huggingface_hub import get_token

    found = get_token()
    if not found:
        raise LinearizeError(f"no Hugging Face token: {HOW_TO_LOG_IN}")
    return found


def _one_line(text, limit=300):
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _hub_error(error, step, endpoint, repo_id):
    """A one-line LinearizeError for a failed Hub request."""
    from huggingface_hub.errors import HfHubHTTPError

    if isinstance(error, HfHubHTTPError):
        response = error.response
        status = getattr(response, "status_code", None)
        reason = getattr(response, "reason_phrase", "") or ""
        detail = f": {_one_line(error.server_message)}" if getattr(error, "server_message", None) else ""
        if status == 401:
            return LinearizeError(f"the Hub at {endpoint} rejected the token (401 Unauthorized) while {step}; "
                                  f"{HOW_TO_LOG_IN}")
        if status == 403:
            return LinearizeError(f"the Hub at {endpoint} refused write access to {repo_id} (403 Forbidden) while "
                                  f"{step}{detail}; use a token with write permission on that namespace")
        return LinearizeError(f"push to {repo_id} failed while {step}: the Hub at {endpoint} answered {status} "
                              f"{reason}{detail}; try again later")
    kind = type(error).__name__
    return LinearizeError(f"could not reach the Hub at {endpoint} while {step} ({kind}: {_one_line(error, 160)}); "
                          "check the network, or HF_ENDPOINT for a private mirror")


def push(path, repo_id, *, private=False, revision=None, token=None, dry_run=False, no_report=False,
         commit_message=None):
    """Push a run folder or a converted model folder to ``repo_id`` on the Hub.

    Returns a dict: ``repo_id``, ``revision``, ``private``, ``endpoint``, ``files`` (``[(path,
    size)]``), ``dry_run`` and, after an upload, ``url`` and ``commit_url``. With ``dry_run``
    nothing is sent (no token is needed).
    """
    push_plan = plan(path, repo_id, revision=revision, private=private, no_report=no_report)
    result = {"repo_id": push_plan.repo_id, "revision": push_plan.revision, "private": push_plan.private,
              "endpoint": push_plan.endpoint, "files": push_plan.sizes(), "dry_run": bool(dry_run)}
    if dry_run:
        return result
    from huggingface_hub import HfApi, constants

    token = resolve_token(token)
    if constants.is_offline_mode():
        raise LinearizeError("HF_HUB_OFFLINE is set: huggingface_hub will not reach the Hub; unset it (or set "
                             "HF_HUB_OFFLINE=0) to push")
    from . import __version__

    endpoint = push_plan.endpoint
    api = HfApi(endpoint=endpoint, token=token, library_name="linearize", library_version=__version__)
    message = commit_message or f"Upload {push_plan.method} linear-attention model with linearize"
    step = "creating the repo"
    try:
        api.create_repo(repo_id, private=True if push_plan.private else None, exist_ok=True)
        if push_plan.revision != "main":
            step = f"creating branch {push_plan.revision!r}"
            api.create_branch(repo_id, branch=push_plan.revision, exist_ok=True)
        step = "uploading the files"
        with tempfile.TemporaryDirectory(prefix="linearize-push-") as staging:
            stage(push_plan, staging)
            info = api.upload_folder(repo_id=repo_id, folder_path=staging, revision=push_plan.revision,
                                     commit_message=message)
    except LinearizeError:
        raise
    except json.JSONDecodeError:
        raise LinearizeError(f"push to {repo_id} failed while {step}: the Hub at {endpoint} sent an answer that is "
                             "not JSON; check HF_ENDPOINT (is it a Hub?) or try again later") from None
    except ValueError as error:  # README metadata rejected by the Hub's validator, malformed answers
        raise LinearizeError(f"push to {repo_id} failed while {step} (Hub at {endpoint}): "
                             f"{_one_line(error)}") from None
    except Exception as error:  # noqa: BLE001 - HTTP errors and transport errors (httpx), never half-reported
        from huggingface_hub.errors import HfHubHTTPError

        if isinstance(error, (HfHubHTTPError, OSError)) or _is_transport_error(error):
            raise _hub_error(error, step, endpoint, repo_id) from None
        raise
    result["url"] = f"{endpoint}/{repo_id}" + ("" if push_plan.revision == "main" else f"/tree/{push_plan.revision}")
    result["commit_url"] = getattr(info, "commit_url", None)
    return result


def _is_transport_error(error):
    """Is ``error`` a network-level failure of huggingface_hub's HTTP client (httpx or httpx2)?"""
    for module_name in ("httpx2", "httpx"):
        try:
            module = __import__(module_name)
        except ImportError:
            continue
        if isinstance(error, getattr(module, "TransportError", ())):
            return True
    return False

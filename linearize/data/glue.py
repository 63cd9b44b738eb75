"""The nine GLUE tasks, from the Hub (``nyu-mll/glue``) or from GLUE's own TSV files.

GLUE (Wang et al., 2019, "GLUE: A Multi-Task Benchmark and Analysis Platform for Natural
Language Understanding", ICLR) distributes one folder per task (``CoLA/``, ``SST-2/``,
``MRPC/``, ``STS-B/``, ``QQP/``, ``MNLI/``, ``QNLI/``, ``RTE/``, ``WNLI/``), each with
``train.tsv`` and ``dev.tsv`` (MNLI: ``dev_matched.tsv`` and ``dev_mismatched.tsv``). The
files are tab-separated with a header row, except CoLA's train/dev files which have none
(columns: source, label, original label, sentence). Sentences contain bare quote characters,
so the files must be read with quoting disabled (``csv.QUOTE_NONE``), as GLUE's own baseline
code and the Hub's loading script do.

``load_glue`` returns the Hub's columns and label ids either way: text columns renamed as
the Hub has them (MNLI ``sentence1``/``sentence2`` → ``premise``/``hypothesis``, MRPC
``#1 String``/``#2 String`` → ``sentence1``/``sentence2``), text labels mapped by the Hub's
``ClassLabel`` order (MNLI entailment/neutral/contradiction → 0/1/2, QNLI and RTE
entailment/not_entailment → 0/1) and ``idx`` the row's position in its file. Splits are
``train`` and ``validation`` (MNLI: ``validation`` is the matched dev set, plus
``validation_mismatched``). The test splits are left out: their labels are hidden.
"""

from __future__ import annotations

import csv
import logging
from dataclasses import dataclass
from pathlib import Path

from ..errors import LinearizeError

log = logging.getLogger(__name__)

HUB_ID = "nyu-mll/glue"


@dataclass(frozen=True)
class GlueTask:
    """One GLUE task: its Hub columns and how they sit in GLUE's own files.

    ``tsv_text`` / ``tsv_label`` name the header fields holding ``text_keys`` / the label
    (integers: positions, for CoLA's header-less files). ``label_names`` is the Hub's
    ``ClassLabel`` order; ``None`` means regression (STS-B's 0–5 similarity score).
    ``files`` maps each split to its file in the task folder.
    """

    name: str
    folder: str
    text_keys: tuple[str, ...]
    tsv_text: tuple[str | int, ...]
    tsv_label: str | int
    label_names: tuple[str, ...] | None
    metrics: tuple[str, ...]
    primary_metric: str
    files: tuple[tuple[str, str], ...] = (("train", "train.tsv"), ("validation", "dev.tsv"))
    has_header: bool = True

    @property
    def is_regression(self) -> bool:
        return self.label_names is None

    @property
    def num_labels(self) -> int:
        return 1 if self.label_names is None else len(self.label_names)

    @property
    def splits(self) -> tuple[str, ...]:
        return tuple(split for split, _ in self.files)


# Metrics as in the GLUE paper, Table 1: MCC for CoLA, F1 and accuracy for MRPC and QQP,
# Pearson and Spearman correlation for STS-B, accuracy elsewhere. Where a task has two
# metrics, "combined" is their mean: the number the GLUE score averages for that task.
GLUE_TASKS: dict[str, GlueTask] = {task.name: task for task in (
    GlueTask("cola", "CoLA", ("sentence",), (3,), 1, ("unacceptable", "acceptable"),
             ("matthews_correlation",), "matthews_correlation", has_header=False),
    GlueTask("sst2", "SST-2", ("sentence",), ("sentence",), "label", ("negative", "positive"),
             ("accuracy",), "accuracy"),
    GlueTask("mrpc", "MRPC", ("sentence1", "sentence2"), ("#1 String", "#2 String"), "Quality",
             ("not_equivalent", "equivalent"), ("accuracy", "f1", "combined"), "combined"),
    GlueTask("stsb", "STS-B", ("sentence1", "sentence2"), ("sentence1", "sentence2"), "score", None,
             ("pearson", "spearmanr", "combined"), "combined"),
    GlueTask("qqp", "QQP", ("question1", "question2"), ("question1", "question2"), "is_duplicate",
             ("not_duplicate", "duplicate"), ("accuracy", "f1", "combined"), "combined"),
    GlueTask("mnli", "MNLI", ("premise", "hypothesis"), ("sentence1", "sentence2"), "gold_label",
             ("entailment", "neutral", "contradiction"), ("accuracy",), "accuracy",
             files=(("train", "train.tsv"), ("validation", "dev_matched.tsv"),
                    ("validation_mismatched", "dev_mismatched.tsv"))),
    GlueTask("qnli", "QNLI", ("question", "sentence"), ("question", "sentence"), "label",
             ("entailment", "not_entailment"), ("accuracy",), "accuracy"),
    GlueTask("rte", "RTE", ("sentence1", "sentence2"), ("sentence1", "sentence2"), "label",
             ("entailment", "not_entailment"), ("accuracy",), "accuracy"),
    GlueTask("wnli", "WNLI", ("sentence1", "sentence2"), ("sentence1", "sentence2"), "label",
             ("not_entailment", "entailment"), ("accuracy",), "accuracy"),
)}

_ALIASES = {"sst-2": "sst2", "sts-b": "stsb", "mnli-m": "mnli", "mnli_matched": "mnli"}


def glue_task_name(name) -> str | None:
    """``"SST-2"``, ``"glue/sst2"``, ``"sst2"`` → ``"sst2"``; ``None`` if not a GLUE task."""
    key = str(name).strip().lower()
    for prefix in ("glue/", "glue:", "glue-", "nyu-mll/glue/"):
        if key.startswith(prefix):
            key = key[len(prefix):]
    key = _ALIASES.get(key, key)
    return key if key in GLUE_TASKS else None


def get_glue_task(name) -> GlueTask:
    key = glue_task_name(name)
    if key is None:
        raise LinearizeError(f"unknown GLUE task {name!r}; GLUE tasks: {', '.join(GLUE_TASKS)}")
    return GLUE_TASKS[key]


def glue_features(task: GlueTask):
    """The Hub's ``datasets.Features`` for ``task``: text columns, ``label``, ``idx``."""
    from datasets import ClassLabel, Features, Value

    columns = {key: Value("string") for key in task.text_keys}
    columns["label"] = Value("float32") if task.is_regression else ClassLabel(names=list(task.label_names))
    columns["idx"] = Value("int32")
    return Features(columns)


def load_glue(task, data_dir=None, cache_dir=None):
    """A GLUE task as a ``DatasetDict`` (splits ``train``, ``validation`` [, ``validation_mismatched``]).

    ``data_dir=None`` loads ``nyu-mll/glue`` from the Hugging Face Hub. Otherwise
    ``data_dir`` is GLUE's own distribution: the folder holding ``SST-2/``, ``MNLI/``, ...
    (as ``download_glue_data.py`` leaves it) or one task's folder itself.
    """
    spec = get_glue_task(task)
    if data_dir is None:
        return _load_glue_hub(spec, cache_dir)
    return _load_glue_dir(spec, Path(data_dir))


def _load_glue_hub(task: GlueTask, cache_dir=None):
    import datasets

    from ..hub import failure_reason, offline_while_unreachable

    unreachable = None
    try:
        with offline_while_unreachable() as unreachable:  # a cached copy at once; else fail at once
            raw = datasets.load_dataset(HUB_ID, task.name, cache_dir=cache_dir)
    except Exception as error:  # the Hub's failures come as many types (ConnectionError, HfHubHTTPError, ...)
        reason = failure_reason(error, unreachable)
        raise LinearizeError(
            f"could not load GLUE {task.name} from the Hugging Face Hub ({HUB_ID}): {reason}. If the Hub is "
            f"unreachable, pass --data-dir with GLUE's own layout ({task.folder}/{task.files[0][1]}, "
            f"{task.folder}/{task.files[1][1]}, ...)") from error
    hub_names = {"validation": "validation_matched" if task.name == "mnli" else "validation"}
    out = {}
    for split in task.splits:
        source = hub_names.get(split, split)
        if source not in raw:
            raise LinearizeError(f"{HUB_ID}/{task.name} has no {source!r} split (it has {', '.join(raw)})")
        out[split] = raw[source]
    return datasets.DatasetDict(out)


def _task_folder(task: GlueTask, data_dir: Path) -> Path:
    if not data_dir.is_dir():
        raise LinearizeError(f"GLUE data folder {data_dir} does not exist; pass the folder that holds "
                             f"{task.folder}/ (GLUE's own layout)")
    for candidate in (data_dir / task.folder, data_dir / task.folder.lower(), data_dir / task.name, data_dir):
        if (candidate / task.files[0][1]).is_file():
            return candidate
    wanted = ", ".join(f"{task.folder}/{name}" for _, name in task.files)
    raise LinearizeError(f"{data_dir} has no {task.folder}/{task.files[0][1]}; GLUE {task.name} needs {wanted} "
                         "in GLUE's own layout (as download_glue_data.py leaves it)")


def _load_glue_dir(task: GlueTask, data_dir: Path):
    from datasets import Dataset, DatasetDict

    folder = _task_folder(task, data_dir)
    features = glue_features(task)
    out = {}
    for split, filename in task.files:
        path = folder / filename
        if not path.is_file():
            raise LinearizeError(f"GLUE {task.name} file {path} is missing; {task.folder}/ should hold "
                                 f"{', '.join(name for _, name in task.files)}")
        columns = read_glue_tsv(task, path)
        out[split] = Dataset.from_dict(columns, features=features, split=split)
    return DatasetDict(out)


def read_glue_tsv(task: GlueTask, path) -> dict[str, list]:
    """Parse one GLUE TSV into the Hub's columns (``text_keys``, ``label``, ``idx``).

    Rows with fewer fields than needed or an empty label are skipped with a warning (the
    official QQP train file has a few broken rows; the Hub drops them too); an unknown
    label is an error naming the file and line.
    """
    path = Path(path)
    columns: dict[str, list] = {key: [] for key in task.text_keys}
    columns["label"] = []
    columns["idx"] = []
    skipped = 0
    # utf-8-sig: MRPC's files start with a byte-order mark on some copies.
    with open(path, encoding="utf-8-sig", newline="") as handle:
        reader = csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)
        if task.has_header:
            header = next(reader, None)
            if header is None:
                raise LinearizeError(f"{path} is empty; expected GLUE's header row")
            positions = [_position(header, field, path) for field in task.tsv_text]
            label_pos = _position(header, task.tsv_label, path)
        else:
            positions, label_pos = list(task.tsv_text), task.tsv_label
        needed = max(positions + [label_pos])
        for idx, row in enumerate(reader):
            line = idx + 1 + int(task.has_header)
            if len(row) <= needed or not row[label_pos].strip():
                skipped += 1
                continue
            for key, pos in zip(task.text_keys, positions):
                columns[key].append(row[pos])
            columns["label"].append(_parse_label(task, row[label_pos].strip(), path, line))
            columns["idx"].append(idx)
    if skipped:
        log.warning("%s: skipped %d malformed row(s) (too few fields or no label)", path, skipped)
    return columns


def _position(header, field, path):
    if isinstance(field, int):
        return field
    if field not in header:
        raise LinearizeError(f"{path} has no column {field!r} (its header: {', '.join(header)}); "
                             "is it the right GLUE task's file?")
    return header.index(field)


def _parse_label(task: GlueTask, raw: str, path, line):
    if task.is_regression:
        try:
            return float(raw)
        except ValueError:
            raise LinearizeError(f"{path}:{line}: score {raw!r} is not a number") from None
    if raw in task.label_names:
        return task.label_names.index(raw)
    if raw.isdigit() and int(raw) < task.num_labels:
        return int(raw)
    raise LinearizeError(f"{path}:{line}: label {raw!r} is not one of {', '.join(task.label_names)} "
                         f"(or 0..{task.num_labels - 1})")

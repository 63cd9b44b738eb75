"""Generic text classification (or regression) from CSV, TSV, JSON or JSON Lines files, or the Hub.

Files: ``.csv`` (comma, standard quoting), ``.tsv`` (tab, standard quoting), ``.json`` (a
list of records, ``{"data": [records]}``, a dict of columns, or JSON Lines) and ``.jsonl``.
Labels are mapped to ids through a stable, sorted label list (numbers sort numerically,
anything else as strings), computed on the train file: the same files always give the same
ids, and the list is returned so the model config's ``id2label`` can name the classes.
"""

from __future__ import annotations

import csv
import json
import math
import sys
from pathlib import Path

from ..errors import LinearizeError

FORMATS = (".csv", ".tsv", ".json", ".jsonl")
MISSING_LABEL = -1  # a test file without labels, as the Hub marks GLUE's hidden test labels


def read_table(path) -> tuple[list[str], dict[str, list]]:
    """``(column names, {column: values})`` of a CSV/TSV/JSON/JSONL file."""
    path = Path(path)
    if not path.is_file():
        raise LinearizeError(f"data file {path} does not exist")
    suffix = path.suffix.lower()
    if suffix not in FORMATS:
        raise LinearizeError(f"cannot read {path}: unsupported file type {suffix or '(none)'}; "
                             f"use one of {', '.join(FORMATS)}")
    try:
        if suffix in (".csv", ".tsv"):
            csv.field_size_limit(min(sys.maxsize, 2**31 - 1))  # a long document is one cell (default 128 kB)
            with open(path, encoding="utf-8-sig", newline="") as handle:
                reader = csv.DictReader(handle, delimiter="\t" if suffix == ".tsv" else ",")
                records = list(reader)
                names = list(reader.fieldnames or [])
        else:
            records = _read_json_records(path, lines=suffix == ".jsonl")
            names = []
            for record in records:
                names.extend(key for key in record if key not in names)
    except UnicodeDecodeError as error:
        raise LinearizeError(f"{path} is not UTF-8 text (byte 0x{error.object[error.start]:02x} at offset "
                             f"{error.start}); re-save it as UTF-8, e.g. iconv -f latin1 -t utf-8") from None
    except csv.Error as error:
        raise LinearizeError(f"{path} is not a valid {suffix[1:].upper()} file ({error}); fix the file") from None
    columns = {name: [record.get(name) for record in records] for name in names}
    return names, columns


def _read_json_records(path, lines):
    text = path.read_text(encoding="utf-8-sig")
    data = None
    if not lines:
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            data = None  # maybe JSON Lines under a .json name
    if data is None:
        data = []
        for number, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    data.append(json.loads(line))
                except json.JSONDecodeError as error:
                    raise LinearizeError(f"{path}:{number}: not valid JSON ({error.msg})") from None
    if isinstance(data, dict):
        lists = {k: v for k, v in data.items() if isinstance(v, list)}
        if len(lists) == 1 and all(isinstance(r, dict) for r in next(iter(lists.values()))):
            data = next(iter(lists.values()))  # {"data": [records]}
        elif lists and len(lists) == len(data) and len({len(v) for v in lists.values()}) == 1:
            keys = list(lists)
            data = [dict(zip(keys, values)) for values in zip(*lists.values())]  # a dict of columns
    if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
        raise LinearizeError(f"{path} is not a list of records; expected JSON Lines or [{{\"text\": ..., "
                             "\"label\": ...}, ...]")
    return data


def label_vocabulary(values, where="the train data", column="label") -> list[str]:
    """The sorted label names: numerically when every label is a number, else as strings.

    Labels that are all numbers but not all whole (0.5, 1.25) are scores, not classes: a
    one-line error (naming ``where`` and ``column``) rather than one class per value."""
    names = {_label_key(v) for v in values}
    try:
        numbers = sorted(names, key=float)
    except ValueError:
        return sorted(names)
    fractional = [name for name in numbers if not math.isfinite(float(name)) or not float(name).is_integer()]
    if fractional:
        shown = ", ".join(fractional[:3]) + (", ..." if len(fractional) > 3 else "")
        raise LinearizeError(f"{where}: the labels in column {column!r} look like numbers ({shown}), not classes, "
                             f"so each of the {len(names)} values would be a class of its own; for a score, train a "
                             "regression (--regression, data.regression: true); for classes, use whole numbers "
                             "(0, 1, ...) or names")
    return numbers


def _label_key(value) -> str:
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value).strip()


def check_column(where, names, column, option):
    """Refuse a ``column`` that is not among ``names`` (the columns of ``where``), naming ``option``
    that chooses it."""
    if column not in names:
        raise LinearizeError(f"{where} has no column {column!r} (its columns: "
                             f"{', '.join(map(str, names)) or 'none'}); name the right one with {option}")


def load_text_files(train_file, validation_file=None, test_file=None, text_column="text",
                    text_pair_column=None, label_column="label", is_regression=False):
    """``(DatasetDict, label_names)`` from local files; ``label_names`` is ``[]`` for regression.

    Each split keeps ``text_column`` (and ``text_pair_column``) under their own names and a
    ``label`` column: a ``ClassLabel`` of ids into ``label_names``, or ``float32`` scores.
    A test file may lack the label column (its labels become -1).
    """
    files = {"train": train_file, "validation": validation_file, "test": test_file}
    tables = {}
    for split, path in files.items():
        if path is None:
            continue
        names, columns = read_table(path)
        if not any(len(values) for values in columns.values()):
            raise LinearizeError(f"{split} file {path} has no records (a header at most); it needs at least one "
                                 "example")
        check_column(f"{split} file {path}", names, text_column, "--text-column")
        if text_pair_column:
            check_column(f"{split} file {path}", names, text_pair_column, "--text-pair-column")
        if split != "test" or label_column in names:
            check_column(f"{split} file {path}", names, label_column, "--label-column")
        for column in filter(None, (text_column, text_pair_column)):
            if any(value is None for value in columns[column]):
                row = [value is None for value in columns[column]].index(True) + 1
                raise LinearizeError(f"{path}: record {row} has no {column!r} value")
        tables[split] = (path, columns)
    text_keys = tuple(filter(None, (text_column, text_pair_column)))
    return _build(tables, text_keys, label_column, is_regression)


def _build(tables, text_keys, label_column, is_regression):
    from datasets import ClassLabel, Dataset, DatasetDict, Features, Value

    train_path, train_columns = tables["train"]
    if not is_regression:
        for path, columns in tables.values():
            check_no_blank_labels(path, columns.get(label_column), label_column)
    label_names = [] if is_regression else label_vocabulary(train_columns[label_column], train_path, label_column)
    if not is_regression and len(label_names) < 2:
        raise LinearizeError(f"train data {train_path} has one class only ({', '.join(label_names)}) in column "
                             f"{label_column!r}: a classifier needs at least two; check the file or --label-column")
    index = {name: i for i, name in enumerate(label_names)}
    label_feature = Value("float32") if is_regression else ClassLabel(names=label_names)
    features = Features({**{key: Value("string") for key in text_keys}, "label": label_feature})
    out = {}
    for split, (path, columns) in tables.items():
        raw = columns.get(label_column)
        if raw is None:
            labels = [MISSING_LABEL] * len(columns[text_keys[0]])
        elif is_regression:
            labels = [numeric_label(value, path, row) for row, value in enumerate(raw, 1)]
        else:
            keys = [_label_key(value) for value in raw]
            unseen = sorted(set(keys) - set(index))
            if unseen:
                raise LinearizeError(f"{split} data {path} has labels not in the train data: "
                                     f"{', '.join(unseen[:10])}; train labels: {', '.join(label_names)}")
            labels = [index[key] for key in keys]
        data = {key: [str(value) for value in columns[key]] for key in text_keys}
        data["label"] = labels
        out[split] = Dataset.from_dict(data, features=features, split=split)
    return DatasetDict(out), label_names


def check_no_blank_labels(path, labels, column):
    """Refuse a blank label cell (empty, spaces, or a record without the ``column`` key) among
    ``labels`` of ``path``: it would become a class ``''`` and shift every class id after it. A NaN
    (a float, or the text ``nan`` that pandas and NumPy write for one) is a missing value too, never a class."""
    for row, value in enumerate(labels or (), 1):
        if value is None or (isinstance(value, str) and not value.strip()):
            raise LinearizeError(f"{path}: record {row} has a blank label in column {column!r}; fill it in or remove "
                                 "the record")
        if (isinstance(value, float) and math.isnan(value)) or (isinstance(value, str) and
                                                                value.strip().lower() == "nan"):
            raise LinearizeError(f"{path}: record {row} has the label {value!r} in column {column!r}: a missing "
                                 "value (NaN), not a class; fill it in or remove the record")


def numeric_label(value, path, row):
    """Record ``row``'s label ``value`` (of file ``path``) as a float: a regression label."""
    try:
        score = float(value)
    except (TypeError, ValueError):
        raise LinearizeError(f"{path}: record {row} label {value!r} is not a number (a regression "
                             "task needs numeric labels)") from None
    if math.isnan(score):
        raise LinearizeError(f"{path}: record {row} label is NaN")
    return score


def normalize_text_dataset(data, text_column="text", text_pair_column=None, label_column="label",
                           is_regression=False):
    """A loaded ``DatasetDict`` (e.g. from the Hub) in the same shape as ``load_text_files``'.

    A ``ClassLabel`` label keeps its names; other labels go through ``label_vocabulary``.
    Returns ``(DatasetDict, label_names)``.
    """
    from datasets import ClassLabel, DatasetDict

    if "train" not in data:
        raise LinearizeError(f"the data set has no 'train' split (splits: {', '.join(data)})")
    first = data["train"]
    feature = first.features.get(label_column)
    if isinstance(feature, ClassLabel) and not is_regression:
        out = {}
        for split, ds in data.items():
            names = ds.column_names
            check_column(f"split {split!r}", names, text_column, "--text-column")
            if text_pair_column:
                check_column(f"split {split!r}", names, text_pair_column, "--text-pair-column")
            check_column(f"split {split!r}", names, label_column, "--label-column")
            keep = [c for c in (text_column, text_pair_column, label_column) if c]
            ds = ds.select_columns(keep)
            if label_column != "label":
                ds = ds.rename_column(label_column, "label")
            out[split] = ds
        return DatasetDict(out), list(feature.names)
    tables = {}
    for split, ds in data.items():
        names = ds.column_names
        check_column(f"split {split!r}", names, text_column, "--text-column")
        if text_pair_column:
            check_column(f"split {split!r}", names, text_pair_column, "--text-pair-column")
        if split != "test" or label_column in names:
            check_column(f"split {split!r}", names, label_column, "--label-column")
        columns = {c: list(ds[c]) for c in (text_column, text_pair_column, label_column) if c and c in names}
        tables[split] = (f"split {split!r}", columns)
    return _build(tables, tuple(filter(None, (text_column, text_pair_column))), label_column, is_regression)

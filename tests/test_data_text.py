"""Generic text classification files: formats, label vocabularies and the errors users see."""

import json

import datasets
import pytest

from linearize.data import load_task_data, load_text_files
from linearize.data.text import label_vocabulary, normalize_text_dataset
from linearize.errors import LinearizeError


def write_csv(path, text):
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def csv_files(tmp_path):
    train = write_csv(tmp_path / "train.csv", 'text,label,extra\n"great, really",pos,a\nawful,neg,b\n'
                                              '"so ""so""",neutral,c\nfine,pos,d\n')
    dev = write_csv(tmp_path / "dev.csv", "text,label\nbad,neg\ngood,pos\n")
    return train, dev


def test_csv_labels_are_sorted_and_stable(csv_files):
    train, dev = csv_files
    data, labels = load_text_files(train, dev)
    assert labels == ["neg", "neutral", "pos"]
    assert data["train"]["label"] == [2, 0, 1, 2]
    assert data["train"]["text"] == ["great, really", "awful", 'so "so"', "fine"]
    assert data["validation"]["label"] == [0, 2]
    assert data["train"].features["label"].names == labels
    assert data["train"].column_names == ["text", "label"]  # other columns dropped


def test_tsv_json_jsonl_and_pairs(tmp_path):
    train = write_csv(tmp_path / "train.tsv", "q\tp\ty\nwho?\tme\t1\nwhy?\tbecause\t0\n")
    records = [{"q": "a", "p": "b", "y": 0}, {"q": "c", "p": "d", "y": 1}]
    dev = tmp_path / "dev.json"
    dev.write_text(json.dumps(records))
    test = tmp_path / "test.jsonl"
    test.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    data, labels = load_text_files(train, dev, test, text_column="q", text_pair_column="p", label_column="y")
    assert labels == ["0", "1"]
    assert data["train"][0] == {"q": "who?", "p": "me", "label": 1}
    assert data["validation"]["label"] == data["test"]["label"] == [0, 1]
    # {"data": [records]} and a dict of columns are JSON layouts people use too
    dev.write_text(json.dumps({"data": records}))
    assert load_text_files(dev, text_column="q", label_column="y")[0]["train"]["q"] == ["a", "c"]
    dev.write_text(json.dumps({"q": ["a", "c"], "y": [1, 0]}))
    assert load_text_files(dev, text_column="q", label_column="y")[0]["train"]["label"] == [1, 0]


def test_numeric_labels_sort_numerically():
    assert label_vocabulary(["10", "2", "-1", "2"]) == ["-1", "2", "10"]
    assert label_vocabulary([1, 0, 1.0, True]) == ["0", "1"]
    assert label_vocabulary(["b", "a", "10"]) == ["10", "a", "b"]


def test_missing_file_and_columns_list_what_exists(csv_files, tmp_path):
    train, _ = csv_files
    with pytest.raises(LinearizeError, match="does not exist"):
        load_text_files(tmp_path / "missing.csv")
    with pytest.raises(LinearizeError, match=r"no column 'sentence' \(its columns: text, label, extra\).*"
                                             r"--text-column"):
        load_text_files(train, text_column="sentence")
    with pytest.raises(LinearizeError, match=r"no column 'y'.*--label-column"):
        load_text_files(train, label_column="y")
    with pytest.raises(LinearizeError, match=r"unsupported file type \.parquet"):
        load_text_files(write_csv(tmp_path / "x.parquet", ""))


def test_unseen_validation_label(csv_files, tmp_path):
    train, _ = csv_files
    dev = write_csv(tmp_path / "dev2.csv", "text,label\nmeh,mixed\n")
    with pytest.raises(LinearizeError, match="labels not in the train data: mixed"):
        load_text_files(train, dev)


def test_unlabelled_test_file_and_regression(tmp_path):
    train = write_csv(tmp_path / "train.csv", "text,label\na,0.5\nb,4.25\n")
    test = write_csv(tmp_path / "test.csv", "text\nc\n")
    data, labels = load_text_files(train, test_file=test, is_regression=True)
    assert labels == [] and data["train"]["label"] == [0.5, 4.25]
    assert data["test"]["label"] == [-1.0]
    data, labels = load_text_files(write_csv(tmp_path / "t2.csv", "text,label\na,x\nb,y\n"), test_file=test)
    assert data["test"]["label"] == [-1]
    with pytest.raises(LinearizeError, match="not a number"):
        load_text_files(write_csv(tmp_path / "t3.csv", "text,label\na,high\n"), is_regression=True)


def test_bad_json(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "a", "label": 1}\n{"text": \n')
    with pytest.raises(LinearizeError, match=r"bad.jsonl:2: not valid JSON"):
        load_text_files(path)


def test_load_task_data_files_carves_a_dev_split(tmp_path):
    rows = "".join(f"sentence {i},{'pos' if i % 2 else 'neg'}\n" for i in range(40))
    train = write_csv(tmp_path / "train.csv", "text,label\n" + rows)
    data, spec = load_task_data("files", train_file=train, seed=3)
    assert len(data["train"]) == 36 and len(data["validation"]) == 4
    assert sorted(data["validation"]["label"]) == [0, 0, 1, 1]  # stratified
    assert not set(data["train"]["text"]) & set(data["validation"]["text"])
    assert spec.label_names == ("neg", "pos") and spec.text_keys == ("text",) and spec.eval_splits == ("validation",)
    again, _ = load_task_data("files", train_file=train, seed=3)
    assert again["validation"]["text"] == data["validation"]["text"]


def test_hub_style_dataset_is_normalised():
    features = datasets.Features({"sentence": datasets.Value("string"), "idx": datasets.Value("int32"),
                                  "lbl": datasets.ClassLabel(names=["no", "yes"])})
    raw = datasets.DatasetDict({"train": datasets.Dataset.from_dict(
        {"sentence": ["a", "b"], "idx": [0, 1], "lbl": [1, 0]}, features=features)})
    data, labels = normalize_text_dataset(raw, text_column="sentence", label_column="lbl")
    assert labels == ["no", "yes"] and data["train"].column_names == ["sentence", "label"]
    raw = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": ["a", "b", "c"],
                                                                     "label": ["z", "y", "z"]})})
    data, labels = normalize_text_dataset(raw)
    assert labels == ["y", "z"] and data["train"]["label"] == [1, 0, 1]


def test_hub_text_dataset_through_load_task_data(monkeypatch):
    features = datasets.Features({"text": datasets.Value("string"),
                                  "label": datasets.ClassLabel(names=["neg", "pos"])})
    rows = {"text": [f"review {i}" for i in range(20)], "label": [i % 2 for i in range(20)]}
    hub = datasets.DatasetDict({split: datasets.Dataset.from_dict(rows, features=features)
                                for split in ("train", "test", "unsupervised")})
    monkeypatch.setattr(datasets, "load_dataset", lambda name, config=None, **kw: hub)
    data, spec = load_task_data("stanfordnlp/imdb")
    assert list(data) == ["train", "validation", "test"]  # unsupervised dropped, dev carved from train
    assert len(data["train"]) == 18 and len(data["validation"]) == 2
    assert spec.kind == "text" and spec.label_names == ("neg", "pos") and spec.eval_splits == ("validation", "test")

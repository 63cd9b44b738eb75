"""GLUE from its own TSV layout (rows copied in the real files' formats) and from the Hub (mocked)."""

import logging

import datasets
import pytest

from linearize.data import GLUE_TASKS, load_glue, load_task_data
from linearize.data.glue import get_glue_task, glue_features, glue_task_name
from linearize.errors import LinearizeError

T = "\t"


def tsv(*rows):
    return "".join(T.join(row) + "\n" for row in rows)


MNLI_TRAIN_HEADER = ["index", "promptID", "pairID", "genre", "sentence1_binary_parse", "sentence2_binary_parse",
                     "sentence1_parse", "sentence2_parse", "sentence1", "sentence2", "label1", "gold_label"]
MNLI_DEV_HEADER = MNLI_TRAIN_HEADER[:11] + ["label2", "label3", "label4", "label5", "gold_label"]
STSB_HEADER = ["index", "genre", "filename", "year", "old_index", "source1", "source2", "sentence1", "sentence2",
               "score"]


def mnli_row(i, s1, s2, label, dev=False):
    votes = [label] * (5 if dev else 1)
    return [str(i), "31193", f"{31193 + i}n", "government", "( ( x ) )", "( y )", "(ROOT (S x))", "(ROOT (S y))",
            s1, s2, *votes, label]


def stsb_row(i, s1, s2, score):
    return [str(i), "main-captions", "MSRvid", "2012test", f"{i:04d}", "none", "none", s1, s2, score]


# One entry per task folder: {file: content}. Sentences with bare and unbalanced quote
# characters check that the files are read with quoting disabled.
GLUE_FILES = {
    "CoLA": {  # no header: source, label, original label, sentence
        "train.tsv": tsv(["gj04", "1", "", "Our friends won't buy this analysis, let alone the next one we propose."],
                         ["gj04", "0", "*", "They drank the pub."],
                         ["cj99", "1", "", '"The more we study verbs, the crazier they get.'],
                         ["cj99", "0", "*", "Day by day the facts are getting murkier."]),
        "dev.tsv": tsv(["gj04", "1", "", "The sailors rode the breeze clear of the rocks."],
                       ["gj04", "0", "*", 'The "weather" is windy.']),
    },
    "SST-2": {
        "train.tsv": tsv(["sentence", "label"], ["hide new secretions from the parental units ", "0"],
                         ['" jaws " is a bad movie , and " charming ', "0"],
                         ["that loves its characters and communicates something rather beautiful ", "1"]),
        "dev.tsv": tsv(["sentence", "label"], ["it 's a charming and often affecting journey . ", "1"],
                       ["unflinchingly bleak and desperate ", "0"]),
    },
    "MRPC": {  # the msr_paraphrase files' header, with its byte-order mark on some copies
        "train.tsv": "\ufeff" + tsv(["Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"],
                                    ["1", "702876", "702977",
                                     'Amrozi accused his brother , whom he called " the witness " , of distorting .',
                                     'Referring to him as only " the witness " , Amrozi accused his brother .'],
                                    ["0", "2108705", "2108831", "Yucaipa owned Dominick 's before 1998 .",
                                     "Yucaipa bought Dominick 's in 1995 ."]),
        "dev.tsv": tsv(["Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"],
                       ["1", "1355540", "1355592", "He said the foodservice pie business doesn 't fit .",
                        "The foodservice pie business does not fit ."]),
    },
    "STS-B": {
        "train.tsv": tsv(STSB_HEADER, stsb_row(0, "A plane is taking off.", "An air plane is taking off.", "5.000"),
                         stsb_row(1, "A man is playing a large flute.", "A man is playing a flute.", "3.800"),
                         stsb_row(2, 'A "man" is slicing.', "A woman is dancing.", "0.000")),
        "dev.tsv": tsv(STSB_HEADER, stsb_row(0, "A man with a hard hat is dancing.", "A man is dancing.", "5.000")),
    },
    "QQP": {  # the real train file has a few rows with missing fields: skipped
        "train.tsv": tsv(["id", "qid1", "qid2", "question1", "question2", "is_duplicate"],
                         ["133273", "213221", "213222", "How is the life of a math student?",
                          "Which level of preparation is enough for the exam jlpt5?", "0"],
                         ["402555", "536040", "536041", "How do I control my emotions?",
                          'How do you control your "emotions"?', "1"],
                         ["201841", "303951", "174364", "How can I create an Android app?"],
                         ["360472", "364011", "490273", "What does the Quran say about homosexuality?",
                          "Is homosexuality a sin in the Quran?", "1"]),
        "dev.tsv": tsv(["id", "qid1", "qid2", "question1", "question2", "is_duplicate"],
                       ["40", "81", "82", "Why are so many Quora users posting questions?",
                        "Why do people ask Quora questions?", "1"]),
    },
    "MNLI": {
        "train.tsv": tsv(MNLI_TRAIN_HEADER,
                         mnli_row(0, "Conceptually cream skimming has two basic dimensions.",
                                  "Product and geography are what make cream skimming work.", "neutral"),
                         mnli_row(1, "you know during the season.", "You lose the things.", "entailment"),
                         mnli_row(2, 'One of our number will carry out your "instructions".',
                                  "A member of my team will execute your orders.", "entailment"),
                         mnli_row(3, "How do you know?", "This information belongs to them.", "contradiction")),
        "dev_matched.tsv": tsv(MNLI_DEV_HEADER,
                               mnli_row(0, "The new rights are nice enough", "Everyone likes the newest benefits",
                                        "neutral", dev=True),
                               mnli_row(1, "This site includes a list.", "The Government Executive articles.",
                                        "contradiction", dev=True)),
        "dev_mismatched.tsv": tsv(MNLI_DEV_HEADER,
                                  mnli_row(0, "Your contribution helped make it possible.",
                                           "Your contributions were of no help.", "contradiction", dev=True)),
    },
    "QNLI": {
        "train.tsv": tsv(["index", "question", "sentence", "label"],
                         ["0", "When did the third Digimon series begin?",
                          "Unlike the two seasons before it, Digimon Tamers is darker.", "not_entailment"],
                         ["1", "Which missile batteries often have individual launchers?",
                          "When MANPADS is operated by specialists, batteries may have several dozen teams.",
                          "entailment"]),
        "dev.tsv": tsv(["index", "question", "sentence", "label"],
                       ["0", "What came into force after the new constitution was herald?",
                        "As of that day, the new constitution heralding the Second Republic came into force.",
                        "entailment"]),
    },
    "RTE": {
        "train.tsv": tsv(["index", "sentence1", "sentence2", "label"],
                         ["0", "No Weapons of Mass Destruction Found in Iraq Yet.",
                          "Weapons of Mass Destruction Found in Iraq.", "not_entailment"],
                         ["1", "A place of sorrow, after Pope John Paul II died, became a place of celebration.",
                          "Pope Benedict XVI is the new leader of the Roman Catholic Church.", "entailment"]),
        "dev.tsv": tsv(["index", "sentence1", "sentence2", "label"],
                       ["0", "Dana Reeve, the widow of the actor Christopher Reeve, has died of lung cancer at age 44.",
                        "Christopher Reeve had an accident.", "not_entailment"]),
    },
    "WNLI": {
        "train.tsv": tsv(["index", "sentence1", "sentence2", "label"],
                         ["0", "I stuck a pin through a carrot. When I pulled the pin out, it had a hole.",
                          "The carrot had a hole.", "1"],
                         ["1", "John couldn't see the stage with Billy in front of him because he is so short.",
                          "John is so short.", "1"],
                         ["2", "The police arrested all of the gang members.", "The police were trying to stop the "
                          "drug trade.", "0"]),
        "dev.tsv": tsv(["index", "sentence1", "sentence2", "label"],
                       ["0", "The drain is clogged with hair. It has to be cleaned.", "The hair has to be cleaned.",
                        "0"]),
    },
}

# task -> expected (train count, {split: count}, train labels, first train text)
EXPECTED = {
    "cola": ({"train": 4, "validation": 2}, [1, 0, 1, 0],
             {"sentence": "Our friends won't buy this analysis, let alone the next one we propose."}),
    "sst2": ({"train": 3, "validation": 2}, [0, 0, 1], {"sentence": "hide new secretions from the parental units "}),
    "mrpc": ({"train": 2, "validation": 1}, [1, 0],
             {"sentence1": 'Amrozi accused his brother , whom he called " the witness " , of distorting .',
              "sentence2": 'Referring to him as only " the witness " , Amrozi accused his brother .'}),
    "stsb": ({"train": 3, "validation": 1}, [5.0, 3.8, 0.0],
             {"sentence1": "A plane is taking off.", "sentence2": "An air plane is taking off."}),
    "qqp": ({"train": 3, "validation": 1}, [0, 1, 1],
            {"question1": "How is the life of a math student?",
             "question2": "Which level of preparation is enough for the exam jlpt5?"}),
    "mnli": ({"train": 4, "validation": 2, "validation_mismatched": 1}, [1, 0, 0, 2],
             {"premise": "Conceptually cream skimming has two basic dimensions.",
              "hypothesis": "Product and geography are what make cream skimming work."}),
    "qnli": ({"train": 2, "validation": 1}, [1, 0],
             {"question": "When did the third Digimon series begin?",
              "sentence": "Unlike the two seasons before it, Digimon Tamers is darker."}),
    "rte": ({"train": 2, "validation": 1}, [1, 0],
            {"sentence1": "No Weapons of Mass Destruction Found in Iraq Yet.",
             "sentence2": "Weapons of Mass Destruction Found in Iraq."}),
    "wnli": ({"train": 3, "validation": 1}, [1, 1, 0],
             {"sentence1": "I stuck a pin through a carrot. When I pulled the pin out, it had a hole.",
              "sentence2": "The carrot had a hole."}),
}


@pytest.fixture(scope="module")
def glue_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("glue_data")
    for folder, files in GLUE_FILES.items():
        (root / folder).mkdir()
        for name, content in files.items():
            (root / folder / name).write_text(content, encoding="utf-8")
    return root


def test_table_covers_all_nine_tasks():
    assert list(GLUE_TASKS) == ["cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte", "wnli"]
    assert set(EXPECTED) == set(GLUE_TASKS)
    assert GLUE_TASKS["stsb"].num_labels == 1 and GLUE_TASKS["stsb"].is_regression
    assert GLUE_TASKS["mnli"].num_labels == 3 and GLUE_TASKS["mnli"].splits == (
        "train", "validation", "validation_mismatched")
    assert GLUE_TASKS["cola"].metrics == ("matthews_correlation",)
    assert GLUE_TASKS["mrpc"].metrics == ("accuracy", "f1", "combined")
    assert GLUE_TASKS["stsb"].metrics == ("pearson", "spearmanr", "combined")


@pytest.mark.parametrize("task", list(EXPECTED))
def test_glue_tsv_layout(glue_dir, task):
    counts, train_labels, first = EXPECTED[task]
    data = load_glue(task, data_dir=glue_dir)
    spec = GLUE_TASKS[task]
    assert {split: len(ds) for split, ds in data.items()} == counts
    assert data["train"].column_names == [*spec.text_keys, "label", "idx"]
    assert data["train"].features == glue_features(spec)
    assert data["train"]["label"] == pytest.approx(train_labels)
    row = data["train"][0]
    assert {key: row[key] for key in spec.text_keys} == first
    if not spec.is_regression:
        assert data["train"].features["label"].names == list(spec.label_names)


def test_label_names_follow_the_hub():
    assert GLUE_TASKS["mnli"].label_names == ("entailment", "neutral", "contradiction")
    assert GLUE_TASKS["qnli"].label_names == ("entailment", "not_entailment")
    assert GLUE_TASKS["rte"].label_names == ("entailment", "not_entailment")
    assert GLUE_TASKS["wnli"].label_names == ("not_entailment", "entailment")
    assert GLUE_TASKS["cola"].label_names == ("unacceptable", "acceptable")


def test_quotes_are_kept_verbatim(glue_dir):
    data = load_glue("sst2", data_dir=glue_dir)
    # with csv's default quoting this row would swallow the tab and the label
    assert data["train"][1] == {"sentence": '" jaws " is a bad movie , and " charming ', "label": 0, "idx": 1}
    cola = load_glue("cola", data_dir=glue_dir)
    assert cola["validation"][1]["sentence"] == 'The "weather" is windy.'


def test_mnli_mismatched_and_idx(glue_dir):
    data = load_glue("mnli", data_dir=glue_dir)
    assert data["validation"]["label"] == [1, 2]  # neutral, contradiction
    assert data["validation_mismatched"][0]["label"] == 2
    assert data["validation"]["idx"] == [0, 1]


def test_qqp_skips_broken_rows_but_keeps_file_positions(glue_dir, caplog):
    with caplog.at_level(logging.WARNING):
        data = load_glue("qqp", data_dir=glue_dir)
    assert data["train"]["idx"] == [0, 1, 3]  # row 2 has too few fields
    assert "skipped 1 malformed row" in caplog.text


def test_task_folder_itself_is_accepted(glue_dir):
    assert len(load_glue("rte", data_dir=glue_dir / "RTE")["train"]) == 2


def test_task_name_aliases():
    assert glue_task_name("SST-2") == "sst2"
    assert glue_task_name("glue/sts-b") == "stsb"
    assert glue_task_name("imdb") is None
    with pytest.raises(LinearizeError, match="GLUE tasks: cola, sst2"):
        get_glue_task("sst3")


def test_missing_files_say_what_is_expected(tmp_path, glue_dir):
    with pytest.raises(LinearizeError, match="does not exist"):
        load_glue("sst2", data_dir=tmp_path / "nope")
    with pytest.raises(LinearizeError, match=r"MNLI/train.tsv.*dev_matched.tsv.*dev_mismatched.tsv"):
        load_glue("mnli", data_dir=tmp_path)
    (tmp_path / "RTE").mkdir()
    (tmp_path / "RTE" / "train.tsv").write_text(GLUE_FILES["RTE"]["train.tsv"])
    with pytest.raises(LinearizeError, match="RTE.dev.tsv is missing"):
        load_glue("rte", data_dir=tmp_path)


def test_wrong_file_and_bad_label(tmp_path):
    (tmp_path / "SST-2").mkdir()
    wrong = tsv(["index", "sentence1", "sentence2", "label"], ["0", "a", "b", "1"])  # an RTE-style file
    (tmp_path / "SST-2" / "train.tsv").write_text(wrong)
    (tmp_path / "SST-2" / "dev.tsv").write_text(tsv(["sentence", "label"], ["ok", "1"]))
    with pytest.raises(LinearizeError, match=r"no column 'sentence'.*right GLUE task"):
        load_glue("sst2", data_dir=tmp_path)
    (tmp_path / "RTE").mkdir()
    (tmp_path / "RTE" / "train.tsv").write_text(tsv(["index", "sentence1", "sentence2", "label"],
                                                    ["0", "a", "b", "maybe"]))
    (tmp_path / "RTE" / "dev.tsv").write_text(tsv(["index", "sentence1", "sentence2", "label"]))
    with pytest.raises(LinearizeError, match=r"train.tsv:2: label 'maybe' is not one of entailment, not_entailment"):
        load_glue("rte", data_dir=tmp_path)


def _fake_hub(task, names):
    features = glue_features(GLUE_TASKS[task])
    row = {key: ["x", "y"] for key in GLUE_TASKS[task].text_keys}
    row.update(label=[0, 1], idx=[0, 1])
    return datasets.DatasetDict({name: datasets.Dataset.from_dict(row, features=features) for name in names})


def test_hub_path_maps_splits(monkeypatch):
    calls = []

    def fake_load_dataset(path, name=None, **kwargs):
        calls.append((path, name))
        return _fake_hub("mnli", ["train", "validation_matched", "validation_mismatched", "test_matched",
                                  "test_mismatched"])

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    data = load_glue("mnli")
    assert calls == [("nyu-mll/glue", "mnli")]
    assert list(data) == ["train", "validation", "validation_mismatched"]


def test_hub_failure_says_to_use_data_dir(monkeypatch):
    def unreachable(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'nyu-mll/glue' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(datasets, "load_dataset", unreachable)
    with pytest.raises(LinearizeError, match=r"Hub is unreachable, pass --data-dir.*SST-2/train.tsv") as info:
        load_glue("sst2")
    assert "\n" not in str(info.value)


def test_load_task_data_glue_spec_and_dev_carving(glue_dir):
    data, spec = load_task_data("mnli", data_dir=glue_dir)
    assert spec.kind == "text" and spec.text_keys == ("premise", "hypothesis") and spec.num_labels == 3
    assert spec.eval_splits == ("validation", "validation_mismatched")
    assert spec.model_config_kwargs()["id2label"] == {0: "entailment", 1: "neutral", 2: "contradiction"}
    data, spec = load_task_data("stsb", data_dir=glue_dir)
    assert spec.is_regression and spec.num_labels == 1 and spec.primary_metric == "combined"
    assert spec.model_config_kwargs() == {"num_labels": 1, "problem_type": "regression"}
    # opt-in dev split: carved from train; GLUE's dev sets become report-only test splits
    data, spec = load_task_data("mnli", data_dir=glue_dir, dev_fraction=0.25, seed=0)
    assert list(data) == ["train", "validation", "test", "test_mismatched"]
    assert len(data["train"]) + len(data["validation"]) == 4
    assert not set(data["train"]["idx"]) & set(data["validation"]["idx"])
    assert spec.selection_split == "validation" and "test" in spec.eval_splits

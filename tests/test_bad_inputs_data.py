"""Issue 36's data cases: data options a task does not read, missing data files, label names that
must reach the saved head, blank and fractional labels, and a teacher at chance.

Each case of the new user's battery is a row here, so it cannot come back: a refused input is one
line (``error: ...``) and a non-zero exit before anything trains; a label file's class names are
the saved model's ``id2label`` (what ``transformers.pipeline()`` answers); a run whose teacher
learnt nothing says so in its last line and in report.md.
"""

import csv
import json
import re
import shlex
from pathlib import Path

import pytest
import torch
import yaml
from typer.testing import CliRunner

from linearize.cli import app
from linearize.cli.run import final_summary
from linearize.convert import convert_checkpoint
from linearize.data import load_task_data
from linearize.data.text import load_text_files
from linearize.errors import LinearizeError
from linearize.report import Report, TaskInfo, render_markdown
from tiny_models import save_tiny_text_classifier

runner = CliRunner()
MOVIE_LABELS = {"id2label": {0: "negative", 1: "positive"}, "label2id": {"negative": 0, "positive": 1}}
SPAM_LABELS = {"id2label": {0: "spam", 1: "ham"}, "label2id": {"spam": 0, "ham": 1}}  # not the sorted order


def write_csv(path, rows, header=("text", "label")):
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def spam_rows():
    return [(f"see you at the meeting {i}", "ham") for i in range(8)] + \
        [(f"win free money now {i}", "spam") for i in range(8)]


@pytest.fixture(scope="module")
def ws(tmp_path_factory, minilm_path):
    """Tiny classifiers (plain; a movie-review one, softmax and converted; one naming its classes
    spam/ham, converted), a ham/spam CSV, label files with blank and fractional labels, and
    recipes of a tiny run."""
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("bad-data")
    save_tiny_text_classifier(root / "tiny", minilm_path)
    save_tiny_text_classifier(root / "movie", minilm_path, **MOVIE_LABELS)
    save_tiny_text_classifier(root / "spam-first", minilm_path, **SPAM_LABELS)
    convert_checkpoint(str(root / "movie"), "relu", root / "movie-converted")
    convert_checkpoint(str(root / "spam-first"), "relu", root / "spam-first-converted")
    write_csv(root / "spam.csv", spam_rows())
    write_csv(root / "blank.csv", [("good", "1"), ("bad", "0"), ("meh", ""), ("fine", "1")])
    write_csv(root / "spaces.csv", [("good", "1"), ("bad", "0"), ("meh", "  ")])
    write_csv(root / "nan.csv", [("good", "pos"), ("bad", "neg"), ("meh", "NaN"), ("fine", "pos")])
    (root / "nan.jsonl").write_text('{"text": "a", "label": "x"}\n{"text": "b", "label": NaN}\n', encoding="utf-8")
    write_csv(root / "floats.csv", [("a", "0.5"), ("b", "1.25"), ("c", "0.5"), ("d", "2"), ("e", "3")])
    write_csv(root / "ints.csv", [(f"text {i}", str(i % 2)) for i in range(16)])
    write_csv(root / "scores.csv", [(f"text {i}", str(i / 4)) for i in range(16)])
    (root / "short.csv").write_text("text,label\ngood,1\nbad\nfine,0\n", encoding="utf-8")
    (root / "missing-label.jsonl").write_text(
        '{"text": "a", "label": "x"}\n{"text": "b", "label": "y"}\n{"text": "c"}\n', encoding="utf-8")
    (root / "a-folder.csv").mkdir()
    run = {"model": str(root / "tiny"), "method": "hedgehog", "data": {"max_length": 16},
           "teacher": {"epochs": 1, "batch_size": 8}, "stage1": {"epochs": 1, "batch_size": 8},
           "stage2": {"epochs": 1, "batch_size": 8}}
    (root / "movie.yaml").write_text(yaml.safe_dump({**run, "task": "moviereviews"}))
    spam_data = {"train_file": str(root / "spam.csv"), "validation_file": str(root / "spam.csv"), "max_length": 16}
    (root / "spam.yaml").write_text(yaml.safe_dump({**run, "task": "files", "data": spam_data}))
    (root / "outs").mkdir()
    return root


def nothing_trained(ws, out):
    assert not Path(out).exists() or not any(Path(out).iterdir()), "a refused command wrote output"


FINETUNE = "finetune {ws}/tiny --out {out} --epochs 1 --batch-size 8 --max-length 16"

#: (case, command, fragment of the one error line)
REFUSED = [
    # -- item 1: data files given to a task that does not read them
    ("run --train-file on the movie-review recipe", "run {ws}/movie.yaml --out {out} --train-file ./nope.csv",
     "task 'moviereviews' does not read --train-file (data.train_file), so it would be ignored: pass --task files"),
    ("run --set data.validation_file on moviereviews", "run {ws}/movie.yaml --out {out} "
     "--set data.validation_file={ws}/spam.csv", "task 'moviereviews' does not read --validation-file"),
    ("distill --train-file without --task", "distill {ws}/tiny --out {out} --method hedgehog "
     "--train-file ./nope.csv", "task 'moviereviews' does not read --train-file"),
    ("finetune --train-file without --task", FINETUNE + " --train-file {ws}/spam.csv",
     "task 'moviereviews' does not read --train-file"),
    ("finetune --test-file on a GLUE task", FINETUNE + " --task sst2 --test-file {ws}/spam.csv",
     "task 'sst2' does not read --test-file"),
    ("eval text --train-file without --task", "eval text {ws}/tiny --train-file {ws}/spam.csv",
     "task 'moviereviews' does not read --train-file"),
    ("eval text --label-column on moviereviews", "eval text {ws}/tiny --label-column stars",
     "task 'moviereviews' does not read --label-column"),
    ("run --set data.text_column on moviereviews", "run {ws}/movie.yaml --out {out} --set data.text_column=nope",
     "task 'moviereviews' does not read --text-column (data.text_column)"),
    ("eval text --text-column on moviereviews", "eval text {ws}/tiny --text-column review",
     "task 'moviereviews' does not read --text-column"),
    ("finetune --data-file on task files", FINETUNE + " --task files --data-file {ws}/spam.csv",
     "task 'files' does not read --data-file (data.data_file), so it would be ignored: pass your file as "
     "--train-file"),
    ("similarity file on a classification task", "run {ws}/spam.yaml --out {out} "
     "--set data.similarity_file={ws}/spam.csv", "task 'files' does not read data.similarity_file"),
    ("--regression on moviereviews", FINETUNE + " --regression",
     "task 'moviereviews' has its own labels: data.regression applies to --task files"),
    # -- item 1: a data file that does not exist, or is a folder
    ("finetune a missing --train-file", FINETUNE + " --task files --train-file ./nope.csv",
     "--train-file (data.train_file) ./nope.csv: no such file; check the path"),
    ("run a missing --train-file", "run {ws}/movie.yaml --out {out} --task files --train-file ./nope.csv",
     "--train-file (data.train_file) nope.csv: no such file"),
    ("a missing --validation-file is found first", FINETUNE + " --task files --train-file {ws}/spam.csv "
     "--validation-file {ws}/nope.csv", "--validation-file (data.validation_file) {ws}/nope.csv: no such file"),
    ("a folder as --train-file", FINETUNE + " --task files --train-file {ws}/a-folder.csv",
     "{ws}/a-folder.csv is a folder; pass a CSV/TSV/JSON(L) file"),
    # -- item 3: a teacher used as it is whose classes are the task's in another order
    ("run teacher.finetune false, classes in another order", "run {ws}/spam.yaml --out {out} --model "
     "{ws}/spam-first --set teacher.finetune=false",
     "numbers its classes spam, ham but task files numbers them ham, spam"),
    # -- item 3: a blank label cell
    ("a blank label cell", FINETUNE + " --task files --train-file {ws}/blank.csv",
     "{ws}/blank.csv: record 3 has a blank label in column 'label'; fill it in or remove the record"),
    ("a label cell of spaces", FINETUNE + " --task files --train-file {ws}/spam.csv --validation-file "
     "{ws}/spaces.csv", "{ws}/spaces.csv: record 3 has a blank label in column 'label'"),
    ("a CSV row without its label cell", FINETUNE + " --task files --train-file {ws}/short.csv",
     "{ws}/short.csv: record 2 has a blank label"),
    ("a JSON record without a label", FINETUNE + " --task files --train-file {ws}/missing-label.jsonl",
     "missing-label.jsonl: record 3 has a blank label in column 'label'"),
    # a NaN label (what pandas writes for a missing value) is a missing value, not a class named 'nan'
    ("a NaN label cell", FINETUNE + " --task files --train-file {ws}/nan.csv",
     "{ws}/nan.csv: record 3 has the label 'NaN' in column 'label': a missing value (NaN), not a class; fill it in "
     "or remove the record"),
    ("a JSON NaN label", FINETUNE + " --task files --train-file {ws}/nan.jsonl",
     "nan.jsonl: record 2 has the label nan in column 'label': a missing value (NaN)"),
    # -- item 4: fractional labels
    ("fractional labels", FINETUNE + " --task files --train-file {ws}/floats.csv",
     "{ws}/floats.csv: the labels in column 'label' look like numbers (0.5, 1.25), not classes, so each of the 4 "
     "values would be a class of its own; for a score, train a regression (--regression, data.regression: true)"),
    ("run with fractional labels", "run {ws}/spam.yaml --out {out} --set data.train_file={ws}/scores.csv "
     "--set data.validation_file={ws}/scores.csv", "scores.csv: the labels in column 'label' look like numbers"),
    # -- item 2: a model used as it is must number its classes as the task does
    ("eval of a model numbering the classes otherwise", "eval text {ws}/spam-first-converted --task files "
     "--train-file {ws}/spam.csv", "numbers its classes spam, ham but task files numbers them ham, spam"),
]


@pytest.mark.parametrize("case, command, fragment", REFUSED, ids=[case[0] for case in REFUSED])
def test_refused_in_one_line_before_anything_trains(ws, monkeypatch, case, command, fragment):
    out = ws / "outs" / re.sub(r"[^A-Za-z0-9]+", "-", case)
    monkeypatch.delenv("LINEARIZE_DEBUG", raising=False)
    monkeypatch.chdir(ws)
    result = runner.invoke(app, shlex.split(command.format(ws=ws, out=out)))
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1 and lines[-1] == errors[0], lines[-5:]
    assert fragment.format(ws=ws) in errors[0], errors[0]
    nothing_trained(ws, out)


@pytest.mark.parametrize("command", ["run {ws}/movie.yaml --out {out} --train-file ./nope.csv",
                                     "run {ws}/movie.yaml --out {out} --task files --train-file ./nope.csv"])
def test_a_data_option_is_refused_with_the_configuration_before_the_run_folder(ws, monkeypatch, command):
    """The refusal came after ``[1/6] data`` and left an empty ``--out`` behind: it is now part of the
    configuration's check (``RunConfig.validate``), before any stage and before the folder is made."""
    out = ws / "outs" / "before-the-folder"
    monkeypatch.chdir(ws)
    result = runner.invoke(app, shlex.split(command.format(ws=ws, out=out)))
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 1 and len(lines) == 1 and lines[0].startswith("error: "), lines
    assert not out.exists()


#: (task, the option given, what the error says): every kind of task refuses what it does not read
NOT_READ = [
    ("moviereviews", "train_file", "pass --task files"),
    ("moviereviews-long", "test_file", "pass --task files"),
    ("sst2", "data_file", "pass a task that reads it (moviereviews, embeddings)"),
    ("mnli", "train_file", "pass --task files"),
    ("fashion-mnist", "validation_file", "pass --task files"),
    ("imagefolder", "train_file", "pass --task files"),
    ("embeddings", "label_column", "pass --task files"),
    ("files", "data_dir", "pass a task that reads it (glue, moviereviews, embeddings, fashion-mnist, imagefolder)"),
    ("someone/a-hub-set", "data_dir", "pass a task that reads it"),
]


@pytest.mark.parametrize("task, option, hint", NOT_READ, ids=[f"{t}-{o}" for t, o, _ in NOT_READ])
def test_each_task_refuses_the_data_options_it_does_not_read(ws, task, option, hint):
    value = str(ws / ("spam.csv" if option != "label_column" else "x"))
    options = {option: value, **({"train_file": str(ws / "spam.csv")} if task == "files" else {})}
    flag = "--" + option.replace("_", "-")
    with pytest.raises(LinearizeError, match=rf"task '{re.escape(task)}' does not read {flag} \(data\.{option}\), "
                                             rf"so it would be ignored: .*{re.escape(hint)}"):
        load_task_data(task, **options)


def test_the_options_a_task_reads_still_load(ws):
    """``embeddings`` reads --train-file, ``files`` its three files: those are not refused."""
    data, spec = load_task_data("embeddings", train_file=str(ws / "spam.csv"))
    assert spec.is_embedding and sum(len(split) for split in data.values()) == 16
    data, spec = load_task_data("files", train_file=str(ws / "spam.csv"), validation_file=str(ws / "spam.csv"),
                                label_column="label")
    assert spec.label_names == ("ham", "spam")


# ---- item 2: a file's class names reach the saved head ---------------------------------------------

def saved_labels(folder):
    config = json.loads((Path(folder) / "config.json").read_text())
    return config["id2label"], config["label2id"]


def pipeline_labels(folder):
    """The labels ``transformers.pipeline`` answers with, for a ham and a spam sentence."""
    import transformers

    classify = transformers.pipeline("text-classification", model=str(folder), trust_remote_code=True,
                                     device="cpu", top_k=None)
    return {entry["label"] for result in classify(["see you at the meeting", "win free money"]) for entry in result}


@pytest.mark.parametrize("source", ["movie-converted", "movie"])
def test_finetune_names_the_head_with_the_files_labels(ws, source):
    """ham/spam fine-tuned into a movie-review model (converted, or softmax): the saved config and
    ``pipeline()`` say ham/spam, not negative/positive."""
    out = ws / "outs" / f"spam-{source}"
    result = runner.invoke(app, shlex.split(f"finetune {ws}/{source} --task files --train-file {ws}/spam.csv "
                                            f"--out {out} --epochs 1 --batch-size 8 --max-length 16"))
    assert result.exit_code == 0, result.output
    assert saved_labels(out) == ({"0": "ham", "1": "spam"}, {"ham": 0, "spam": 1})
    assert pipeline_labels(out) == {"ham", "spam"}


@pytest.fixture(scope="module")
def spam_run(ws):
    """A tiny run on the ham/spam files: (its folder, the CLI's output). Its random teacher
    learns nothing in one epoch of 16 examples: it is at chance."""
    out = ws / "outs" / "spam-run"
    result = runner.invoke(app, ["run", str(ws / "spam.yaml"), "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out, result.output


def test_run_names_the_teacher_and_the_student_with_the_files_labels(spam_run):
    out, _ = spam_run
    for folder in (out / "teacher", out / "model"):
        assert saved_labels(folder) == ({"0": "ham", "1": "spam"}, {"ham": 0, "spam": 1}), folder
    assert pipeline_labels(out / "model") == {"ham", "spam"}


# ---- item 4: whole-number labels are classes; scores need --regression -----------------------------

def test_whole_number_labels_stay_classes(ws, tmp_path):
    data, labels = load_text_files(ws / "ints.csv")
    assert labels == ["0", "1"] and data["train"]["label"][:4] == [0, 1, 0, 1]
    jsonl = tmp_path / "floats-whole.jsonl"
    jsonl.write_text("".join(json.dumps({"text": f"t{i}", "label": float(i % 3)}) + "\n" for i in range(6)))
    assert load_text_files(jsonl)[1] == ["0", "1", "2"]


def test_fractional_labels_train_as_a_regression_when_asked(ws):
    out = ws / "outs" / "regression"
    result = runner.invoke(app, shlex.split(f"finetune {ws}/tiny --task files --train-file {ws}/scores.csv "
                                            f"--regression --out {out} --epochs 1 --batch-size 8 --max-length 16"))
    assert result.exit_code == 0, result.output
    config = json.loads((out / "config.json").read_text())
    assert config["problem_type"] == "regression" and len(config["id2label"]) == 1
    assert "pearson" in result.output


# ---- item 5: a teacher at chance ----------------------------------------------------------------------

def chance_report(teacher, student, metric="accuracy", num_labels=2, embedding=None):
    task = TaskInfo(name="files", kind="text", metric_names=(metric,), primary_metric=metric,
                    selection_split="validation", report_split="test", num_labels=num_labels, embedding=embedding)
    return Report(task=task, scores={"teacher": {"test": {metric: teacher}}, "student": {"test": {metric: student}}})


WARNING = ("the teacher is at chance (0.484 on 2 classes): the recovery says nothing; train the teacher longer "
           "or on more data")


def test_a_teacher_at_chance_is_said_in_the_last_line_and_the_report():
    report = chance_report(0.484, 0.5935)
    assert report.teacher_at_chance() and report.chance_warning() == WARNING
    assert final_summary(report) == f"student keeps 122.6% of the teacher's accuracy on the test split, but {WARNING}"
    assert f"**Warning: {WARNING}.**" in render_markdown(report)


@pytest.mark.parametrize("teacher, metric, num_labels, embedding, at_chance", [
    (0.52, "accuracy", 2, None, True),  # within the margin
    (0.60, "accuracy", 2, None, False),
    (0.11, "accuracy", 10, None, True),
    (0.40, "accuracy", 10, None, False),
    (0.01, "matthews_correlation", 2, None, True),
    (0.45, "matthews_correlation", 2, None, False),
    (0.00, "combined", 1, None, True),  # a regression's correlation
    (0.50, "accuracy", None, None, False),  # a report written before num_labels: unknown, no claim
    (0.50, "f1", 2, None, False),  # F1's chance depends on the data: no claim
    (0.10, "cosine", None, True, False),  # an embedding task has no chance level
])
def test_chance_is_per_metric(teacher, metric, num_labels, embedding, at_chance):
    report = chance_report(teacher, teacher, metric, num_labels, embedding)
    assert report.teacher_at_chance() is at_chance
    assert (report.chance_warning() is not None) is at_chance
    assert ("Warning: the teacher is at chance" in render_markdown(report)) is at_chance


def test_num_labels_travels_through_report_json():
    report = chance_report(0.484, 0.59)
    again = Report.from_json(report.to_json())
    assert again.task.num_labels == 2 and again.chance_warning() == WARNING


def test_a_run_at_chance_says_so(spam_run):
    out, output = spam_run
    report = Report.read(out)
    assert report.task.num_labels == 2 and report.teacher_at_chance(), report.scores
    last = " ".join(output.split())  # the console wraps long lines
    assert "the teacher is at chance (" in last and "on 2 classes): the recovery says nothing" in last
    assert "**Warning: the teacher is at chance (" in (out / "report.md").read_text()

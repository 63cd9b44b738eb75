"""Image data: IDX parsing (Fashion-MNIST's format), image folders, ViT transforms and loaders."""

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from linearize.data import (FASHION_MNIST_LABELS, build_image_transforms, image_dataloader, load_fashion_mnist,
                            load_task_data, read_idx)
from linearize.data.images import FASHION_MNIST_DIR, load_image_folder
from linearize.errors import LinearizeError


def write_idx(path, array):
    """LeCun's IDX: 0, 0, type 0x08 (uint8), ndim, then big-endian int32 dims, then the bytes."""
    array = np.asarray(array, dtype=np.uint8)
    header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "wb") as handle:
        handle.write(header + array.tobytes())
    return path


@pytest.fixture
def fmnist_dir(tmp_path):
    rng = np.random.default_rng(0)
    train_labels = np.repeat(np.arange(10), 4)  # 40 images, 4 per class
    write_idx(tmp_path / "train-images-idx3-ubyte.gz", rng.integers(0, 256, (40, 28, 28)))
    write_idx(tmp_path / "train-labels-idx1-ubyte.gz", train_labels)
    write_idx(tmp_path / "t10k-images-idx3-ubyte.gz", rng.integers(0, 256, (10, 28, 28)))
    write_idx(tmp_path / "t10k-labels-idx1-ubyte.gz", np.arange(10))
    return tmp_path


def test_read_idx_roundtrip_and_errors(tmp_path):
    array = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    assert np.array_equal(read_idx(write_idx(tmp_path / "a.gz", array)), array)
    assert np.array_equal(read_idx(write_idx(tmp_path / "b", array)), array)  # uncompressed too
    (tmp_path / "short").write_bytes((tmp_path / "b").read_bytes()[:-1])
    with pytest.raises(LinearizeError, match="truncated or corrupt"):
        read_idx(tmp_path / "short")
    (tmp_path / "png").write_bytes(b"\x89PNG\r\n")
    with pytest.raises(LinearizeError, match="not an IDX file"):
        read_idx(tmp_path / "png")


def test_fashion_mnist_from_idx(fmnist_dir):
    data = load_fashion_mnist(fmnist_dir, dev_fraction=0.25, seed=0)
    assert {k: len(v) for k, v in data.items()} == {"train": 30, "validation": 10, "test": 10}
    assert data["train"].features["label"].names == list(FASHION_MNIST_LABELS)
    assert FASHION_MNIST_LABELS[:2] == ("T-shirt/top", "Trouser") and FASHION_MNIST_LABELS[9] == "Ankle boot"
    assert sorted(data["validation"]["label"]) == list(range(10))  # one per class: stratified
    raw = read_idx(fmnist_dir / "t10k-images-idx3-ubyte.gz")
    assert np.array_equal(np.asarray(data["test"][3]["image"], dtype=np.uint8), raw[3])
    assert data["test"]["label"] == list(range(10))


def test_fashion_mnist_missing_says_apt_get(tmp_path, monkeypatch):
    monkeypatch.setattr("linearize.data.images.FASHION_MNIST_DIR", tmp_path / "none")
    with pytest.raises(LinearizeError, match="apt-get install dataset-fashion-mnist"):
        load_fashion_mnist()
    with pytest.raises(LinearizeError, match="point data_dir at"):
        load_fashion_mnist(tmp_path)


@pytest.mark.skipif(not (FASHION_MNIST_DIR / "t10k-labels-idx1-ubyte.gz").is_file(),
                    reason="Debian's dataset-fashion-mnist is not installed")
def test_real_debian_fashion_mnist_headers():
    labels = read_idx(FASHION_MNIST_DIR / "t10k-labels-idx1-ubyte.gz")
    images = read_idx(FASHION_MNIST_DIR / "t10k-images-idx3-ubyte.gz")
    assert images.shape == (10000, 28, 28) and labels.shape == (10000,)
    assert np.bincount(labels).tolist() == [1000] * 10


@pytest.fixture
def image_folder(tmp_path):
    rng = np.random.default_rng(0)
    for split, count in (("train", 4), ("test", 1)):
        for label in ("cat", "dog"):
            folder = tmp_path / "imgs" / split / label
            folder.mkdir(parents=True)
            for i in range(count):
                pixels = rng.integers(0, 256, (12, 16, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(folder / f"{i}.png")
    return tmp_path / "imgs"


def test_image_folder(image_folder, tmp_path):
    data = load_image_folder(image_folder, seed=0, cache_dir=str(tmp_path / "hf"))
    assert {k: len(v) for k, v in data.items()} == {"train": 7, "validation": 1, "test": 2}  # at least one held out
    data = load_image_folder(image_folder, dev_fraction=0.25, seed=0, cache_dir=str(tmp_path / "hf"))
    assert {k: len(v) for k, v in data.items()} == {"train": 6, "validation": 2, "test": 2}
    assert sorted(data["validation"]["label"]) == [0, 1]
    assert data["train"].features["label"].names == ["cat", "dog"]
    assert data["train"].column_names == ["image", "label"]
    assert data["train"][0]["image"].size == (16, 12)
    data, spec = load_task_data("imagefolder", data_dir=image_folder, cache_dir=str(tmp_path / "hf"))
    assert spec.kind == "image" and spec.label_names == ("cat", "dog") and spec.metric_names == ("accuracy",)
    with pytest.raises(LinearizeError, match="does not exist"):
        load_image_folder(tmp_path / "nowhere")


def test_transforms_from_a_vit_processor_turn_gray_into_rgb():
    from transformers import ViTImageProcessor

    processor = ViTImageProcessor(size={"height": 32, "width": 32}, image_mean=[0.5] * 3, image_std=[0.5] * 3)
    train_tf, eval_tf = build_image_transforms(processor)
    gray = np.full((28, 28), 255, dtype=np.uint8)
    for tf in (train_tf, eval_tf):
        out = tf(gray)
        assert out.shape == (3, 32, 32) and out.dtype == torch.float32
        assert torch.allclose(out, torch.ones_like(out))  # (1 - 0.5) / 0.5
    pil = Image.fromarray(np.zeros((40, 50, 3), dtype=np.uint8))
    assert torch.allclose(eval_tf(pil), -torch.ones(3, 32, 32))
    assert eval_tf(pil.convert("RGBA")).shape == eval_tf(pil.convert("P")).shape == (3, 32, 32)


def test_transforms_geometry_deit_style_and_explicit():
    from transformers import DeiTImageProcessor

    processor = DeiTImageProcessor(size={"height": 40, "width": 40}, crop_size={"height": 32, "width": 32})
    train_tf, eval_tf = build_image_transforms(processor)
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (60, 80, 3), dtype=np.uint8))
    assert train_tf(image).shape == eval_tf(image).shape == (3, 32, 32)
    train_tf, eval_tf = build_image_transforms(size=24, mean=[0.2860], std=[0.3530], num_channels=1)
    assert eval_tf(image).shape == (1, 24, 24)  # RGB -> 1 channel for a grayscale model
    with pytest.raises(LinearizeError, match="image processor or an explicit size"):
        build_image_transforms()


def test_image_dataloader_batches(fmnist_dir):
    data = load_fashion_mnist(fmnist_dir, dev_fraction=0.25, seed=0)
    train_tf, eval_tf = build_image_transforms(size=32, mean=[0.5] * 3, std=[0.5] * 3)
    loader = image_dataloader(data["train"], train_tf, batch_size=8, shuffle=True, seed=0)
    batch = next(iter(loader))
    assert batch["pixel_values"].shape == (8, 3, 32, 32) and batch["labels"].dtype == torch.long
    first = [b["labels"].tolist() for b in image_dataloader(data["train"], eval_tf, batch_size=8, shuffle=True,
                                                            seed=5)]
    second = [b["labels"].tolist() for b in image_dataloader(data["train"], eval_tf, batch_size=8, shuffle=True,
                                                             seed=5)]
    assert first == second and sum(len(b) for b in first) == 30


def test_load_task_data_fashion_mnist(fmnist_dir):
    data, spec = load_task_data("fashion-mnist", data_dir=fmnist_dir, dev_fraction=0.25)
    assert spec.kind == "image" and spec.num_labels == 10 and spec.image_key == "image"
    assert spec.metric_names == ("accuracy", "top5_accuracy") and spec.eval_splits == ("validation", "test")
    assert Path(fmnist_dir).is_dir()


def test_hub_image_dataset_is_detected_and_normalised(monkeypatch, image_folder, tmp_path):
    import datasets

    folder = load_image_folder(image_folder, dev_fraction=0, cache_dir=str(tmp_path / "hf"))
    hub = datasets.DatasetDict({split: ds.rename_columns({"image": "img", "label": "fine_label"})
                                for split, ds in folder.items()})
    monkeypatch.setattr(datasets, "load_dataset", lambda name, config=None, **kw: hub)
    data, spec = load_task_data("someone/pets")
    assert spec.kind == "image" and spec.label_names == ("cat", "dog") and spec.name == "someone/pets"
    assert list(data) == ["train", "validation", "test"] and data["train"].column_names == ["image", "label"]

    def unreachable(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'someone/pets' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(datasets, "load_dataset", unreachable)
    with pytest.raises(LinearizeError, match=r"could not load data set 'someone/pets'.*Hub is unreachable"):
        load_task_data("someone/pets")

"""Image classification data (Hub data sets, image folders, Fashion-MNIST) and ViT-style transforms.

Every loader returns a ``DatasetDict`` with an ``image`` column and a ``ClassLabel``
``label`` column, splits ``train``/``validation`` (and ``test`` when the source has one);
a missing ``validation`` is carved out of ``train`` with a fixed seed (``splits.py``).

Fashion-MNIST (Xiao, Rasul & Vollgraf, 2017, arXiv:1708.07747) is read from the IDX files
of Debian's ``dataset-fashion-mnist`` package (``/usr/share/datasets/fashion-mnist/``).
IDX is LeCun's MNIST format: a big-endian header of two zero bytes, a type byte
(0x08 = uint8) and the number of dimensions, then each dimension as a big-endian int32,
then the data row-major. Its ``image`` column holds the raw 28×28 uint8 arrays
(``Array2D``): encoding 70,000 PNGs would cost several seconds for nothing, and the
transforms below accept arrays and PIL images alike.

Transforms follow the usual ViT fine-tuning recipe (Dosovitskiy et al., 2021; the
``run_image_classification`` example of transformers): RandomResizedCrop + horizontal flip
for training, resize + centre crop for evaluation, then scaling to [0, 1] and the
processor's mean/std normalisation, all with ``torchvision.transforms.v2``.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np

from ..errors import LinearizeError
from .splits import carve_dev_split

FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
FASHION_MNIST_LABELS = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker",
                        "Bag", "Ankle boot")
FASHION_MNIST_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
DEFAULT_DEV_FRACTION = 0.1


# ---------------------------------------------------------------- IDX / Fashion-MNIST

def read_idx(path) -> np.ndarray:
    """An IDX file (gzip-compressed or not) as a NumPy array of its declared shape and type."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as handle:
            data = handle.read()
    except (OSError, EOFError) as error:
        raise LinearizeError(f"cannot read IDX file {path} ({error}); re-install or re-download it") from None
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] not in IDX_DTYPES:
        raise LinearizeError(f"{path} is not an IDX file (bad magic number {data[:4].hex()})")
    ndim = data[3]
    header = 4 + 4 * ndim
    shape = tuple(int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    dtype = np.dtype(IDX_DTYPES[data[2]])
    expected = header + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(data) != expected:
        raise LinearizeError(f"{path} is truncated or corrupt: {len(data)} bytes, its header says {expected}")
    return np.frombuffer(data, dtype=dtype, offset=header).reshape(shape)


def _find_idx(directory: Path, stem: str) -> Path | None:
    for name in (stem + ".gz", stem, stem.replace("-idx", ".idx") + ".gz", stem.replace("-idx", ".idx")):
        if (directory / name).is_file():
            return directory / name
    return None


def load_fashion_mnist(data_dir=None, dev_fraction=DEFAULT_DEV_FRACTION, seed=0):
    """Fashion-MNIST as ``DatasetDict(train, validation, test)``: 54,000 / 6,000 / 10,000 by default.

    ``validation`` is a stratified ``dev_fraction`` of the 60,000 training images; ``test``
    is the official 10,000-image test set. ``data_dir`` defaults to Debian's location.
    """
    from datasets import Array2D, ClassLabel, Dataset, DatasetDict, Features

    directory = Path(data_dir) if data_dir is not None else FASHION_MNIST_DIR
    out = {}
    for split, (images_stem, labels_stem) in FASHION_MNIST_FILES.items():
        images_path, labels_path = _find_idx(directory, images_stem), _find_idx(directory, labels_stem)
        if images_path is None or labels_path is None:
            missing = images_stem if images_path is None else labels_stem
            hint = ("run `apt-get install dataset-fashion-mnist` (Debian/Ubuntu)" if data_dir is None else
                    "point data_dir at the folder holding Fashion-MNIST's four IDX files")
            raise LinearizeError(f"Fashion-MNIST not found: {directory / (missing + '.gz')} is missing; {hint}")
        images, labels = read_idx(images_path), read_idx(labels_path)
        if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
            raise LinearizeError(f"{images_path} and {labels_path} do not match: images {images.shape}, "
                                 f"labels {labels.shape}")
        if labels.size and int(labels.max()) >= len(FASHION_MNIST_LABELS):
            raise LinearizeError(f"{labels_path} has label {int(labels.max())}; Fashion-MNIST has 10 classes")
        features = Features({"image": Array2D(shape=images.shape[1:], dtype="uint8"),
                             "label": ClassLabel(names=list(FASHION_MNIST_LABELS))})
        out[split] = Dataset.from_dict({"image": images.astype(np.uint8), "label": labels.astype(np.int64)},
                                       features=features, split=split)
    return carve_dev_split(DatasetDict(out), dev_fraction, seed=seed)


# ---------------------------------------------------------------- image folders and the Hub

def normalize_image_dataset(data, image_column=None, label_column=None, dev_fraction=None, seed=0):
    """Rename a loaded data set's image/label columns to ``image``/``label``, drop the rest.

    Columns default to the first ``Image`` and the first ``ClassLabel`` feature. A missing
    ``validation`` split is carved from ``train`` (``dev_fraction`` default 0.1);
    ``dev_fraction=0`` never carves, a positive one always does.
    """
    from datasets import ClassLabel, DatasetDict, Image

    if "train" not in data:
        raise LinearizeError(f"the image data set has no 'train' split (splits: {', '.join(data)})")
    features = data["train"].features
    image_column = image_column or next((k for k, f in features.items() if isinstance(f, Image)), None)
    label_column = label_column or next((k for k, f in features.items() if isinstance(f, ClassLabel)), None)
    columns = ", ".join(features)
    if image_column is None or image_column not in features:
        raise LinearizeError(f"no image column {image_column or ''} found (columns: {columns}); "
                             "name it with --image-column")
    if label_column is None or label_column not in features:
        raise LinearizeError(f"no class-label column {label_column or ''} found (columns: {columns}); "
                             "name it with --label-column")
    if not isinstance(features[label_column], ClassLabel):
        data = data.class_encode_column(label_column)
    out = {}
    for split, ds in data.items():
        ds = ds.select_columns([image_column, label_column])
        ds = ds.rename_columns({k: v for k, v in ((image_column, "image"), (label_column, "label")) if k != v})
        out[split] = ds
    data = DatasetDict(out)
    if dev_fraction is None:
        dev_fraction = 0.0 if "validation" in data else DEFAULT_DEV_FRACTION
    return carve_dev_split(data, dev_fraction, seed=seed)


def load_image_folder(data_dir, dev_fraction=None, seed=0, cache_dir=None):
    """An image folder (``data_dir/<split>/<class>/*.png`` or ``data_dir/<class>/*.png``).

    Uses the ``imagefolder`` builder of ``datasets``: class names are the folder names,
    sorted; split folders named ``train``/``validation``/``test`` become those splits.
    """
    import datasets

    if not Path(data_dir).is_dir():
        raise LinearizeError(f"image folder {data_dir} does not exist")
    try:
        data = datasets.load_dataset("imagefolder", data_dir=str(data_dir), cache_dir=cache_dir)
    except Exception as error:
        raise LinearizeError(f"cannot read image folder {data_dir} ({error}); expected "
                             "<split>/<class>/<image> or <class>/<image>") from error
    return normalize_image_dataset(data, "image", "label", dev_fraction=dev_fraction, seed=seed)


def load_hub_images(name, config=None, image_column=None, label_column=None, dev_fraction=None, seed=0,
                    cache_dir=None):
    """An image classification data set from the Hugging Face Hub, normalised as above."""
    data = load_hub_dataset(name, config, cache_dir)
    return normalize_image_dataset(data, image_column, label_column, dev_fraction=dev_fraction, seed=seed)


def load_hub_dataset(name, config=None, cache_dir=None):
    """``datasets.load_dataset(name, config)`` with its failures turned into one-line errors."""
    import datasets

    from ..hub import failure_reason, offline_while_unreachable

    unreachable = None
    try:
        with offline_while_unreachable() as unreachable:  # a cached copy at once; else fail at once
            data = datasets.load_dataset(name, config, cache_dir=cache_dir)
    except Exception as error:
        reason = failure_reason(error, unreachable)
        raise LinearizeError(f"could not load data set {name!r} from the Hugging Face Hub: {reason}. Check the "
                             "name, or use local files (--data-dir / --train-file) if the Hub is unreachable"
                             ) from error
    if not isinstance(data, datasets.DatasetDict):
        data = datasets.DatasetDict({"train": data})
    return data


# ---------------------------------------------------------------- transforms

def _size_value(size, key):
    if size is None:
        return None
    if isinstance(size, dict):
        return size.get(key)
    return getattr(size, key, None)


def _processor_geometry(processor):
    """``(resize, crop)`` for eval from an image processor: ints (shorter side) or (h, w) tuples."""
    size, crop = getattr(processor, "size", None), getattr(processor, "crop_size", None)
    if isinstance(size, int):
        size = {"height": size, "width": size}
    height, width, shortest = (_size_value(size, "height"), _size_value(size, "width"),
                               _size_value(size, "shortest_edge"))
    resize = (height, width) if height and width else shortest
    if resize is None:
        raise LinearizeError(f"{type(processor).__name__} has no usable size ({size}); pass size= explicitly")
    crop_h, crop_w = _size_value(crop, "height"), _size_value(crop, "width")
    if crop_h and crop_w and getattr(processor, "do_center_crop", True):
        return resize, (crop_h, crop_w)
    crop_pct = getattr(processor, "crop_pct", None)
    if shortest and crop_pct:  # ConvNeXt-style: resize to shortest/crop_pct, crop shortest
        return int(shortest / crop_pct), shortest
    return resize, resize


def build_image_transforms(image_processor=None, *, size=None, mean=None, std=None, num_channels=3,
                           crop_scale=(0.08, 1.0), resize=None):
    """``(train_transform, eval_transform)``: callables from a PIL image or array to a float tensor.

    Geometry and normalisation come from ``image_processor`` (an HF image processor:
    ``size``, ``crop_size``, ``image_mean``, ``image_std``) or from ``size``/``mean``/``std``
    (timm models: ``model.pretrained_cfg``). Grayscale inputs become 3 channels when
    ``num_channels == 3`` (RGB inputs become 1 when it is 1). ``crop_scale`` is
    RandomResizedCrop's area range; raise its lower end for small, centred objects.
    """
    import torch
    from torchvision.transforms import v2

    if image_processor is not None:
        eval_resize, crop = _processor_geometry(image_processor)
        if getattr(image_processor, "do_normalize", True):
            mean = mean if mean is not None else getattr(image_processor, "image_mean", None)
            std = std if std is not None else getattr(image_processor, "image_std", None)
    elif size is not None:
        crop = size
        eval_resize = resize if resize is not None else size
    else:
        raise LinearizeError("image transforms need an image processor or an explicit size")
    crop = tuple(crop) if isinstance(crop, (tuple, list)) else (int(crop), int(crop))
    if num_channels == 3:
        channels = [v2.RGB()]
    elif num_channels == 1:
        channels = [v2.Grayscale(num_output_channels=1)]
    else:
        raise LinearizeError(f"num_channels must be 1 or 3, got {num_channels}")
    finish = [v2.ToDtype(torch.float32, scale=True)]
    if mean is not None and std is not None:
        mean, std = list(mean), list(std)
        if len(mean) != num_channels:  # a 3-channel mean for a 1-channel model, or the reverse
            mean, std = [float(np.mean(mean))] * num_channels, [float(np.mean(std))] * num_channels
        finish.append(v2.Normalize(mean=mean, std=std))
    train = v2.Compose([_ToImage(), *channels,
                        v2.RandomResizedCrop(crop, scale=tuple(crop_scale), antialias=True),
                        v2.RandomHorizontalFlip(), *finish])
    evaluate = v2.Compose([_ToImage(), *channels, v2.Resize(eval_resize, antialias=True), v2.CenterCrop(crop),
                           *finish])
    return train, evaluate


class _ToImage:
    """PIL image, ``H×W``/``H×W×C`` array or nested list → a ``tv_tensors.Image`` (uint8, C×H×W)."""

    def __call__(self, image):
        from torchvision.transforms import v2

        if hasattr(image, "mode"):
            if image.mode not in ("L", "RGB"):  # RGBA, palette, CMYK, 16-bit: v2.RGB takes 1 or 3 channels
                image = image.convert("RGB")
        else:  # an Array2D/Array3D row comes as an array or nested lists
            image = np.ascontiguousarray(np.asarray(image, dtype=np.uint8))
        return v2.functional.to_image(image)


def image_transform(transform, image_key="image"):
    """A ``Dataset.with_transform`` function: ``{image, label}`` batch → ``{pixel_values, label}``."""

    def apply(batch):
        out = {"pixel_values": [transform(image) for image in batch[image_key]]}
        if "label" in batch:
            out["label"] = batch["label"]
        return out

    return apply


def collate_images(examples):
    """Stack ``pixel_values`` and make ``labels`` the tensor HF image classifiers take."""
    import torch

    batch = {"pixel_values": torch.stack([torch.as_tensor(e["pixel_values"]) for e in examples])}
    if "label" in examples[0]:
        batch["labels"] = torch.tensor([e["label"] for e in examples], dtype=torch.long)
    return batch


def image_dataloader(dataset, transform, batch_size=32, shuffle=False, seed=0, num_workers=0, drop_last=False):
    """A ``DataLoader`` over one split: ``transform`` applied on the fly, reproducible shuffling."""
    import torch
    from torch.utils.data import DataLoader

    generator = torch.Generator().manual_seed(int(seed)) if shuffle else None
    return DataLoader(dataset.with_transform(image_transform(transform)), batch_size=batch_size, shuffle=shuffle,
                      generator=generator, num_workers=num_workers, collate_fn=collate_images, drop_last=drop_last)

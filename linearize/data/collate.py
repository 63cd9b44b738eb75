"""Tokenisation, dynamic padding and DataLoaders for text and image tasks.

Text is tokenised once with the checkpoint's own tokenizer (single sentences or pairs,
truncated to ``max_length``, not padded), and each batch is padded only to its longest
member by ``DataCollatorWithPadding``: on short sentences (SST-2, movie reviews) that is a
large saving over padding everything to ``max_length``. Shuffling uses a seeded
``torch.Generator``, so the batch order is the same on every run with the same seed.

On long documents of uneven length (whole reviews: 100 to 2,048 tokens) a random batch is still
padded to its longest member; ``group_by_length`` batches training examples of similar length
together, as transformers' Trainer does with ``group_by_length`` (a shuffled order cut into
megabatches of up to 50 batches — a quarter of the split when smaller — each sorted by length),
so most of the padding goes while the batches stay random.
"""

from __future__ import annotations

from ..errors import LinearizeError

MODEL_COLUMNS = ("input_ids", "attention_mask", "token_type_ids", "label", "labels")


def tokenize_dataset(data, tokenizer, text_keys, max_length=128):
    """Tokenise a ``Dataset``/``DatasetDict``: adds ``input_ids`` etc., keeps ``label``, drops the rest.

    ``text_keys`` has one column (single sentences) or two (sentence pairs, encoded as
    ``[CLS] a [SEP] b [SEP]`` with the longer one truncated first).
    """
    text_keys = tuple(text_keys)
    if len(text_keys) not in (1, 2):
        raise LinearizeError(f"text_keys must name one or two columns, got {text_keys}")
    columns = data.column_names
    names = columns if isinstance(columns, list) else next(iter(columns.values()))
    missing = [key for key in text_keys if key not in names]
    if missing:
        raise LinearizeError(f"no text column {', '.join(map(repr, missing))} (columns: {', '.join(names)})")
    limit = getattr(tokenizer, "model_max_length", None)
    if limit and limit < 10**6 and max_length > limit:
        raise LinearizeError(f"max_length {max_length} exceeds the tokenizer's limit {limit}; pass --max-length "
                             f"{limit} or less, or give the model that many positions first (linearize convert "
                             f"SOURCE --max-length {max_length})")

    def encode(batch):
        return tokenizer(*(batch[key] for key in text_keys), truncation=True, max_length=max_length)

    remove = [name for name in names if name not in ("label",)]

    def tokenized(split):
        return split.map(encode, batched=True, remove_columns=remove, desc="tokenizing",
                         new_fingerprint=map_fingerprint(split, tokenizer, text_keys, max_length))

    if isinstance(data, dict):  # a DatasetDict: split by split (its own map takes no fingerprints)
        return type(data)({name: tokenized(split) for name, split in data.items()})
    return tokenized(data)


#: bumped whenever ``tokenize_dataset``'s encoding changes, so no cache file of the old one is reused
TOKENIZE_VERSION = "linearize.tokenize_dataset/1"


def map_fingerprint(split, tokenizer, text_keys, max_length):
    """The fingerprint of ``split`` tokenised by ``tokenize_dataset``: what names its cache file when ``datasets``
    keeps one (a split loaded from files), from everything the result depends on (the split's own fingerprint, the
    fast tokenizer's full definition and settings, the columns and the length). Without it ``datasets`` hashes the
    encoding function by pickling the tokenizer in it: ~0.7 s a split on a 2-core CPU, measured, most of a small
    run's tokenising. None (that default) for a tokenizer without a serialisable backend or a split without a
    fingerprint."""
    import hashlib

    backend, fingerprint = getattr(tokenizer, "backend_tokenizer", None), getattr(split, "_fingerprint", None)
    if backend is None or fingerprint is None:
        return None
    digest = hashlib.sha256()
    for part in (TOKENIZE_VERSION, fingerprint, type(tokenizer).__name__, backend.to_str(),
                 repr(sorted(tokenizer.init_kwargs.items(), key=str)), str(tokenizer.truncation_side),
                 repr(tuple(text_keys)), str(max_length)):
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()[:32]


def text_collator(tokenizer):
    from transformers import DataCollatorWithPadding

    return DataCollatorWithPadding(tokenizer)


def length_grouped_sampler(dataset, batch_size, seed):
    """A sampler over a tokenised split that puts examples of similar length in the same batch:
    transformers' ``LengthGroupedSampler`` with a per-epoch seed (``seed + epoch``, set by
    ``set_epoch`` as accelerate's seedable sampler is), so a resumed run sees the same batches."""
    import torch
    from transformers.trainer_pt_utils import LengthGroupedSampler

    class SeededLengthGroupedSampler(LengthGroupedSampler):
        epoch = 0

        def set_epoch(self, epoch):
            self.epoch = epoch

        def __iter__(self):
            self.generator.manual_seed(int(seed) + self.epoch)
            return super().__iter__()

    lengths = [len(ids) for ids in dataset["input_ids"]]
    return SeededLengthGroupedSampler(batch_size, lengths=lengths, generator=torch.Generator())


def text_dataloader(dataset, tokenizer, batch_size=32, shuffle=False, seed=0, num_workers=0, drop_last=False,
                    group_by_length=False):
    """A ``DataLoader`` over a tokenised split with dynamic padding; batches carry ``labels``.
    ``group_by_length`` (with ``shuffle``) batches examples of similar length together."""
    import torch
    from torch.utils.data import DataLoader

    keep = [name for name in dataset.column_names if name in MODEL_COLUMNS]
    if "input_ids" not in keep:
        raise LinearizeError("the split is not tokenised (no input_ids); call tokenize_dataset first")
    order = {}
    if shuffle and group_by_length:
        order["sampler"] = length_grouped_sampler(dataset, batch_size, seed)
    elif shuffle:
        order.update(shuffle=True, generator=torch.Generator().manual_seed(int(seed)))
    return DataLoader(dataset.select_columns(keep), batch_size=batch_size, collate_fn=text_collator(tokenizer),
                      num_workers=num_workers, drop_last=drop_last, **order)


def text_dataloaders(tokenized, tokenizer, *, batch_size=32, eval_batch_size=None, seed=0, num_workers=0,
                     group_by_length=False):
    """``{split: DataLoader}`` over already tokenised splits (:func:`tokenize_dataset`): only ``train``
    is shuffled (grouped by length with ``group_by_length``); a run tokenises once and builds these
    for each stage's batch size."""
    eval_batch_size = eval_batch_size or batch_size
    loaders = {}
    for split, ds in tokenized.items():
        if len(ds) == 0:
            continue
        train = split == "train"
        loaders[split] = text_dataloader(ds, tokenizer, batch_size if train else eval_batch_size, shuffle=train,
                                         seed=seed, num_workers=num_workers, group_by_length=group_by_length)
    return loaders


def make_dataloaders(data, spec, *, tokenizer=None, image_processor=None, batch_size=32, eval_batch_size=None,
                     max_length=128, seed=0, num_workers=0, num_channels=3, **transform_options):
    """``{split: DataLoader}`` for every split of ``data``: only ``train`` is shuffled/augmented.

    Text tasks need ``tokenizer``; image tasks need ``image_processor`` (or ``size=``/
    ``mean=``/``std=`` in ``transform_options``, see ``build_image_transforms``).
    """
    eval_batch_size = eval_batch_size or batch_size
    loaders = {}
    if spec.kind == "text":
        if tokenizer is None:
            raise LinearizeError(f"task {spec.name!r} is text: a tokenizer is needed")
        tokenized = tokenize_dataset(data, tokenizer, spec.text_keys, max_length=max_length)
        return text_dataloaders(tokenized, tokenizer, batch_size=batch_size, eval_batch_size=eval_batch_size,
                                seed=seed, num_workers=num_workers)
    from .images import build_image_transforms, image_dataloader

    train_tf, eval_tf = build_image_transforms(image_processor, num_channels=num_channels, **transform_options)
    for split, ds in data.items():
        if len(ds) == 0:
            continue
        train = split == "train"
        loaders[split] = image_dataloader(ds, train_tf if train else eval_tf, batch_size if train else eval_batch_size,
                                          shuffle=train, seed=seed, num_workers=num_workers)
    return loaders

"""What a run reads: the softmax source model, its processor, the task data and its loaders.

The text splits are tokenised once per run (:class:`TaskData`); each stage gets fresh
``DataLoader``\\ s over them at its own batch size, each with its own seeded generator, so the
batches and their order are those of tokenising afresh for every stage.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..errors import LinearizeError


def build_source_model(recipe, spec):
    """The softmax starting point: a pretrained checkpoint with the task's head, or (``model:
    {config: ...}``) a model built from a config to be trained from scratch. An image task's
    ``data.image_size`` different from a checkpoint's own resizes its position grid
    (``convert.resolution``), so the teacher and the student both work at that size."""
    import transformers

    from ..convert.heads import auto_class_for
    from ..convert.loading import load_source_model
    from ..convert.resolution import resize_image_positions

    head_kwargs = spec.model_config_kwargs()
    source = recipe["model"]
    if isinstance(source, dict):
        config_dict = dict(source.get("config") or {})
        model_type = config_dict.pop("model_type", None)
        if model_type is None:
            raise LinearizeError("recipe model.config needs a model_type (e.g. vit)")
        config = transformers.AutoConfig.for_model(model_type, **config_dict, **head_kwargs)
        config.update(attention_dropout_kwargs(recipe, config))
        cls = getattr(transformers, auto_class_for(recipe["head"]))
        torch.manual_seed(recipe["seed"])
        return cls.from_config(config), None
    if recipe["teacher"]["attention_dropout"] is not None:
        head_kwargs.update(attention_dropout_kwargs(recipe, source_config(source)))
    model = load_source_model(source, head=recipe["head"], **head_kwargs)
    if spec.kind == "image" and recipe["data"]["image_size"]:
        resize_image_positions(model, recipe["data"]["image_size"])
    return fit_positions(model, recipe, spec), source


#: the config fields that hold attention-probability dropout (BERT, RoBERTa, ELECTRA, ALBERT, ViT,
#: DeiT: the first; ModernBERT, DistilBERT, CLIP, SigLIP and most newer models: the second)
ATTENTION_DROPOUT_FIELDS = ("attention_probs_dropout_prob", "attention_dropout")


def attention_dropout_kwargs(recipe, config):
    """The overrides of ``config``'s attention-dropout field(s) that ``teacher.attention_dropout``
    asks for (none when it is null, or when ``config`` is None: unreadable, reported by the
    loading); a one-line error for a model without such a field."""
    dropout = recipe["teacher"]["attention_dropout"]
    if dropout is None or config is None:
        return {}
    fields = [name for name in ATTENTION_DROPOUT_FIELDS if hasattr(config, name)]
    if not fields:
        raise LinearizeError(f"teacher.attention_dropout: {type(config).__name__} has no attention dropout setting "
                             f"({' or '.join(ATTENTION_DROPOUT_FIELDS)}); leave teacher.attention_dropout null")
    return {name: float(dropout) for name in fields}


#: from this many tokens on, PyTorch's CPU attention with dropout costs gigabytes (see below)
LONG_DROPOUT_LENGTH = 1024


def attention_dropout_warning(model, max_length, on_device):
    """A one-line warning when a softmax teacher is about to train on the CPU at ``max_length`` ≥
    :data:`LONG_DROPOUT_LENGTH` tokens with attention dropout on: PyTorch's CPU attention then
    leaves its fused kernel for one that keeps N × N matrices for backward (1,573 MiB against 39
    MiB per 12-head layer for 2 sequences of 2,048 tokens, measured); else None. ``on_device``:
    training runs on an accelerator device (``linearize.training.has_device``)."""
    config = getattr(model, "config", None)
    dropout = max((float(getattr(config, name, 0.0) or 0.0) for name in ATTENTION_DROPOUT_FIELDS), default=0.0)
    if on_device or not dropout or not max_length or max_length < LONG_DROPOUT_LENGTH:
        return None
    return (f"the teacher trains at {max_length} tokens on the CPU with attention dropout {dropout:g}: PyTorch's "
            f"CPU attention then holds N x N matrices for backward (gigabytes per layer) and runs several times "
            f"slower; --set teacher.attention_dropout=0 keeps its fused kernel")


def source_config(source):
    """The source checkpoint's config, or None where it cannot be read (``load_source_model``
    then says why, in one line)."""
    import transformers

    from ..convert.loading import resolve_model_name

    try:
        return transformers.AutoConfig.from_pretrained(resolve_model_name(source))
    except (OSError, ValueError):
        return None


def fit_positions(model, recipe, spec):
    """``model`` made to take ``data.max_length`` tokens, the run's one length rule.

    Text is cut to ``data.max_length`` tokens; a model whose learned position table is shorter
    (BERT, RoBERTa, ... : ``linearize.convert.positions``) gets its table extended to that length,
    initialised as ``position_init`` says, before the teacher is fine-tuned, so the teacher and
    the student converted from it both read whole inputs. A model whose positions are not learned
    must already take that length (a one-line error otherwise)."""
    from ..convert.positions import POSITION_INITS, extend_positions, max_positions

    length = recipe["data"]["max_length"]
    if recipe["position_init"] not in POSITION_INITS:
        raise LinearizeError(f"unknown position_init {recipe['position_init']!r}; valid: "
                             f"{', '.join(POSITION_INITS)}")
    if spec.kind != "text":
        return model
    try:
        current = max_positions(model)
    except LinearizeError:  # no learned table: rotary or fixed positions
        limit = getattr(model.config, "max_position_embeddings", None)
        if limit and length > limit:
            raise LinearizeError(f"data.max_length {length} is longer than the {limit} positions of "
                                 f"{recipe['model']}, which are not a learned table linearize can extend; set "
                                 f"data.max_length {limit} or less") from None
        return model
    if length > current:
        extend_positions(model, length, recipe["position_init"])
    return model


def fit_tokenizer(processor, recipe):
    """A tokenizer whose ``model_max_length`` is below ``data.max_length`` raised to it: the
    model's positions follow (:func:`fit_positions`), and the saved tokenizer says so."""
    limit = getattr(processor, "model_max_length", None)
    if limit is not None and recipe["data"]["max_length"] > limit:
        processor.model_max_length = recipe["data"]["max_length"]
    return processor


def load_processor(recipe, spec):
    """Tokenizer (text) or image processor (image) of the source checkpoint, or None; an image
    processor feeds ``data.image_size`` images when the recipe sets it."""
    from ..convert.resolution import processor_at_size

    processor = _source_processor(recipe, spec)
    if spec.kind == "image" and processor is not None and recipe["data"]["image_size"]:
        return processor_at_size(processor, recipe["data"]["image_size"])
    return processor


def _source_processor(recipe, spec):
    import transformers

    from ..convert.loading import resolve_model_name

    if isinstance(recipe["model"], dict):
        return None
    source = resolve_model_name(recipe["model"])
    if (Path(source) / "config.json").is_file() and "linearize" in json.loads((Path(source) / "config.json").read_text()):
        from ..convert.api import load_processor as load_saved_processor

        return load_saved_processor(source)
    auto = transformers.AutoTokenizer if spec.kind == "text" else transformers.AutoImageProcessor
    try:
        return auto.from_pretrained(source)
    except (OSError, ValueError) as error:
        raise LinearizeError(f"could not load the {'tokenizer' if spec.kind == 'text' else 'image processor'} of "
                             f"{recipe['model']}: {str(error).splitlines()[0]}") from None


def check_head(model, spec, name):
    """A model used as it is must have the task's number of outputs (an embedding task has none)."""
    if spec.is_embedding:
        return
    labels = getattr(model.config, "num_labels", None)
    if labels is not None and labels != spec.num_labels:
        raise LinearizeError(f"{name} has {labels} labels but task {spec.name} has {spec.num_labels}: its head "
                             "cannot serve this task; fine-tune a checkpoint with a new head instead")


def check_task_head(model, name):
    """A model fine-tuned or scored on a task needs a classification head (outputs ``logits``)."""
    import transformers

    from ..convert import linearize_config
    from ..convert.heads import head_for_class

    if not isinstance(model, transformers.PreTrainedModel):
        return
    architecture = (linearize_config(model) or {}).get("architecture") or type(model).__name__
    head = head_for_class(architecture)
    if head is None or head.pipeline_tag not in ("text-classification", "image-classification"):
        raise LinearizeError(f"{name} is a {architecture}, without a classification head: convert or fine-tune "
                             "its softmax source with --head sequence-classification (or image-classification) "
                             "first")


def load_data(recipe):
    """``(DatasetDict, TaskSpec)`` of the recipe's task, cut to ``data.max_train_examples`` /
    ``data.max_eval_examples`` (a seeded shuffle first); a validation split is required."""
    from ..data import load_task_data

    d = recipe["data"]
    paths = ("data_dir", "data_file", "train_file", "validation_file", "test_file")
    keys = (*paths, "text_column", "text_pair_column", "label_column", "dev_fraction")  # not similarity_file
    given = {k: os.path.expanduser(d[k]) if k in paths else d[k] for k in keys if d[k] is not None}  # ~/glue
    data, spec = load_task_data(recipe["task"], seed=d["seed"], **given)
    for split, limit in (("train", d["max_train_examples"]),):
        if limit and len(data[split]) > limit:
            data[split] = data[split].shuffle(seed=d["seed"]).select(range(limit))
    for split in list(data):
        if split != "train" and d["max_eval_examples"] and len(data[split]) > d["max_eval_examples"]:
            data[split] = data[split].shuffle(seed=d["seed"]).select(range(d["max_eval_examples"]))
    if "validation" not in data or len(data["validation"]) == 0:
        raise LinearizeError(f"task {recipe['task']!r} has no validation split to select on; set data.dev_fraction")
    return data, spec


@dataclass
class TaskData:
    """A run's task data with its processor: loaders for any batch size, the text tokenised once."""

    recipe: dict
    data: object  # DatasetDict
    spec: object  # TaskSpec
    processor: object = None
    _tokenized: object = field(default=None, init=False, repr=False)
    similarity: object = None  # an embedding task's (first, second, gold) similarity pairs, or None

    @classmethod
    def load(cls, recipe):
        """The recipe's data (:func:`load_data`) and its source's processor (:func:`load_processor`),
        a tokenizer's limit raised to ``data.max_length`` (:func:`fit_tokenizer`). An embedding task
        pools as the source model's sentence-transformers files say (``embeddings.folder_pooling``)
        and reads ``data.similarity_file``."""
        data, spec = load_data(recipe)
        spec, similarity = embedding_inputs(recipe, spec)
        processor = load_processor(recipe, spec)
        return cls(recipe, data, spec, fit_tokenizer(processor, recipe) if spec.kind == "text" else processor,
                   similarity=similarity)

    def set_targets(self, teacher):
        """An embedding task's targets: the ``teacher``'s sentence embeddings of every split become
        the split's labels, what stage 2 distils toward and every score compares with (other tasks
        keep their labels)."""
        if not self.spec.is_embedding:
            return
        from datasets import DatasetDict

        from ..data import text_dataloader
        from ..finetune.stage2 import predict

        targets = {}
        for split, ds in self.tokenized().items():
            ds = ds.remove_columns([c for c in ("label",) if c in ds.column_names])
            vectors = predict(teacher, text_dataloader(ds, self.processor, self.recipe["eval"]["batch_size"]),
                              task=self.spec)[0] if len(ds) else []
            targets[split] = ds.add_column("label", [list(map(float, v)) for v in vectors])
        self._tokenized = DatasetDict(targets)

    def similarity_spearman(self, model):
        """Spearman correlation of ``model``'s cosine similarities with the similarity file's scores."""
        from datasets import Dataset

        from ..data import text_dataloader, tokenize_dataset
        from ..embeddings import similarity_spearman
        from ..finetune.stage2 import predict

        first, second, gold = self.similarity
        vectors = []
        for sentences in (first, second):
            ds = tokenize_dataset(Dataset.from_dict({"text": sentences}), self.processor, ("text",),
                                  max_length=self.recipe["data"]["max_length"])
            vectors.append(predict(model, text_dataloader(ds, self.processor, self.recipe["eval"]["batch_size"]),
                                   task=self.spec)[0])
        return similarity_spearman(*vectors, gold)

    def loaders(self, batch_size, seed):
        """``{split: DataLoader}``: ``train`` shuffled with ``seed`` at ``batch_size``, the other
        splits in order at the recipe's ``eval.batch_size``."""
        if self.spec.kind == "image":
            return self._image_loaders(batch_size, seed)
        from ..data import text_dataloaders

        return text_dataloaders(self.tokenized(), self.processor, batch_size=batch_size,
                                eval_batch_size=self.recipe["eval"]["batch_size"], seed=seed,
                                group_by_length=self.recipe["data"]["group_by_length"])

    def tokenized(self):
        """Every split tokenised (once: later calls return the same datasets)."""
        from ..data import tokenize_dataset

        if self._tokenized is None:
            if self.processor is None:
                raise LinearizeError(f"task {self.spec.name!r} is text: a tokenizer is needed")
            self._tokenized = tokenize_dataset(self.data, self.processor, self.spec.text_keys,
                                               max_length=self.recipe["data"]["max_length"])
        return self._tokenized

    def _image_loaders(self, batch_size, seed):
        from ..data import make_dataloaders

        d = self.recipe["data"]
        extra = {"num_channels": d["num_channels"] or 3, "crop_scale": tuple(d["crop_scale"])}
        if self.processor is None:
            if not d["image_size"]:
                raise LinearizeError("a model trained from scratch needs data.image_size (and image_mean/std)")
            extra.update(size=d["image_size"], mean=d["image_mean"], std=d["image_std"])
        return make_dataloaders(self.data, self.spec, image_processor=self.processor, batch_size=batch_size,
                                eval_batch_size=self.recipe["eval"]["batch_size"], seed=seed, **extra)


def embedding_inputs(recipe, spec):
    """``(spec, similarity pairs or None)``: an embedding task's spec pooled as the source model is,
    and its similarity file's pairs; any other task's ``spec`` as it is, and None."""
    import dataclasses

    from ..data.sentences import read_similarity_pairs
    from ..embeddings import folder_pooling

    if not spec.is_embedding:
        return spec, None
    if isinstance(recipe["model"], dict):
        raise LinearizeError("the embeddings task distils a pretrained encoder's embeddings; set model to a "
                             "checkpoint, not a config")
    spec = dataclasses.replace(spec, embedding=folder_pooling(recipe["model"]))
    path = recipe["data"]["similarity_file"]
    return spec, read_similarity_pairs(os.path.expanduser(path)) if path else None


def make_loaders(recipe, data, spec, processor, batch_size, seed):
    """``{split: DataLoader}`` of ``data`` (tokenising it; a run keeps a :class:`TaskData` instead)."""
    return TaskData(recipe, data, spec, processor).loaders(batch_size, seed)

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


def build_source_model(config, spec):
    """The softmax starting point: a pretrained checkpoint with the task's head, or (``model:
    {config: ...}``) a model built from a config to be trained from scratch. An image task's
    ``data.image_size`` different from a checkpoint's own resizes its position grid
    (``convert.resolution``), so the teacher and the student both work at that size."""
    import transformers

    from ..convert.heads import auto_class_for, check_head_fits
    from ..convert.loading import load_source_model
    from ..convert.resolution import resize_image_positions

    head_kwargs = spec.model_config_kwargs()
    source, dropout = config.model, config.teacher.attention_dropout
    if isinstance(source, dict):
        config_dict = dict(source.get("config") or {})
        model_type = config_dict.pop("model_type", None)
        if model_type is None:
            raise LinearizeError("recipe model.config needs a model_type (e.g. vit)")
        model_config = transformers.AutoConfig.for_model(model_type, **config_dict, **head_kwargs)
        model_config.update(attention_dropout_kwargs(dropout, model_config))
        check_head_fits(config.head, model_type, "the recipe's model")
        cls = getattr(transformers, auto_class_for(config.head))
        torch.manual_seed(config.seed)
        return cls.from_config(model_config), None
    if dropout is not None:
        head_kwargs.update(attention_dropout_kwargs(dropout, source_config(source)))
    model = load_source_model(source, head=config.head, **head_kwargs)
    if spec.kind == "image" and config.data.image_size:
        resize_image_positions(model, config.data.image_size)
    if spec.kind == "text":
        fit_positions(model, config.data.max_length, config.position_init, source)
    return model, source


#: the config fields that hold attention-probability dropout (BERT, RoBERTa, ELECTRA, ALBERT, ViT,
#: DeiT: the first; ModernBERT, DistilBERT, CLIP, SigLIP and most newer models: the second)
ATTENTION_DROPOUT_FIELDS = ("attention_probs_dropout_prob", "attention_dropout")


def attention_dropout_kwargs(dropout, config):
    """The overrides of ``config``'s attention-dropout field(s) that ``teacher.attention_dropout``
    (``dropout``) asks for (none when it is None, or when ``config`` is None: unreadable, reported
    by the loading); a one-line error for a model without such a field."""
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


def fit_positions(model, length, position_init, name):
    """The text model ``model`` made to take ``length`` (``data.max_length``) tokens, the run's
    one length rule.

    Text is cut to ``data.max_length`` tokens; a model whose learned position table is shorter
    (BERT, RoBERTa, ... : ``linearize.convert.positions``) gets its table extended to that length,
    initialised as ``position_init`` says, before the teacher is fine-tuned, so the teacher and
    the student converted from it both read whole inputs. A model whose positions are not learned
    must already take that length (a one-line error otherwise); ``name``: the source, for it."""
    from ..convert.positions import POSITION_INITS, extend_positions, max_positions

    if position_init not in POSITION_INITS:
        raise LinearizeError(f"unknown position_init {position_init!r}; valid: {', '.join(POSITION_INITS)}")
    try:
        current = max_positions(model)
    except LinearizeError:  # no learned table: rotary or fixed positions
        limit = getattr(model.config, "max_position_embeddings", None)
        if limit and length > limit:
            raise LinearizeError(f"data.max_length {length} is longer than the {limit} positions of "
                                 f"{name}, which are not a learned table linearize can extend; set "
                                 f"data.max_length {limit} or less") from None
        return model
    if length > current:
        extend_positions(model, length, position_init)
    return model


def fit_tokenizer(processor, max_length):
    """A tokenizer whose ``model_max_length`` is below ``max_length`` (``data.max_length``) raised
    to it: the model's positions follow (:func:`fit_positions`), and the saved tokenizer says so."""
    limit = getattr(processor, "model_max_length", None)
    if limit is not None and max_length > limit:
        processor.model_max_length = max_length
    return processor


def load_processor(model, spec, image_size=None):
    """Tokenizer (text) or image processor (image) of the source checkpoint ``model``, or None (a
    model from a config); an image processor feeds ``image_size`` images (``data.image_size``)."""
    from ..convert.resolution import processor_at_size

    processor = _source_processor(model, spec)
    if spec.kind == "image" and processor is not None and image_size:
        return processor_at_size(processor, image_size)
    return processor


def _source_processor(model, spec):
    import transformers

    from ..convert.loading import resolve_model_name

    if isinstance(model, dict):
        return None
    source = resolve_model_name(model)
    if (Path(source) / "config.json").is_file() and "linearize" in json.loads((Path(source) / "config.json").read_text()):
        from ..convert.api import load_processor as load_saved_processor

        return load_saved_processor(source)
    auto = transformers.AutoTokenizer if spec.kind == "text" else transformers.AutoImageProcessor
    try:
        return auto.from_pretrained(source)
    except (OSError, ValueError) as error:
        check_model_kind(source_config(model), spec, model)  # a text model on an image task says so
        raise LinearizeError(f"could not load the {'tokenizer' if spec.kind == 'text' else 'image processor'} of "
                             f"{model}: {str(error).splitlines()[0]}") from None


def model_kind(model):
    """``"text"``, ``"image"`` or None (unknown, or both) for a loaded model (its main input) or a
    transformers config (the task heads its model type has)."""
    from ..convert.heads import heads_for_model_type

    main_input = getattr(model, "main_input_name", None)
    if main_input in ("input_ids", "pixel_values"):
        return "text" if main_input == "input_ids" else "image"
    fits = heads_for_model_type(getattr(model, "model_type", None)) or ()
    image, text = "image-classification" in fits, "sequence-classification" in fits
    return "image" if image and not text else "text" if text and not image else None


def check_model_kind(model, spec, name):
    """A text model on an image task, or an image model on a text task, is one line saying so
    (rather than a mismatch of heads or label counts further on). ``model``: as :func:`model_kind`."""
    kind = model_kind(model)
    if kind is not None and kind != spec.kind:
        wanted = "an image model (e.g. vit-base)" if spec.kind == "image" else "a text model (e.g. minilm)"
        model_type = getattr(getattr(model, "config", model), "model_type", None)
        raise LinearizeError(f"{name} is {'an image' if kind == 'image' else 'a text'} model"
                             f"{f' ({model_type})' if model_type else ''}, but task {spec.name} is "
                             f"{'an image' if spec.kind == 'image' else 'a text'} task: it needs {wanted}")


def check_head(model, spec, name):
    """A model (or a checkpoint's config) used as it is must be of the task's kind (text or image)
    and have the task's number of outputs (an embedding task has none)."""
    check_model_kind(model, spec, name)
    if spec.is_embedding:
        return
    labels = getattr(getattr(model, "config", model), "num_labels", None)
    if labels is not None and labels != spec.num_labels:
        raise LinearizeError(f"{name} has {labels} labels but task {spec.name} has {spec.num_labels}: its head "
                             "cannot serve this task; fine-tune a checkpoint with a new head instead")


def name_labels(model, spec):
    """Give ``model``'s head the task's class names (``config.id2label`` / ``label2id``): the saved
    config carries them to ``transformers.pipeline()``, so a model fine-tuned on a task with its own
    labels (ham/spam) does not keep the names of the task it was trained on before."""
    if spec.is_embedding or spec.is_regression or not spec.label_names:
        return model
    model.config.id2label = dict(spec.id2label)
    model.config.label2id = dict(spec.label2id)
    return model


def check_label_order(model_config, spec, name):
    """A model used as it is (``model_config``: its config) must name its classes in the task's order: the
    same names (case aside) in another order would score its predictions against the wrong classes."""
    id2label = getattr(model_config, "id2label", None) or {}
    if spec.is_embedding or spec.is_regression or len(id2label) != len(spec.label_names):
        return
    names = [str(id2label.get(i, id2label.get(str(i), ""))) for i in range(len(id2label))]
    if [n.lower() for n in names] != [n.lower() for n in spec.label_names] and \
            sorted(n.lower() for n in names) == sorted(n.lower() for n in spec.label_names):
        raise LinearizeError(f"{name} numbers its classes {', '.join(names)} but task {spec.name} numbers them "
                             f"{', '.join(spec.label_names)}: its predictions would be scored against the wrong "
                             "classes; fine-tune it on this task first (linearize finetune)")


def _architecture(model):
    """The transformers class name of a loaded model (a converted one: of its source) or of a
    checkpoint's config, or None where it is neither or does not say."""
    import transformers

    from ..convert import conversion_record

    if isinstance(model, transformers.PretrainedConfig):
        return (model.architectures or [None])[0]
    if not isinstance(model, transformers.PreTrainedModel):
        return None
    record = conversion_record(model)
    return (record.architecture if record else None) or type(model).__name__


def check_task_head(model, name):
    """A model (or a checkpoint's config) fine-tuned or scored on a task needs a classification head
    (outputs ``logits``)."""
    from ..convert.heads import head_for_class

    architecture = _architecture(model)
    if architecture is None:
        return
    head = head_for_class(architecture)
    if head is None or head.pipeline_tag not in ("text-classification", "image-classification"):
        raise LinearizeError(f"{name} is a {architecture}, without a classification head: convert or fine-tune "
                             "its softmax source with --head sequence-classification (or image-classification) "
                             "first")


def check_trained_head(model, name):
    """Scoring a softmax checkpoint needs the head it was trained with: a checkpoint whose config.json names no
    class with the loaded model's head (all-MiniLM-L6-v2, a ``BertModel``, scored on a classification task) would
    be scored through a head transformers started at random; refused in one line."""
    from ..convert.heads import head_for_class

    head = head_for_class(type(model).__name__)
    trained = getattr(model.config, "architectures", None) or []
    tags = {getattr(head_for_class(architecture), "pipeline_tag", None) for architecture in trained}
    if head is not None and head.pipeline_tag not in tags:
        kind = f"a {trained[0]}" if trained else "a checkpoint whose config names no class"
        raise LinearizeError(f"{name} has no trained {head.name} head ({kind}): transformers would start one at "
                             f"random and its scores would mean nothing; fine-tune it first (linearize finetune "
                             f"{name} --task TASK --out DIR) and evaluate that")


def load_data(task, data):
    """``(DatasetDict, TaskSpec)`` of ``task`` as the data section ``data`` (:class:`DataConfig`)
    says, cut to ``max_train_examples`` / ``max_eval_examples`` (a seeded shuffle first); a
    validation split is required."""
    from ..data import CORPUS_OPTIONS, load_task_data

    keys = (*CORPUS_OPTIONS, "text_column", "text_pair_column", "label_column", "dev_fraction")  # not similarity_file
    given = {k: os.path.expanduser(getattr(data, k)) if k in CORPUS_OPTIONS else getattr(data, k)
             for k in keys if getattr(data, k) is not None}  # ~/glue
    dataset, spec = load_task_data(task, seed=data.seed, is_regression=data.regression, **given)
    for split in list(dataset):
        limit = data.max_train_examples if split == "train" else data.max_eval_examples
        if limit and len(dataset[split]) > limit:
            dataset[split] = dataset[split].shuffle(seed=data.seed).select(range(limit))
    if data.train_documents:
        dataset = with_training_documents(dataset, data.seed)
    if "validation" not in dataset or len(dataset["validation"]) == 0:
        raise LinearizeError(f"task {task!r} has no validation split to select on; set data.dev_fraction")
    return dataset, spec


def with_training_documents(dataset, seed):
    """``data.train_documents``: the embedding corpus ``dataset`` with moviereviews-long's train reviews added to
    its train split and its dev reviews to its validation split (that task's split for ``seed``: its test
    reviews, the ones ``data.document_length`` scores, never join)."""
    from datasets import Dataset

    from ..data import LONG_REVIEWS_NAMES, load_task_data

    reviews, _ = load_task_data(LONG_REVIEWS_NAMES[0], seed=seed)
    for split in ("train", "validation"):
        texts = list(dataset[split]["text"]) + list(reviews[split]["text"])
        dataset[split] = Dataset.from_dict({"text": texts}, split=split)
    return dataset


@dataclass
class TaskData:
    """A run's task data with its processor: loaders for any batch size, the text tokenised once.
    It reads the run's ``data`` and ``eval`` sections (:class:`~linearize.config.DataConfig`,
    :class:`~linearize.config.EvalConfig`)."""

    data_config: object  # DataConfig
    eval_config: object  # EvalConfig
    data: object  # DatasetDict
    spec: object  # TaskSpec
    processor: object = None
    _tokenized: object = field(default=None, init=False, repr=False)
    similarity: object = None  # an embedding task's (first, second, gold) similarity pairs, or None
    documents: object = None  # an embedding task's whole documents (data.document_length), or None
    _document_targets: object = field(default=None, init=False, repr=False)

    @classmethod
    def load(cls, config):
        """The data of the run ``config`` (:func:`load_data`) and its source's processor
        (:func:`load_processor`), a tokenizer's limit raised to ``data.max_length``
        (:func:`fit_tokenizer`). An embedding task pools as the source model's sentence-transformers
        files say (``embeddings.folder_pooling``) and reads ``data.similarity_file``."""
        data, spec = load_data(config.task, config.data)
        spec, similarity = embedding_inputs(config.model, spec, config.data.similarity_file)
        processor = load_processor(config.model, spec, config.data.image_size)
        if spec.kind == "text":
            processor = fit_tokenizer(processor, config.data.max_length)
        return cls(config.data, config.eval, data, spec, processor, similarity=similarity,
                   documents=document_texts(spec, config.data))

    def set_targets(self, teacher):
        """An embedding task's targets: the ``teacher``'s sentence embeddings of every split become
        the split's labels, what stage 2 distils toward and every score compares with (other tasks
        keep their labels)."""
        if not self.spec.is_embedding:
            return
        from datasets import DatasetDict

        from ..data import text_dataloader
        from ..evaluation import predict

        targets = {}
        for split, ds in self.tokenized().items():
            ds = ds.remove_columns([c for c in ("label",) if c in ds.column_names])
            vectors = predict(teacher, text_dataloader(ds, self.processor, self.eval_config.batch_size),
                              task=self.spec)[0] if len(ds) else []
            targets[split] = ds.add_column("label", [list(map(float, v)) for v in vectors])
        self._tokenized = DatasetDict(targets)
        if self.documents is not None:
            check_document_length(teacher, self.data_config.document_length)
            self._document_targets = self._embed_documents(teacher)

    def document_agreement(self, model):
        """``{"doc_cosine", "doc_top10_overlap"}``: ``model``'s embeddings of the whole documents
        (``data.document_length``) against the teacher's (:meth:`set_targets` made them)."""
        from ..metrics import agreement

        scores = agreement(self._embed_documents(model), self._document_targets)
        return {f"doc_{name}": value for name, value in scores.items()}

    def _embed_documents(self, model):
        from datasets import Dataset

        from ..data import text_dataloader, tokenize_dataset
        from ..evaluation import predict

        ds = tokenize_dataset(Dataset.from_dict({"text": self.documents}), self.processor, ("text",),
                              max_length=self.data_config.document_length)
        return predict(model, text_dataloader(ds, self.processor, self.eval_config.batch_size), task=self.spec)[0]

    def similarity_spearman(self, model):
        """Spearman correlation of ``model``'s cosine similarities with the similarity file's scores."""
        from datasets import Dataset

        from ..data import text_dataloader, tokenize_dataset
        from ..metrics import similarity_spearman
        from ..evaluation import predict

        first, second, gold = self.similarity
        vectors = []
        for sentences in (first, second):
            ds = tokenize_dataset(Dataset.from_dict({"text": sentences}), self.processor, ("text",),
                                  max_length=self.data_config.max_length)
            vectors.append(predict(model, text_dataloader(ds, self.processor, self.eval_config.batch_size),
                                   task=self.spec)[0])
        return similarity_spearman(*vectors, gold)

    def loaders(self, batch_size, seed):
        """``{split: DataLoader}``: ``train`` shuffled with ``seed`` at ``batch_size``, the other
        splits in order at ``eval.batch_size``."""
        if self.spec.kind == "image":
            return self._image_loaders(batch_size, seed)
        from ..data import text_dataloaders

        return text_dataloaders(self.tokenized(), self.processor, batch_size=batch_size,
                                eval_batch_size=self.eval_config.batch_size, seed=seed,
                                group_by_length=self.data_config.group_by_length)

    def tokenized(self):
        """Every split tokenised (once: later calls return the same datasets)."""
        from ..data import tokenize_dataset

        if self._tokenized is None:
            if self.processor is None:
                raise LinearizeError(f"task {self.spec.name!r} is text: a tokenizer is needed")
            self._tokenized = tokenize_dataset(self.data, self.processor, self.spec.text_keys,
                                               max_length=self.data_config.max_length)
        return self._tokenized

    def _image_loaders(self, batch_size, seed):
        from ..data import make_dataloaders

        d = self.data_config
        extra = {"num_channels": d.num_channels or 3, "crop_scale": tuple(d.crop_scale)}
        if self.processor is None:
            if not d.image_size:
                raise LinearizeError("a model trained from scratch needs data.image_size (and image_mean/std)")
            extra.update(size=d.image_size, mean=d.image_mean, std=d.image_std)
        return make_dataloaders(self.data, self.spec, image_processor=self.processor, batch_size=batch_size,
                                eval_batch_size=self.eval_config.batch_size, seed=seed, **extra)


def document_texts(spec, data):
    """The whole documents an embedding task is also scored on (``data.document_length``: the test split of
    moviereviews-long, drawn with ``data.seed``), or None; the setting on another task is refused (it would
    be ignored)."""
    if not data.document_length:
        return None
    if not spec.is_embedding:
        raise LinearizeError(f"task {spec.name!r} does not read data.document_length (embedding tasks do), so it "
                             "would be ignored: leave it out")
    from ..data import LONG_REVIEWS_NAMES, load_task_data

    reviews, _ = load_task_data(LONG_REVIEWS_NAMES[0], seed=data.seed)
    return list(reviews["test"]["text"])


def check_document_length(model, length):
    """A one-line error when ``model``'s learned positions are fewer than ``data.document_length``."""
    from ..bench.models import learned_positions

    positions = learned_positions(model)
    if positions is not None and length > positions:
        raise LinearizeError(f"data.document_length {length} exceeds the model's {positions} positions: pass at "
                             f"most {positions}, or extend the positions (data.max_length)")


def embedding_inputs(model, spec, similarity_file=None):
    """``(spec, similarity pairs or None)``: an embedding task's spec pooled as the source
    ``model`` is, and the pairs of ``similarity_file`` (``data.similarity_file``); any other
    task's ``spec`` as it is, and None."""
    import dataclasses

    from ..data.sentences import read_similarity_pairs
    from ..embeddings import folder_pooling

    if not spec.is_embedding:
        if similarity_file:
            raise LinearizeError(f"task {spec.name!r} does not read data.similarity_file, so it would be ignored: "
                                 "it scores the embeddings task only (--task embeddings)")
        return spec, None
    if isinstance(model, dict):
        raise LinearizeError("the embeddings task distils a pretrained encoder's embeddings; set model to a "
                             "checkpoint, not a config")
    spec = dataclasses.replace(spec, embedding=folder_pooling(model))
    return spec, read_similarity_pairs(os.path.expanduser(similarity_file)) if similarity_file else None

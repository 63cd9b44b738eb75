"""The one table of task heads: CLI name, transformers Auto class, pipeline tag and card task name.

Every place that needs to know about heads (``--head`` when loading a source model, the ``auto_map`` of
the saved remote code, the model card's pipeline tag, the pipeline's teacher) reads this table.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import LinearizeError


@dataclass(frozen=True)
class Head:
    name: str | None  #: the ``--head`` value, or None where the head is not offered on the command line
    class_suffix: str  #: how its transformers class names end (``BertForSequenceClassification``)
    auto_class: str | None  #: the transformers Auto class that builds it
    auto_mapping: str | None  #: ``transformers.models.auto.modeling_auto`` mapping of model_type -> class name
    pipeline_tag: str | None  #: the Hub's pipeline tag (model card)
    task_name: str | None  #: the model-index task name (model card)


#: Ordered: ``--head`` lists them in this order, and a class name takes the first row whose suffix it ends
#: with (``...WithTeacher`` before ``ForImageClassification``; the base row matches no class).
HEADS = (
    Head("base", "Model", "AutoModel", "MODEL_MAPPING_NAMES", None, None),
    Head("sequence-classification", "ForSequenceClassification", "AutoModelForSequenceClassification",
         "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES", "text-classification", "Text Classification"),
    Head("token-classification", "ForTokenClassification", "AutoModelForTokenClassification",
         "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES", "token-classification", "Token Classification"),
    Head("masked-lm", "ForMaskedLM", "AutoModelForMaskedLM", "MODEL_FOR_MASKED_LM_MAPPING_NAMES", "fill-mask",
         "Fill-Mask"),
    Head(None, "ForImageClassificationWithTeacher", None, None, "image-classification", "Image Classification"),
    Head("image-classification", "ForImageClassification", "AutoModelForImageClassification",
         "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES", "image-classification", "Image Classification"),
    Head("question-answering", "ForQuestionAnswering", "AutoModelForQuestionAnswering",
         "MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES", "question-answering", "Question Answering"),
    Head(None, "ForMaskedImageModeling", "AutoModelForMaskedImageModeling",
         "MODEL_FOR_MASKED_IMAGE_MODELING_MAPPING_NAMES", None, None),
    Head(None, "ForMultipleChoice", "AutoModelForMultipleChoice", "MODEL_FOR_MULTIPLE_CHOICE_MAPPING_NAMES",
         None, None),
)


def cli_heads():
    """``{--head value: Auto class name}`` for the heads offered on the command line."""
    return {head.name: head.auto_class for head in HEADS if head.name}


def auto_mappings():
    """``{Auto class name: modeling_auto mapping name}`` of every head with an Auto class."""
    return {head.auto_class: head.auto_mapping for head in HEADS if head.auto_class}


def head_for_class(class_name):
    """The task-head row of a transformers class name, or None for a base model (or an unknown class)."""
    for head in HEADS:
        if head.name != "base" and class_name and class_name.endswith(head.class_suffix):
            return head
    return None


def auto_class_for(head_name):
    """The Auto class name of a ``--head`` value, or None when no such head exists."""
    return cli_heads().get(head_name)


def heads_for_model_type(model_type):
    """The ``--head`` values transformers can build for ``model_type`` (``bert``: base,
    sequence-classification, ...), or None for a model type it does not know (custom code)."""
    from transformers.models.auto import modeling_auto

    fits = [head.name for head in HEADS
            if head.name and model_type in getattr(modeling_auto, head.auto_mapping, {})]
    return fits or None


def check_head_fits(head_name, model_type, name):
    """A one-line ``LinearizeError`` when transformers has no ``head_name`` head for ``model_type``
    (``--head image-classification`` on BERT), listing the heads it has; ``name``: the model's."""
    fits = heads_for_model_type(model_type)
    if fits is not None and head_name not in fits:
        raise LinearizeError(f"head {head_name!r} does not fit {name}, a {model_type} model; heads that do: "
                             f"{', '.join(fits)}")

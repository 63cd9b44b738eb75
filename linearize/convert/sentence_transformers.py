"""A sentence-transformers folder's own files, kept through conversion.

A sentence-transformers model (all-MiniLM-L6-v2 among them) is a transformers folder plus
``modules.json`` (the module chain: Transformer, Pooling, Normalize, ...), one folder per module
(``1_Pooling/config.json``), ``sentence_bert_config.json`` (``max_seq_length``) and
``config_sentence_transformers.json`` (prompts, similarity function). Without them
``SentenceTransformer(dir)`` silently falls back to mean pooling, no normalisation and the
tokenizer's length limit.

:func:`read_files` takes them from the source at conversion and the conversion record
(``ConversionRecord.sentence_transformers_files``, in ``config.json``'s ``linearize`` block)
carries them, so every later ``save_pretrained`` (``linearize convert``, ``run``, ``distill``, ``finetune``, a model
loaded with ``linearize.load`` and saved again) writes them back (:func:`write_files`) without
needing the source folder. Only JSON files are carried: a module with weights of its own (a
``Dense`` layer) is not, and conversion warns that the folder is not kept as a
sentence-transformers model. sentence-transformers itself is never imported here.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

from ..outputs import atomic_write_json

MODULES = "modules.json"
MODEL_CONFIG = "sentence_bert_config.json"
TOP_FILES = (MODULES, MODEL_CONFIG, "config_sentence_transformers.json")


def _local_file(source, name):
    """``source``'s file ``name`` (a local folder, or a Hub id's cached/downloaded file), or None."""
    folder = Path(str(source))
    if folder.is_dir():
        path = folder / name
        return path if path.is_file() else None
    try:
        from transformers.utils import cached_file

        found = cached_file(str(source), name, _raise_exceptions_for_missing_entries=False,
                            _raise_exceptions_for_connection_errors=False)
    except (OSError, ValueError):
        return None
    return Path(found) if found else None


def read_files(source):
    """``{relative path: JSON content}`` of the sentence-transformers files of ``source`` (a
    folder, alias-resolved name or Hub id), or None when it is not a sentence-transformers model
    or carries a module whose weights cannot be kept (then with a warning)."""
    if source is None:
        return None
    from .loading import resolve_model_name

    try:
        source = resolve_model_name(str(source))
    except Exception:  # noqa: BLE001 - an alias whose package is missing: not a sentence-transformers source
        return None
    modules_path = _local_file(source, MODULES)
    if modules_path is None:
        return None
    files = {}
    for name in TOP_FILES:
        path = _local_file(source, name)
        if path is not None:
            files[name] = json.loads(path.read_text(encoding="utf-8"))
    for module in files[MODULES]:
        folder = module.get("path") or ""
        if not folder:
            continue  # the Transformer module: the converted model itself
        local = Path(str(source)) / folder
        others = sorted(p.name for p in local.iterdir() if p.is_file() and p.suffix != ".json") \
            if local.is_dir() else []
        if others:
            warnings.warn(f"{source}: sentence-transformers module {folder!r} holds {', '.join(others)}, which "
                          "linearize does not carry; the converted folder is a plain transformers model", stacklevel=2)
            return None
        config = _local_file(source, f"{folder}/config.json")
        if config is not None:
            files[f"{folder}/config.json"] = json.loads(config.read_text(encoding="utf-8"))
    return files


def with_max_length(files, max_length):
    """``files`` with ``sentence_bert_config.json``'s ``max_seq_length`` set to ``max_length``
    (positions extended at conversion: the encoder now reads that many tokens)."""
    if not files or max_length is None:
        return files
    out = dict(files)
    out[MODEL_CONFIG] = {**out.get(MODEL_CONFIG, {}), "max_seq_length": int(max_length)}
    return out


def write_files(directory, files):
    """Write the sentence-transformers ``files`` a conversion record carries
    (``{relative path: JSON content}``, or None) into ``directory`` (module folders without a config,
    e.g. ``2_Normalize``, are created empty)."""
    if not files:
        return
    directory = Path(directory)
    for module in files.get(MODULES, []):
        if module.get("path"):
            (directory / module["path"]).mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(directory / name, content)


def pooling_config(files):
    """``(Pooling config dict or None, normalize, max_seq_length or None)`` of a files dict."""
    if not files:
        return None, True, None
    pooling, normalize = None, False
    for module in files.get(MODULES, []):
        kind = str(module.get("type", "")).rsplit(".", 1)[-1]
        if kind == "Pooling":
            pooling = files.get(f"{module.get('path')}/config.json", {})
        elif kind == "Normalize":
            normalize = True
    return pooling, normalize, (files.get(MODEL_CONFIG) or {}).get("max_seq_length")

"""Publish a converted model to the Hugging Face Hub with a model card carrying its recovery report.

``push(path, repo_id)`` takes a run folder (written by ``linearize run``: the converted model in
``model/`` plus ``report.json`` and ``figures/``) or a converted model folder, and uploads

- the model: ``config.json``, the safetensors weights, ``modeling_linearize.py`` (the
  self-contained remote code) and the tokenizer or image-processor files;
- the report: ``report.json`` and ``figures/*.png``;
- a generated ``README.md`` model card (:mod:`linearize.report.card`): YAML metadata (license inherited from
  the source when known, ``base_model``, tags, datasets, pipeline tag, ``model-index`` with the
  student's and the teacher's scores), the method, the recovery table, the figures and a usage
  snippet that loads the model with ``trust_remote_code=True``.

The files are gathered in a temporary staging folder (links or copies: the user's folder is
never modified) and sent with ``huggingface_hub`` (``HfApi.create_repo(exist_ok=True)``, then
``upload_folder``). The endpoint is ``HF_ENDPOINT`` as set when ``push`` is called (a private Hub
mirror works); the token is ``token``, else ``HF_TOKEN``, else the cached ``hf auth login``, and
it is never printed. Every failure is a one-line ``LinearizeError``; success is only reported
after the commit went through.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import Path

from .errors import LinearizeError
from .report import Report
from .convert.loading import read_conversion_record
from .lazy import lazy_exports

#: the model card's parts, re-exported; imported on first use (the card loads the feature maps, so torch)
__getattr__, __dir__ = lazy_exports(__name__, dict.fromkeys(("METHOD_NOTES", "build_card", "source_info"),
                                                          "linearize.report.card"))

README = "README.md"
REPORT = "report.json"
FIGURES = "figures"
MODELING_FILE = "modeling_linearize.py"

#: the files of a converted model folder that are uploaded (glob patterns, top level only)
MODEL_PATTERNS = (
    "config.json", "generation_config.json", MODELING_FILE,
    "model.safetensors", "model-*-of-*.safetensors", "model.safetensors.index.json",
    # tokenizers (WordPiece, BPE, SentencePiece) and processors
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "vocab.txt", "vocab.json", "merges.txt", "*.model", "spm.*",
    "preprocessor_config.json", "processor_config.json", "image_processor_config.json",
    "feature_extractor_config.json", "video_preprocessor_config.json",
    # an ONNX export (`linearize export`): beside the model, or in onnx/ (sentence-transformers' ONNX backend)
    "*.onnx", "*.onnx_data", "*.onnx.data",
)
HOW_TO_LOG_IN = "run `hf auth login`, set HF_TOKEN, or pass --token"


@dataclass
class PushPlan:
    """What ``push`` sends: ``files`` maps each path in the repo to its local file (README.md
    to None: it is ``card``)."""

    repo_id: str
    revision: str
    private: bool
    endpoint: str
    model_dir: Path
    report_path: Path | None
    card: str
    method: str = "linear-attention"
    files: dict = field(default_factory=dict)

    def sizes(self):
        """``[(path in repo, size in bytes)]``, sorted by path."""
        return sorted((name, len(self.card.encode("utf-8")) if src is None else src.stat().st_size)
                      for name, src in self.files.items())


# ---- finding the model and its report -----------------------------------------------------------

def hub_endpoint():
    """The endpoint to push to: ``HF_ENDPOINT`` as set now, else huggingface_hub's default; an ``HF_ENDPOINT``
    that is not an http(s) address is refused in one line (a dry run says so too, before any real push)."""
    from urllib.parse import urlparse

    from huggingface_hub import constants

    given = os.environ.get("HF_ENDPOINT") or constants.ENDPOINT
    endpoint = given.rstrip("/")
    parsed = urlparse(endpoint)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise LinearizeError(f"HF_ENDPOINT {given!r} is not an http(s) address; set it to the Hub's (such as "
                             "https://huggingface.co or a mirror's) or unset it")
    return endpoint


#: what git (so the Hub) refuses in a branch name: control characters, space and ~^:?*[\, "..", "@{", "//"
BAD_REVISION = re.compile(r"[\x00-\x20\x7f~^:?*\[\\]|\.\.|@\{|//")


def check_revision(revision):
    """``--revision``, a branch the push creates if needed: a name git's ref rules refuse (``git
    check-ref-format``: the characters of :data:`BAD_REVISION`, a part starting with "." or ending with ".lock", a
    leading or trailing "/", a trailing ".", "@" alone) is refused in one line, a dry run included."""
    parts = revision.split("/")
    if (not revision or BAD_REVISION.search(revision) or revision == "@" or revision.endswith(".")
            or any(not part or part.startswith(".") or part.endswith(".lock") for part in parts)):
        raise LinearizeError(f"--revision {revision!r} is not a valid branch name (no spaces, ~^:?*[\\, '..' or "
                             "'//'; no part starting with '.' or ending with '.lock'); pass a name such as dev or v2")


def locate(path, *, no_report=False):
    """``(model folder, report.json path or None)`` for a run folder or a model folder.

    A run folder's own report is preferred to the copy inside its ``model/``. Without a report
    this refuses unless ``no_report``; with ``no_report`` no report is used even if present.
    """
    path = Path(path)
    if not path.exists():
        raise LinearizeError(f"{path} does not exist; pass a run folder (from `linearize run`) or a converted "
                             "model folder")
    if not path.is_dir():
        raise LinearizeError(f"{path} is not a folder; pass a run folder or a converted model folder")
    if (path / "config.json").is_file():
        model_dir, candidates = path, [path / REPORT]
    elif (path / "model" / "config.json").is_file():
        model_dir, candidates = path / "model", [path / REPORT, path / "model" / REPORT]
    else:
        raise LinearizeError(f"{path} is not a converted model folder (no config.json) nor a run folder (no "
                             "model/config.json); convert a model with `linearize convert` or `linearize run`")
    read_conversion_record(model_dir)  # raises if it is not a linearize-converted model
    if no_report:
        return model_dir, None
    for candidate in candidates:
        if candidate.is_file():
            return model_dir, candidate
    raise LinearizeError(f"no {REPORT} in {path}: the model card's recovery table comes from the report of "
                         "`linearize run`; push a run folder, or pass --no-report to push the model without one")


def read_report(path):
    """The :class:`~linearize.report.Report` in ``path``, or a one-line LinearizeError."""
    try:
        return Report.read(path, required=())
    except LinearizeError as error:
        raise LinearizeError(f"{error}; or pass --no-report to push without it") from None


def model_files(model_dir):
    """``{path in repo: local file}`` of the model folder's files to upload (or a LinearizeError
    naming what is missing)."""
    model_dir = Path(model_dir)
    files = {str(p.relative_to(model_dir)): p for folder in (model_dir, model_dir / "onnx") if folder.is_dir()
             for p in sorted(folder.iterdir())
             if p.is_file() and any(fnmatch(p.name, pattern) for pattern in MODEL_PATTERNS)
             and (folder == model_dir or ".onnx" in p.name)}
    _, record = read_conversion_record(model_dir)
    timm = record.is_timm
    # a sentence-transformers model's own files (modules.json, 1_Pooling/config.json, ...)
    files.update({name: model_dir / name for name in record.sentence_transformers_files or {}
                  if (model_dir / name).is_file()})
    missing = []
    if "model.safetensors" not in files and "model.safetensors.index.json" not in files:
        missing.append("model.safetensors")
    if not timm and MODELING_FILE not in files:
        missing.append(MODELING_FILE)
    index = model_dir / "model.safetensors.index.json"
    if "model.safetensors" not in files and index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text()).get("weight_map", {}).values()))
        except (ValueError, AttributeError):
            shards = []
        missing += [shard for shard in shards if shard not in files]
    if missing:
        raise LinearizeError(f"{model_dir} is an incomplete converted model (missing {', '.join(missing)}); "
                             "save it again with model.save_pretrained or `linearize convert`")
    return files


def figure_files(report_dir):
    folder = Path(report_dir) / FIGURES
    if not folder.is_dir():
        return {}
    return {f"{FIGURES}/{p.name}": p for p in sorted(folder.iterdir()) if p.is_file() and p.suffix.lower() == ".png"}


def model_card(repo_id, config, report=None, figures=(), files=(), speed=None):
    """The README.md text (:func:`linearize.report.card.build_card`; ``report``: a
    :class:`~linearize.report.Report`, ``report.json``'s content, or None; ``speed``: the
    folder's measured crossover, ``bench.json``, or None)."""
    from .report.card import build_card

    return str(build_card(repo_id, config, report, figures=figures, files=files, speed=speed))


# ---- the push ------------------------------------------------------------------------------------

def plan(path, repo_id, *, revision=None, private=False, no_report=False):
    """Everything ``push`` would send (nothing is uploaded): a ``PushPlan``."""
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(repo_id)
    except ValueError as error:
        raise LinearizeError(f"--repo-id {repo_id!r} is not a Hub repo id (expected user/name): "
                             f"{str(error).splitlines()[0]}") from None
    if revision is not None:
        check_revision(revision)
    endpoint = hub_endpoint()
    model_dir, report_path = locate(path, no_report=no_report)
    files = model_files(model_dir)
    report, figures = None, {}
    if report_path is not None:
        report = read_report(report_path)
        figures = figure_files(report_path.parent)
        listed = [f for f in report.figures if f in figures]
        order = listed + [f for f in figures if f not in listed]
        figures = {name: figures[name] for name in order}
        files[REPORT] = report_path
    files.update(figures)
    from .bench import FOLDER_BENCH_JSON, read_folder_bench  # loads torch: after the checks above

    speed = read_folder_bench(model_dir)
    if speed is not None:
        files[FOLDER_BENCH_JSON] = model_dir / FOLDER_BENCH_JSON
    config, record = read_conversion_record(model_dir)
    card = model_card(repo_id, config, report, figures=list(figures), files=list(files), speed=speed)
    files[README] = None
    return PushPlan(repo_id=repo_id, revision=revision or "main", private=bool(private), endpoint=endpoint,
                    model_dir=model_dir, report_path=report_path, card=card,
                    method=record.method, files=files)


def stage(push_plan, directory):
    """Write the files to upload into ``directory``: links to (or copies of) the user's files and
    the generated README.md. The user's folder is only read."""
    directory = Path(directory)
    for name, src in push_plan.files.items():
        target = directory / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if src is None:
            target.write_text(push_plan.card, encoding="utf-8")
            continue
        try:
            os.symlink(src.resolve(), target)
        except OSError:
            shutil.copy2(src, target)
    return directory


def resolve_token(token=None):
    """``token``, else ``HF_TOKEN``, else the cached login; a LinearizeError saying how to log in."""
    if token:
        return token
    from huggingface_hub import get_token

    found = get_token()
    if not found:
        raise LinearizeError(f"no Hugging Face token: {HOW_TO_LOG_IN}")
    return found


def _one_line(text, limit=300):
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _hub_error(error, step, endpoint, repo_id):
    """A one-line LinearizeError for a failed Hub request."""
    from huggingface_hub.errors import HfHubHTTPError

    if isinstance(error, HfHubHTTPError):
        response = error.response
        status = getattr(response, "status_code", None)
        reason = getattr(response, "reason_phrase", "") or ""
        detail = f": {_one_line(error.server_message)}" if getattr(error, "server_message", None) else ""
        if status == 401:
            return LinearizeError(f"the Hub at {endpoint} rejected the token (401 Unauthorized) while {step}; "
                                  f"{HOW_TO_LOG_IN}")
        if status == 403:
            return LinearizeError(f"the Hub at {endpoint} refused write access to {repo_id} (403 Forbidden) while "
                                  f"{step}{detail}; use a token with write permission on that namespace")
        return LinearizeError(f"push to {repo_id} failed while {step}: the Hub at {endpoint} answered {status} "
                              f"{reason}{detail}; try again later")
    kind = type(error).__name__
    return LinearizeError(f"could not reach the Hub at {endpoint} while {step} ({kind}: {_one_line(error, 160)}); "
                          "check the network, or HF_ENDPOINT for a private mirror")


def push(path, repo_id, *, private=False, revision=None, token=None, dry_run=False, no_report=False,
         commit_message=None):
    """Push a run folder or a converted model folder to ``repo_id`` on the Hub.

    Returns a dict: ``repo_id``, ``revision``, ``private``, ``endpoint``, ``files`` (``[(path,
    size)]``), ``dry_run`` and, after an upload, ``url`` and ``commit_url``. With ``dry_run``
    nothing is sent (no token is needed).
    """
    push_plan = plan(path, repo_id, revision=revision, private=private, no_report=no_report)
    result = {"repo_id": push_plan.repo_id, "revision": push_plan.revision, "private": push_plan.private,
              "endpoint": push_plan.endpoint, "files": push_plan.sizes(), "dry_run": bool(dry_run)}
    if dry_run:
        return result
    from huggingface_hub import HfApi, constants

    token = resolve_token(token)
    if constants.is_offline_mode():
        raise LinearizeError("HF_HUB_OFFLINE is set: huggingface_hub will not reach the Hub; unset it (or set "
                             "HF_HUB_OFFLINE=0) to push")
    from .version import __version__

    endpoint = push_plan.endpoint
    api = HfApi(endpoint=endpoint, token=token, library_name="linearize", library_version=__version__)
    message = commit_message or f"Upload {push_plan.method} linear-attention model with linearize"
    step = "creating the repo"
    try:
        api.create_repo(repo_id, private=True if push_plan.private else None, exist_ok=True)
        if push_plan.revision != "main":
            step = f"creating branch {push_plan.revision!r}"
            api.create_branch(repo_id, branch=push_plan.revision, exist_ok=True)
        step = "uploading the files"
        with tempfile.TemporaryDirectory(prefix="linearize-push-") as staging:
            stage(push_plan, staging)
            info = api.upload_folder(repo_id=repo_id, folder_path=staging, revision=push_plan.revision,
                                     commit_message=message)
    except LinearizeError:
        raise
    except json.JSONDecodeError:
        raise LinearizeError(f"push to {repo_id} failed while {step}: the Hub at {endpoint} sent an answer that is "
                             "not JSON; check HF_ENDPOINT (is it a Hub?) or try again later") from None
    except ValueError as error:  # README metadata rejected by the Hub's validator, malformed answers
        raise LinearizeError(f"push to {repo_id} failed while {step} (Hub at {endpoint}): "
                             f"{_one_line(error)}") from None
    except Exception as error:  # noqa: BLE001 - HTTP errors and transport errors (httpx), never half-reported
        from huggingface_hub.errors import HfHubHTTPError

        if isinstance(error, (HfHubHTTPError, OSError)) or _is_transport_error(error):
            raise _hub_error(error, step, endpoint, repo_id) from None
        raise
    result["url"] = f"{endpoint}/{repo_id}" + ("" if push_plan.revision == "main" else f"/tree/{push_plan.revision}")
    result["commit_url"] = getattr(info, "commit_url", None)
    return result


def _is_transport_error(error):
    """Is ``error`` a network-level failure of huggingface_hub's HTTP client (httpx or httpx2)?"""
    for module_name in ("httpx2", "httpx"):
        try:
            module = __import__(module_name)
        except ImportError:
            continue
        if isinstance(error, getattr(module, "TransportError", ())):
            return True
    return False

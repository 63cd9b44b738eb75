"""Export a converted model for deployment: ONNX with dynamic batch and sequence axes.

Exporter: torch.onnx's dynamo exporter (``torch.onnx.export(..., dynamo=True, dynamic_shapes=...)``),
which captures the model with ``torch.export``. Its graph is proven valid for every size in the
declared range, so the batch and sequence axes stay symbolic. The TorchScript exporter records
one call instead, and a size computed in Python during it is baked in as a constant: Hedgehog's
graph matched at the traced shape and failed in onnxruntime at every other one. While it is traced,
the attention code takes its traceable form (``linearize.attention.core.is_tracing``): the same
formula without the eager fast paths that branch on sizes or values (chunking, LUNA's knot
lookup, dropping an all-real mask).

Inputs are ``input_ids``, ``attention_mask`` (and ``token_type_ids`` where the model has token
types) for text, ``pixel_values`` for vision; the output is the model's first output
(``logits``, or ``last_hidden_state`` for a model without a head). The graph is float32. After
writing, the file is run in onnxruntime against PyTorch at a batch size and length other than
the traced ones, with padding (:func:`check_onnx`).

A sentence-transformers folder (``modules.json``, ``1_Pooling/``, ...) is exported by default to
``onnx/model.onnx`` inside it: the layout sentence-transformers' ONNX backend and
text-embeddings-inference's CPU (onnxruntime) image read, beside the pooling they apply to its
``last_hidden_state``. Any other folder's default is ``model.onnx`` at its root.
"""

from __future__ import annotations

import inspect
import os
import warnings
from pathlib import Path

import torch

from .errors import LinearizeError

FORMATS = ("onnx",)
#: the traced example: batch 2, 16 tokens (the last sequence padded); checked at batch 3, 27 tokens
TRACE_BATCH, TRACE_LENGTH, CHECK_BATCH, CHECK_LENGTH = 2, 16, 3, 27


class FirstOutput(torch.nn.Module):
    """``model(**named inputs)[0]`` with the inputs as positional arguments (the ONNX graph's inputs);
    a timm model (no ``config``) takes its one image tensor positionally."""

    def __init__(self, model, names):
        super().__init__()
        self.model, self.names = model, list(names)

    def forward(self, *inputs):
        if not hasattr(self.model, "config"):
            return self.model(*inputs)
        out = self.model(**dict(zip(self.names, inputs)))
        return out if isinstance(out, torch.Tensor) else out[0]


def require_onnx(check):
    """The exporter's packages, or a one-line error that says how to install them."""
    missing = []
    for name in ("onnx", "onnxscript") + (("onnxruntime",) if check else ()):
        try:
            __import__(name)
        except ImportError:
            missing.append(name)
    if missing:
        hint = " (or pass --no-check to skip the onnxruntime check)" if missing == ["onnxruntime"] else ""
        raise LinearizeError(f"ONNX export needs {', '.join(missing)}: pip install 'linearize[export]'{hint}")


def example_inputs(model, batch=TRACE_BATCH, length=TRACE_LENGTH, seed=0):
    """``{input name: tensor}`` for ``model``: token ids with the last sequence padded by 3 (text),
    or random pixels at the model's image size (vision)."""
    generator = torch.Generator().manual_seed(seed)
    config = getattr(model, "config", None)
    if getattr(model, "main_input_name", "input_ids") != "input_ids" or config is None:
        return {"pixel_values": torch.randn(batch, *image_shape(model), generator=generator)}
    vocab = int(config.vocab_size)
    inputs = {"input_ids": torch.randint(min(1000, vocab // 4), vocab, (batch, length), generator=generator),
              "attention_mask": torch.ones(batch, length, dtype=torch.long)}
    inputs["attention_mask"][-1, length - 3:] = 0
    if int(getattr(config, "type_vocab_size", 0) or 0) > 1 and "token_type_ids" in inspect.signature(
            model.forward).parameters:
        inputs["token_type_ids"] = torch.zeros(batch, length, dtype=torch.long)
    return inputs


def image_shape(model):
    """``(channels, height, width)`` of a vision model's input (HF config or timm patch embedding)."""
    config = getattr(model, "config", None)
    if config is not None:
        size = config.image_size
        size = (size, size) if isinstance(size, int) else tuple(size)
        return (int(getattr(config, "num_channels", 3)), *size)
    return (model.patch_embed.proj.in_channels, *model.patch_embed.img_size)


def dynamic_shapes(inputs):
    """Batch axis dynamic for every input, sequence axis too for token inputs (one tuple: the
    ``*inputs`` of :class:`FirstOutput`)."""
    batch, sequence = torch.export.Dim("batch"), torch.export.Dim("sequence")
    return (tuple({0: batch} if name == "pixel_values" else {0: batch, 1: sequence} for name in inputs),)


def output_name(model, inputs):
    if not hasattr(model, "config"):  # timm: the classifier, or the pooled features without one
        return "logits" if getattr(model, "num_classes", 0) else "features"
    with torch.no_grad():
        return next(iter(model(**inputs).keys()))


def default_output(directory):
    """Where :func:`export` writes without ``out``: ``onnx/model.onnx`` in a sentence-transformers
    folder (what its ONNX backend and text-embeddings-inference read), else ``model.onnx``."""
    from .convert.sentence_transformers import MODULES

    directory = Path(directory)
    return directory / "onnx" / "model.onnx" if (directory / MODULES).is_file() else directory / "model.onnx"


def export(directory, out=None, format="onnx", check=True, overwrite=False, log=None):
    """Export the converted model folder ``directory`` (or a run folder's ``model/``) to ``out``
    (default :func:`default_output`), written atomically; an existing ``out`` is replaced only with
    ``overwrite``. ``check`` runs the graph in onnxruntime against PyTorch (:func:`check_onnx`).
    ``log`` (a callable taking one line) hears what it is doing: the export takes seconds to minutes.

    Returns ``{"path", "inputs", "output", "max_abs_difference" (None without check)}``."""
    from .convert import load
    from .convert.loading import converted_folder
    from .outputs import check_output_file

    if format not in FORMATS:
        raise LinearizeError(f"unknown export format {format!r}; supported: {', '.join(FORMATS)}")
    require_onnx(check)
    directory = converted_folder(directory)  # the folder itself, or a run folder's model/
    named = str(out) if out is not None else None
    out = Path(out).expanduser() if out is not None else default_output(directory)
    if out.is_dir() or (named is not None and named.endswith(("/", os.sep))):
        raise LinearizeError(f"--out {named or out} is a folder; give a file name, e.g. --out {out / 'model.onnx'}")
    if out.suffix.lower() != ".onnx":
        raise LinearizeError(f"--out {out} is not an .onnx file name; give one, e.g. --out {out / 'model.onnx'} "
                             f"(a folder) or --out {out.with_suffix('.onnx')}")
    if out.exists() and not overwrite:
        raise LinearizeError(f"{out} exists; pass --overwrite to replace it")
    check_output_file(out)  # a place the file cannot be written is one line now, not after the export
    say = log or (lambda line: None)
    say(f"loading {directory}")
    return export_model(load(directory), out, check, log=say)


def export_model(model, out, check=True, log=None):
    """:func:`export` of a model in memory (float32, evaluation mode)."""
    from .outputs import atomic_path

    say = log or (lambda line: None)
    model = model.float().eval()
    inputs = example_inputs(model)
    name = output_name(model, inputs)
    wrapper = FirstOutput(model, inputs).eval()
    say("tracing the model and exporting its graph with torch.onnx's dynamo exporter (this takes a while)")
    with torch.no_grad(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*axis name.*will not be used")  # the names are kept
        program = torch.onnx.export(wrapper, tuple(inputs.values()), dynamo=True, dynamic_shapes=dynamic_shapes(inputs),
                                    input_names=list(inputs), output_names=[name], verbose=False)
    say(f"writing {out}")
    with atomic_path(out) as tmp:
        program.save(tmp, external_data=False)
    difference = None
    if check:
        say(f"checking the graph in onnxruntime against PyTorch at batch {CHECK_BATCH}"
            + ("" if "pixel_values" in inputs else f", {CHECK_LENGTH} tokens with padding"))
        difference = check_onnx(out, wrapper, example_inputs(model, CHECK_BATCH, CHECK_LENGTH, seed=1))
    return {"path": Path(out), "inputs": list(inputs), "output": name, "max_abs_difference": difference}


def check_onnx(path, wrapper, inputs):
    """Max |onnxruntime − PyTorch| of the exported graph at ``path`` on ``inputs``."""
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = session.run(None, {name: value.numpy() for name, value in inputs.items()})[0]
    with torch.no_grad():
        expected = wrapper(*inputs.values()).numpy()
    return float(abs(got - expected).max())

"""Position extension at conversion: a longer learned absolute position table.

Linear attention pays off only beyond the 512 positions BERT-style encoders learned, so
``linearize.convert(model, method, max_length=N)`` (``linearize convert --max-length N``) gives the
model a position table of N rows, initialised from the pretrained one in one of two ways
(``position_init``):

- ``tile`` (default): the pretrained rows copied repeatedly, new row ``j`` = old row ``j mod L``
  (Beltagy, Peters & Cohan 2020, "Longformer: The Long-Document Transformer", §5 "Position
  Embeddings": RoBERTa's 512 positions copied to 4,096, which kept its quality after little
  training, because the attention heads' strong local pattern survives everywhere but at the
  seams). Positions below L keep their pretrained rows, so every input the source model accepted
  gives exactly its output; any N ≥ L is supported whose table fits in the machine's memory.
- ``interpolate``: the table read as a curve over positions and resampled linearly at N points,
  new row ``j`` = old table at position ``x = j·(L-1)/(N-1)``, ``(1-t)·P[⌊x⌋] + t·P[⌈x⌉]``, ``t = x - ⌊x⌋``
  (the position-interpolation idea of Chen, Wong, Chen & Tian 2023, "Extending Context Window of
  Large Language Models via Positional Interpolation", §2.3 "Position Interpolation",
  f′(x, m) = f(x, m·L/L′), applied to a learned table;
  transformers' ``interpolate_pos_encoding`` does the same for ViT's grid). The first and last rows
  are kept; every other row lies between two neighbouring pretrained rows. Supported for
  L ≤ N ≤ ``INTERPOLATION_MAX_FACTOR``·L: Chen et al. extend by up to 16× (§3, 2,048 → 32,768);
  past that, neighbouring positions differ by less than a sixteenth of a pretrained step.

RoBERTa, XLM-R and CamemBERT number their positions from ``padding_idx + 1`` (rows
``0..padding_idx`` are never a real position), so their table has ``N + padding_idx + 1`` rows:
those first rows are kept as they are and only the real positions are tiled or interpolated.
The ``position_ids`` / ``token_type_ids`` buffers grow with the table and
``config.max_position_embeddings`` is set, so a saved model reloads at length N (with linearize or
with plain transformers and ``trust_remote_code``).

Models with rotary positions (RoPE: ModernBERT, GTE, NomicBERT, EuroBERT, Jina-embeddings-v3) have no
table: their positions are computed for any length, and they were trained up to
``config.max_position_embeddings`` (ModernBERT: 8,192). For them ``max_length`` ≤ that is a no-op
(recorded, and the saved tokenizer's limit follows); a longer one is an error.
"""

from __future__ import annotations

import torch
from torch import nn

from .. import machine
from ..config import PositionsConfig
from ..errors import LinearizeError

POSITION_INITS = ("tile", "interpolate")
INTERPOLATION_MAX_FACTOR = 16
#: buffers of an embeddings module that hold one entry per position
POSITION_BUFFERS = ("position_ids", "token_type_ids")
LEARNED_POSITION_MODELS = "BERT, RoBERTa, XLM-R, CamemBERT, ELECTRA, ALBERT and DistilBERT"


def tile_positions(table, length):
    """``length`` rows: the rows of ``table`` repeated (Longformer's copy initialisation, §5)."""
    return table[torch.arange(length, device=table.device) % table.shape[0]]


def interpolate_positions(table, length):
    """``length`` rows sampled linearly from ``table`` (Chen et al. 2023, §2.3: position ``j`` reads the
    pretrained table at ``j·(L-1)/(length-1)``); the first and last rows are kept."""
    curve = table.t().unsqueeze(0)  # [1, dim, rows]: interpolate along the positions
    resampled = nn.functional.interpolate(curve.float(), size=length, mode="linear", align_corners=True)
    return resampled[0].t().to(table.dtype).contiguous()


def position_table(model):
    """``(embeddings module, offset)``: the module whose ``position_embeddings`` is a learned
    ``nn.Embedding`` of ``config.max_position_embeddings`` rows, and the first real position's row
    (``padding_idx + 1`` for RoBERTa-style tables, else 0); a LinearizeError if the model has none."""
    rows = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    for module in model.modules():
        table = getattr(module, "position_embeddings", None)
        if isinstance(table, nn.Embedding) and table.num_embeddings == rows:
            if getattr(getattr(model, "config", None), "sinusoidal_pos_embds", False):
                break  # DistilBERT configured with fixed sinusoids: nothing learned to extend
            offset = 0 if table.padding_idx is None else table.padding_idx + 1
            return module, offset
    kind = getattr(getattr(model, "config", None), "model_type", None) or type(model).__name__
    hint = "; for a vision model pass --image-size / image_size instead" if _is_vision(model) else ""
    raise LinearizeError(f"{kind!r} has no learned absolute position table to extend; --max-length / max_length "
                         f"applies to {LEARNED_POSITION_MODELS}{hint}")


def _is_vision(model):
    """A model that takes images (a transformers config with an ``image_size``, or a timm model)."""
    config = getattr(model, "config", None)
    return getattr(config, "image_size", None) is not None if config is not None else hasattr(model, "patch_embed")


def rotary_limit(model):
    """``config.max_position_embeddings`` of a model with rotary positions (a ``*RotaryEmbedding``
    module and no learned table), or None."""
    limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if limit is None or not any(type(m).__name__.endswith("RotaryEmbedding") for m in model.modules()):
        return None
    return int(limit)


def _check_rotary_length(model, limit, max_length, position_init):
    """``check_max_length`` for a rotary model: ``(max_length, None)`` (nothing to extend)."""
    kind = model.config.model_type
    if position_init not in (None, PositionsConfig().position_init):
        raise LinearizeError(f"position_init={position_init!r} applies to learned position tables; {kind!r} has "
                             "rotary positions: leave position_init out")
    if max_length is None:
        return None, None
    if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length <= 0:
        raise LinearizeError(f"max_length must be a positive number of tokens (≤ the model's {limit}), got "
                             f"{max_length!r}")
    if max_length > limit:
        raise LinearizeError(f"{kind!r} has rotary positions trained up to {limit} tokens and nothing to extend: "
                             f"pass max_length ≤ {limit} (a no-op), or leave it out")
    return max_length, None


def max_positions(model):
    """The longest input (in tokens) the model's position table takes now."""
    module, offset = position_table(model)
    return module.position_embeddings.num_embeddings - offset


def check_max_length(model, max_length, position_init=None):
    """The chosen ``(max_length, position_init)`` or a one-line LinearizeError saying what fits.

    ``max_length`` None means no extension; ``position_init`` None the default (``tile``). A rotary
    model (``rotary_limit``) gives ``(max_length, None)``: nothing to extend."""
    limit = rotary_limit(model)
    if limit is not None:
        return _check_rotary_length(model, limit, max_length, position_init)
    default = PositionsConfig().position_init
    if max_length is None:
        if position_init not in (None, default):
            raise LinearizeError(f"position_init={position_init!r} needs max_length (--max-length N): the length "
                                 "to extend the position table to")
        return None, None
    position_init = default if position_init is None else position_init
    if position_init not in POSITION_INITS:
        raise LinearizeError(f"unknown position_init {position_init!r}; valid: {', '.join(POSITION_INITS)}")
    current = max_positions(model)
    if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length <= 0:
        raise LinearizeError(f"max_length must be a positive number of tokens (≥ the model's {current}), got "
                             f"{max_length!r}")
    if max_length < current:
        raise LinearizeError(f"max_length {max_length!r} is shorter than the model's {current} positions: pass an "
                             f"integer N ≥ {current}")
    if max_length == current and position_init != default:  # a setting that cannot take effect
        raise LinearizeError(f"position_init={position_init!r} has nothing to do: max_length {max_length} is the "
                             f"model's own {current} positions; pass a longer max_length, or leave position_init out")
    if position_init == "interpolate" and max_length > INTERPOLATION_MAX_FACTOR * current:
        raise LinearizeError(f"max_length {max_length} is more than {INTERPOLATION_MAX_FACTOR}× the model's "
                             f"{current} positions, beyond what interpolation supports: pass N ≤ "
                             f"{INTERPOLATION_MAX_FACTOR * current}, or position_init='tile' (any N ≥ {current})")
    _check_table_fits(model, max_length)
    return max_length, position_init


def _check_table_fits(model, max_length):
    """A one-line LinearizeError when the extended table (``max_length`` rows of the model's width,
    built beside the old one) and its per-position buffers are more than this machine's memory."""
    module, _ = position_table(model)
    weight = module.position_embeddings.weight
    row_bytes = weight.shape[1] * weight.element_size() + 8 * len(POSITION_BUFFERS)  # int64 buffers
    memory = machine.physical_memory()
    if memory and max_length * row_bytes > memory:
        raise LinearizeError(f"max_length {max_length} needs a position table of {max_length * row_bytes / 2**30:.1f} "
                             f"GiB, more than this machine's {memory / 2**30:.1f} GiB of memory: pass a smaller N")


def extend_positions(model, max_length, position_init=None):
    """Give ``model`` a learned position table of ``max_length`` positions, in place; return it.

    ``position_init``: ``"tile"`` (default) or ``"interpolate"`` (see the module docstring for the
    papers). Rows before the first real position (RoBERTa's padding offset) are kept; the
    per-position buffers and ``config.max_position_embeddings`` follow."""
    max_length, position_init = check_max_length(model, max_length, position_init)
    if max_length is None or position_init is None:  # nothing asked, or rotary positions: nothing to extend
        return model
    module, offset = position_table(model)
    old = module.position_embeddings
    with torch.no_grad():
        real = old.weight[offset:]
        grown = tile_positions(real, max_length) if position_init == "tile" else interpolate_positions(real, max_length)
        weight = torch.cat([old.weight[:offset], grown]) if offset else grown
    new = nn.Embedding(weight.shape[0], weight.shape[1], padding_idx=old.padding_idx, device=weight.device,
                       dtype=weight.dtype)
    new.weight = nn.Parameter(weight, requires_grad=old.weight.requires_grad)
    module.position_embeddings = new
    rows = weight.shape[0]
    for name in POSITION_BUFFERS:  # assigning keeps each buffer's persistence
        buffer = getattr(module, name, None)
        if isinstance(buffer, torch.Tensor):
            fill = torch.arange(rows, device=buffer.device) if name == "position_ids" else \
                torch.zeros(rows, dtype=buffer.dtype, device=buffer.device)
            setattr(module, name, fill.to(buffer.dtype).expand(1, -1).clone())
    model.config.max_position_embeddings = rows
    return model

"""The conversion record: what ``linearize.convert`` did to a model, carried in its config.

A converted model keeps one :class:`ConversionRecord` (method, options, layers, source, parameter
counts, ...) as the ``linearize`` block of its ``config.json`` (and, in memory, as
``config.linearize``, or ``linearize_config`` on a timm model), versioned as torchao versions its
configs::

    {"_type": "ConversionRecord", "_version": 3, "_data": {"method": ..., "layers": [...], ...}}

Older blocks still read: version 3 (no hybrid attention: ``window`` 0), version 2
(``{"_type": "LinearizeConfig", "_version": 2, "_data": {...}}``) and version 1 (the unversioned dict with ``format_version: 1``). A block of another type or of a
newer version is refused with what to do. This module imports only the standard library and
linearize's error class, so a saved model's self-contained remote code bundles it
(``hf_remote_code.bundled_sources``) and reads the block without linearize.
"""

import dataclasses

from ..errors import LinearizeError

RECORD_TYPE = "ConversionRecord"
RECORD_VERSION = 4
#: the ``_type`` version 2 blocks carry (version 1 blocks carry none)
LEGACY_RECORD_TYPE = "LinearizeConfig"
#: keys of version 1 and 2 blocks that version 3 names otherwise
LEGACY_KEYS = {"sentence_transformers": "sentence_transformers_files"}
#: the fields that hold a list of attention layer indices (a tuple in the record, a list on disk)
LAYER_FIELDS = ("layers", "sliding_window_layers")


@dataclasses.dataclass(frozen=True)
class ConversionRecord:
    """What a conversion did: written once by ``linearize.convert``, read everywhere else.

    ``method`` / ``options``: the feature map and its options; ``layers``: the attention layers
    converted, of ``num_attention_layers``; ``sliding_window_layers``: the layers that attend through
    a sliding window (those not in ``layers`` stay windowed softmax); ``source``: the model name
    converted; ``base_model_type`` / ``architecture``: its transformers model type and class
    (``"timm"`` and the timm class for timm models); ``previous_attn_implementation``: the attention
    ``revert`` restores; ``sentence_transformers_files``: ``{relative path: JSON content}`` of a
    sentence-transformers source, written back on every save; ``parameters_base`` /
    ``parameters_added``: the pretrained and the feature maps' parameter counts; ``window`` / ``sinks`` /
    ``gamma``: hybrid attention (``linearize.attention.hybrid``: the exact window's block size, 0 for none,
    the sink tokens, both none for pure linear attention, and γ's initial value; the layers in
    ``sliding_window_layers`` are never hybrid); ``hybrid_layers``: the converted layers that are hybrid
    (None: all of them; the others are pure linear attention); ``max_length`` /
    ``position_init``: the extended position table, if any; ``image_size``: the image size the model
    was converted for, if any; ``linearize_version``: the linearize that converted it.
    """

    method: str
    layers: tuple[int, ...] = ()
    options: dict = dataclasses.field(default_factory=dict)
    num_attention_layers: int | None = None
    sliding_window_layers: tuple[int, ...] = ()
    source: str | None = None
    base_model_type: str | None = None
    architecture: str | None = None
    previous_attn_implementation: str | None = None
    sentence_transformers_files: dict | None = None
    parameters_base: int | None = None
    parameters_added: int = 0
    window: int = 0
    sinks: tuple[str, ...] = ()
    gamma: float = 1.0
    hybrid_layers: tuple[int, ...] | None = None
    max_length: int | None = None
    position_init: str | None = None
    image_size: int | None = None
    linearize_version: str | None = None

    @property
    def parameters_added_percent(self):
        """The feature maps' parameters as a percentage of the pretrained ones (0 when unknown)."""
        return 100.0 * self.parameters_added / self.parameters_base if self.parameters_base else 0.0

    @property
    def is_timm(self):
        """The record of a timm model (saved and loaded by the timm backend)."""
        return self.base_model_type == "timm"

    def to_block(self):
        """The versioned, JSON-ready block: ``{"_type", "_version", "_data"}``."""
        data = {item.name: getattr(self, item.name) for item in dataclasses.fields(self)}
        for name in LAYER_FIELDS:
            data[name] = list(data[name])
        data["options"] = dict(data["options"])
        data["sinks"] = list(data["sinks"])
        data["hybrid_layers"] = None if self.hybrid_layers is None else list(self.hybrid_layers)
        return {"_type": RECORD_TYPE, "_version": RECORD_VERSION, "_data": data}

    @classmethod
    def from_block(cls, stored):
        """The record of a stored block: this version's, version 2's or version 1's (unversioned).

        Keys the record does not know (version 1's ``format_version``) are ignored; a block of another
        type, of a newer version or without a method is refused in one line."""
        try:
            return cls._from_data(_record_data(stored))
        except LinearizeError:
            raise
        except (TypeError, ValueError) as error:  # a hand-edited or damaged block: a value of the wrong type
            raise LinearizeError(f"config.json's 'linearize' block is malformed ({error}); re-convert the model "
                                 "with `linearize convert`") from None

    @classmethod
    def _from_data(cls, data):
        known = {item.name for item in dataclasses.fields(cls)}
        data = {LEGACY_KEYS.get(key, key): value for key, value in data.items()}
        data = {key: value for key, value in data.items() if key in known}
        if not isinstance(data.get("method"), str) or not data["method"]:
            raise LinearizeError("config.json's 'linearize' block names no method; re-convert the model with "
                                 "`linearize convert`")
        for name in LAYER_FIELDS:
            data[name] = tuple(int(index) for index in data.get(name) or ())
        data["options"] = dict(data.get("options") or {})
        data["sinks"] = tuple(str(name) for name in data.get("sinks") or ())
        if data.get("hybrid_layers") is not None:
            data["hybrid_layers"] = tuple(int(index) for index in data["hybrid_layers"])
        return cls(**data)

    def check_method(self, known):
        """The recorded method must be one of ``known`` (this code's methods): a block naming another (a newer
        linearize's method, or a hand edit) is refused in one line, before any layer is built."""
        if self.method not in known:
            raise LinearizeError(f"config.json's 'linearize' block names method {self.method!r}, which this code does "
                                 f"not have (it has {', '.join(known)}); upgrade linearize, or re-convert the model "
                                 "with `linearize convert`")

    @property
    def hybrid(self):
        """The hybrid settings ``{window, sinks, gamma, hybrid_layers}`` (``FeatureMap.make_hybrid`` takes the
        first three in the layers of the last, None: every converted layer), or None for pure linear attention (no
        window, no sinks)."""
        if not (self.window or self.sinks):
            return None
        return {"window": self.window, "sinks": self.sinks, "gamma": self.gamma, "hybrid_layers": self.hybrid_layers}

    @classmethod
    def from_config(cls, config):
        """The record in a model config (a transformers config's ``linearize`` attribute, or the
        ``"linearize"`` key of config.json's content), or None when it has none."""
        stored = config.get("linearize") if isinstance(config, dict) else getattr(config, "linearize", None)
        return None if stored is None else cls.from_block(stored)


def _record_data(stored):
    """The plain record dict of a stored block of any version (a copy)."""
    if not isinstance(stored, dict):
        raise LinearizeError(f"config.json's 'linearize' block is a {type(stored).__name__}, not an object; "
                             "re-convert the model with `linearize convert`")
    if "_type" not in stored:
        return dict(stored)  # version 1: the record itself
    if stored["_type"] not in (RECORD_TYPE, LEGACY_RECORD_TYPE):
        raise LinearizeError(f"config.json's 'linearize' block is a {stored['_type']!r}, not a {RECORD_TYPE}")
    if int(stored.get("_version", 0)) > RECORD_VERSION:
        raise LinearizeError(f"config.json's 'linearize' block has version {stored['_version']}; this linearize "
                             f"reads up to {RECORD_VERSION}: upgrade linearize")
    return dict(stored.get("_data") or {})

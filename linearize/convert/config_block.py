"""The ``linearize`` block of a converted model's ``config.json``, versioned as torchao versions its
configs: ``{"_type": "LinearizeConfig", "_version": 2, "_data": {method, options, layers, ...}}``.

Version 1 is the unversioned block written before (a plain dict with ``format_version: 1``);
:func:`decode_block` reads both. This module imports only linearize's error class, so a saved model's
self-contained remote code can bundle it (``hf_remote_code.bundled_sources``).
"""

from ..errors import LinearizeError

BLOCK_TYPE = "LinearizeConfig"
BLOCK_VERSION = 2


def encode_block(block):
    """The versioned form of a conversion record (the plain dict ``convert`` makes)."""
    return {"_type": BLOCK_TYPE, "_version": BLOCK_VERSION, "_data": dict(block)}


def decode_block(stored):
    """The plain conversion record from a stored block, versioned or not (version 1); None stays
    None. A block of another type or of a newer version is refused with what to do."""
    if stored is None or "_type" not in stored:
        return stored  # version 1: the record itself
    if stored["_type"] != BLOCK_TYPE:
        raise LinearizeError(f"config.json's 'linearize' block is a {stored['_type']!r}, not a {BLOCK_TYPE}")
    if int(stored.get("_version", 0)) > BLOCK_VERSION:
        raise LinearizeError(f"config.json's 'linearize' block has version {stored['_version']}; this linearize reads "
                         f"up to {BLOCK_VERSION}: upgrade linearize")
    return dict(stored["_data"])

"""The memory a conversion's feature maps would take, measured before any is allocated.

A map is built on PyTorch's meta device (:func:`meta_feature_map`: shapes and counts, no storage),
so a huge option value (``projections=100000000``) is refused in one line naming the options to
lower (:func:`check_feature_map_memory`) instead of allocating many GiB. ``convert`` checks every
layer it converts (``api.check_memory``), ``linearize methods`` each map of its table. Imports
neither transformers nor the backends, so the table does not wait for them.
"""

from __future__ import annotations

from ..errors import LinearizeError

#: the share of the machine's memory the feature maps of a conversion may take: the model, the
#: temporaries of their construction and their training (gradients, AdamW's moments) need the rest
FEATURE_MAP_MEMORY_SHARE = 0.5


def meta_feature_map(method, head_dim, num_heads, options):
    """``method``'s feature map for this geometry with ``options``, built on the meta device: its
    sizes, counts and facts, nothing allocated (a map that cannot be built for this geometry
    raises its one-line error here). Built through ``linearize.attention.create_feature_map``."""
    import torch

    from .. import attention

    with torch.device("meta"):
        return attention.create_feature_map(method, head_dim, num_heads, **options)


def map_bytes(feature_map, element_size):
    """Bytes of ``feature_map``'s parameters and buffers at ``element_size`` bytes an element."""
    return sum(t.numel() for t in (*feature_map.parameters(), *feature_map.buffers())) * element_size


def check_feature_map_memory(method, needed, layers, options):
    """A one-line ``LinearizeError`` when ``needed`` bytes (``method``'s feature maps on ``layers``
    attention layers) would pass :data:`FEATURE_MAP_MEMORY_SHARE` of this machine's memory, naming
    the integer ``options`` to lower, largest first."""
    from ..machine import physical_memory

    memory = physical_memory()
    if not memory or needed <= memory * FEATURE_MAP_MEMORY_SHARE:
        return
    size_options = sorted((key for key, value in options.items() if key != "seed" and isinstance(value, int)
                           and not isinstance(value, bool)), key=lambda key: -options[key])
    lower = f"lower {', '.join(f'{key} (now {options[key]:,})' for key in size_options)}" if size_options else \
        "convert fewer layers"
    raise LinearizeError(f"{method}'s feature maps would take {needed / 2**30:,.1f} GiB ({layers} "
                         f"layer{'' if layers == 1 else 's'}), more than {FEATURE_MAP_MEMORY_SHARE:.0%} of this "
                         f"machine's {memory / 2**30:,.1f} GiB of memory: {lower}")

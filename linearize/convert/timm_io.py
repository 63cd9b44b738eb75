"""Save and load converted timm Vision Transformers (safetensors + a JSON config)."""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import LinearizeError
from ..io import atomic_write_json

CONFIG = "config.json"
WEIGHTS = "model.safetensors"


def save_timm(model, directory, model_name, **create_kwargs):
    """Write ``model.safetensors`` and ``config.json`` (timm name, create kwargs, linearize block)."""
    from safetensors.torch import save_file

    from .api import linearize_config

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(directory / WEIGHTS))
    atomic_write_json(directory / CONFIG, {"timm_model": model_name, "timm_kwargs": create_kwargs,
                                           "linearize": linearize_config(model)})


def load_timm(directory):
    import timm
    from safetensors.torch import load_file

    from .api import convert
    from .loading import check_weights

    directory = Path(directory)
    data = json.loads((directory / CONFIG).read_text())
    if "timm_model" not in data:
        raise LinearizeError(f"{directory} is not a saved timm model (config.json has no 'timm_model')")
    check_weights(directory)
    model = timm.create_model(data["timm_model"], pretrained=False, **data.get("timm_kwargs", {}))
    block = data["linearize"]
    convert(model, block["method"], layers=block["layers"], source=block.get("source"), **block.get("options", {}))
    model.load_state_dict(load_file(str(directory / WEIGHTS)))
    return model.eval()

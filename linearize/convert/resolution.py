"""Vision models at a higher resolution: the position grid resized at conversion.

``linearize.convert(model, method, image_size=S)`` (``linearize convert --image-size S``) makes a
ViT, DeiT, Dinov2 or timm ``VisionTransformer`` take S×S images. A larger image is more patches,
hence a longer sequence, where linear attention pays off. The learned position embeddings form a
2D grid, one per patch; the new grid is read off the pretrained one by 2D interpolation
(Dosovitskiy et al. 2021, "An Image is Worth 16x16 Words: Transformers for Image Recognition at
Scale", §3.2 "Fine-tuning and higher resolution": "we perform 2D interpolation of the pre-trained
position embeddings, according to their location in the original image"):

- ViT and DeiT: transformers' ``interpolate_pos_encoding`` (``ViTEmbeddings`` / ``DeiTEmbeddings``),
  done once and stored: the patch grid G×G resampled bicubically to (S/p)×(S/p)
  (``align_corners=False``, in the table's dtype); the class position (DeiT: class and distillation
  positions) kept as it is. A model converted at S gives exactly what the source model gives when
  called at S with ``interpolate_pos_encoding=True``. ``config.image_size`` becomes S.
- Dinov2: its embeddings interpolate the pretrained grid to every input's size on every call
  already, so nothing in the model changes; ``config.image_size`` stays the pretrained size
  (it sets the shape of the saved grid) and only the saved image processor feeds S×S images.
- timm: timm's own ``VisionTransformer.set_input_size`` (``resample_abs_pos_embed``: bicubic with
  antialiasing, prefix tokens kept, and ``patch_embed.img_size`` set), the resampling a
  ``dynamic_img_size`` model does on every call at S.

The saved image processor (``processor_at_size``) resizes and crops to S×S, so ``pipeline()`` and
``AutoImageProcessor`` feed the converted model its size.
"""

from __future__ import annotations

import torch
from torch import nn

from ..errors import LinearizeError
from .backends.timm_attention import is_timm_vit

#: transformers model types whose stored grid is interpolated -> positions before the patch grid
GRID_MODELS = {"vit": 1, "deit": 2}  # DeiT: class and distillation token
#: model types that interpolate their pretrained grid on every call
RUNTIME_INTERPOLATED = {"dinov2"}
VISION_MODELS = "ViT, DeiT, Dinov2 and timm VisionTransformer"


def _pair(value):
    return tuple(int(v) for v in value) if isinstance(value, (tuple, list)) else (int(value), int(value))


def _kind(model):
    if is_timm_vit(model):
        return "timm"
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type in GRID_MODELS or model_type in RUNTIME_INTERPOLATED:
        return model_type
    kind = model_type or type(model).__name__
    raise LinearizeError(f"{kind!r} has no image position grid; --image-size / image_size applies to "
                         f"{VISION_MODELS} (a text model's length is --max-length / max_length)")


def patch_size(model):
    """The model's patch size ``(height, width)`` in pixels."""
    if is_timm_vit(model):
        return _pair(model.patch_embed.patch_size)
    return _pair(model.config.patch_size)


def check_image_size(model, image_size):
    """``image_size`` if ``model`` can be converted for S×S images, else a one-line LinearizeError
    saying what fits. None means keep the model's own size."""
    if image_size is None:
        return None
    _kind(model)
    patch = patch_size(model)
    if isinstance(image_size, bool) or not isinstance(image_size, int) or image_size <= 0:
        raise LinearizeError(f"image_size must be a positive number of pixels (a multiple of the patch size "
                             f"{patch[0]}), got {image_size!r}")
    if image_size % patch[0] or image_size % patch[1]:
        lower = max(image_size // patch[0], 1) * patch[0]
        raise LinearizeError(f"image_size {image_size} is not a multiple of the patch size {patch[0]}: pass e.g. "
                             f"{lower} or {lower + patch[0]}")
    return image_size


def interpolate_grid(table, prefix, old_grid, new_grid):
    """``table`` ``[1, prefix + H·W, dim]`` with its H×W patch grid resampled to ``new_grid``, as
    transformers' ``ViTEmbeddings.interpolate_pos_encoding`` does (bicubic, ``align_corners=False``,
    in the table's dtype; the ``prefix`` positions, CLS and DeiT's distillation token, kept): the
    2D interpolation of the ViT paper (Dosovitskiy et al. 2021, §3.2)."""
    dim = table.shape[-1]
    head, grid = table[:, :prefix], table[:, prefix:]
    grid = grid.reshape(1, *old_grid, dim).permute(0, 3, 1, 2)
    grid = nn.functional.interpolate(grid, size=tuple(new_grid), mode="bicubic", align_corners=False)
    return torch.cat([head, grid.permute(0, 2, 3, 1).reshape(1, -1, dim)], dim=1)


def _grid_embeddings(model):
    """The embeddings module holding the learned grid (``position_embeddings`` and ``patch_embeddings``)."""
    for module in model.modules():
        if isinstance(getattr(module, "position_embeddings", None), nn.Parameter) and \
                hasattr(module, "patch_embeddings"):
            return module
    raise LinearizeError(f"{type(model).__name__} has no position_embeddings grid to interpolate")  # pragma: no cover


def _resize_hf_grid(model, image_size, prefix):
    embeddings = _grid_embeddings(model)
    patches = embeddings.patch_embeddings
    patch = _pair(patches.patch_size)
    old_grid = tuple(size // step for size, step in zip(_pair(patches.image_size), patch))
    new_grid = (image_size // patch[0], image_size // patch[1])
    old = embeddings.position_embeddings
    with torch.no_grad():
        table = interpolate_grid(old.detach(), prefix, old_grid, new_grid)
    embeddings.position_embeddings = nn.Parameter(table.contiguous(), requires_grad=old.requires_grad)
    patches.image_size = (image_size, image_size)
    patches.num_patches = new_grid[0] * new_grid[1]
    if hasattr(embeddings, "image_size"):
        embeddings.image_size = patches.image_size
    model.config.image_size = image_size


def resize_image_positions(model, image_size):
    """Make ``model`` take ``image_size``×``image_size`` images, in place; return it (see the module
    docstring for what each family does)."""
    image_size = check_image_size(model, image_size)
    if image_size is None:
        return model
    kind = _kind(model)
    if kind == "timm":
        model.set_input_size(img_size=(image_size, image_size))
    elif kind in GRID_MODELS:
        _resize_hf_grid(model, image_size, GRID_MODELS[kind])
    return model  # Dinov2: interpolates to any size on every call; only its processor changes


def processor_at_size(processor, image_size):
    """A copy of an image processor that feeds ``image_size``×``image_size`` images: a centre crop
    becomes S×S and the resize before it scales by the same factor (DeiT's 256 → 224 crop ratio
    kept); without a crop the resize itself becomes S×S."""
    settings = processor.to_dict()
    crop = settings.get("crop_size") or {}
    if settings.get("do_center_crop") and crop.get("height"):
        scale = image_size / crop["height"]
        size = {key: round(value * scale) for key, value in (settings.get("size") or {}).items() if value}
        changes = {"size": size, "crop_size": {"height": image_size, "width": image_size}}
    else:
        changes = {"size": {"height": image_size, "width": image_size}}
    return type(processor).from_dict(settings, **changes)

"""Vision at a higher resolution (issue 19): ``convert(..., image_size=S)`` and ``linearize convert
--image-size S`` on ViT, DeiT, Dinov2 and timm's VisionTransformer (tiny random models, 32×32 images of
8×8 patches, converted for 64×64)."""

import copy
import json
import subprocess
import sys
import textwrap

import pytest
import torch
import transformers as T
from typer.testing import CliRunner

import linearize
from linearize.cli import app
from linearize.convert.api import is_converted, load_processor
from linearize.convert import ConversionRecord, conversion_record
from linearize.convert.resolution import processor_at_size
from linearize.errors import LinearizeError
from tiny_models import WITHOUT_LINEARIZE, build, first_output

SIZE, LARGE = 32, 64  # the tiny models' image side, and the side they are converted for
CASES = [("vit", "AutoModel"), ("vit", "AutoModelForImageClassification"), ("deit", "AutoModel"),
         ("deit", "DeiTForImageClassificationWithTeacher")]


def images(side, batch=2, seed=0):
    return {"pixel_values": torch.randn(batch, 3, side, side, generator=torch.Generator().manual_seed(seed))}


def embeddings_of(model):
    return model.base_model.embeddings


@pytest.mark.parametrize("arch,head", CASES)
def test_softmax_conversion_at_a_larger_size_equals_the_original_interpolating(arch, head):
    """The stored grid is what transformers' interpolate_pos_encoding computes at S, so a model converted
    at S gives the original's output called at S with interpolate_pos_encoding=True."""
    original = build(arch, head)
    model = linearize.convert(copy.deepcopy(original), "softmax", image_size=LARGE)
    prefix = 2 if arch == "deit" else 1  # CLS (and DeiT's distillation token)
    old, new = embeddings_of(original).position_embeddings, embeddings_of(model).position_embeddings
    assert new.shape == (1, prefix + (LARGE // 8) ** 2, old.shape[-1])
    assert torch.equal(new[:, :prefix], old[:, :prefix])
    with torch.no_grad():
        tokens = torch.zeros(1, prefix + (LARGE // 8) ** 2, old.shape[-1])
        assert torch.equal(new, embeddings_of(original).interpolate_pos_encoding(tokens, LARGE, LARGE))
    batch = images(LARGE)
    with torch.no_grad():
        want = original(**batch, interpolate_pos_encoding=True)[0]
    torch.testing.assert_close(first_output(model, batch), want, atol=1e-5, rtol=0)
    assert model.config.image_size == LARGE and original.config.image_size == SIZE
    record = conversion_record(model)
    assert record.image_size == LARGE
    assert record.parameters_base == sum(p.numel() for p in model.parameters()) - record.parameters_added
    with pytest.raises(ValueError, match="doesn't match model"):  # the model's own size is S now
        model(**images(SIZE))


def test_a_linear_method_at_the_larger_size_runs_and_differs_from_softmax():
    original = build("vit")
    softmax = linearize.convert(copy.deepcopy(original), "softmax", image_size=LARGE)
    hedgehog = linearize.convert(copy.deepcopy(original), "hedgehog", image_size=LARGE)
    batch = images(LARGE)
    out = first_output(hedgehog, batch)
    assert out.isfinite().all() and not torch.allclose(out, first_output(softmax, batch), atol=1e-3)
    assert torch.equal(embeddings_of(hedgehog).position_embeddings, embeddings_of(softmax).position_embeddings)


def test_dinov2_interpolates_at_any_size_so_only_the_size_is_recorded():
    original = build("dinov2")
    model = linearize.convert(copy.deepcopy(original), "softmax", image_size=LARGE)
    assert torch.equal(embeddings_of(model).position_embeddings, embeddings_of(original).position_embeddings)
    assert model.config.image_size == SIZE  # the pretrained grid's size: it shapes the saved table
    assert conversion_record(model).image_size == LARGE
    batch = images(LARGE)
    torch.testing.assert_close(first_output(model, batch), first_output(original, batch), atol=1e-5, rtol=0)


# ---- timm -------------------------------------------------------------------------------------------

def tiny_timm(**kwargs):
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    return timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=SIZE, patch_size=8, depth=2,
                             num_classes=3, **kwargs).eval()


def test_timm_conversion_resamples_as_dynamic_img_size_and_reloads_at_the_size(tmp_path):
    original = tiny_timm()
    dynamic = tiny_timm(dynamic_img_size=True)  # timm's own resampling, on every call
    dynamic.load_state_dict(original.state_dict())
    model = linearize.convert(copy.deepcopy(original), "softmax", image_size=LARGE)
    assert tuple(model.patch_embed.img_size) == (LARGE, LARGE) and model.pos_embed.shape[1] == 1 + (LARGE // 8) ** 2
    batch = images(LARGE)["pixel_values"]
    with torch.no_grad():
        torch.testing.assert_close(model(batch), dynamic(batch), atol=1e-5, rtol=0)
    linear = linearize.convert(copy.deepcopy(original), "hedgehog", image_size=LARGE)
    linear.save_pretrained(tmp_path / "timm")
    config = json.loads((tmp_path / "timm" / "config.json").read_text())
    assert config["timm_kwargs"]["img_size"] == [LARGE, LARGE]
    assert ConversionRecord.from_config(config).image_size == LARGE
    reloaded = linearize.load(tmp_path / "timm")
    with torch.no_grad():
        assert torch.equal(reloaded(batch), linear(batch))


# ---- bad input --------------------------------------------------------------------------------------

@pytest.mark.parametrize("arch,kwargs,message", [
    ("vit", {"image_size": 0}, "image_size must be a positive number of pixels (a multiple of the patch size 8), "
                               "got 0"),
    ("vit", {"image_size": -64}, "image_size must be a positive number of pixels"),
    ("vit", {"image_size": True}, "image_size must be a positive number of pixels"),
    ("deit", {"image_size": 60}, "image_size 60 is not a multiple of the patch size 8: pass e.g. 56 or 64"),
    ("dinov2", {"image_size": 4}, "image_size 4 is not a multiple of the patch size 8: pass e.g. 8 or 16"),
    ("timm", {"image_size": 100}, "image_size 100 is not a multiple of the patch size 8: pass e.g. 96 or 104"),
    ("bert", {"image_size": 64}, "'bert' has no image position grid; --image-size / image_size applies to ViT, "
                                 "DeiT, Dinov2 and timm VisionTransformer (a text model's length is --max-length"),
    ("vit", {"max_length": 1024}, "'vit' has no learned absolute position table to extend; --max-length / "
                                  "max_length applies to"),
    ("timm", {"max_length": 1024}, "for a vision model pass --image-size / image_size instead"),
])
def test_bad_sizes_are_one_line_errors_and_leave_the_model_alone(arch, kwargs, message):
    model = tiny_timm() if arch == "timm" else build(arch, "AutoModel")
    state = copy.deepcopy(model.state_dict())
    with pytest.raises(LinearizeError) as error:
        linearize.convert(model, "hedgehog", **kwargs)
    assert message in str(error.value) and "\n" not in str(error.value), str(error.value)
    if "max_length" in kwargs:
        assert "for a vision model pass --image-size / image_size instead" in str(error.value)
    assert not is_converted(model) and all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())


# ---- saved folders: processors, the command line, reloading without linearize ------------------------

PROCESSORS = {  # the processor each family ships with (Dinov2: BitImageProcessor), at the tiny size
    "vit": lambda: T.ViTImageProcessor(size={"height": SIZE, "width": SIZE}),
    "deit": lambda: T.DeiTImageProcessor(size={"height": 36, "width": 36}, crop_size={"height": SIZE, "width": SIZE}),
    "dinov2": lambda: T.BitImageProcessor(size={"shortest_edge": 36}, crop_size={"height": SIZE, "width": SIZE}),
}
SCALED = {  # what the converted folder's processor does: the crop is S×S, the resize before it scaled alike
    "vit": ({"height": LARGE, "width": LARGE}, None),
    "deit": ({"height": 72, "width": 72}, {"height": LARGE, "width": LARGE}),
    "dinov2": ({"shortest_edge": 72}, {"height": LARGE, "width": LARGE}),
}


@pytest.mark.parametrize("arch", sorted(PROCESSORS))
def test_processor_at_size_crops_to_the_size_and_scales_the_resize(arch):
    processor = processor_at_size(PROCESSORS[arch](), LARGE)
    size, crop = SCALED[arch]
    settings = processor.to_dict()
    assert settings["size"] == size and (crop is None or settings["crop_size"] == crop)
    image = (torch.rand(50, 70, 3) * 255).to(torch.uint8).numpy()
    assert processor(image, return_tensors="pt")["pixel_values"].shape == (1, 3, LARGE, LARGE)


FRESH_PROCESS = WITHOUT_LINEARIZE + textwrap.dedent("""
    import numpy
    from PIL import Image
    results = {}
    for directory, image_file in json.loads(sys.argv[1]):
        model = transformers.AutoModelForImageClassification.from_pretrained(directory, trust_remote_code=True)
        processor = transformers.AutoImageProcessor.from_pretrained(directory, trust_remote_code=True)
        image = Image.open(image_file)
        pixels = processor(image, return_tensors="pt")["pixel_values"]
        with torch.no_grad():
            logits = model.eval()(pixel_values=pixels).logits
        classify = transformers.pipeline("image-classification", model=directory, trust_remote_code=True)
        results[directory] = {"class": type(model).__name__, "shape": list(pixels.shape),
                              "image_size": model.config.image_size, "logits": logits.tolist(),
                              "pipeline": classify(image, top_k=1)[0]["score"]}
    assert not any(name.split(".")[0] == "linearize" for name in sys.modules)
    print(json.dumps(results))
""")


def test_cli_converts_at_a_size_and_the_folder_reloads_there_with_and_without_linearize(tmp_path):
    from PIL import Image

    image = Image.fromarray((torch.rand(50, 70, 3) * 255).to(torch.uint8).numpy())
    image.save(tmp_path / "image.png")
    runner, jobs, expected = CliRunner(), [], {}
    for arch in sorted(PROCESSORS):
        source, out = tmp_path / f"{arch}-source", tmp_path / arch
        build(arch).save_pretrained(source)  # the image-classification head of each family
        PROCESSORS[arch]().save_pretrained(source)
        result = runner.invoke(app, ["convert", str(source), "--method", "hedgehog", "--image-size", str(LARGE),
                                     "--out", str(out)])
        assert result.exit_code == 0 and f"{LARGE}×{LARGE} pixels" in result.output, result.output
        assert ConversionRecord.from_config(json.loads((out / "config.json").read_text())).image_size == LARGE
        pixels = load_processor(out)(image, return_tensors="pt")["pixel_values"]
        assert pixels.shape == (1, 3, LARGE, LARGE)
        model = linearize.load(out)
        expected[str(out)] = (first_output(model, {"pixel_values": pixels}), model.config.image_size)
        jobs.append([str(out), str(tmp_path / "image.png")])
    info = runner.invoke(app, ["info", str(tmp_path / "vit")])
    assert info.exit_code == 0 and f"{LARGE}×{LARGE} pixels" in info.output
    done = subprocess.run([sys.executable, "-c", FRESH_PROCESS, json.dumps(jobs)], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    for directory, _ in jobs:
        result, (logits, image_size) = results[directory], expected[directory]
        assert result["class"].startswith("Linearize") and result["shape"] == [1, 3, LARGE, LARGE], result
        assert result["image_size"] == image_size == (SIZE if directory.endswith("dinov2") else LARGE)
        torch.testing.assert_close(torch.tensor(result["logits"]), logits, atol=1e-5, rtol=0)
        assert result["pipeline"] == pytest.approx(logits.softmax(-1).max().item(), abs=1e-6)


def test_cli_bad_image_size_is_a_one_line_error(tmp_path):
    source = tmp_path / "vit"
    build("vit", "AutoModel").save_pretrained(source)
    result = CliRunner().invoke(app, ["convert", str(source), "--image-size", "30", "--out", str(tmp_path / "o")])
    assert result.exit_code == 1 and result.output.startswith("error: image_size 30 is not a multiple of the patch "
                                                              "size 8: pass e.g. 24 or 32"), result.output
    assert len(result.output.strip().splitlines()) == 1 and not (tmp_path / "o").exists()


# ---- recipes: data.image_size -------------------------------------------------------------------------

def test_a_recipe_image_size_runs_a_pretrained_teacher_and_its_processor_at_that_size(tmp_path):
    from linearize.data.spec import TaskSpec
    from linearize.pipeline import build_source_model, load_processor as recipe_processor
    from linearize.config import RunConfig

    source = tmp_path / "deit"
    original = build("deit")
    original.save_pretrained(source)
    PROCESSORS["deit"]().save_pretrained(source)
    spec = TaskSpec(name="shapes", kind="image", num_labels=original.config.num_labels)
    recipe = RunConfig.from_recipe({"model": str(source), "head": "image-classification", "task": "imagefolder",
                                    "data": {"image_size": LARGE}}).validate()
    teacher, _ = build_source_model(recipe, spec)
    assert teacher.config.image_size == LARGE and not is_converted(teacher)
    processor = recipe_processor(recipe.model, spec, recipe.data.image_size)
    assert processor.to_dict()["crop_size"] == SCALED["deit"][1]
    image = (torch.rand(50, 70, 3) * 255).to(torch.uint8).numpy()
    batch = {"pixel_values": processor(image, return_tensors="pt")["pixel_values"]}
    with torch.no_grad():
        want = original.eval()(**batch, interpolate_pos_encoding=True).logits
    torch.testing.assert_close(first_output(teacher.eval(), batch), want, atol=1e-5, rtol=0)
    recipe = recipe.with_overrides({"data": {"image_size": None}})  # unset: the checkpoint's own size and processor
    assert build_source_model(recipe, spec)[0].config.image_size == SIZE
    assert recipe_processor(recipe.model, spec, recipe.data.image_size).to_dict()["crop_size"] == {"height": SIZE,
                                                                                                  "width": SIZE}

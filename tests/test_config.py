"""The one configuration system: recipe defaults, stage configs and CLI options from one place."""

import dataclasses

import pytest
from typer.testing import CliRunner

from linearize import config as cfg
from linearize.cli import app
from linearize.errors import LinearizeError

runner = CliRunner()

#: recipes.DEFAULTS as it was written by hand before it was derived: every value must stay
OLD_DEFAULTS = {
    "name": None, "description": "", "model": None, "head": "sequence-classification", "task": None,
    "method": "luna", "options": {}, "layers": None, "seed": 0,
    "data": {
        "data_dir": None, "data_file": None, "train_file": None, "validation_file": None, "test_file": None,
        "text_column": "text", "text_pair_column": None, "label_column": None, "dev_fraction": None,
        "seed": 0, "max_length": 128, "max_train_examples": None, "max_eval_examples": None,
        "image_size": None, "image_mean": None, "image_std": None, "num_channels": None, "crop_scale": [0.08, 1.0],
    },
    "teacher": {
        "finetune": True, "lr": 2e-5, "batch_size": 32, "epochs": 3.0, "max_steps": None, "weight_decay": 0.0,
        "scheduler": "linear", "warmup_ratio": 0.0, "patience": 3, "max_grad_norm": 1.0,
        "gradient_accumulation_steps": 1, "checkpoint_every": 200, "mixed_precision": "no",
    },
    "stage1": {
        "enabled": True, "lr": 1e-3, "batch_size": 32, "epochs": 1.0, "max_steps": None, "weight_decay": 0.0,
        "warmup_ratio": 0.0, "scheduler": "cosine", "output_loss_weight": 0.0, "max_grad_norm": 1.0,
        "eval_batches": 10, "gradient_accumulation_steps": 1, "checkpoint_every": 100, "mixed_precision": "no",
    },
    "stage2": {
        "enabled": True, "lr": 1e-5, "batch_size": 8, "epochs": 10.0, "max_steps": None, "weight_decay": 0.0,
        "scheduler": "linear", "warmup_ratio": 0.0, "patience": 3, "max_grad_norm": 1.0,
        "gradient_accumulation_steps": 1, "checkpoint_every": 200, "mixed_precision": "no",
        "kd_weight": 0.0, "kd_temperature": 2.0,
    },
    "eval": {"batch_size": 64, "latency_batch_size": 1, "latency_repeats": 10, "examples": 3},
    "quick": {},
}


#: keys added since, with their defaults (issue 19: stage 1 block by block at long lengths; positions
#: extended to data.max_length; issue 23: the negative-weight penalty of maps whose kernel can be negative;
#: issue 22: an embedding task's similarity file; length-grouped batches and the teacher's attention
#: dropout for long documents)
NEW_DEFAULTS = {"stage1": {"block_size": 512, "negative_weight_penalty": 100.0}, "position_init": "tile",
                "data": {"similarity_file": None, "group_by_length": False}, "teacher": {"attention_dropout": None}}


def _with_new_keys(old):
    merged = {key: dict(value) if isinstance(value, dict) else value for key, value in old.items()}
    for key, value in NEW_DEFAULTS.items():
        if isinstance(value, dict):
            merged[key].update(value)
        else:
            merged[key] = value
    return merged


def _typed(value):
    if isinstance(value, dict):
        return {key: _typed(item) for key, item in value.items()}
    return (type(value).__name__, value)


def test_recipe_defaults_are_derived_and_unchanged():
    from linearize.recipes import DEFAULTS

    assert _typed(DEFAULTS) == _typed(_with_new_keys(OLD_DEFAULTS))  # same keys, values and types (1.0 stays a float)
    assert DEFAULTS == cfg.recipe_defaults()
    fresh = cfg.recipe_defaults()
    fresh["data"]["crop_scale"].append(2.0)
    fresh["options"]["x"] = 1
    assert cfg.recipe_defaults() == DEFAULTS  # mutable defaults are made afresh


def test_stage_configs_live_in_one_module_and_are_importable_where_they_were():
    from linearize.distill import DistillConfig as from_distill
    from linearize.distill.stage1 import DistillConfig as from_stage1
    from linearize.finetune import FinetuneConfig as from_finetune
    from linearize.finetune.stage2 import FinetuneConfig as from_stage2

    assert from_distill is from_stage1 is cfg.DistillConfig
    assert from_finetune is from_stage2 is cfg.FinetuneConfig
    assert "eval_batch_size" not in {f.name for f in dataclasses.fields(cfg.FinetuneConfig)}  # eval.batch_size is
    for config_class in (cfg.RunConfig, cfg.DataConfig, cfg.TeacherConfig, cfg.Stage1Config, cfg.Stage2Config,
                         cfg.EvalConfig, cfg.DistillConfig, cfg.FinetuneConfig):
        assert all(f.metadata.get("help") for f in dataclasses.fields(config_class)), config_class
    # the teacher is stage 2's settings with its own defaults, the help restated from stage 2
    assert cfg.TeacherConfig.help("lr") == cfg.FinetuneConfig.help("lr") and cfg.TeacherConfig().lr == 2e-5
    assert cfg.FinetuneConfig().lr == 1e-5


def test_configs_check_their_types_in_one_line():
    assert cfg.RunConfig().check() is not None
    assert cfg.DistillConfig(epochs=3).check().epochs == 3  # an integer is a number
    for bad, message in [(cfg.DistillConfig(lr="fast"), "stage1.lr must be a number, got 'fast'"),
                         (cfg.FinetuneConfig(batch_size=8.5), "stage1.batch_size must be an integer, got 8.5"),
                         (cfg.DataConfig(crop_scale=["a"]), "stage1.crop_scale must be a list of a number")]:
        with pytest.raises(LinearizeError, match=message):
            bad.check("stage1.")


def test_stage_config_takes_the_fields_of_a_section():
    section = cfg.recipe_defaults()["stage1"]
    config = cfg.stage_config(cfg.DistillConfig, {**section, "lr": 0.5}, seed=3)
    assert (config.lr, config.seed, config.checkpoint_every) == (0.5, 3, 100)


@pytest.mark.parametrize("command,config_class,skip", [
    ("distill", cfg.Stage1Config, {"enabled"}), ("finetune", cfg.FinetuneConfig, set())])
def test_stage_options_of_the_cli_come_from_the_config_fields(command, config_class, skip):
    result = runner.invoke(app, [command, "--help"], env={"COLUMNS": "300"}, terminal_width=300)
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    for item in dataclasses.fields(config_class):
        if item.name in skip:
            continue
        assert f"--{item.name.replace('_', '-')} " in text, item.name
        assert item.metadata["help"].split(" (")[0][:40] in text, item.name


def test_the_config_block_round_trips_and_old_blocks_still_read(tmp_path):
    import json

    import linearize
    from linearize.convert.config_block import BLOCK_VERSION, decode_block, encode_block
    from tiny_models import build

    model = linearize.convert(build("bert"), "luna", projections=4)
    block = model.config.linearize
    stored = json.loads(json.dumps(encode_block(block)))  # through config.json
    assert set(stored) == {"_type", "_version", "_data"} and stored["_version"] == BLOCK_VERSION
    assert decode_block(stored) == block
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())["linearize"]  # what save_pretrained writes
    assert set(saved) == {"_type", "_version", "_data"} and decode_block(saved) == block
    assert decode_block(dict(block)) == block and decode_block(None) is None  # version 1: the unversioned block
    with pytest.raises(ValueError, match="upgrade linearize"):
        decode_block({**stored, "_version": BLOCK_VERSION + 1})
    with pytest.raises(ValueError, match="not a LinearizeConfig"):
        decode_block({**stored, "_type": "Other"})

"""The one configuration system: recipe defaults, stage configs and CLI options from one place."""

import dataclasses
import json

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
#: dropout for long documents; issue 36: data.regression, a score label of data files; issue 34: the time per
#: example at the task's own lengths; the embedding task's training documents; the stage-1 model's selection
#: margin)
NEW_DEFAULTS = {"stage1": {"block_size": 512, "negative_weight_penalty": 100.0, "keep_softmax": 0},
                "position_init": "tile",
                "data": {"similarity_file": None, "group_by_length": False, "regression": False, "document_length": 0,
                         "train_documents": False},
                "teacher": {"attention_dropout": None},
                "stage2": {"trainable": "all", "stage1_margin": 1.0, "similarity_weight": 0.0, "similarity_temperature": 0.05,
                           "similarity_anchors": "batch"},
                "eval": {"latency_max_length": 8192, "latency_lengths": [2048, 4096], "latency_examples": 100},
                "hybrid": {"window": 0, "sinks": "none", "gamma": None, "hybrid_layers": None}}


def _with_new_keys(old):
    merged = {key: dict(value) if isinstance(value, dict) else value for key, value in old.items()}
    for key, value in NEW_DEFAULTS.items():
        if isinstance(value, dict):
            merged.setdefault(key, {}).update(value)
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


def test_a_stage_receives_its_section_typed_with_the_run_seed():
    config = cfg.RunConfig(seed=3, stage1=cfg.Stage1Config(lr=0.5))
    stage1 = config.stage("stage1", report_to="tensorboard")
    assert isinstance(stage1, cfg.DistillConfig) and isinstance(stage1, cfg.TrainingConfig)
    assert (stage1.lr, stage1.seed, stage1.checkpoint_every, stage1.report_to) == (0.5, 3, 100, "tensorboard")
    assert isinstance(config.stage("teacher"), cfg.FinetuneConfig) and config.stage("stage2").seed == 3


def test_the_two_stages_share_one_training_base():
    shared = {f.name for f in dataclasses.fields(cfg.TrainingConfig)}
    distill, finetune = ({f.name for f in dataclasses.fields(c)} for c in (cfg.DistillConfig, cfg.FinetuneConfig))
    assert shared <= distill and shared <= finetune
    assert distill & finetune == shared  # what both have is in the base, once
    for name in shared:  # help written once, in the base
        assert cfg.DistillConfig.help(name) == cfg.FinetuneConfig.help(name) == cfg.TrainingConfig.help(name)
    assert (cfg.DistillConfig().lr, cfg.FinetuneConfig().lr) == (1e-3, 1e-5)


def test_the_run_configuration_round_trips_through_its_recipe_dict():
    from linearize.recipes import load_recipe

    config = load_recipe(None, quick=True)
    assert isinstance(config, cfg.RunConfig) and isinstance(config.stage1, cfg.Stage1Config) and config.quick_mode
    recipe = config.to_recipe()
    assert set(recipe) == set(cfg.recipe_defaults()) | {"quick_mode"}
    assert cfg.RunConfig.from_recipe(json.loads(json.dumps(recipe))) == config
    assert cfg.RunConfig.from_recipe({"seed": 4}) == cfg.RunConfig(seed=4)  # a missing key: its default
    changed = config.with_overrides({"stage2": {"kd_weight": 0.5}, "seed": 2})
    assert (changed.stage2.kd_weight, changed.seed, changed.stage1) == (0.5, 2, config.stage1)
    with pytest.raises(LinearizeError, match="unknown recipe key 'stage2.kd'"):
        config.with_overrides({"stage2": {"kd": 0.5}})
    with pytest.raises(LinearizeError, match="unknown recipe key stage1.nope"):
        cfg.RunConfig.from_recipe({"stage1": {"nope": 1}})


def test_config_difference_names_the_first_setting_and_fills_method_defaults():
    base = cfg.RunConfig(method="luna", options={})
    assert cfg.config_difference(base, base) is None
    assert cfg.config_difference(base, cfg.RunConfig(stage2=cfg.Stage2Config(kd_weight=0.5))) == \
        "stage2.kd_weight: 0.0 -> 0.5"
    assert cfg.config_difference(base, cfg.RunConfig(options={"shared_projections": True})) is None  # the default
    assert cfg.config_difference(base, cfg.RunConfig(options={"shared_projections": False})) == \
        "options.shared_projections: True -> False"
    # a shared teacher only needs the teacher's settings to match
    other_stage1 = cfg.RunConfig(stage1=cfg.Stage1Config(lr=1.0))
    assert cfg.config_difference(base, other_stage1, cfg.TEACHER_KEYS) is None


#: the data options an evaluation explains in its own words (the field's help speaks of training too)
EVAL_TEXT_HELPS = {"data_dir": "Task moviereviews: a folder holding its corpus",
                   "max_length": "Truncate text to this many tokens (at most the model's positions"}


@pytest.mark.parametrize("command", [["distill"], ["finetune"], ["eval", "text"]])
def test_data_options_of_the_cli_come_from_the_data_config(command):
    from linearize.cli import TEXT_DATA_FIELDS

    own = EVAL_TEXT_HELPS if command[0] == "eval" else {}
    result = runner.invoke(app, [*command, "--help"], env={"COLUMNS": "300"}, terminal_width=300)
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    for name in TEXT_DATA_FIELDS:
        assert f"--{name.replace('_', '-')} " in text, name
        assert own.get(name, cfg.DataConfig.help(name).split(" (")[0][:40]) in text, name
    assert ("linearize run a learned position table" in text) == (command[0] != "eval")


@pytest.mark.parametrize("command,data_dir,not_said", [
    (["eval", "glue"], "GLUE's own layout (the folder that holds SST-2/", "an image folder"),
    (["eval", "image"], "One folder of images per class", "GLUE")])
def test_an_evaluation_explains_data_dir_for_its_own_data(command, data_dir, not_said):
    result = runner.invoke(app, [*command, "--help"], env={"COLUMNS": "300"}, terminal_width=300)
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert data_dir in text and not_said not in text.split("--data-dir", 1)[1]


def test_a_help_override_must_name_a_field_the_command_takes():
    from linearize.cli.config_options import config_options

    with pytest.raises(TypeError, match="helps names fields the command does not take: \\['seed'\\]"):
        config_options(cfg.DataConfig, include=("data_dir",), helps={"seed": "x"})


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


def test_a_recipes_method_settings_read_without_its_model(monkeypatch):
    """``linearize bench long`` reads the default recipe's LUNA options for any geometry: a machine
    without the MiniLM package (a GPU machine measuring MiniLM's shape) still gets them, while a
    run's recipe still checks its model first."""
    from linearize.bench.long import recipe_luna
    from linearize.convert import loading
    from linearize.recipes import DEFAULT_RECIPE, load_recipe

    expected = recipe_luna()

    def missing():
        raise LinearizeError("all-MiniLM-L6-v2 is not installed")

    monkeypatch.setattr(loading, "minilm_path", missing)
    assert recipe_luna() == expected and expected[0] == "luna"
    with pytest.raises(LinearizeError, match="not installed"):
        load_recipe(DEFAULT_RECIPE)

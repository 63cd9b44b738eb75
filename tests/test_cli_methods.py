from typer.testing import CliRunner

from linearize.attention import methods
from linearize.cli import app

runner = CliRunner()


def test_methods_table_lists_every_method_with_parameter_counts():
    result = runner.invoke(app, ["methods", "--head-dim", "32", "--num-heads", "12"])
    assert result.exit_code == 0, result.output
    for name in methods():
        assert name in result.output
    # LUNA with M=8, L=8, hidden 64 on head dim 32: W 8x32 + b 8 + ψ (64+64+64*8+8) = 912
    assert "912" in result.output


def test_methods_shows_the_options_it_was_given_and_the_defaults_as_typed():
    result = runner.invoke(app, ["methods", "--head-dim", "32", "--num-heads", "12", "-o", "projections=4"])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "options (with -o)" in text and "projections=4," in text and "projections=8" not in text
    assert "shared_mlp=true" in text and "feature_dim=auto" in text and "True" not in text and "None" not in text


def test_methods_rejects_bad_options_in_one_line():
    result = runner.invoke(app, ["methods", "--option", "bogus=1"])
    assert result.exit_code == 1
    assert "unknown option(s) bogus; valid options:" in result.output
    result = runner.invoke(app, ["methods", "--option", "projections"])
    assert result.exit_code == 1 and "is not key=value" in result.output


def test_bench_command_writes_its_files(tmp_path):
    import json

    result = runner.invoke(app, ["bench", "attention", "--out", str(tmp_path), "--methods", "relu,luna",
                                 "--seq-lens", "16,32", "--model", "none", "--repeats", "1", "--warmup", "0",
                                 "--no-memory"])
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "bench.json").read_text())
    assert [row["seq_len"] for row in data["attention"]] == [16, 32]
    assert (tmp_path / "bench.md").is_file() and (tmp_path / "bench.png").stat().st_size > 1000
    result = runner.invoke(app, ["bench", "attention", "--out", str(tmp_path / "opts"), "--methods",
                                 "luna(projections=4)", "--seq-lens", "16", "--model", "none", "--repeats", "1",
                                 "--warmup", "0", "--no-memory"])
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "opts" / "bench.json").read_text())
    assert data["config"]["methods"] == {"luna(projections=4)": {"method": "luna", "options": {"projections": 4}}}
    result = runner.invoke(app, ["bench", "attention", "--out", str(tmp_path / "bad"), "--methods", "luna(bogus=1)",
                                 "--model", "none"])
    assert result.exit_code == 1 and "unknown option(s) 'bogus' for method 'luna'" in result.output

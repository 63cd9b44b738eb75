"""`linearize convert` and `linearize info` through Typer's CliRunner, bad inputs included."""

import json

import pytest
import torch
import transformers as T
from safetensors.torch import load_file
from typer.testing import CliRunner

from linearize.cli import app
from linearize.convert import ConversionRecord
from linearize.errors import LinearizeError
from linearize.hub import PROXIES
from tiny_models import build

runner = CliRunner()


@pytest.fixture()
def tiny_bert(tmp_path):
    path = tmp_path / "tiny-bert"
    build("bert").save_pretrained(path)
    return path


def invoke(*args):
    result = runner.invoke(app, [str(a) for a in args])
    return result.exit_code, result.output


def test_convert_and_info(tiny_bert, tmp_path):
    out = tmp_path / "out"
    code, text = invoke("convert", tiny_bert, "--method", "luna", "--out", out, "--layers", "1",
                        "--option", "projections=4", "--option", "shared_mlp=false")
    assert code == 0, text
    assert "parameters added" in text and "1 of 2: [1] (others softmax)" in text
    config = json.loads((out / "config.json").read_text())
    assert ConversionRecord.from_config(config).options == {"projections": 4, "shared_mlp": False}
    assert any(".linearize_map." in key for key in load_file(out / "model.safetensors"))
    code, text = invoke("info", out)
    assert code == 0 and "luna" in text and "projections=4" in text
    assert not any(p.name.startswith(".") for p in tmp_path.iterdir())  # no temporary folder left behind


def test_convert_with_a_new_head(tiny_bert, tmp_path):
    code, text = invoke("convert", tiny_bert, "--out", tmp_path / "o", "--head", "token-classification",
                        "--num-labels", "5", "--method", "t2r")
    assert code == 0, text
    assert ConversionRecord.from_config(json.loads((tmp_path / "o" / "config.json").read_text())).architecture == \
        "BertForTokenClassification"


def test_convert_with_a_question_answering_head_loads_with_plain_transformers(tiny_bert, tmp_path):
    """``--head question-answering``: the saved folder's remote code builds the same span-extraction model
    through ``AutoModelForQuestionAnswering`` that ``linearize.load`` does."""
    import linearize

    out = tmp_path / "qa"
    code, text = invoke("convert", tiny_bert, "--out", out, "--head", "question-answering", "--method", "hedgehog")
    assert code == 0, text
    assert ConversionRecord.from_config(json.loads((out / "config.json").read_text())).architecture == \
        "BertForQuestionAnswering"
    ids = torch.randint(5, 90, (2, 11))
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0
    plain = T.AutoModelForQuestionAnswering.from_pretrained(out, trust_remote_code=True).eval()
    ours = linearize.load(out).eval()
    with torch.no_grad():
        expected, got = ours(input_ids=ids, attention_mask=mask), plain(input_ids=ids, attention_mask=mask)
    assert type(ours).__name__.endswith("BertForQuestionAnswering") and got.start_logits.shape == (2, 11)
    torch.testing.assert_close(got.start_logits, expected.start_logits)
    torch.testing.assert_close(got.end_logits, expected.end_logits)


def test_refuses_a_non_empty_output_folder_unless_overwrite(tiny_bert, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    code, text = invoke("convert", tiny_bert, "--out", out)
    assert code == 1 and "exists and is not empty; pass --overwrite" in text
    assert (out / "keep.txt").read_text() == "mine"
    code, text = invoke("convert", tiny_bert, "--out", out, "--overwrite")
    assert code == 0, text
    assert (out / "config.json").is_file() and not (out / "keep.txt").exists()


def test_unsupported_architecture(tmp_path):
    path = tmp_path / "gpt2"
    T.GPT2Model(T.GPT2Config(n_layer=1, n_embd=32, n_head=4, vocab_size=50)).save_pretrained(path)
    code, text = invoke("convert", path, "--out", tmp_path / "o")
    assert code == 1
    assert "unsupported architecture 'gpt2'; supported: albert, bert" in text and "timm VisionTransformer" in text


@pytest.mark.parametrize("args,message", [
    (["--method", "lunar"], "unknown method 'lunar'; valid methods: luna, hedgehog"),
    (["--option", "projection=3"], "valid options: projections, channels"),
    (["--option", "oops"], "is not key=value"),
    (["--option", "projections="], "option 'projections=' has no value"),
    (["--layers", "0,x"], "is not a comma-separated list"),
    (["--layers", "7"], "7 is out of range; give a non-empty list of distinct integers in 0..1"),
    (["--head", "decoder"], "unknown head 'decoder'; valid heads: base, sequence-classification"),
])
def test_bad_method_options_and_layers(tiny_bert, tmp_path, args, message):
    code, text = invoke("convert", tiny_bert, "--out", tmp_path / "o", *args)
    assert code == 1 and message in " ".join(text.split()), text
    assert text.count("\n") <= 3  # one line, not a traceback
    assert not (tmp_path / "o").exists()


def test_path_that_is_neither_folder_nor_on_the_hub(tmp_path):
    code, text = invoke("convert", "nobody-xyz/no-such-model", "--out", tmp_path / "o")
    assert code == 1
    assert "not a local folder and could not be fetched from the Hugging Face Hub" in " ".join(text.split())
    code, text = invoke("convert", tmp_path / "missing" / "dir", "--out", tmp_path / "o")
    assert code == 1 and "neither a model folder nor a Hub id" in " ".join(text.split())
    code, text = invoke("convert", "minlm", "--out", tmp_path / "o")  # an alias mistyped
    assert code == 1 and "could not be fetched" in text and "did you mean minilm?" in " ".join(text.split())


def test_an_unreachable_hub_is_said_at_once_not_after_retries(tmp_path, monkeypatch):
    """Online mode with an endpoint that refuses connections: the id, not cached, is refused after one probe
    (not huggingface_hub's five retries), with the alias hint; a proxy or offline mode skips the probe."""
    from huggingface_hub import constants

    from linearize.hub import hub_unreachable

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # the discard port: nothing listens
    for proxy in PROXIES:
        monkeypatch.delenv(proxy, raising=False)
    assert "127.0.0.1:9" in hub_unreachable("nobody-xyz/no-such-model")
    code, text = invoke("convert", "minlm", "--out", tmp_path / "o")
    flat = " ".join(text.split())
    assert code == 1 and "the Hub is unreachable (127.0.0.1:9" in flat and "did you mean minilm?" in flat, text
    assert text.count("\n") <= 3 and not (tmp_path / "o").exists()
    code, text = invoke("convert", "bert-base", "--out", tmp_path / "o")  # an alias, not cached: said as one
    assert code == 1 and "bert-base is the alias of google-bert/bert-base-uncased" in " ".join(text.split()), text
    code, text = invoke("convert", "MiniLM", "--out", tmp_path / "o")  # case aside
    assert code == 1 and "did you mean minilm?" in " ".join(text.split()), text
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")
    assert hub_unreachable("nobody-xyz/no-such-model") is None  # reached through the proxy: not probed
    monkeypatch.delenv("HTTPS_PROXY")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert hub_unreachable("nobody-xyz/no-such-model") is None


def test_a_data_set_while_the_hub_is_unreachable_is_refused_at_once(monkeypatch):
    """Offline mode inside the block when the endpoint refuses connections (a cached data set would load from the
    cache), restored after it; a data set that is not cached is one line saying the Hub is unreachable."""
    import datasets
    from huggingface_hub import constants

    from linearize.data.images import load_hub_dataset
    from linearize.hub import offline_while_unreachable

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    for proxy in PROXIES:
        monkeypatch.delenv(proxy, raising=False)
    with offline_while_unreachable() as reason:
        assert "127.0.0.1:9" in reason and constants.HF_HUB_OFFLINE and datasets.config.HF_HUB_OFFLINE
    assert not constants.HF_HUB_OFFLINE and not datasets.config.HF_HUB_OFFLINE
    with pytest.raises(LinearizeError, match=r"the Hub is unreachable \(127.0.0.1:9.*not in the local cache"):
        load_hub_dataset("nobody-xyz/no-such-data")
    assert not constants.HF_HUB_OFFLINE and not datasets.config.HF_HUB_OFFLINE


def test_the_version_is_printed():
    from linearize.version import __version__

    code, text = invoke("--version")
    assert code == 0 and text.strip() == f"linearize {__version__}"


def test_corrupt_or_truncated_safetensors(tiny_bert, tmp_path):
    weights = tiny_bert / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    code, text = invoke("convert", tiny_bert, "--out", tmp_path / "o")
    assert code == 1 and "corrupt or truncated" in text
    weights.write_bytes(b"\x00garbage")
    code, text = invoke("convert", tiny_bert, "--out", tmp_path / "o")
    assert code == 1 and "corrupt or truncated" in text


def test_pickled_weights_need_explicit_consent(tiny_bert, tmp_path):
    state = load_file(tiny_bert / "model.safetensors")
    (tiny_bert / "model.safetensors").unlink()
    torch.save(state, tiny_bert / "pytorch_model.bin")
    code, text = invoke("convert", tiny_bert, "--out", tmp_path / "o")
    assert code == 1 and "only has pickled .bin weights" in text and "--allow-pickle" in text
    code, text = invoke("convert", tiny_bert, "--out", tmp_path / "o", "--allow-pickle")
    assert code == 0, text


def test_info_on_a_folder_that_is_not_converted(tiny_bert, tmp_path):
    code, text = invoke("info", tiny_bert)
    assert code == 1 and "not a linearize-converted model" in text
    code, text = invoke("info", tmp_path / "nothing")
    assert code == 1 and "nothing does not exist; pass a converted model folder" in text
    (tmp_path / "empty").mkdir()
    code, text = invoke("info", tmp_path / "empty")
    assert code == 1 and "has no config.json" in text
    code, text = invoke("info", tiny_bert / "config.json")
    assert code == 1 and "config.json is a file; pass the converted model folder that holds it" in text

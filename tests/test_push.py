"""`linearize push` against a fake Hub on 127.0.0.1 (tests/fake_hub.py): the files that arrive,
the model card's metadata and usage snippet, --dry-run, and every bad input."""

import json
import os
import re
import socket
import struct
import subprocess
import sys
import textwrap
import types
import zlib
from pathlib import Path

import pytest
import torch
import transformers as T
import yaml
from typer.testing import CliRunner

import linearize
import linearize.cli.push  # noqa: F401  (registers `push` even before the CLI imports it)
from fake_hub import FakeHub
from linearize import push as push_module
from linearize.cli import app

runner = CliRunner()
REPO = "tester/tiny-luna"
WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + \
    "an engrossing , beautifully acted film . linear attention makes long documents easy to read".split()


def png(width=4, height=3):
    """A valid RGB PNG, built by hand."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    rows = b"".join(b"\x00" + bytes([40 * x % 256, 80, 160]) * width for x in range(height))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def tokenizer(directory):
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "vocab.txt").write_text("\n".join(WORDS + [f"w{i}" for i in range(40)]) + "\n")
    return T.BertTokenizer(str(directory / "vocab.txt"))


REPORT = {
    "schema": "linearize.report", "schema_version": 1,
    "recipe": {"model": "bert-base", "task": "sst2", "method": "luna", "stage1": {"epochs": 1}},
    "task": {"name": "sst2", "kind": "text", "metric_names": ["accuracy"], "primary_metric": "accuracy",
             "report_split": "validation"},
    "model": {"source": "x", "architecture": "BertForSequenceClassification", "method": "luna"},
    "scores": {"teacher": {"validation": {"accuracy": 0.8125}},
               "student_stage1": {"validation": {"accuracy": 0.75}},
               "student": {"validation": {"accuracy": 0.8}}},
    "recovery": {"split": "validation", "per_metric": {"accuracy": 98.46}, "average": 98.46},
    "attention": {"mean_kl_before": 1.1, "mean_kl_after": 0.7},
    "latency": {"seq_len": 64, "teacher_ms": 40.1, "student_ms": 38.0, "speedup": 1.05},
    "figures": ["figures/curves.png", "figures/attention.png"],
}


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A source folder with a license, a converted tiny BERT (+ tokenizer) and a run folder."""
    root = tmp_path_factory.mktemp("push")
    source = root / "source"
    torch.manual_seed(0)
    config = T.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                          vocab_size=100, id2label={0: "negative", 1: "positive"})
    T.BertForSequenceClassification(config).save_pretrained(source)
    (source / "README.md").write_text("---\nlicense: mit\nlanguage: en\n---\n# a source model\n")
    tok = tokenizer(root / "vocab")
    tok.save_pretrained(source)
    model = T.AutoModelForSequenceClassification.from_pretrained(source).eval()
    linearize.convert(model, "luna", source=str(source))
    run = root / "run"
    model.save_pretrained(run / "model")
    tok.save_pretrained(run / "model")
    for folder in (run, run / "model"):
        (folder / "figures").mkdir()
        (folder / "figures" / "curves.png").write_bytes(png())
        (folder / "figures" / "attention.png").write_bytes(png(2, 2))
        (folder / "report.json").write_text(json.dumps(REPORT, indent=2))
        (folder / "report.md").write_text("# report\n")
    batch = tok(["an engrossing , beautifully acted film .", "linear attention"], padding=True, return_tensors="pt")
    with torch.no_grad():
        logits = model(**batch).logits
    return types.SimpleNamespace(root=root, source=source, run=run, model_dir=run / "model", batch=batch,
                                 logits=logits)


@pytest.fixture()
def hub(tmp_path, monkeypatch):
    """The fake Hub, HF_ENDPOINT pointing at it, its token in HF_TOKEN, offline mode off."""
    from huggingface_hub import constants

    server = FakeHub(tmp_path / "hub").start()
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.setenv("HF_TOKEN", server.token)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-cached-token"))
    yield server
    server.stop()


def invoke(*args):
    result = runner.invoke(app, ["push", *[str(a) for a in args]])
    return result.exit_code, result.output


def tree(folder):
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(Path(folder).rglob("*")) if p.is_file()}


def front_matter(card):
    match = re.match(r"^---\n(.*?)\n---\n", card, re.S)
    assert match, card[:200]
    return yaml.safe_load(match.group(1))


def python_block(card):
    blocks = re.findall(r"```python\n(.*?)```", card, re.S)
    assert len(blocks) == 1, blocks
    return blocks[0]


# ---- a push that works -----------------------------------------------------------------------------

def test_push_a_run_folder(made, hub):
    before = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in made.run.rglob("*") if p.is_file()}
    code, text = invoke(made.run, "--repo-id", REPO)
    assert code == 0, text
    assert "pushed 9 files" in text and f"{hub.url}/{REPO}" in text and "/commit/" in text
    assert hub.token not in text

    uploaded = tree(hub.repo_folder(REPO))
    model_files = ["config.json", "model.safetensors", "modeling_linearize.py", "tokenizer.json",
                   "tokenizer_config.json"]
    assert set(uploaded) == {*model_files, "README.md", "report.json", "figures/curves.png",
                             "figures/attention.png"}
    for name in model_files:
        assert uploaded[name] == (made.model_dir / name).read_bytes(), name
    for name in ("report.json", "figures/curves.png", "figures/attention.png"):
        assert uploaded[name] == (made.run / name).read_bytes(), name  # the run's own report, byte for byte
    assert hub.commits == [(REPO, "main", "Upload luna linear-attention model with linearize", sorted(uploaded))]
    assert "visibility" not in hub.repos[REPO] and not hub.repos[REPO].get("private")

    card = uploaded["README.md"].decode()
    meta = front_matter(card)
    assert meta["license"] == "mit"  # inherited from the source folder's README
    assert meta["library_name"] == "transformers"
    assert "base_model" not in meta  # a local folder is not a Hub id
    assert meta["tags"] == ["linear-attention", "luna", "linearize"]
    assert meta["datasets"] == ["nyu-mll/glue"] and meta["pipeline_tag"] == "text-classification"
    (result,) = meta["model-index"][0]["results"]
    assert meta["model-index"][0]["name"] == "tiny-luna"
    assert result["task"]["type"] == "text-classification"
    assert result["dataset"] == {"name": "GLUE SST-2", "type": "nyu-mll/glue", "config": "sst2", "split": "validation"}
    assert {(m["type"], m["value"]) for m in result["metrics"]} == {("accuracy", 0.8), ("teacher_accuracy", 0.8125)}
    assert "| accuracy | 0.8125 | 0.7500 | 0.8000 | 98.5 % |" in card
    assert "![curves](figures/curves.png)" in card and "![attention](figures/attention.png)" in card
    assert card.index("figures/curves.png") < card.index("figures/attention.png")  # the report's order
    assert "**LUNA**" in card and "trust_remote_code=True" in python_block(card)

    # the folder as the Hub holds it reloads through the remote code, same logits
    reloaded = T.AutoModelForSequenceClassification.from_pretrained(hub.repo_folder(REPO), trust_remote_code=True)
    with torch.no_grad():
        torch.testing.assert_close(reloaded.eval()(**made.batch).logits, made.logits, atol=1e-5, rtol=1e-5)

    after = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in made.run.rglob("*") if p.is_file()}
    assert after == before  # the user's folder is untouched
    assert not any(p.name.startswith(".") for p in made.run.rglob("*"))


def test_private_revision_and_commit_message(made, hub):
    code, text = invoke(made.model_dir, "--repo-id", REPO, "--private", "--revision", "dev", "--commit-message",
                        "first push")
    assert code == 0, text
    assert "revision dev, private: yes" in text
    assert hub.repos[REPO]["visibility"] == "private"
    assert (REPO, "dev") in hub.branches
    assert hub.commits[0][1:3] == ("dev", "first push")
    assert (hub.repo_folder(REPO, "dev") / "model.safetensors").is_file()
    # the model folder's own copy of the report is used when a model folder is pushed
    assert (hub.repo_folder(REPO, "dev") / "report.json").read_bytes() == (made.model_dir / "report.json").read_bytes()
    code, text = invoke(made.model_dir, "--repo-id", REPO, "--revision", "dev")  # the repo exists: fine
    assert code == 0, text
    assert len(hub.commits) == 2


def test_usage_snippets_run(made, hub, tmp_path):
    """The card's python block, with the repo id replaced by the downloaded folder, runs without
    linearize: text classification and masked LM with a tokenizer, image classification with an
    image processor, a vision encoder without one."""
    code, text = invoke(made.run, "--repo-id", REPO)
    assert code == 0, text
    folders = {"text": hub.repo_folder(REPO)}
    torch.manual_seed(0)
    mlm = T.BertForMaskedLM(T.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                         intermediate_size=64, vocab_size=100))
    linearize.convert(mlm, "hedgehog", source="google-bert/bert-base-uncased")
    mlm.save_pretrained(tmp_path / "mlm")
    tokenizer(tmp_path / "vocab").save_pretrained(tmp_path / "mlm")
    vit = T.ViTForImageClassification(T.ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2,
                                                  num_attention_heads=4, intermediate_size=64, num_labels=3))
    linearize.convert(vit, "performer", layers=[1])
    vit.save_pretrained(tmp_path / "vit")
    T.ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(tmp_path / "vit")
    encoder = T.ViTModel(vit.config.__class__(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2,
                                              num_attention_heads=4, intermediate_size=64, num_channels=1))
    linearize.convert(encoder, "cosformer")
    encoder.save_pretrained(tmp_path / "encoder")  # no image processor: the snippet makes pixel values
    scripts = {}
    for kind in ("mlm", "vit", "encoder"):
        plan = push_module.plan(tmp_path / kind, "someone/model", no_report=True)
        meta = front_matter(plan.card)
        assert meta["pipeline_tag"] == {"mlm": "fill-mask", "vit": "image-classification",
                                        "encoder": "image-feature-extraction"}[kind]
        assert meta.get("base_model") == ("google-bert/bert-base-uncased" if kind == "mlm" else None)
        assert "model-index" not in meta and "datasets" not in meta and "report.json" not in plan.files
        folders[kind] = tmp_path / kind
        scripts[kind] = python_block(plan.card).replace('"someone/model"', json.dumps(str(tmp_path / kind)))
    card = (hub.repo_folder(REPO) / "README.md").read_text()
    scripts["text"] = python_block(card).replace(json.dumps(REPO), json.dumps(str(folders["text"])))
    for kind, script in scripts.items():
        assert str(folders[kind]) in script, script
        (tmp_path / f"{kind}.py").write_text(script)
    runner_code = textwrap.dedent("""
        import runpy, sys
        class BlockLinearize:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] == "linearize":
                    raise ImportError("the card's snippet must not need linearize")
        sys.meta_path.insert(0, BlockLinearize())
        for script in sys.argv[1:]:
            print("==", script, flush=True)
            runpy.run_path(script, run_name="__main__")
    """)
    done = subprocess.run([sys.executable, "-c", runner_code, *[str(tmp_path / f"{k}.py") for k in scripts]],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    printed = {Path(part.splitlines()[0]).stem: part.strip().splitlines()[-1]
               for part in done.stdout.split("== ")[1:]}
    assert printed["text"] in {"negative", "positive"}  # the predicted label
    assert printed["vit"] in {"LABEL_0", "LABEL_1", "LABEL_2"}
    assert printed["mlm"] in WORDS + [f"w{i}" for i in range(40)]  # the predicted token
    assert printed["encoder"].startswith("torch.Size([1, 17, 32])")  # 16 patches + CLS, hidden size 32
    assert "Do you wish to run the custom code" not in done.stdout + done.stderr  # no interactive prompt


def test_dry_run_uploads_nothing_and_needs_no_token(made, hub, monkeypatch):
    monkeypatch.delenv("HF_TOKEN")
    code, text = invoke(made.run, "--repo-id", REPO, "--dry-run", "--private", "--revision", "v2")
    assert code == 0, text
    assert hub.requests == [] and hub.commits == []
    assert f"{hub.url}/{REPO}" in text and "revision v2, private: yes" in text
    assert "nothing was uploaded" in text and "9 files" in text
    size = (made.model_dir / "model.safetensors").stat().st_size
    assert re.search(r"model\.safetensors\s*│\s*" + re.escape(f"{size / 1000:.1f} kB"), text), text
    for name in ("README.md", "config.json", "modeling_linearize.py", "report.json", "figures/curves.png",
                 "tokenizer.json"):
        assert name in text



@pytest.mark.parametrize("revision", ["my branch", "a..b", ".hidden", "v1.lock", "dev/", "x:y", ""])
def test_a_revision_git_refuses_is_refused_before_anything_even_in_a_dry_run(made, hub, revision):
    for dry_run in (["--dry-run"], []):
        code, text = invoke(made.run, "--repo-id", REPO, "--revision", revision, *dry_run)
        assert_refused(code, text, f"--revision {revision!r} is not a valid branch name", token=hub.token)
    assert hub.requests == [] and hub.commits == []


@pytest.mark.parametrize("endpoint", ["huggingface.co", "ftp://hub.example", "http://"])
def test_an_hf_endpoint_that_is_no_http_address_is_refused_even_in_a_dry_run(made, hub, monkeypatch, endpoint):
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    for dry_run in (["--dry-run"], []):
        code, text = invoke(made.run, "--repo-id", REPO, *dry_run)
        assert_refused(code, text, f"HF_ENDPOINT {endpoint!r} is not an http(s) address", token=hub.token)
    assert hub.requests == []


def test_no_report_pushes_the_model_alone(made, hub, tmp_path):
    model_dir = tmp_path / "model"
    for name in ("config.json", "model.safetensors", "modeling_linearize.py"):
        (model_dir / name).parent.mkdir(exist_ok=True)
        (model_dir / name).write_bytes((made.model_dir / name).read_bytes())
    code, text = invoke(model_dir, "--repo-id", REPO)
    assert code == 1 and "no report.json" in text and "--no-report" in text
    assert hub.requests == []
    code, text = invoke(made.run, "--repo-id", REPO, "--no-report")
    assert code == 0, text
    uploaded = tree(hub.repo_folder(REPO))
    assert "report.json" not in uploaded and not any(name.startswith("figures/") for name in uploaded)
    meta = front_matter(uploaded["README.md"].decode())
    assert "model-index" not in meta and meta["pipeline_tag"] == "text-classification"


def test_an_onnx_export_in_the_folder_is_pushed_with_it(made, hub, tmp_path):
    """`linearize export` writes onnx/model.onnx (sentence-transformers' layout) or model.onnx in the model folder:
    both go up with the model; other files in onnx/ do not."""
    model_dir = tmp_path / "model"
    for name in ("config.json", "model.safetensors", "modeling_linearize.py"):
        (model_dir / name).parent.mkdir(exist_ok=True)
        (model_dir / name).write_bytes((made.model_dir / name).read_bytes())
    (model_dir / "onnx").mkdir()
    (model_dir / "onnx" / "model.onnx").write_bytes(b"onnx graph")
    (model_dir / "onnx" / "notes.txt").write_text("mine")
    (model_dir / "model.onnx").write_bytes(b"onnx graph")
    code, text = invoke(model_dir, "--repo-id", REPO, "--no-report")
    assert code == 0, text
    uploaded = tree(hub.repo_folder(REPO))
    assert uploaded["onnx/model.onnx"] == b"onnx graph" and uploaded["model.onnx"] == b"onnx graph"
    assert "onnx/notes.txt" not in uploaded


# ---- bad input: one line, exit 1, nothing reported as pushed ---------------------------------------

def assert_refused(code, text, *needles, token=None):
    assert code == 1, text
    lines = [line for line in text.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), text
    for needle in needles:
        assert needle in text, (needle, text)
    assert "pushed" not in text
    if token:
        assert token not in text


def test_no_token(made, hub, monkeypatch):
    monkeypatch.delenv("HF_TOKEN")
    code, text = invoke(made.run, "--repo-id", REPO)
    assert_refused(code, text, "no Hugging Face token", "hf auth login", "HF_TOKEN", "--token")
    assert hub.requests == []


def test_token_option_and_rejected_token(made, hub, monkeypatch):
    monkeypatch.delenv("HF_TOKEN")
    code, text = invoke(made.run, "--repo-id", REPO, "--token", "hf_wrong_token_secret")
    assert_refused(code, text, "rejected the token (401", hub.url, "hf auth login", token="hf_wrong_token_secret")
    assert hub.commits == []
    code, text = invoke(made.run, "--repo-id", REPO, "--token", hub.token)
    assert code == 0 and hub.token not in text, text


def test_not_a_converted_model(made, hub, tmp_path):
    T.BertModel(T.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64,
                             vocab_size=100)).save_pretrained(tmp_path / "plain")
    code, text = invoke(tmp_path / "plain", "--repo-id", REPO)
    assert_refused(code, text, "is not a linearize-converted model")
    (tmp_path / "empty").mkdir()
    code, text = invoke(tmp_path / "empty", "--repo-id", REPO)
    assert_refused(code, text, "is not a converted model folder (no config.json) nor a run folder")
    code, text = invoke(tmp_path / "missing", "--repo-id", REPO)
    assert_refused(code, text, "does not exist")
    code, text = invoke(made.run, "--repo-id", "not/a/repo")
    assert_refused(code, text, "is not a Hub repo id")
    assert hub.requests == []


def test_bad_report(made, hub, tmp_path):
    run = tmp_path / "run"
    (run / "model").mkdir(parents=True)
    for name in ("config.json", "model.safetensors", "modeling_linearize.py"):
        (run / "model" / name).write_bytes((made.model_dir / name).read_bytes())
    (run / "report.json").write_text('{"scores": {}}')
    code, text = invoke(run, "--repo-id", REPO)
    assert_refused(code, text, "is not a linearize report", "--no-report")
    (run / "model" / "modeling_linearize.py").unlink()
    code, text = invoke(run, "--repo-id", REPO, "--no-report")
    assert_refused(code, text, "incomplete converted model (missing modeling_linearize.py)")


@pytest.mark.parametrize("where", ["/api/repos/create", "/api/validate-yaml", "/preupload/", "/commit/"])
@pytest.mark.parametrize("html", [False, True], ids=["json", "html"])
def test_server_error(made, hub, monkeypatch, where, html):
    from huggingface_hub.utils import _http

    monkeypatch.setattr(_http, "time", types.SimpleNamespace(sleep=lambda seconds: None))  # no backoff waits
    hub.fail[where], hub.fail_html = 500, html
    code, text = invoke(made.run, "--repo-id", REPO)
    if html and where == "/api/validate-yaml":  # huggingface_hub parses this answer before its status
        assert_refused(code, text, f"the Hub at {hub.url} sent an answer that is not JSON", token=hub.token)
    else:
        assert_refused(code, text, f"the Hub at {hub.url} answered 500 Internal Server Error", token=hub.token)
    assert hub.commits == [] and not hub.repo_folder(REPO).exists()
    assert sum(path.endswith("/commit/main") for _, path in hub.requests) <= 6  # bounded retries


def test_network_failure(made, hub, monkeypatch):
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    code, text = invoke(made.run, "--repo-id", REPO)
    assert_refused(code, text, f"could not reach the Hub at http://127.0.0.1:{port}", "HF_ENDPOINT", token=hub.token)


def test_offline_mode_is_refused(made, hub, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    code, text = invoke(made.run, "--repo-id", REPO)
    assert_refused(code, text, "HF_HUB_OFFLINE is set")
    assert hub.requests == []


# ---- the card on its own ---------------------------------------------------------------------------

def test_card_metadata_for_hub_sources_and_other_heads():
    config = {"model_type": "linearize_vit", "image_size": 28,
              "auto_map": {"AutoModel": "modeling_linearize.LinearizeViTModel"},
              "linearize": {"method": "flexformer-n", "options": {"num_frequencies": 8}, "layers": [0, 1],
                            "num_attention_layers": 4, "source": "google/vit-base-patch16-224",
                            "base_model_type": "vit", "architecture": "ViTModel",
                            "parameters_added": 10, "parameters_base": 1000}}
    report = {"schema": "linearize.report", "schema_version": 1,
              "task": {"name": "fashion-mnist", "kind": "image", "metric_names": ["accuracy"]},
              "scores": {"teacher": {"test": {"accuracy": 0.9}}, "student": {"test": {"accuracy": 0.45}}}}
    card = push_module.model_card("me/vit-flex", config, report)
    meta = front_matter(card)
    assert meta["base_model"] == "google/vit-base-patch16-224" and "license" not in meta
    assert meta["pipeline_tag"] == "image-feature-extraction"
    assert meta["datasets"] == ["zalando-datasets/fashion_mnist"]
    assert meta["tags"] == ["linear-attention", "flexformer-n", "linearize"]
    metrics = meta["model-index"][0]["results"][0]["metrics"]
    assert [(m["type"], m["value"]) for m in metrics] == [("accuracy", 0.45), ("teacher_accuracy", 0.9)]
    assert "| accuracy | 0.9000 | 0.4500 | 50.0 % |" in card  # recovery computed when the report has none
    assert "attention layers [0, 1] of 4 (the others keep softmax attention)" in card
    assert "**Flexformer**" in card and "`num_frequencies=8`" in card
    assert "from transformers import AutoModel" in python_block(card)
    for method in linearize.methods():  # every method has its paragraph
        config["linearize"]["method"] = method
        assert any(method in methods for methods, _ in push_module.METHOD_NOTES.values()), method
    assert push_module.source_info("bert-base")[0] == "google-bert/bert-base-uncased"
    assert push_module.source_info("minilm")[0] == "sentence-transformers/all-MiniLM-L6-v2"
    assert push_module.source_info(None) == (None, None)


def test_timm_model_card_and_snippet(tmp_path):
    timm = pytest.importorskip("timm")
    from linearize.convert.backends.timm import save_timm

    kwargs = dict(img_size=32, patch_size=8, depth=2, embed_dim=32, num_heads=4, num_classes=3)
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, **kwargs).eval()
    linearize.convert(model, "t2r", source="timm/vit_tiny_patch16_224.augreg_in21k")
    save_timm(model, tmp_path / "timm", "vit_tiny_patch16_224", **kwargs)
    plan = push_module.plan(tmp_path / "timm", "me/timm-t2r", no_report=True)
    assert sorted(plan.files) == ["README.md", "config.json", "model.safetensors"]
    meta = front_matter(plan.card)
    assert meta["base_model"] == "timm/vit_tiny_patch16_224.augreg_in21k" and "library_name" not in meta
    assert meta["pipeline_tag"] == "image-classification"
    script = python_block(plan.card).replace("snapshot_download(repo_id)", json.dumps(str(tmp_path / "timm")))
    namespace = {}
    exec(compile(script, "card-snippet", "exec"), namespace)  # noqa: S102 - our own generated snippet
    assert tuple(namespace["model"](namespace["images"]).shape) == (1, 3)


def test_card_reads_back_through_huggingface_hub(made):
    """The card is a huggingface_hub ModelCard: its metadata parses back into the same EvalResults,
    read from the run's typed report (the recovery table's numbers are the report's)."""
    from huggingface_hub import ModelCard

    from linearize.report import load_report

    report = load_report(made.run / "report.json")
    card = ModelCard(push_module.plan(made.run, REPO).card)
    assert card.data.license == "mit" and card.data.pipeline_tag == "text-classification"
    assert card.data.model_name == "tiny-luna"
    assert [(r.metric_type, r.metric_value, r.dataset_split) for r in card.data.eval_results] == [
        ("accuracy", 0.8, "validation"), ("teacher_accuracy", 0.8125, "validation")]
    assert f"| {report.recovery().per_metric['accuracy']:.1f} % |" in card.text
    assert f"Average recovery: **{report.recovery().average:.1f} %**." in card.text

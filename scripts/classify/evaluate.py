#!/usr/bin/env python3
"""Leave-one-benchmark-out evaluation of complexity-classifier designs (issue 18).

    python3 scripts/classify/evaluate.py --data /work/data/classify \
        --out docs/benchmarks/classification-research [--export DIR]

Inputs: the normalized rows from fetch_sets.py (<data>/<family>/*.jsonl), the static tables from
distill.py (<data>/cache/static_*.npz), scripts/classify/everyday.jsonl and tag_exemplars.jsonl.
Outputs under --out: results.json (every number), lobo_<design>.csv, everyday.csv,
reliability.csv, calibration.png, and (with --export) the runtime files of the chosen design.

Protocol
- A family is held out whole. Training rows: train_ok rows of every other family (sets with an
  unstated or non-commercial licence are never trained on; they are test-only families).
- Rows listed as contaminated are dropped everywhere.
- Each training family gets the same total weight (a family of 300 rows counts as much as one of
  14,000), so the head cannot win by fitting MMLU alone.
- Calibration and thresholds never see held-out scores: inside each training set, every
  training family is scored by a model fitted on the other training families (cross-fitting by
  family), the calibrator (isotonic, or Platt) is fitted on those out-of-family scores, and the
  thresholds are chosen on the calibrated out-of-family scores.
- The regularisation strength C is chosen the same way (best mean out-of-family AUC).
"""
import argparse
import csv
import glob
import hashlib
import json
import math
import os
import pickle
import sys
import time
from collections import Counter, defaultdict

import numpy as np
from sklearn.isotonic import IsotonicRegression
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from kclassify import DENSE, dense_features, embed_text, minilm_dir, question_of  # noqa: E402
from wordpiece import WordPiece  # noqa: E402

# The labelled everyday prompts live with the Rust crate's tests, which assert their levels.
EVERYDAY = os.path.join(HERE, "..", "..", "proxy", "classify", "tests", "everyday.jsonl")

RNG_SEED = 18
Z = 1.645           # one-sided 95% bound
LOW_RATIO = 0.95    # low: weak keeps >= 95% of strong's quality
HIGH_RATIO = 0.80   # high: weak keeps <= 80% of strong's quality
MIN_LOW_ROWS = 50


# ---------------------------------------------------------------------------------- data

def load_rows(data):
    rows = []
    for f in sorted(glob.glob(os.path.join(data, "*", "*.jsonl"))):
        for l in open(f):
            r = json.loads(l)
            if not r["contaminated"]:
                rows.append(r)
    return rows


def token_cache(rows, data, wp, key):
    """WordPiece ids of the final question (key='fq') or of the raw prompt (key='raw')."""
    h = hashlib.sha1(b"caps-v2")
    for r in rows:
        h.update(r["id"].encode())
        h.update(str(len(r["prompt"])).encode())
    path = os.path.join(data, "cache", f"ids_{key}_{h.hexdigest()[:12]}.pkl")
    if os.path.exists(path):
        return pickle.load(open(path, "rb"))
    t0 = time.time()
    out = {"ids": [], "dense": []}
    for r in rows:
        text = question_of(r["prompt"], extract=key == "fq")
        out["ids"].append(np.array(wp.encode(embed_text(text)), np.int32))
        out["dense"].append(dense_features(text))
    out["dense"] = np.array(out["dense"], np.float32)
    pickle.dump(out, open(path, "wb"))
    print(f"tokenized {len(rows)} prompts ({key}) in {time.time() - t0:.0f}s", file=sys.stderr)
    return out


def embed_all(ids_list, table):
    q = table["q"].astype(np.float32)
    scale = table["scale"]
    out = np.zeros((len(ids_list), q.shape[1]), np.float32)
    for i, ids in enumerate(ids_list):
        if len(ids):
            s = q[ids].sum(0) * scale / len(ids)
            n = np.linalg.norm(s)
            out[i] = s / n if n > 0 else s
    return out


# ---------------------------------------------------------------------------------- metrics

def share_at(score, qs, qw, target_ratio=0.95, rng=None):
    """Largest share routed to the weak model, lowest score first, with quality >= ratio * strong."""
    n = len(score)
    if rng is not None:  # random tie-break
        order = np.lexsort((rng.random(n), score))
    else:
        order = np.argsort(score, kind="stable")
    gain = np.concatenate([[0.0], np.cumsum(qw[order] - qs[order])])
    quality = (qs.sum() + gain) / n
    ok = np.nonzero(quality >= target_ratio * qs.mean() - 1e-12)[0]
    return ok.max() / n


def random_shares(qs, qw, reps=1000, seed=RNG_SEED):
    rng = np.random.default_rng(seed)
    n = len(qs)
    out = np.empty(reps)
    for k in range(reps):
        out[k] = share_at(rng.random(n), qs, qw)
    return out


def auc(y, s):
    return float(roc_auc_score(y, s)) if 0 < y.sum() < len(y) else float("nan")


def ratio_bound(qs, qw, w=None):
    """Mean of u = qw - LOW_RATIO*qs and its standard error (weighted)."""
    u = qw - LOW_RATIO * qs
    if w is None:
        w = np.ones_like(u)
    w = w / w.sum()
    m = float((w * u).sum())
    neff = 1.0 / float((w ** 2).sum())
    var = float((w * (u - m) ** 2).sum()) * neff / max(1.0, neff - 1)
    return m, math.sqrt(var / neff)


def ece(p, y, bins=10):
    edges = np.linspace(0, 1, bins + 1)
    idx = np.clip(np.digitize(p, edges) - 1, 0, bins - 1)
    e, table = 0.0, []
    for b in range(bins):
        m = idx == b
        if m.sum() == 0:
            table.append((edges[b], edges[b + 1], 0, None, None))
            continue
        e += m.sum() / len(p) * abs(p[m].mean() - y[m].mean())
        table.append((edges[b], edges[b + 1], int(m.sum()), float(p[m].mean()), float(y[m].mean())))
    return e, table


# ---------------------------------------------------------------------------------- models

def family_weights(fam):
    c = Counter(fam)
    w = np.array([1.0 / c[f] for f in fam])
    return w * len(fam) / w.sum()


class Standard:
    def fit(self, X, w):
        w = w / w.sum()
        self.mu = (X * w[:, None]).sum(0)
        sd = np.sqrt(((X - self.mu) ** 2 * w[:, None]).sum(0))
        self.sd = np.where(sd > 1e-8, sd, 1.0)
        return self

    def __call__(self, X):
        return (X - self.mu) / self.sd


def fit_head(X, y, w, C, target):
    st = Standard().fit(X, w)
    Xs = st(X)
    if target == "binary":
        m = LogisticRegression(C=C, max_iter=2000)
        m.fit(Xs, y, sample_weight=w)
        return ("binary", st, m)
    # "gap": three classes, strong better (2) / tie (1) / weak better (0); score = P(2) - P(0)
    m = LogisticRegression(C=C, max_iter=2000)
    m.fit(Xs, y, sample_weight=w)
    return ("gap", st, m)


def head_score(h, X):
    kind, st, m = h
    P = m.predict_proba(st(X))
    if kind == "binary":
        return P[:, 1]
    cls = list(m.classes_)
    return P[:, cls.index(2)] - P[:, cls.index(0)]


def labels(rows, target):
    if target == "binary":
        return np.array([r["needs_strong"] for r in rows], int)
    return np.array([2 if r["q_strong"] > r["q_weak"] else (0 if r["q_weak"] > r["q_strong"] else 1)
                     for r in rows], int)


class Calibrator:
    """Monotone map from head score to P(needs strong)."""

    def __init__(self, kind):
        self.kind = kind

    def fit(self, s, y, w):
        if self.kind == "isotonic":
            self.m = IsotonicRegression(out_of_bounds="clip", y_min=0.0, y_max=1.0, increasing=True)
            self.m.fit(s, y, sample_weight=w)
            # store as a piecewise-linear table for the port
            self.x = self.m.X_thresholds_.astype(float)
            self.yv = self.m.y_thresholds_.astype(float)
        else:
            self.m = LogisticRegression(C=1e6, max_iter=1000)
            self.m.fit(s.reshape(-1, 1), y, sample_weight=w)
            self.a, self.b = float(self.m.coef_[0, 0]), float(self.m.intercept_[0])
        return self

    def __call__(self, s):
        if self.kind == "isotonic":
            return np.interp(s, self.x, self.yv)
        return 1.0 / (1.0 + np.exp(-(self.a * s + self.b)))


def choose_thresholds(p, qs, qw, w):
    """low: the largest cut with weak >= 95% of strong below it at the one-sided 95% bound
    (at least MIN_LOW_ROWS rows); high: the smallest cut with weak <= 80% of strong at or above it,
    at the bound. Both on cross-fitted calibrated scores of the training families."""
    order = np.argsort(p)
    ps, s, v, ww = p[order], qs[order], qw[order], w[order]
    cands = np.unique(ps)
    low = 0.0
    for c in cands:
        m = ps < c
        if m.sum() < MIN_LOW_ROWS:
            continue
        mu, se = ratio_bound(s[m], v[m], ww[m])
        if mu - Z * se >= 0:
            low = float(c)
    high = 1.0
    for c in cands[::-1]:
        m = ps >= c
        if m.sum() < MIN_LOW_ROWS:
            continue
        u = v[m] - HIGH_RATIO * s[m]
        wm = ww[m] / ww[m].sum()
        mu = float((wm * u).sum())
        neff = 1 / float((wm ** 2).sum())
        se = math.sqrt(float((wm * (u - mu) ** 2).sum()) / max(1, neff - 1))
        if mu + Z * se <= 0:
            high = float(c)
    if high <= low:
        high = min(1.0, low + 1e-6)
    return low, high


def level_of(p, low, high):
    return np.where(p < low, "low", np.where(p >= high, "high", "medium"))


def confidence_of(p, lv):
    # the calibrated probability of what the level promises: for low and medium that the weak
    # model is not worse (1 - p), for high that the strong model is needed (p)
    return np.where(lv == "high", p, 1.0 - p)


# ---------------------------------------------------------------------------------- designs

def make_X(design, F):
    parts = []
    if "emb" in design["features"]:
        parts.append(F["emb"])
    if "dense" in design["features"]:
        parts.append(F["dense"])
    if "len" in design["features"]:
        parts.append(F["dense"][:, :1])
    return np.hstack(parts)


def crossfit(X, y, w, fam, C, target):
    """Out-of-family scores for every row, each from a model fitted on the other families."""
    s = np.zeros(len(y))
    for g in sorted(set(fam)):
        m = fam == g
        if (~m).sum() == 0:
            continue
        h = fit_head(X[~m], y[~m], w[~m], C, target)
        s[m] = head_score(h, X[m])
    return s


def train_design(design, X, rows_idx, rows, fam_all, target, Cs):
    """Fit head + calibrator + thresholds on the given training rows. Returns a predictor."""
    y = labels([rows[i] for i in rows_idx], target)
    yb = labels([rows[i] for i in rows_idx], "binary")
    fam = fam_all[rows_idx]
    w = family_weights(fam)
    Xtr = X[rows_idx]
    qs = np.array([rows[i]["q_strong"] for i in rows_idx])
    qw = np.array([rows[i]["q_weak"] for i in rows_idx])
    best = None
    for C in Cs:
        s = crossfit(Xtr, y, w, fam, C, target)
        a = np.nanmean([auc(yb[fam == g], s[fam == g]) for g in set(fam)])
        if best is None or a > best[0]:
            best = (a, C, s)
    inner_auc, C, s_oof = best
    cal = Calibrator(design.get("calibration", "isotonic")).fit(s_oof, yb, w)
    p_oof = cal(s_oof)
    low, high = choose_thresholds(p_oof, qs, qw, w)
    head = fit_head(Xtr, y, w, C, target)
    return {"head": head, "cal": cal, "low": low, "high": high, "C": C, "inner_auc": inner_auc,
            "p_oof": p_oof, "y_oof": yb, "fam_oof": fam}


def predict(model, X):
    p = model["cal"](head_score(model["head"], X))
    lv = level_of(p, model["low"], model["high"])
    return p, lv, confidence_of(p, lv)


# ---------------------------------------------------------------------------------- family tagger

TAGS = ["chat", "code", "extraction", "long-context-qa", "math", "reasoning", "translation", "trivia", "writing"]
HASH_BUCKETS = 4096


def fnv1a32(b):
    h = 0x811C9DC5
    for c in b:
        h ^= c
        h = (h * 0x01000193) & 0xFFFFFFFF
    return h


def hashed_words(q):
    """Tagger's lexical features: lower-cased ASCII words ([A-Za-z0-9']+ runs, first 64), each
    hashed with FNV-1a 32 into 4096 buckets (+1); the first two words also as "^word". L2-normalised."""
    v = np.zeros(HASH_BUCKETS, np.float32)
    ws = [w.lower() for w in _WORDS.findall(q)][:64]
    for i, w in enumerate(ws):
        v[fnv1a32(w.encode()) % HASH_BUCKETS] += 1
        if i < 2:
            v[fnv1a32(("^" + w).encode()) % HASH_BUCKETS] += 1
    n = np.linalg.norm(v)
    return v / n if n > 0 else v


import re as _re  # noqa: E402
_WORDS = _re.compile(r"[A-Za-z0-9']+")


def derived_exemplars(rows, seed=RNG_SEED):
    """Benchmark prompts that stand for a tag (train_ok sources only), 0.25 weight each."""
    rng = np.random.default_rng(seed)
    spec = [("math", lambda r: r["family"] == "gsm8k", 120),
            ("code", lambda r: r["family"] == "code", 120),
            ("trivia", lambda r: r["family"] == "mmlu", 120),
            ("reasoning", lambda r: r["family"] == "bbh", 120),
            ("writing", lambda r: r["source"] == "routellm-mt-bench" and r.get("category") in ("writing", "roleplay"), 40),
            ("extraction", lambda r: r["source"] == "routellm-mt-bench" and r.get("category") == "extraction", 20)]
    out = []
    for tag, pred, k in spec:
        idx = [i for i, r in enumerate(rows) if r["train_ok"] and pred(r)]
        for i in rng.permutation(idx)[:k]:
            out.append((tag, rows[i]["prompt"], int(i)))
    return out


class Tagger:
    """Multinomial logistic regression over [static embedding, hashed words] of the final question."""

    def fit(self, emb, hw, y, w, C=10.0):
        self.m = LogisticRegression(C=C, max_iter=5000)
        self.m.fit(np.hstack([emb, hw]), y, sample_weight=w)
        self.classes = list(self.m.classes_)
        return self

    def proba(self, emb, hw):
        P = self.m.predict_proba(np.hstack([emb, hw]))
        out = np.zeros((len(P), len(TAGS)))
        for j, c in enumerate(self.classes):
            out[:, TAGS.index(c)] = P[:, j]
        return out


# ---------------------------------------------------------------------------------- tag-then-size levels

def family_priors(P_tr, qs, qw, fam, min_rows=30):
    """Per tag: weak/strong quality ratio over the training rows the tagger puts in that tag
    (argmax), each training family carrying the same total weight. Tags with fewer than min_rows
    rows are unmeasured (None)."""
    w = family_weights(fam)
    top = P_tr.argmax(1)
    pri = {}
    for j, t in enumerate(TAGS):
        m = top == j
        if m.sum() < min_rows:
            pri[t] = None
            continue
        pri[t] = float((w[m] * qw[m]).sum() / (w[m] * qs[m]).sum())
    return pri


def tts_level_for(tag, ntok, pri, small):
    if ntok <= small:
        return "low"
    r = pri.get(tag)
    if r is None:
        return "medium"
    if r >= LOW_RATIO:
        return "low"
    if r <= HIGH_RATIO:
        return "high"
    return "medium"


def tts_predict(P, ntok, pri, small):
    """Level = the level with the most tag-probability mass; confidence = that mass."""
    lv, conf, loss = [], [], []
    for p, n in zip(P, ntok):
        mass = defaultdict(float)
        el = 0.0
        for j, t in enumerate(TAGS):
            L = tts_level_for(t, n, pri, small)
            mass[L] += p[j]
            r = pri.get(t)
            el += p[j] * (0.0 if n <= small else (1.0 - (r if r is not None else 0.85)))
        best = max(("low", "medium", "high"), key=lambda k: mass[k])
        lv.append(best)
        conf.append(mass[best])
        loss.append(el + 1e-6 * n)  # tie-break by size for ranking
    return np.array(lv), np.array(conf), np.array(loss)


# ---------------------------------------------------------------------------------- level confidence

LEVELS = ("low", "medium", "high")


def promise_held(lv, qs, qw):
    """What each level promises, per prompt: `low` and `medium` that the weak model is not worse
    (q_weak >= q_strong), `high` that the strong model is needed (q_strong > q_weak)."""
    return np.where(lv == "high", qs > qw, qw >= qs).astype(float)


def mass_key(mass):
    """The mass as the calibrator reads it: rounded to 3 decimals, so that a sum of
    probabilities that is 1 up to float rounding is 1 (the Rust port rounds the same way)."""
    return np.round(np.asarray(mass, float), 3)


class LevelCalibrator:
    """Per level, an isotonic map from the level's tag-probability mass to the probability that
    the level's promise holds. A level with fewer than 30 fitting rows maps every mass to the
    promise's weighted base rate over all fitting rows."""

    def fit(self, lv, mass, y_not_worse, y_needs, w):
        mass = mass_key(mass)
        self.maps = {}
        for L in LEVELS:
            y = y_needs if L == "high" else y_not_worse
            m = lv == L
            if m.sum() < 30:
                rate = float((w * y).sum() / w.sum())
                self.maps[L] = (np.array([0.0, 1.0]), np.array([rate, rate]))
                continue
            iso = IsotonicRegression(out_of_bounds="clip", y_min=0.0, y_max=1.0, increasing=True)
            iso.fit(mass[m], y[m], sample_weight=w[m])
            self.maps[L] = (iso.X_thresholds_.astype(float), iso.y_thresholds_.astype(float))
        return self

    def __call__(self, lv, mass):
        mass = mass_key(mass)
        out = np.zeros(len(lv))
        for L in LEVELS:
            m = lv == L
            if m.any():
                x, y = self.maps[L]
                out[m] = np.interp(mass[m], x, y)
        return out


def calibrate_levels(lv, mass, qs, qw, fam, train_ok, families):
    """Fits the shipped level calibrator on the leave-one-family-out (held-out) levels of the
    train_ok rows, and measures it without tuning on what it is measured on: each family's rows
    are calibrated by a calibrator fitted on the other families' train_ok rows."""
    y_nw = (qw >= qs).astype(float)
    y_ns = (qs > qw).astype(float)
    held = promise_held(lv, qs, qw)
    nested = np.zeros(len(lv))
    for g in families:
        fit = train_ok & (fam != g)
        w = family_weights(fam[fit])
        cal = LevelCalibrator().fit(lv[fit], mass[fit], y_nw[fit], y_ns[fit], w)
        m = fam == g
        nested[m] = cal(lv[m], mass[m])
    w = family_weights(fam[train_ok])
    shipped = LevelCalibrator().fit(lv[train_ok], mass[train_ok], y_nw[train_ok], y_ns[train_ok], w)
    per = {}
    for g in families:
        m = fam == g
        per[g] = {"ece": ece(nested[m], held[m])[0], "rows": int(m.sum()),
                  "mean_confidence": float(nested[m].mean()), "promise_rate": float(held[m].mean()),
                  "by_level": {L: {"rows": int((m & (lv == L)).sum()),
                                   "mean_confidence": float(nested[m & (lv == L)].mean()) if (m & (lv == L)).any() else None,
                                   "promise_rate": float(held[m & (lv == L)].mean()) if (m & (lv == L)).any() else None}
                               for L in LEVELS}}
    e, rel = ece(nested, held)
    return shipped, {"pooled_ece": e, "reliability": rel, "per_family": per,
                     "raw_mass_ece": ece(mass, held)[0]}


# ---------------------------------------------------------------------------------- main

def winogrande_variants(rows, rng):
    """Few-shot prompt as RouterBench gives it; the zero-shot question (the text after the last
    'Answer:\\n<letter>\\n\\n', a format-specific cut independent of final_question); and the same
    question behind three other rows' questions re-formatted as 'Question: ...\\nAnswer: X'."""
    wg = [r for r in rows if r["family"] == "winogrande"]
    zero = []
    for r in wg:
        p = r["prompt"]
        k = p.rfind("without explanation. Answer:\n")
        cut = p.find("\n\n", k) if k >= 0 else -1
        zero.append(p[cut + 2:] if cut >= 0 else p)
    alt = []
    for i, z in enumerate(zero):
        js = rng.choice(len(zero), 3, replace=False)
        shots = []
        for j in js:
            q = zero[j].replace('Print only a single choice  from "A" or "B" without explanation. Answer:', "").strip()
            shots.append("Question: " + q + "\nAnswer: " + ("A" if j % 2 else "B"))
        alt.append("\n\n".join(shots) + "\n\nQuestion: " + z.replace('Print only a single choice  from "A" or "B" without explanation. Answer:', "").strip() + "\nAnswer:")
    return [r["prompt"] for r in wg], zero, alt


def featurize(texts, wp, table, extract=True):
    qs_ = [question_of(t, extract) for t in texts]
    ids = [np.array(wp.encode(embed_text(q)), np.int32) for q in qs_]
    return {"emb": embed_all(ids, table), "dense": np.array([dense_features(q) for q in qs_], np.float32),
            "hw": np.array([hashed_words(q) for q in qs_], np.float32), "ntok": np.array([len(i) for i in ids]),
            "fq": qs_}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default="/work/data/classify")
    ap.add_argument("--out", default=os.path.join(HERE, "..", "..", "docs", "benchmarks", "classification-research"))
    ap.add_argument("--table", default="static_mean_d64_sif")
    ap.add_argument("--designs", nargs="*", default=None)
    ap.add_argument("--reps", type=int, default=1000)
    ap.add_argument("--export", default=None, help="write the chosen design's runtime files here")
    ap.add_argument("--predictions", default=None,
                    help="write the final models' per-row answers here (jsonl; data, never commit it)")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    rng = np.random.default_rng(RNG_SEED)
    md = minilm_dir()
    wp = WordPiece(os.path.join(md, "vocab.txt"))
    table = np.load(os.path.join(a.data, "cache", a.table + ".npz"))
    rows = load_rows(a.data)
    fam_all = np.array([r["family"] for r in rows])
    train_ok = np.array([r["train_ok"] for r in rows])
    families = sorted(set(fam_all))
    qs_all = np.array([r["q_strong"] for r in rows])
    qw_all = np.array([r["q_weak"] for r in rows])
    ns_all = np.array([r["needs_strong"] for r in rows], int)
    tok_fq = token_cache(rows, a.data, wp, "fq")
    Ffq = {"emb": embed_all(tok_fq["ids"], table), "dense": tok_fq["dense"]}
    ntok = np.array([len(i) for i in tok_fq["ids"]])
    hw_path = os.path.join(a.data, "cache", f"hw_v2_{len(rows)}.npy")
    if os.path.exists(hw_path):
        HW = np.load(hw_path)
    else:
        HW = np.array([hashed_words(question_of(r["prompt"])) for r in rows], np.float32)
        np.save(hw_path, HW)
    raw_bytes = np.array([[math.log1p(len(r["prompt"].encode()))] for r in rows])
    Cs = [0.03, 0.3]
    results = {"families": {}, "designs": {}, "table": a.table}

    # ---- per-family facts and random orderings
    rand_cache = {}
    for g in families:
        m = fam_all == g
        rs = random_shares(qs_all[m], qw_all[m], a.reps)
        rand_cache[g] = (float(rs.mean()), float(np.percentile(rs, 95)))
        results["families"][g] = {
            "rows": int(m.sum()), "train_ok_rows": int((m & train_ok).sum()),
            "strong_q": float(qs_all[m].mean()), "weak_q": float(qw_all[m].mean()),
            "needs_strong_rate": float(ns_all[m].mean()),
            "random_share95_mean": rand_cache[g][0], "random_share95_p95": rand_cache[g][1],
            "sources": sorted({r["source"] for r, k in zip(rows, m) if k}),
        }

    # ---- tagger (written exemplars + derived benchmark prompts)
    ex = [json.loads(l) for l in open(os.path.join(HERE, "tag_exemplars.jsonl"))]
    der = derived_exemplars(rows)
    der_idx = {i for _, _, i in der}
    tex = [e["prompt"] for e in ex] + [p for _, p, _ in der]
    ty = np.array([e["family"] for e in ex] + [t for t, _, _ in der])
    tw = np.array([1.0] * len(ex) + [0.25] * len(der))
    TF = featurize(tex, wp, table)
    tagger = Tagger().fit(TF["emb"], TF["hw"], ty, tw)
    P_all = tagger.proba(Ffq["emb"], HW)
    ev = [json.loads(l) for l in open(EVERYDAY)]
    EF = featurize([e["prompt"] for e in ev], wp, table)
    P_ev = tagger.proba(EF["emb"], EF["hw"])
    ev_tag = [TAGS[j] for j in P_ev.argmax(1)]
    tag_acc = float(np.mean([t == e["family"] for t, e in zip(ev_tag, ev)]))
    # benchmark rows not used as exemplars, with an unambiguous tag
    bmap = {"gsm8k": "math", "code": "code", "bbh": "reasoning", "mmlu": "trivia", "arc": "trivia"}
    bidx = [i for i, r in enumerate(rows) if r["family"] in bmap and i not in der_idx]
    bacc = {g: float(np.mean([TAGS[P_all[i].argmax()] == bmap[g] for i in bidx if rows[i]["family"] == g])) for g in bmap}
    tag_dist = {g: dict(Counter(TAGS[j] for j in P_all[fam_all == g].argmax(1)).most_common()) for g in families}
    conf_ev = P_ev.max(1)
    results["tagger"] = {"everyday_accuracy": tag_acc, "everyday_n": len(ev), "benchmark_accuracy": bacc,
                         "tag_distribution": tag_dist,
                         "everyday_mean_top_p_correct": float(conf_ev[[t == e["family"] for t, e in zip(ev_tag, ev)]].mean()),
                         "everyday_mean_top_p_wrong": float(conf_ev[[t != e["family"] for t, e in zip(ev_tag, ev)]].mean()) if tag_acc < 1 else None}
    print(f"tagger: everyday {tag_acc:.3f}; benchmark {bacc}", file=sys.stderr)
    small = float(np.percentile(ntok[train_ok], 1))
    results["tts_small_tokens"] = small

    # ---- designs
    designs = {
        "tag+size (chosen levels)": {"kind": "tts"},
        "emb+dense": {"features": ["emb", "dense"], "target": "binary"},
        "emb+dense/difficulty": {"features": ["emb", "dense"], "target": "difficulty"},
        "emb+dense/platt": {"features": ["emb", "dense"], "target": "binary", "calibration": "platt"},
        "emb": {"features": ["emb"], "target": "binary"},
        "dense": {"features": ["dense"], "target": "binary"},
        "emb+dense/raw-prompt": {"features": ["emb", "dense"], "target": "binary", "raw": True},
        "length": {"features": ["len"], "target": "binary"},
    }
    if a.designs:
        designs = {k: v for k, v in designs.items() if k in a.designs}
    Fraw = None
    lobo_p = {}
    tts_lv = np.empty(len(rows), dtype=object)
    tts_mass = np.zeros(len(rows))
    for name, d in designs.items():
        t0 = time.time()
        per = {}
        pooled_p, pooled_y = [], []
        if d.get("kind") != "tts":
            if d.get("raw"):
                if Fraw is None:
                    tok_raw = token_cache(rows, a.data, wp, "raw")
                    Fraw = {"emb": embed_all(tok_raw["ids"], table), "dense": tok_raw["dense"]}
                X = make_X(d, Fraw)
            elif name == "length":
                X = raw_bytes
            else:
                X = make_X(d, Ffq)
        for g in families:
            test = np.nonzero(fam_all == g)[0]
            tr = np.nonzero((fam_all != g) & train_ok)[0]
            qs, qw, y = qs_all[test], qw_all[test], ns_all[test]
            extra = {}
            if d.get("kind") == "tts":
                pri = family_priors(P_all[tr], qs_all[tr], qw_all[tr], fam_all[tr])
                lv, conf, s = tts_predict(P_all[test], ntok[test], pri, small)
                tts_lv[test], tts_mass[test] = lv, conf
                p = None
                extra["priors"] = pri
            else:
                target = d["target"]
                if target == "difficulty":
                    # rank by P(weak model wrong); calibrate that probability on its own label
                    yd = (qw_all < 0.5).astype(int)
                    save = [r["needs_strong"] for r in rows]
                    for i in range(len(rows)):
                        rows[i]["needs_strong"] = bool(yd[i])
                    model = train_design(d, X, tr, rows, fam_all, "binary", Cs)
                    for i in range(len(rows)):
                        rows[i]["needs_strong"] = save[i]
                    p_d, lv, conf = predict(model, X[test])
                    s = head_score(model["head"], X[test])
                    p = None
                elif name == "length":
                    model = train_design(d, X, tr, rows, fam_all, "binary", [1.0])
                    p, lv, conf = predict(model, X[test])
                    s = X[test, 0]
                else:
                    model = train_design(d, X, tr, rows, fam_all, target, Cs)
                    p, lv, conf = predict(model, X[test])
                    s = head_score(model["head"], X[test])
                extra.update({"thresholds": [model["low"], model["high"]], "C": model["C"],
                              "inner_auc": model["inner_auc"]})
            share = share_at(s, qs, qw, rng=rng)
            low, high = lv == "low", lv == "high"
            per[g] = {
                "auc": auc(y, s), "share95": share,
                "random_mean": rand_cache[g][0], "random_p95": rand_cache[g][1],
                "beats_p95": bool(share > rand_cache[g][1]),
                "low_share": float(low.mean()), "low_rows": int(low.sum()),
                "weak_q_low": float(qw[low].mean()) if low.any() else None,
                "strong_q_low": float(qs[low].mean()) if low.any() else None,
                "weak_q_all": float(qw.mean()), "strong_q_all": float(qs.mean()),
                "ratio_low": float(qw[low].mean() / qs[low].mean()) if low.any() and qs[low].mean() > 0 else None,
                "high_share": float(high.mean()),
                "ratio_high": float(qw[high].mean() / qs[high].mean()) if high.any() and qs[high].mean() > 0 else None,
                "ece": ece(p, y)[0] if p is not None else None,
                **extra,
            }
            srcs = np.array([rows[i]["source"] for i in test])
            if len(set(srcs)) > 1:
                per[g]["per_source"] = {}
                for so in sorted(set(srcs)):
                    mm = srcs == so
                    lm = low & mm
                    per[g]["per_source"][so] = {
                        "rows": int(mm.sum()), "auc": auc(y[mm], s[mm]), "low_rows": int(lm.sum()),
                        "ratio_low": float(qw[lm].mean() / qs[lm].mean()) if lm.any() and qs[lm].mean() > 0 else None,
                        "ratio_all": float(qw[mm].mean() / qs[mm].mean()) if qs[mm].mean() > 0 else None}
            if p is not None:
                pooled_p.append(p)
                pooled_y.append(y)
                lobo_p.setdefault(name, {})[g] = (p, y)
        aucs = [per[g]["auc"] for g in families]
        summary = {
            "mean_auc": float(np.nanmean(aucs)),
            "families_beating_p95": sum(per[g]["beats_p95"] for g in families),
            "families_low_ratio_ok": sum(1 for g in families if per[g]["ratio_low"] is not None and per[g]["ratio_low"] >= LOW_RATIO),
            "families_with_low": sum(1 for g in families if per[g]["low_rows"] > 0),
        }
        if pooled_p:
            pp, py = np.concatenate(pooled_p), np.concatenate(pooled_y)
            e, rel = ece(pp, py)
            summary["pooled_ece"], summary["reliability"] = e, rel
        results["designs"][name] = {"per_family": per, "summary": summary}
        print(f"{name:26s} meanAUC {summary['mean_auc']:.3f}  >p95 {summary['families_beating_p95']}/{len(families)}  "
              f"low>=95% {summary['families_low_ratio_ok']}/{summary['families_with_low']} families with low  "
              f"ECE {summary.get('pooled_ece', float('nan')):.3f}  [{time.time() - t0:.0f}s]", file=sys.stderr)
        with open(os.path.join(a.out, "lobo_" + _re.sub(r"[^A-Za-z0-9]+", "_", name).strip("_") + ".csv"), "w", newline="") as f:
            wr = csv.writer(f)
            keys = ["auc", "share95", "random_mean", "random_p95", "low_share", "low_rows", "weak_q_low",
                    "strong_q_low", "weak_q_all", "strong_q_all", "ratio_low", "high_share", "ratio_high", "ece"]
            wr.writerow(["family"] + keys)
            for g in families:
                wr.writerow([g] + [per[g][k] for k in keys])

    # ---- level confidence: calibrated on the held-out (leave-one-family-out) levels
    level_cal = None
    if "tag+size (chosen levels)" in designs:
        lv_all = tts_lv.astype(str)
        level_cal, cal_report = calibrate_levels(lv_all, tts_mass, qs_all, qw_all, fam_all, train_ok, families)
        results["level_calibration"] = cal_report
        print(f"level confidence: nested ECE {cal_report['pooled_ece']:.3f} (raw mass {cal_report['raw_mass_ece']:.3f})",
              file=sys.stderr)

    # ---- final models on every train_ok row
    trall = np.nonzero(train_ok)[0]
    pri_all = family_priors(P_all[trall], qs_all[trall], qw_all[trall], fam_all[trall])
    results["final_priors"] = pri_all
    Xh = make_X({"features": ["emb", "dense"]}, Ffq)
    head = train_design({"features": ["emb", "dense"]}, Xh, trall, rows, fam_all, "binary", Cs)
    XE = np.hstack([EF["emb"], EF["dense"]])
    p_ev, lv_head, conf_head = predict(head, XE)
    lv_ev, mass_ev, _ = tts_predict(P_ev, EF["ntok"], pri_all, small)
    conf_ev = level_cal(lv_ev, mass_ev) if level_cal is not None else mass_ev
    ok = [l == e["level"] for l, e in zip(lv_ev, ev)]
    ok_head = [l == e["level"] for l, e in zip(lv_head, ev)]
    results["everyday"] = {
        "accuracy": float(np.mean(ok)), "accuracy_head_only": float(np.mean(ok_head)), "n": len(ev),
        "by_kind": {}, "low_with_conf_over_half": None,
    }
    kinds = sorted({e["kind"] for e in ev}, key=lambda k: [e["kind"] for e in ev].index(k))
    for k in kinds:
        idx = [i for i, e in enumerate(ev) if e["kind"] == k]
        results["everyday"]["by_kind"][k] = {
            "n": len(idx), "expected": ev[idx[0]]["level"],
            "levels": dict(Counter(lv_ev[i] for i in idx)), "head_levels": dict(Counter(lv_head[i] for i in idx)),
            "mean_conf": float(np.mean([conf_ev[i] for i in idx])),
            "tags": dict(Counter(ev_tag[i] for i in idx)),
        }
    lows = [i for i, e in enumerate(ev) if e["level"] == "low"]
    results["everyday"]["low_with_conf_over_half"] = float(np.mean([lv_ev[i] == "low" and conf_ev[i] > 0.5 for i in lows]))
    with open(os.path.join(a.out, "everyday.csv"), "w", newline="") as f:
        wr = csv.writer(f)
        wr.writerow(["kind", "expected", "level", "confidence", "tag", "tag_p", "tokens", "head_p", "head_level", "prompt"])
        for i, e in enumerate(ev):
            wr.writerow([e["kind"], e["level"], lv_ev[i], round(float(conf_ev[i]), 3), ev_tag[i],
                         round(float(P_ev[i].max()), 3), int(EF["ntok"][i]), round(float(p_ev[i]), 3), lv_head[i],
                         e["prompt"][:80]])
    print(f"everyday: tag+size {np.mean(ok):.3f}, head alone {np.mean(ok_head):.3f}", file=sys.stderr)

    # ---- calibration of the head (pooled LOBO predictions)
    rel_rows = []
    for name in ("emb+dense", "emb+dense/platt"):
        if name in lobo_p:
            pp = np.concatenate([v[0] for v in lobo_p[name].values()])
            py = np.concatenate([v[1] for v in lobo_p[name].values()])
            e, rel = ece(pp, py)
            for lo, hi, n, mp, my in rel:
                rel_rows.append([name, round(lo, 2), round(hi, 2), n, mp, my])
    with open(os.path.join(a.out, "reliability.csv"), "w", newline="") as f:
        wr = csv.writer(f)
        wr.writerow(["design", "bin_lo", "bin_hi", "n", "mean_predicted", "observed_rate"])
        wr.writerows(rel_rows)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, axes = plt.subplots(1, 2, figsize=(10, 5))
        ax = axes[0]
        ax.plot([0, 1], [0, 1], "k--", lw=1)
        for name in ("emb+dense", "emb+dense/platt"):
            pts = [(r[4], r[5]) for r in rel_rows if r[0] == name and r[3] >= 20]
            if pts:
                ax.plot(*zip(*pts), "o-", label=name + (" (isotonic)" if name == "emb+dense" else ""))
        ax.set_xlabel("score: predicted P(needs strong), held-out family")
        ax.set_ylabel("observed rate")
        ax.set_title("complexity score (bins with >= 20 rows)")
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.legend()
        ax = axes[1]
        ax.plot([0, 1], [0, 1], "k--", lw=1)
        lc = results.get("level_calibration")
        if lc:
            pts = [(mp, my) for lo, hi, n, mp, my in lc["reliability"] if n >= 20]
            if pts:
                ax.plot(*zip(*pts), "o-", label=f"calibrated (ECE {lc['pooled_ece']:.3f})")
        ax.set_xlabel("confidence: predicted P(the level's promise holds), held-out family")
        ax.set_ylabel("observed rate")
        ax.set_title("complexity tag confidence (bins with >= 20 rows)")
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.legend()
        fig.tight_layout()
        fig.savefig(os.path.join(a.out, "calibration.png"), dpi=110)
    except Exception as ex_:  # plotting is optional
        print("no plot:", ex_, file=sys.stderr)

    # ---- robustness: Winogrande with and without few-shot examples
    few, zero, alt = winogrande_variants(rows, rng)
    rob = {}
    for label, extract in (("with extraction", True), ("raw prompt", False)):
        Fs = [featurize(v, wp, table, extract) for v in (few, zero, alt)]
        Ps = [tagger.proba(F["emb"], F["hw"]) for F in Fs]
        tags_ = [[TAGS[j] for j in P.argmax(1)] for P in Ps]
        lvs = [tts_predict(P, F["ntok"], pri_all, small)[0] for P, F in zip(Ps, Fs)]
        hp = [predict(head, np.hstack([F["emb"], F["dense"]]))[1] for F in Fs]
        rob[label] = {
            "tag_same_fewshot_vs_zero": float(np.mean([x == y for x, y in zip(tags_[0], tags_[1])])),
            "tag_same_altfewshot_vs_zero": float(np.mean([x == y for x, y in zip(tags_[2], tags_[1])])),
            "level_same_fewshot_vs_zero": float(np.mean(lvs[0] == lvs[1])),
            "level_same_altfewshot_vs_zero": float(np.mean(lvs[2] == lvs[1])),
            "head_level_same_fewshot_vs_zero": float(np.mean(hp[0] == hp[1])),
            "levels_fewshot": dict(Counter(lvs[0])), "levels_zero": dict(Counter(lvs[1])),
            "head_levels_fewshot": dict(Counter(hp[0])), "head_levels_zero": dict(Counter(hp[1])),
        }
    results["winogrande_robustness"] = rob
    print("robustness:", json.dumps(rob["with extraction"]), file=sys.stderr)

    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump(results, f, indent=1, default=float)

    if a.predictions:
        # The final models' answers on every row, for the Rust port's parity check
        # (kinference-classify-eval --python-predictions). Data: never committed.
        lv_fin, mass_fin, _ = tts_predict(P_all, ntok, pri_all, small)
        conf_fin = level_cal(lv_fin, mass_fin) if level_cal is not None else mass_fin
        p_fin = predict(head, Xh)[0]
        with open(a.predictions, "w") as f:
            for i, r in enumerate(rows):
                f.write(json.dumps({"id": r["id"], "family_tag": TAGS[int(P_all[i].argmax())],
                                    "family_p": round(float(P_all[i].max()), 5), "level": str(lv_fin[i]),
                                    "mass": round(float(mass_fin[i]), 5), "confidence": round(float(conf_fin[i]), 5),
                                    "score": round(float(p_fin[i]), 5), "tokens": int(ntok[i])}) + "\n")
        print(f"wrote {a.predictions}", file=sys.stderr)
    if a.export:
        export(a, table, tagger, head, pri_all, small, level_cal)
    import subprocess
    with open(os.path.join(a.out, "tables.md"), "w") as f:
        subprocess.run([sys.executable, os.path.join(HERE, "report.py"), os.path.join(a.out, "results.json")],
                       stdout=f, check=True)


def export(a, table, tagger, head, pri_all, small, level_cal):
    from distill import export_table
    os.makedirs(a.export, exist_ok=True)
    export_table(os.path.join(a.export, "static-minilm-d%d.kste" % table["q"].shape[1]), table["q"], table["scale"])
    m = tagger.m
    d = table["q"].shape[1]
    tag_json = {
        "format": "kinference-family-tagger-v1", "tags": list(m.classes_), "embedding_dims": d,
        "hash_buckets": HASH_BUCKETS, "hash": "fnv1a32(lowercased word) % 4096; first two words also '^'+word",
        "weights_embedding": m.coef_[:, :d].round(6).tolist(), "weights_hashed": m.coef_[:, d:].round(6).tolist(),
        "bias": m.intercept_.round(6).tolist(),
    }
    json.dump(tag_json, open(os.path.join(a.export, "family-tagger-v1.json"), "w"))
    kind, st, lr = head["head"]
    head_json = {
        "format": "kinference-complexity-head-v2", "embedding_dims": d, "dense": DENSE,
        "mean": st.mu.round(6).tolist(), "std": st.sd.round(6).tolist(),
        "weights": lr.coef_[0].round(6).tolist(), "bias": float(lr.intercept_[0]),
        "calibration": {"kind": "isotonic-piecewise-linear", "x": head["cal"].x.round(6).tolist(),
                        "y": head["cal"].yv.round(6).tolist()},
        "thresholds": {"low": head["low"], "high": head["high"]},
    }
    json.dump(head_json, open(os.path.join(a.export, "complexity-head-v2.json"), "w"))
    levels = {"format": "kinference-levels-v2", "small_request_tokens": small, "low_ratio": LOW_RATIO,
              "high_ratio": HIGH_RATIO, "family_ratio": pri_all,
              "rule": "tokens <= small -> low; else by the tagged family's weak/strong ratio: >= low_ratio low, "
                      "<= high_ratio high, else (or unmeasured) medium; level = most tag-probability mass",
              "confidence": {
                  "kind": "isotonic-piecewise-linear per level, over the level's tag-probability mass",
                  "promise": {"low": "q_weak >= q_strong", "medium": "q_weak >= q_strong",
                              "high": "q_strong > q_weak"},
                  "fitted_on": "leave-one-family-out levels of every train_ok row, families weighted equally",
                  **{L: {"x": [round(float(v), 6) for v in level_cal.maps[L][0]],
                         "y": [round(float(v), 6) for v in level_cal.maps[L][1]]} for L in LEVELS}}}
    json.dump(levels, open(os.path.join(a.export, "levels-v2.json"), "w"), indent=1)
    print(f"exported to {a.export}", file=sys.stderr)


if __name__ == "__main__":
    main()

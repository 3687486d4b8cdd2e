"""BERT uncased WordPiece tokenizer in plain Python: the reference for the Rust port.

It reproduces the `tokenizer.json` that ships with all-MiniLM-L6-v2 (BertNormalizer with
clean_text, handle_chinese_chars, strip_accents following lowercase, lowercase; BertPreTokenizer;
WordPiece with "##" continuations, [UNK] for words over 100 characters or with no segmentation).
`python3 wordpiece.py --check FILE.jsonl` compares it with the `tokenizers` package on every prompt.

Steps (each is a per-character rule, no regex engine needed):
 1. clean: drop U+0000, U+FFFD and control characters (Unicode category Cc or Cf, except
    tab/newline/CR); map tab, newline, CR and every category-Zs character to a space.
 2. CJK: put a space before and after every code point in the CJK ideograph blocks
    (4E00-9FFF, 3400-4DBF, 20000-2A6DF, 2A700-2B73F, 2B740-2B81F, 2B820-2CEAF, F900-FAFF, 2F800-2FA1F).
 3. strip accents: Unicode NFD, then drop category Mn (combining marks).
 4. lowercase (Unicode simple lowercase).
 5. pre-tokenize: split on whitespace; every punctuation character is its own word, where
    punctuation is ASCII 33-47, 58-64, 91-96, 123-126 or any Unicode category P*.
 6. WordPiece per word: more than 100 characters -> [UNK]; else greedy longest match from the
    start against the vocabulary, later pieces looked up with the "##" prefix; if some position
    has no match, the whole word is [UNK].
"""
import sys
import unicodedata

_CJK = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
        (0x2B740, 0x2B81F), (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))


def _is_cjk(cp):
    return any(a <= cp <= b for a, b in _CJK)


def _is_punct(ch):
    cp = ord(ch)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(ch).startswith("P")


def normalize(text):
    out = []
    for ch in text:
        cp = ord(ch)
        if cp == 0 or cp == 0xFFFD:
            continue
        if ch in "\t\n\r":
            out.append(" ")
            continue
        cat = unicodedata.category(ch)
        if cat in ("Cc", "Cf"):
            continue
        if cat == "Zs":
            out.append(" ")
            continue
        if _is_cjk(cp):
            out.append(" " + ch + " ")
            continue
        out.append(ch)
    s = unicodedata.normalize("NFD", "".join(out))
    s = "".join(c for c in s if unicodedata.category(c) != "Mn")
    return s.lower()


def pre_tokenize(s):
    words, cur = [], []
    for ch in s:
        if ch.isspace():
            if cur:
                words.append("".join(cur))
                cur = []
        elif _is_punct(ch):
            if cur:
                words.append("".join(cur))
                cur = []
            words.append(ch)
        else:
            cur.append(ch)
    if cur:
        words.append("".join(cur))
    return words


class WordPiece:
    def __init__(self, vocab_path):
        with open(vocab_path, encoding="utf-8") as f:
            self.vocab = {line.rstrip("\n"): i for i, line in enumerate(f)}
        self.unk = self.vocab["[UNK]"]
        self.cache = {}

    def word_ids(self, w):
        r = self.cache.get(w)
        if r is not None:
            return r
        if len(w) > 100:
            r = [self.unk]
        else:
            r, start = [], 0
            while start < len(w):
                end, hit = len(w), None
                while start < end:
                    piece = w[start:end] if start == 0 else "##" + w[start:end]
                    hit = self.vocab.get(piece)
                    if hit is not None:
                        break
                    end -= 1
                if hit is None:
                    r = [self.unk]
                    break
                r.append(hit)
                start = end
        if len(self.cache) < 1_000_000:
            self.cache[w] = r
        return r

    def encode(self, text):
        ids = []
        for w in pre_tokenize(normalize(text)):
            ids.extend(self.word_ids(w))
        return ids


def _check(path, vocab, tokenizer_json):
    import json
    from tokenizers import Tokenizer
    ref = Tokenizer.from_file(tokenizer_json)
    ref.no_truncation()
    ref.no_padding()
    wp = WordPiece(vocab)
    n = bad = 0
    for line in open(path):
        p = json.loads(line)["prompt"]
        a = wp.encode(p)
        b = ref.encode(p, add_special_tokens=False).ids
        n += 1
        if a != b:
            bad += 1
            if bad <= 3:
                print("mismatch:", repr(p[:120]), a[:20], b[:20])
    print(f"{path}: {n - bad}/{n} prompts tokenized identically")


if __name__ == "__main__":
    import argparse
    import os
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", nargs="+", required=True)
    ap.add_argument("--model-dir", default=None)
    a = ap.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from kclassify import minilm_dir
    d = a.model_dir or minilm_dir()
    for p in a.check:
        _check(p, os.path.join(d, "vocab.txt"), os.path.join(d, "tokenizer.json"))

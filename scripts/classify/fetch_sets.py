#!/usr/bin/env python3
"""Extract the labelled prompt sets named in datasets.toml into one normalized jsonl per family.

Reads only local git directories (the search tool's `fetch` puts them under
/work/.mirror/<owner>+<name>/repo); every file is read with `git show <commit>:<path>`, so the
output depends only on the pinned commits. Nothing is downloaded, and the output (data) is never
committed: it goes under --out (default /work/data/classify), one folder per family.

    python3 scripts/classify/fetch_sets.py --mirror /work/.mirror --out /work/data/classify

Each output row (jsonl, one file per source: <out>/<family>/<source>.jsonl):

    id             "<source>:<key>"
    family         leave-one-benchmark-out unit (mmlu, gsm8k, chat, mmlu_pro, bbh, code, arc, winogrande)
    source         the manifest entry's name; benchmark: sub-benchmark where a source has several
    prompt         the last user turn exactly as the models saw it (few-shot exemplars included)
    context        earlier turns [{role, text}] (MT-Bench turn 2), else []
    strong_model, weak_model
    label_kind     "correct" | "score" | "preference"
    strong_correct, weak_correct   bool (label_kind == "correct"), else null
    strong_score, weak_score       judge score / 10 (label_kind == "score"), else null
    preference     "strong" | "weak" | "tie" (label_kind == "preference"), else null
    q_strong, q_weak               quality in [0, 1] used by every metric:
                                   correct -> 0/1; score -> score/10;
                                   preference -> strong 1, weak 1 if preferred, 0.5 if tie, else 0
    needs_strong   q_strong > q_weak (RouteLLM's "strong right and weak wrong" for correctness)
    contaminated   listed in the source's contaminated_prompts.jsonl (eval_prompt, exact match)
    train_ok       may be used to fit the shipped classifier (licence)
    licence
"""
import argparse
import ast
import csv
import io
import json
import os
import re
import subprocess
import sys
import tomllib
import zipfile
from collections import Counter

csv.field_size_limit(1 << 30)
HERE = os.path.dirname(os.path.abspath(__file__))


class Git:
    def __init__(self, mirror, repo, commit):
        self.dir = os.path.join(mirror, repo.replace("/", "+"), "repo")
        if not os.path.isdir(self.dir):
            raise SystemExit(f"{repo}: no git directory at {self.dir} (fetch github:{repo} first)")
        self.commit = commit

    def bytes(self, path):
        r = subprocess.run(["git", "--git-dir", self.dir, "show", f"{self.commit}:{path}"],
                           capture_output=True)
        if r.returncode != 0:
            raise SystemExit(f"{self.dir} {self.commit}:{path}: {r.stderr.decode().strip()}")
        return r.stdout

    def text(self, path):
        return self.bytes(path).decode("utf-8")

    def ls(self, path):
        r = subprocess.run(["git", "--git-dir", self.dir, "ls-tree", "--name-only",
                            f"{self.commit}:{path}"], capture_output=True, check=True)
        return sorted(r.stdout.decode().split())


def row(src, key, prompt, *, strong_correct=None, weak_correct=None, strong_score=None,
        weak_score=None, preference=None, context=None, benchmark=None, train_ok=None, extra=None):
    if strong_correct is not None:
        kind, qs, qw = "correct", float(bool(strong_correct)), float(bool(weak_correct))
    elif strong_score is not None:
        kind, qs, qw = "score", strong_score, weak_score
    else:
        kind, qs = "preference", 1.0
        qw = {"strong": 0.0, "tie": 0.5, "weak": 1.0}[preference]
    r = {
        "id": f"{src['name']}:{key}",
        "family": src["family"],
        "source": src["name"],
        "benchmark": benchmark or src["family"],
        "prompt": prompt,
        "context": context or [],
        "strong_model": src["strong"],
        "weak_model": src["weak"],
        "label_kind": kind,
        "strong_correct": None if strong_correct is None else bool(strong_correct),
        "weak_correct": None if weak_correct is None else bool(weak_correct),
        "strong_score": strong_score,
        "weak_score": weak_score,
        "preference": preference,
        "q_strong": qs,
        "q_weak": qw,
        "needs_strong": qs > qw,
        "contaminated": False,
        "train_ok": src["train_ok"] if train_ok is None else train_ok,
        "licence": src["licence"],
    }
    if extra:
        r.update(extra)
    return r


def contaminated_set(git, src):
    if "contaminated" not in src:
        return set()
    return {json.loads(l)["eval_prompt"] for l in git.text(src["contaminated"]).splitlines() if l.strip()}


def truthy(v):
    return str(v).strip().lower() in ("true", "1", "1.0")


# ---------------------------------------------------------------- parsers

def p_routellm_mmlu(git, src):
    out = []
    for name in git.ls(src["path"]):
        if not name.endswith(".csv"):
            continue
        subject = name[len("mmlu_"):-len(".csv")]
        rows = list(csv.DictReader(io.StringIO(git.text(f"{src['path']}/{name}"))))
        for i, r in enumerate(rows):
            out.append(row(src, f"{subject}/{i}", r["prompt"], strong_correct=truthy(r[src["strong"]]),
                           weak_correct=truthy(r[src["weak"]]), extra={"subject": subject}))
    return out


def p_routellm_gsm8k(git, src):
    rows = list(csv.DictReader(io.StringIO(git.text(src["path"]))))
    return [row(src, str(i), r["prompt"], strong_correct=truthy(r[src["strong"]]),
                weak_correct=truthy(r[src["weak"]])) for i, r in enumerate(rows)]


def p_routellm_mt_bench(git, src):
    qs = {}
    for l in git.text(f"{src['path']}/question.jsonl").splitlines():
        if l.strip():
            q = json.loads(l)
            qs[q["question_id"]] = q
    scores = {}
    for l in git.text(f"{src['path']}/judgements.jsonl").splitlines():
        if l.strip():
            j = json.loads(l)
            scores[(j["question_id"], j["turn"], j["model"])] = float(j["score"])
    out = []
    for qid, q in sorted(qs.items()):
        for turn in (1, 2):
            s, w = scores.get((qid, turn, src["strong"])), scores.get((qid, turn, src["weak"]))
            if s is None or w is None or s < 0 or w < 0:
                continue
            ctx = [] if turn == 1 else [{"role": "user", "text": q["turns"][0]},
                                        {"role": "assistant", "text": ""}]
            out.append(row(src, f"{qid}/{turn}", q["turns"][turn - 1], strong_score=s / 10,
                           weak_score=w / 10, context=ctx, extra={"category": q["category"], "turn": turn}))
    return out


def p_alpaca_eval(git, src):
    ann = json.loads(git.text(src["path"]))
    out = []
    for i, a in enumerate(ann):
        assert a["generator_1"] == src["strong"] and a["generator_2"] == src["weak"], a["generator_2"]
        p = a["preference"]
        if p is None:
            continue
        p = float(p)
        pref = "strong" if p < 1.5 else ("weak" if p > 1.5 else "tie")
        out.append(row(src, str(i), a["instruction"], preference=pref,
                       extra={"subset": a.get("dataset")}))
    return out


def _mmlu_pro_outputs(git, path):
    z = zipfile.ZipFile(io.BytesIO(git.bytes(path)))
    name = [n for n in z.namelist() if n.endswith(".json")][0]
    return {str(x["question_id"]): x for x in json.loads(z.read(name))}


def p_mmlu_pro(git, src):
    s, w = _mmlu_pro_outputs(git, src["strong_path"]), _mmlu_pro_outputs(git, src["weak_path"])
    out = []
    drop = src.get("drop_src_prefix")
    for qid in sorted(set(s) & set(w), key=int):
        a, b = s[qid], w[qid]
        if drop and a["src"].startswith(drop):
            continue
        opts = a["options"] if isinstance(a["options"], list) else ast.literal_eval(a["options"])
        letters = "ABCDEFGHIJKLMNOP"
        prompt = a["question"].strip() + "\n" + "\n".join(f"{letters[k]}. {o}" for k, o in enumerate(opts)) + "\nAnswer:"
        out.append(row(src, qid, prompt, strong_correct=a["pred"] == a["answer"],
                       weak_correct=b["pred"] == b["answer"],
                       extra={"category": a["category"], "src": a["src"]}))
    return out


_BBH_ANS = re.compile(r"the answer is (.*?)\.?\s*$", re.S | re.I)


def _bbh_norm(t):
    return t.strip().strip(".").strip()


def _bbh_cot_answer(pred):
    # the paper's rule: the text after the last "So the answer is", else the whole completion
    m = list(re.finditer(r"answer is (.*)", pred))
    ans = m[-1].group(1) if m else pred
    ans = ans.split("\n")[0]
    return _bbh_norm(ans)


def p_bbh(git, src):
    out = []
    for name in git.ls(src["weak_path"]):
        if not name.endswith("_few_shot_template_0-255000.json"):
            continue
        task = name.split("_few_shot_template")[0]
        d = json.loads(git.text(f"{src['weak_path']}/{name}"))["outputs"]
        c = json.loads(git.text(f"{src['strong_path']}/{name}"))["outputs"]
        assert len(d) == len(c), task
        for i, (a, b) in enumerate(zip(c, d)):
            assert a["target"] == b["target"]
            tgt = _bbh_norm(a["target"])
            weak_ok = _bbh_norm(b["prediction"]) == tgt
            strong_ok = _bbh_cot_answer(a["prediction"]) == tgt
            out.append(row(src, f"{task}/{i}", b["input"], strong_correct=strong_ok, weak_correct=weak_ok,
                           benchmark="bbh", extra={"task": task}))
    return out


def _mapcoder_prompt(bench, x):
    if bench == "humaneval":
        return x["prompt"]
    if bench == "apps":
        p = x["description"].strip()
        if x.get("starter_code", "").strip():
            p += "\n\nStarter code:\n" + x["starter_code"]
        return p
    if bench == "xcodeeval":
        parts = [x["description"].strip(), "Input: " + x.get("input_spec", "").strip(),
                 "Output: " + x.get("output_spec", "").strip()]
        return "\n\n".join(parts)
    raise ValueError(bench)


def p_mapcoder(git, src):
    out = []
    for bench, sp, wp, ok in src["pairs"]:
        s = [json.loads(l) for l in git.text(sp).splitlines() if l.strip()]
        w = [json.loads(l) for l in git.text(wp).splitlines() if l.strip()]
        key = lambda x: str(x.get("task_id", x.get("id", x.get("src_uid"))))
        wm = {key(x): x for x in w}
        for x in s:
            k = key(x)
            if k not in wm:
                continue
            out.append(row(src, f"{bench}/{k}", _mapcoder_prompt(bench, x),
                           strong_correct=truthy(x["is_solved"]), weak_correct=truthy(wm[k]["is_solved"]),
                           benchmark=bench, train_ok=ok and src["train_ok"]))
    return out


def p_routerbench_csv(git, src):
    out = []
    for path in src["paths"]:
        split = os.path.basename(path).rsplit("_", 1)[1].split(".")[0]
        for r in csv.DictReader(io.StringIO(git.text(path))):
            p = r["prompt"]
            try:
                v = ast.literal_eval(p)
                if isinstance(v, list):
                    p = v[-1]
            except (ValueError, SyntaxError):
                pass
            if r[src["strong"]].strip() == "" or r[src["weak"]].strip() == "":
                continue  # RouterBench has no score for this model on this prompt
            out.append(row(src, r["sample_id"], p, strong_correct=float(r[src["strong"]]) >= 0.5,
                           weak_correct=float(r[src["weak"]]) >= 0.5,
                           extra={"eval_name": r["eval_name"], "rb_split": split}))
    return out


PARSERS = {k[2:]: v for k, v in globals().items() if k.startswith("p_")}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--manifest", default=os.path.join(HERE, "datasets.toml"))
    ap.add_argument("--mirror", default="/work/.mirror")
    ap.add_argument("--out", default="/work/data/classify")
    ap.add_argument("--only", nargs="*", help="source names to extract (default: all)")
    a = ap.parse_args()
    with open(a.manifest, "rb") as f:
        man = tomllib.load(f)
    summary = []
    for src in man["source"]:
        if a.only and src["name"] not in a.only:
            continue
        git = Git(a.mirror, src["repo"], src["commit"])
        rows = PARSERS[src["parser"]](git, src)
        bad = contaminated_set(git, src)
        seen, dedup = set(), []
        for r in rows:
            r["contaminated"] = r["prompt"] in bad
            if r["id"] in seen:
                continue
            seen.add(r["id"])
            dedup.append(r)
        d = os.path.join(a.out, src["family"])
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, src["name"] + ".jsonl"), "w") as f:
            for r in dedup:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
        n = len(dedup)
        sacc = sum(r["q_strong"] for r in dedup) / n
        wacc = sum(r["q_weak"] for r in dedup) / n
        ns = sum(r["needs_strong"] for r in dedup)
        cont = sum(r["contaminated"] for r in dedup)
        tr = sum(r["train_ok"] for r in dedup)
        summary.append((src["name"], src["family"], n, sacc, wacc, ns, cont, tr))
        print(f"{src['name']:38s} {src['family']:10s} rows {n:6d}  strong {sacc:.3f}  weak {wacc:.3f}  "
              f"needs-strong {ns:5d}  contaminated {cont:3d}  train_ok {tr}", file=sys.stderr)
    with open(os.path.join(a.out, "summary.json"), "w") as f:
        json.dump([dict(zip(["source", "family", "rows", "strong_q", "weak_q", "needs_strong",
                             "contaminated", "train_ok_rows"], s)) for s in summary], f, indent=1)


if __name__ == "__main__":
    main()

//! How the complexity model and the chat exemplar set of `examples/classifiers/chat.yaml` treat
//! everyday chat prompts, and how many benchmark prompts the exemplar set tags by mistake.
//!
//!     cargo run --release -p kinference-classify --example everyday_chat -- --split test
//!
//! `--split dev` measures on the dev chat prompts and the training split of MMLU/GSM8K (what the
//! exemplar set and its threshold may be chosen on; `--min-similarity a,b,c` sweeps the threshold
//! there); `--split test` on the held-out chat prompts and the test split. The chat prompts are
//! `proxy/classify/data/everyday-chat.txt`; MT-Bench's first turns are shown per category.

use anyhow::{Context as _, bail};
use kinference_classify::{
    ClassifierDefinition, ClassifierSet, EmbeddingKind, Limits, Prompt, Role, TagDefinition,
    TagKind, Turn,
    complexity::default_model,
    dataset::{self, Split},
};
use std::{collections::BTreeMap, path::PathBuf};

#[derive(clap::Parser)]
struct Args {
    /// RouteLLM's labelled prompts (MMLU, GSM8K, MT-Bench).
    #[arg(long, default_value = "../shared/classify")]
    data: PathBuf,
    /// The InferenceClassifier with the `everyday` exemplars tag.
    #[arg(long, default_value = "examples/classifiers/chat.yaml")]
    classifier: PathBuf,
    /// The dev and test chat prompts.
    #[arg(long, default_value = "proxy/classify/data/everyday-chat.txt")]
    chat: PathBuf,
    /// `dev` or `test`.
    #[arg(long, default_value = "test")]
    split: String,
    /// Thresholds to try instead of the classifier's `minSimilarity` (dev only).
    #[arg(long, value_delimiter = ',')]
    min_similarity: Vec<f32>,
    /// Adds this many training-split MMLU/GSM8K prompts as a contrasting `task` value, and
    /// prints them (dev only: how the contrast examples of the resource were chosen).
    #[arg(long, default_value_t = 0)]
    contrast: usize,
}

/// The `everyday` tag's examples per value, k and minSimilarity, read from the resource.
type Examples = BTreeMap<String, Vec<String>>;

fn exemplars(path: &PathBuf) -> anyhow::Result<(Examples, usize, f32)> {
    let text = std::fs::read_to_string(path).with_context(|| path.display().to_string())?;
    let doc: serde_yaml::Value = serde_yaml::from_str(&text)?;
    let tags = doc["spec"]["tags"].as_sequence().context("spec.tags")?;
    let Some(tag) = tags.iter().find(|t| t["name"] == "everyday") else {
        bail!("{}: no tag named everyday", path.display());
    };
    let e = &tag["exemplars"];
    let mut examples = Examples::new();
    for v in e["values"].as_sequence().context("values")? {
        let value = v["value"].as_str().context("value")?.to_string();
        let prompts = v["examples"]
            .as_sequence()
            .context("examples")?
            .iter()
            .filter_map(|p| p.as_str().map(str::to_string));
        examples.entry(value).or_default().extend(prompts);
    }
    let k = e["k"].as_u64().unwrap_or(3) as usize;
    let min = e["minSimilarity"].as_f64().unwrap_or(0.2) as f32;
    Ok((examples, k, min))
}

fn chat_prompts(path: &PathBuf, section: &str) -> anyhow::Result<Vec<String>> {
    let text = std::fs::read_to_string(path).with_context(|| path.display().to_string())?;
    let mut current = String::new();
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some(s) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            current = s.to_string();
        } else if current == section {
            out.push(line.to_string());
        }
    }
    Ok(out)
}

fn set(examples: &Examples, k: usize, min_similarity: f32) -> ClassifierSet {
    ClassifierSet::new(&ClassifierDefinition {
        detectors: vec![],
        tags: vec![TagDefinition {
            name: "everyday".into(),
            kind: TagKind::Exemplars {
                examples: examples.clone(),
                k,
                min_similarity,
                embedding: EmbeddingKind::Static,
            },
        }],
        limits: Limits::default(),
    })
    .expect("a valid exemplar set")
}

fn user(text: &str) -> [Turn<'_>; 1] {
    [Turn {
        role: Role::User,
        text,
    }]
}

fn pct(n: usize, d: usize) -> String {
    if d == 0 {
        "-".into()
    } else {
        format!("{:.1}%", 100.0 * n as f64 / d as f64)
    }
}

fn main() -> anyhow::Result<()> {
    let args = <Args as clap::Parser>::parse();
    let (section, split) = match args.split.as_str() {
        "dev" => ("dev", Split::Train),
        "test" => ("test", Split::Test),
        other => bail!("--split must be dev or test, not {other:?}"),
    };
    if split == Split::Test && (!args.min_similarity.is_empty() || args.contrast > 0) {
        bail!(
            "--min-similarity and --contrast work only on --split dev: never tune on the test split"
        );
    }
    let chat = chat_prompts(&args.chat, section)?;
    let (mut examples, k, min_similarity) = exemplars(&args.classifier)?;
    let rows: Vec<_> = dataset::load(&args.data)?
        .into_iter()
        .filter(|r| r.split() == split && !r.contaminated)
        .collect();
    if let Some(step) = rows.len().checked_div(args.contrast) {
        // Every n-th training prompt, so subjects and GSM8K are spread.
        let step = step.max(1);
        let picked: Vec<String> = rows
            .iter()
            .step_by(step)
            .take(args.contrast)
            .map(|r| r.prompt.clone())
            .collect();
        for p in &picked {
            println!("contrast example: {p:?}");
        }
        examples.entry("task".into()).or_default().extend(picked);
    }
    let mt_bench: Vec<(String, String)> =
        std::fs::read_to_string(args.data.join("routellm/mt_bench/question.jsonl"))?
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter_map(|q| {
                Some((
                    q["category"].as_str()?.to_string(),
                    q["turns"][0].as_str()?.to_string(),
                ))
            })
            .collect();

    // The complexity model on the chat prompts, as the example policy reads it.
    let model = default_model();
    let low = model.thresholds.low;
    let mut scores: Vec<f32> = chat
        .iter()
        .map(|p| model.score_prompt(Prompt::Chat(&user(p)), Limits::default()))
        .collect();
    let below = scores.iter().filter(|s| **s < low).count();
    // confidence of "low" is (low - s) / low; the example policy asks for 0.5.
    let confident = scores.iter().filter(|s| (low - **s) / low >= 0.5).count();
    scores.sort_by(f32::total_cmp);
    println!(
        "{section} chat prompts: {} | complexity score min {:.4} median {:.4} max {:.4} | \
         below low ({low:.4}): {} | low with confidence >= 0.5: {}",
        chat.len(),
        scores[0],
        scores[scores.len() / 2],
        scores[scores.len() - 1],
        pct(below, chat.len()),
        pct(confident, chat.len()),
    );

    let thresholds = if args.min_similarity.is_empty() {
        vec![min_similarity]
    } else {
        args.min_similarity.clone()
    };
    println!(
        "\n| minSimilarity | chat tagged | chat tagged, conf >= 0.3 | MMLU tagged (n) | GSM8K \
         tagged (n) | weak / strong acc on tagged MMLU |"
    );
    println!("|---|---|---|---|---|---|");
    for t in thresholds {
        let s = set(&examples, k, t);
        let tagged = |p: &str, min_conf: f32| {
            s.classify(Prompt::Chat(&user(p)))
                .matches("everyday", "chat", min_conf)
        };
        let chat_tagged = chat.iter().filter(|p| tagged(p, 0.0)).count();
        let chat_conf = chat.iter().filter(|p| tagged(p, 0.3)).count();
        let mut by_set: BTreeMap<String, (usize, usize, usize, usize)> = BTreeMap::new();
        for r in &rows {
            let e = by_set.entry(r.dataset.to_string()).or_default();
            e.0 += 1;
            if tagged(&r.prompt, 0.3) {
                e.1 += 1;
                e.2 += usize::from(r.weak_correct);
                e.3 += usize::from(r.strong_correct);
            }
        }
        let (mmlu, gsm) = (by_set["MMLU"], by_set["GSM8K"]);
        println!(
            "| {t} | {} ({chat_tagged}/{}) | {} | {} ({}/{}) | {} ({}/{}) | {} / {} |",
            pct(chat_tagged, chat.len()),
            chat.len(),
            pct(chat_conf, chat.len()),
            pct(mmlu.1, mmlu.0),
            mmlu.1,
            mmlu.0,
            pct(gsm.1, gsm.0),
            gsm.1,
            gsm.0,
            pct(mmlu.2, mmlu.1),
            pct(mmlu.3, mmlu.1),
        );
        if args.min_similarity.is_empty() {
            let mut cats: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
            for (c, q) in &mt_bench {
                let e = cats.entry(c).or_default();
                e.0 += 1;
                e.1 += usize::from(tagged(q, 0.3));
            }
            let line: Vec<String> = cats
                .iter()
                .map(|(c, (n, k))| format!("{c} {k}/{n}"))
                .collect();
            println!(
                "\nMT-Bench first turns tagged (conf >= 0.3): {}",
                line.join(", ")
            );
            let missed: Vec<&str> = chat
                .iter()
                .filter(|p| !tagged(p, 0.3))
                .map(String::as_str)
                .collect();
            println!("{section} chat prompts not tagged: {missed:?}");
        }
    }
    Ok(())
}

//! RouteLLM's labelled prompts, the fixed train/test split and the contamination list.
//!
//! Used by the training and evaluation commands only, never on the request path. The split is a rule
//! in code: a prompt is in the test split when `xxh3_64(prompt bytes) % 100 >= 80`, so it never
//! changes between runs and duplicates of a prompt always fall on the same side.

use std::{collections::HashSet, fmt, fs, path::Path};

/// Which benchmark a prompt comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dataset {
    Mmlu,
    Gsm8k,
}

impl fmt::Display for Dataset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Mmlu => "MMLU",
            Self::Gsm8k => "GSM8K",
        })
    }
}

/// One labelled prompt.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    pub dataset: Dataset,
    pub prompt: String,
    pub weak_correct: bool,
    pub strong_correct: bool,
    /// Listed in the dataset's `contaminated_prompts.jsonl`: left out of evaluation.
    pub contaminated: bool,
}

impl Row {
    /// The RouteLLM label: the prompt needs the strong model.
    pub fn needs_strong(&self) -> bool {
        self.strong_correct && !self.weak_correct
    }

    pub fn split(&self) -> Split {
        split_of(&self.prompt)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Split {
    Train,
    Test,
}

/// Percent of prompts in the training split.
pub const TRAIN_PERCENT: u64 = 80;

/// The fixed split rule.
pub fn split_of(prompt: &str) -> Split {
    if xxhash_rust::xxh3::xxh3_64(prompt.as_bytes()) % 100 < TRAIN_PERCENT {
        Split::Train
    } else {
        Split::Test
    }
}

pub const WEAK_MODEL: &str = "mistralai/Mixtral-8x7B-Instruct-v0.1";
pub const STRONG_MODEL: &str = "gpt-4-1106-preview";

#[derive(Debug, thiserror::Error)]
pub enum DatasetError {
    #[error("{path}: {error}")]
    Io { path: String, error: std::io::Error },
    #[error("{path}: {message}")]
    Format { path: String, message: String },
}

/// Loads MMLU and GSM8K from `root` (the `shared/classify` folder).
pub fn load(root: &Path) -> Result<Vec<Row>, DatasetError> {
    let mut rows = Vec::new();
    let mmlu = root.join("routellm/mmlu");
    let mut files: Vec<_> = fs::read_dir(&mmlu)
        .map_err(|error| io(&mmlu, error))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "csv"))
        .collect();
    files.sort();
    let listed = contaminated(&mmlu.join("contaminated_prompts.jsonl"))?;
    for f in files {
        load_csv(&f, Dataset::Mmlu, &listed, &mut rows)?;
    }
    let gsm = root.join("routellm/gsm8k");
    let listed = contaminated(&gsm.join("contaminated_prompts.jsonl"))?;
    load_csv(
        &gsm.join("gsm8k_responses.csv"),
        Dataset::Gsm8k,
        &listed,
        &mut rows,
    )?;
    Ok(rows)
}

fn io(path: &Path, error: std::io::Error) -> DatasetError {
    DatasetError::Io {
        path: path.display().to_string(),
        error,
    }
}

fn contaminated(path: &Path) -> Result<HashSet<String>, DatasetError> {
    let text = fs::read_to_string(path).map_err(|e| io(path, e))?;
    let mut set = HashSet::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let v: serde_json::Value =
            serde_json::from_str(line).map_err(|e| DatasetError::Format {
                path: path.display().to_string(),
                message: e.to_string(),
            })?;
        if let Some(p) = v.get("eval_prompt").and_then(|p| p.as_str()) {
            set.insert(p.to_string());
        }
    }
    Ok(set)
}

fn load_csv(
    path: &Path,
    dataset: Dataset,
    contaminated: &HashSet<String>,
    rows: &mut Vec<Row>,
) -> Result<(), DatasetError> {
    let text = fs::read_to_string(path).map_err(|e| io(path, e))?;
    let err = |message: String| DatasetError::Format {
        path: path.display().to_string(),
        message,
    };
    let records = parse_csv(&text).map_err(err)?;
    let (header, body) = records
        .split_first()
        .ok_or_else(|| err("empty file".into()))?;
    let col = |name: &str| {
        header
            .iter()
            .position(|h| h == name)
            .ok_or_else(|| err(format!("no column {name:?}")))
    };
    let (p, w, s) = (col("prompt")?, col(WEAK_MODEL)?, col(STRONG_MODEL)?);
    let boolean = |v: &str| match v {
        "True" | "true" => Ok(true),
        "False" | "false" => Ok(false),
        other => Err(err(format!("not a boolean: {other:?}"))),
    };
    for r in body {
        let get = |i: usize| {
            r.get(i)
                .map(String::as_str)
                .ok_or_else(|| err("short record".into()))
        };
        let prompt = get(p)?.to_string();
        rows.push(Row {
            dataset,
            contaminated: contaminated.contains(&prompt),
            weak_correct: boolean(get(w)?)?,
            strong_correct: boolean(get(s)?)?,
            prompt,
        });
    }
    Ok(())
}

/// Parses RFC 4180 CSV (quoted fields may hold commas, newlines and doubled quotes).
pub fn parse_csv(text: &str) -> Result<Vec<Vec<String>>, String> {
    let mut records = Vec::new();
    let mut record = Vec::new();
    let mut field = String::new();
    let mut chars = text.chars().peekable();
    let mut quoted = false;
    let mut at_field_start = true;
    while let Some(c) = chars.next() {
        if quoted {
            if c == '"' {
                if chars.peek() == Some(&'"') {
                    chars.next();
                    field.push('"');
                } else {
                    quoted = false;
                }
            } else {
                field.push(c);
            }
            continue;
        }
        match c {
            '"' if at_field_start => {
                quoted = true;
                at_field_start = false;
            }
            ',' => {
                record.push(std::mem::take(&mut field));
                at_field_start = true;
            }
            '\r' if chars.peek() == Some(&'\n') => {}
            '\n' => {
                record.push(std::mem::take(&mut field));
                records.push(std::mem::take(&mut record));
                at_field_start = true;
            }
            c => {
                field.push(c);
                at_field_start = false;
            }
        }
    }
    if quoted {
        return Err("unterminated quoted field".into());
    }
    if !field.is_empty() || !record.is_empty() {
        record.push(field);
        records.push(record);
    }
    Ok(records)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_quotes_commas_and_newlines() {
        let r = parse_csv("a,b\n\"x, \"\"y\"\"\nz\",True\r\nlast,False").unwrap();
        assert_eq!(
            r,
            vec![
                vec!["a", "b"],
                vec!["x, \"y\"\nz", "True"],
                vec!["last", "False"]
            ]
        );
        assert!(parse_csv("\"open").is_err());
    }

    #[test]
    fn split_is_fixed() {
        // The rule is xxh3 % 100 < 80; pinned so a change to it is noticed.
        let train = (0..1000)
            .filter(|i| split_of(&format!("prompt {i}")) == Split::Train)
            .count();
        assert!((750..=850).contains(&train), "{train}");
        assert_eq!(split_of("prompt 1"), split_of("prompt 1"));
    }
}

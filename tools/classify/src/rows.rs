//! The labelled rows `scripts/classify/fetch_sets.py` writes: one jsonl file per source under
//! `<data>/<family>/`. They are fetched data and never committed; the benchmark doc says how to
//! obtain them.

use serde::Deserialize;
use std::{fs, io, path::Path};

/// One earlier turn of a row's conversation.
#[derive(Clone, Debug, Deserialize)]
pub struct ContextTurn {
    pub role: String,
    pub text: String,
}

/// One labelled prompt: what both models' answers were worth.
#[derive(Clone, Debug, Deserialize)]
pub struct Row {
    pub id: String,
    /// The leave-one-benchmark-out unit.
    pub family: String,
    pub source: String,
    /// The last user turn as the models saw it.
    pub prompt: String,
    #[serde(default)]
    pub context: Vec<ContextTurn>,
    pub q_strong: f64,
    pub q_weak: f64,
    pub needs_strong: bool,
    pub contaminated: bool,
    /// Whether the licence lets the shipped model be fitted on the row.
    pub train_ok: bool,
}

/// Why rows could not be read.
#[derive(Debug, thiserror::Error)]
pub enum RowsError {
    #[error("{path}: {error}")]
    Io { path: String, error: io::Error },
    #[error("{path}:{line}: {error}")]
    Json {
        path: String,
        line: usize,
        error: serde_json::Error,
    },
    #[error("{0}: no <family>/*.jsonl rows (run scripts/classify/fetch_sets.py first)")]
    Empty(String),
}

/// Every uncontaminated row under `data`, families and files in name order.
pub fn load(data: &Path) -> Result<Vec<Row>, RowsError> {
    let io_err = |p: &Path| {
        let path = p.display().to_string();
        move |error| RowsError::Io { path, error }
    };
    let mut dirs: Vec<_> = fs::read_dir(data)
        .map_err(io_err(data))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    let mut rows = Vec::new();
    for dir in dirs {
        let mut files: Vec<_> = fs::read_dir(&dir)
            .map_err(io_err(&dir))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
            .collect();
        files.sort();
        for f in files {
            let text = fs::read_to_string(&f).map_err(io_err(&f))?;
            for (i, line) in text
                .lines()
                .enumerate()
                .filter(|(_, l)| !l.trim().is_empty())
            {
                let row: Row = serde_json::from_str(line).map_err(|error| RowsError::Json {
                    path: f.display().to_string(),
                    line: i + 1,
                    error,
                })?;
                if !row.contaminated {
                    rows.push(row);
                }
            }
        }
    }
    if rows.is_empty() {
        return Err(RowsError::Empty(data.display().to_string()));
    }
    Ok(rows)
}

impl Row {
    /// The shipped classifier's explanation of the row, its conversation as the models saw it.
    pub fn explain(
        &self,
        set: &kinference_classify::ClassifierSet,
    ) -> kinference_classify::Explanation {
        use kinference_classify::{Prompt, Role, Turn};
        let mut turns: Vec<Turn<'_>> = self
            .context
            .iter()
            .map(|t| Turn {
                role: match t.role.as_str() {
                    "system" => Role::System,
                    "assistant" => Role::Assistant,
                    _ => Role::User,
                },
                text: &t.text,
            })
            .collect();
        turns.push(Turn {
            role: Role::User,
            text: &self.prompt,
        });
        set.explain(Prompt::Chat(&turns))
    }
}

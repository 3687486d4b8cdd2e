//! What-if replay reports (`kinfctl replay`), read from a directory for the experiment page.
//!
//! A replay runs recorded traffic through the current and a candidate policy in the fleet
//! simulation; its report is a file, not a time series, so viz reads it from a directory given
//! by `--replay-dir` rather than from Prometheus. Each `*.json` there is one report (the format is
//! in docs/rollout.md, "Replay reports"). A file that does not parse is named in the answer's
//! `errors` and the others are still shown: one bad report must not hide the rest.

use serde::{Deserialize, Serialize};
use std::path::Path;

/// At most this many reports are read (the newest names last, so sorted by name).
pub const MAX_REPORTS: usize = 200;
/// At most this many differing decisions of a report are sent to the page.
pub const MAX_DIFFERING: usize = 200;
/// A report file larger than this is refused rather than read.
pub const MAX_FILE_BYTES: u64 = 16 << 20;

/// One policy's side of a replay.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Side {
    /// The policy replayed (`namespace/name`, or the candidate's rollout name).
    #[serde(default)]
    pub policy: Option<String>,
    pub ttft_p50_s: Option<f64>,
    pub ttft_p90_s: Option<f64>,
    pub ttft_p99_s: Option<f64>,
    /// The share of requests sent to another model than the one requested.
    pub moved_share: Option<f64>,
    /// Cost of the replayed requests at the policy's prices.
    pub cost_usd: Option<f64>,
    /// The share of requests refused (admission control, budgets, no candidate).
    pub shed_rate: Option<f64>,
}

/// A request the two policies decided differently.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Differing {
    pub request_id: String,
    /// What the current policy chose: `model@endpoint`, or `shed`.
    pub current: String,
    /// What the candidate chose.
    pub candidate: String,
    /// The candidate decision's reason (`lowest_predicted_ttft`, a rule's name, ...).
    pub reason: String,
}

/// One replay report.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub name: String,
    /// The rollout this replay is about, when there is one: the page shows it beside that
    /// rollout.
    #[serde(default)]
    pub rollout: Option<String>,
    /// When the replay ran (RFC 3339).
    #[serde(default)]
    pub created: Option<String>,
    /// The recorded requests replayed.
    #[serde(default)]
    pub requests: Option<u64>,
    pub current: Side,
    pub candidate: Side,
    #[serde(default)]
    pub differing: Vec<Differing>,
}

/// A report as the API sends it: the file it came from, the differing decisions cut to
/// [`MAX_DIFFERING`] with their full count.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Loaded {
    pub file: String,
    #[serde(flatten)]
    pub report: Report,
    pub differing_total: usize,
}

/// Reads every `*.json` report in `dir`, sorted by file name; the second list names the files
/// (or the directory) that could not be read.
pub fn load(dir: &Path) -> (Vec<Loaded>, Vec<String>) {
    let mut errors = Vec::new();
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) => {
            return (
                Vec::new(),
                vec![format!("replay reports in {}: {e}", dir.display())],
            );
        }
    };
    let mut files: Vec<_> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json") && p.is_file())
        .collect();
    files.sort();
    if files.len() > MAX_REPORTS {
        errors.push(format!(
            "replay reports in {}: {} files, the last {MAX_REPORTS} shown",
            dir.display(),
            files.len()
        ));
        files.drain(..files.len() - MAX_REPORTS);
    }
    let mut out = Vec::new();
    for path in files {
        let file = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        match read(&path) {
            Ok(mut report) => {
                let differing_total = report.differing.len();
                report.differing.truncate(MAX_DIFFERING);
                out.push(Loaded {
                    file,
                    report,
                    differing_total,
                });
            }
            Err(e) => errors.push(format!("replay report {file}: {e}")),
        }
    }
    (out, errors)
}

fn read(path: &Path) -> anyhow::Result<Report> {
    let len = std::fs::metadata(path)?.len();
    anyhow::ensure!(
        len <= MAX_FILE_BYTES,
        "{len} bytes, more than {MAX_FILE_BYTES}"
    );
    let report: Report = serde_json::from_slice(&std::fs::read(path)?)?;
    anyhow::ensure!(!report.name.is_empty(), "no name");
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    const REPORT: &str = r#"{
      "name": "cheaper vs current, 10:00-11:00",
      "rollout": "cheaper",
      "requests": 1200,
      "current": {"policy": "default/llm", "ttft_p50_s": 0.41, "ttft_p90_s": 0.9, "ttft_p99_s": 1.6,
                  "moved_share": 0.1, "cost_usd": 1.25, "shed_rate": 0.0},
      "candidate": {"ttft_p50_s": 0.45, "ttft_p90_s": 1.1, "ttft_p99_s": 2.0,
                    "moved_share": 0.35, "cost_usd": 0.8, "shed_rate": 0.01, "future_field": 1},
      "differing": [{"request_id": "r-1", "current": "glm-5.3@10.0.0.1:8000",
                     "candidate": "qwen-3.6-27b@10.0.0.2:8000", "reason": "low-complexity-may-use-qwen"}]
    }"#;

    #[test]
    fn reports_load_sorted_and_a_bad_file_is_named_not_fatal() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("b.json"), REPORT).unwrap();
        let mut many: Report = serde_json::from_str(REPORT).unwrap();
        many.name = "a".into();
        many.differing = (0..MAX_DIFFERING + 5)
            .map(|i| Differing {
                request_id: format!("r-{i}"),
                current: "x".into(),
                candidate: "y".into(),
                reason: "z".into(),
            })
            .collect();
        std::fs::write(
            dir.path().join("a.json"),
            serde_json::to_string(&many).unwrap(),
        )
        .unwrap();
        std::fs::write(dir.path().join("c.json"), r#"{"name": "no sides"}"#).unwrap();
        std::fs::write(dir.path().join("notes.txt"), "not a report").unwrap();
        let (reports, errors) = load(dir.path());
        assert_eq!(
            reports.iter().map(|r| r.file.as_str()).collect::<Vec<_>>(),
            ["a.json", "b.json"]
        );
        assert_eq!(reports[0].differing_total, MAX_DIFFERING + 5);
        assert_eq!(reports[0].report.differing.len(), MAX_DIFFERING);
        let b = &reports[1].report;
        assert_eq!(b.rollout.as_deref(), Some("cheaper"));
        assert_eq!(b.candidate.ttft_p90_s, Some(1.1));
        assert_eq!(b.current.policy.as_deref(), Some("default/llm"));
        assert_eq!(b.differing[0].reason, "low-complexity-may-use-qwen");
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(errors[0].contains("c.json"), "{errors:?}");
        // The API's shape: the report's fields at the top level beside the file.
        let v = serde_json::to_value(&reports[1]).unwrap();
        assert_eq!(v["file"], "b.json");
        assert_eq!(v["current"]["cost_usd"], 1.25);
        assert_eq!(v["differing_total"], 1);
    }

    #[test]
    fn a_missing_directory_is_an_error() {
        let (reports, errors) = load(Path::new("/nonexistent/kinference-replays"));
        assert!(reports.is_empty());
        assert!(
            errors[0].contains("/nonexistent/kinference-replays"),
            "{errors:?}"
        );
    }
}

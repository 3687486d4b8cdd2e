//! The explanation as a person reads it.
//!
//! The JSON is the proxy's dry run (`kinference_decision::explain`), whatever computed it;
//! this module reads the parts a person needs into plain types (tolerant of fields it does not
//! know, so a newer proxy still renders) and lays them out as tables. Rendering is a pure
//! function of the report, tested here on fixed inputs.

use serde::Deserialize;
use std::fmt::Write as _;

/// How to print the explanation.
#[derive(Copy, Clone, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    Table,
    Json,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct Source {
    /// Where the policy came from: `proxy URL`, `manifests DIR` or `cluster`.
    pub policy: String,
    pub target: Option<String>,
    /// Where predictions came from (a proxy), if anywhere.
    pub predictions: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct PolicyView {
    pub revision: String,
    pub mode: String,
    pub failure_mode: String,
    pub freshness_budget_s: f64,
    pub tie_window_s: f64,
    pub status_message: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct Feature {
    pub feature: String,
    pub weight: f64,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct TagView {
    pub name: String,
    pub value: String,
    pub confidence: f64,
    /// The classifier, as `{"kind": ..., "detail": ...}`.
    pub source: serde_json::Value,
    pub score: Option<f64>,
    pub features: Vec<Feature>,
}

impl TagView {
    pub fn classifier(&self) -> String {
        let kind = self.source["kind"].as_str().unwrap_or("?");
        match &self.source["detail"] {
            serde_json::Value::String(d) => format!("{kind}/{d}"),
            _ => kind.to_string(),
        }
    }
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct Explanation {
    pub tags: Vec<TagView>,
}

/// A tag the policy declares that was not computed, and why.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct Unavailable {
    pub tag: String,
    pub reason: String,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct RuleTrace {
    pub rule: String,
    pub matched: bool,
}

/// A matched rule's quality guard, for the prompt's family (`/debug/explain`'s `guards`).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct GuardView {
    pub rule: String,
    pub family: String,
    pub tenant: Option<String>,
    pub state: String,
    pub samples: u32,
    pub min_samples: u32,
    pub gap: Option<f64>,
    pub tolerance: f64,
    pub capped_share: f64,
}

impl GuardView {
    fn describe(&self) -> String {
        let who = self
            .tenant
            .as_deref()
            .map_or(String::new(), |t| format!("{t}, "));
        let measured = match self.gap {
            Some(g) => format!(
                "gap {g:.2} over {} of {} samples, tolerance {:.2}",
                self.samples, self.min_samples, self.tolerance
            ),
            None => format!("no verdicts yet, {} needed", self.min_samples),
        };
        let does = match self.state.as_str() {
            "measuring" => format!("moves at most {:.0}%", self.capped_share * 100.0),
            "suspended" => "moves nothing".into(),
            _ => "applies in full".into(),
        };
        format!(
            "{} ({who}family {}: {measured}; {does})",
            self.state, self.family
        )
    }
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct Candidates {
    pub requested_model: String,
    pub models: Vec<String>,
    pub service_class: String,
    pub rule_trace: Vec<RuleTrace>,
}

#[derive(Clone, Copy, Debug, Default, Deserialize)]
#[serde(default)]
pub struct Signal {
    pub value: f64,
    pub age_s: f64,
    /// Within the freshness budget, and so used.
    pub used: bool,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct Prediction {
    pub prompt_tokens: u32,
    pub cached_tokens: u32,
    pub prefix_source: Option<String>,
    pub reported_waiting: Option<Signal>,
    pub reported_running: Option<Signal>,
    pub kv_cache_usage: Option<Signal>,
    /// Requests `GET /load` counted beyond the scheduler's gauges (sent during the step in
    /// progress).
    pub unpublished_requests: u32,
    /// How long the engine step in progress had run, timed by the proxy's own streams.
    pub step_elapsed_s: Option<f64>,
    pub own_awaiting_first_token: u32,
    pub own_decoding: u32,
    pub wait_s: f64,
    pub prefill_s: f64,
    pub raw_ttft_s: f64,
    pub correction: f64,
    pub predicted_ttft_s: f64,
    pub selection_cost_s: f64,
    pub signals_fresh: bool,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct P2c {
    pub latency_ewma_s: f64,
    pub pending_requests: u32,
    pub cost: f64,
    pub sampled: bool,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct Candidate {
    pub endpoint: String,
    pub model: String,
    pub prediction: Prediction,
    pub p2c: Option<P2c>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct Excluded {
    pub endpoint: String,
    pub model: String,
    pub why: String,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct Reason {
    pub kind: String,
    pub tied: Option<u32>,
    pub eligible: Option<u32>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct Decision {
    pub requested_model: String,
    pub reason: Reason,
    pub chosen: Option<usize>,
    pub candidates: Vec<Candidate>,
    pub excluded: Vec<Excluded>,
    pub tie_window_s: f64,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct Routing {
    pub models: Vec<String>,
    pub decision: Decision,
    pub order: Vec<String>,
    pub refused: Option<String>,
    pub objective: Option<ObjectiveView>,
}

/// What the policy's objective decided (`kinference_decision::ObjectiveOutcome`).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct ObjectiveView {
    pub objective: String,
    pub decided_by: String,
    pub ttft_slo_s: Option<f64>,
    pub tolerance_s: Option<f64>,
    pub fastest: usize,
    pub ttft_given_up_s: f64,
    pub chosen_cost: f64,
    pub fastest_cost: f64,
}

impl ObjectiveView {
    /// One line: the objective, and why the choice is the one it is.
    fn describe(&self, d: &Decision) -> String {
        let fastest = d
            .candidates
            .get(self.fastest)
            .map_or("?", |c| c.endpoint.as_str());
        let what = match (self.objective.as_str(), self.ttft_slo_s, self.tolerance_s) {
            ("cheapest_within_slo", Some(slo), _) => format!("cheapest within SLO {}", secs(slo)),
            ("lowest_ttft", _, Some(t)) => {
                format!("lowest TTFT, a cheaper candidate within {}", secs(t))
            }
            (o, _, _) => o.replace('_', " "),
        };
        let why = match self.decided_by.as_str() {
            "fastest" => "the fastest".to_string(),
            "cheaper_within_tolerance" | "cheapest_within_slo" if self.ttft_given_up_s > 0.0 => {
                format!(
                    "{} later than the fastest ({fastest}) for {:.6} instead of {:.6}",
                    secs(self.ttft_given_up_s),
                    self.chosen_cost,
                    self.fastest_cost
                )
            }
            "cheapest_within_slo" => "the fastest is also the cheapest within the SLO".into(),
            "none_within_slo" => "no candidate is predicted within the SLO: the fastest".into(),
            "fallback" => "prediction fell back: the fallback's pick".into(),
            other => other.replace('_', " "),
        };
        format!("{what}: {why}")
    }
}

/// What `kinfctl explain` prints.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct Report {
    pub requested_model: String,
    pub prompt_tokens: u32,
    pub policy: PolicyView,
    pub explanation: Explanation,
    /// Declared tags that could not be computed (rules on them do not match).
    pub unavailable_tags: Vec<Unavailable>,
    pub candidates: Option<Candidates>,
    pub routing: Option<Routing>,
    /// The quality guards of the matched rules (from a proxy; empty from a declared policy).
    pub guards: Vec<GuardView>,
    pub source: Source,
    /// The proxy's own policy, when predictions came from a proxy over a declared policy.
    pub live_policy: Option<PolicyView>,
}

/// Seconds as a person reads a latency or an age.
fn secs(s: f64) -> String {
    if !s.is_finite() {
        "∞".into()
    } else if s < 1.0 {
        format!("{:.1}ms", s * 1e3)
    } else {
        format!("{s:.2}s")
    }
}

/// A reported signal with its age; stale ones (not used) are marked.
fn signal(s: Option<Signal>, fraction: bool) -> String {
    match s {
        None => "-".into(),
        Some(s) => {
            let v = if fraction {
                format!("{:.2}", s.value)
            } else {
                format!("{}", s.value.round() as i64)
            };
            let stale = if s.used { "" } else { " stale" };
            format!("{v} ({}{stale})", secs(s.age_s))
        }
    }
}

/// Lays out rows in aligned columns, two spaces apart, indented by two.
fn table(out: &mut String, rows: &[Vec<String>]) {
    let n = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..n)
        .map(|i| {
            rows.iter()
                .filter_map(|r| r.get(i))
                .map(|c| c.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    for r in rows {
        let mut line = String::from("  ");
        for (i, cell) in r.iter().enumerate() {
            line.push_str(cell);
            if i + 1 < r.len() {
                let pad = widths[i] - cell.chars().count() + 2;
                line.extend(std::iter::repeat_n(' ', pad));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
}

impl Reason {
    fn describe(&self, d: &Decision) -> String {
        match self.kind.as_str() {
            "lowest_predicted_ttft" => "lowest predicted TTFT".into(),
            "tie_broken" => format!(
                "{} endpoints predicted within the tie window ({}); of two drawn at random, the one \
                 using less of its KV cache",
                self.tied.unwrap_or(0),
                secs(d.tie_window_s)
            ),
            "prefix_affinity" => format!(
                "{} endpoints of one model predicted within the affinity slack (the KV cache is \
                 short); the one holding most of the prompt, then the prompt's home endpoint, won",
                self.eligible.unwrap_or(0)
            ),
            "fallback_stale_signals" => format!(
                "fallback: every candidate's signals are older than the freshness budget, so \
                 peak-EWMA power of two over {}'s endpoints",
                d.requested_model
            ),
            "fallback_no_signals" => format!(
                "fallback: no candidate has reported signals yet, so peak-EWMA power of two over \
                 {}'s endpoints",
                d.requested_model
            ),
            "no_candidates" => "no ready endpoint serves the allowed models".into(),
            other => other.replace('_', " "),
        }
    }
}

impl Report {
    /// The chosen endpoint of the decision, if any.
    pub fn chosen(&self) -> Option<&Candidate> {
        let d = &self.routing.as_ref()?.decision;
        d.chosen.and_then(|i| d.candidates.get(i))
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        let p = &self.policy;
        let _ = writeln!(
            out,
            "Request   {}, about {} prompt tokens",
            self.requested_model, self.prompt_tokens
        );
        let _ = writeln!(
            out,
            "Policy    {}, revision {} ({}, {}, signals fresh for {})",
            self.source.policy,
            if p.revision.is_empty() {
                "-"
            } else {
                &p.revision
            },
            p.mode,
            p.failure_mode,
            secs(p.freshness_budget_s)
        );
        if let Some(t) = &self.source.target {
            let _ = writeln!(out, "Target    {t}");
        }
        if let Some(msg) = &p.status_message {
            let _ = writeln!(out, "Status    not served: {msg}");
        }

        out.push_str("\nTags\n");
        if self.explanation.tags.is_empty() {
            out.push_str("  (the policy declares no classifier)\n");
        } else {
            let mut rows = vec![
                [
                    "TAG",
                    "VALUE",
                    "CONFIDENCE",
                    "CLASSIFIER",
                    "SCORE",
                    "DRIVEN BY",
                ]
                .map(String::from)
                .to_vec(),
            ];
            for t in &self.explanation.tags {
                let features: Vec<String> = t
                    .features
                    .iter()
                    .take(3)
                    .map(|f| format!("{} {:+.2}", f.feature, f.weight))
                    .collect();
                rows.push(vec![
                    t.name.clone(),
                    t.value.clone(),
                    format!("{:.2}", t.confidence),
                    t.classifier(),
                    t.score.map_or_else(|| "-".into(), |s| format!("{s:.3}")),
                    if features.is_empty() {
                        "-".into()
                    } else {
                        features.join(", ")
                    },
                ]);
            }
            table(&mut out, &rows);
        }
        for u in &self.unavailable_tags {
            let _ = writeln!(out, "  not computed: {} ({})", u.tag, u.reason);
        }

        out.push_str("\nRules\n");
        let Some(c) = &self.candidates else {
            let _ = writeln!(
                out,
                "  {} is neither a model nor an alias of the policy",
                self.requested_model
            );
            return out;
        };
        if c.rule_trace.is_empty() {
            out.push_str("  (the policy has no rules)\n");
        } else {
            // The guard column only where a matched rule has a guard.
            let guarded = !self.guards.is_empty();
            let mut head = vec!["RULE".to_string(), "MATCHED".to_string()];
            if guarded {
                head.push("QUALITY GUARD".to_string());
            }
            let mut rows = vec![head];
            for r in &c.rule_trace {
                let mut row = vec![
                    r.rule.clone(),
                    if r.matched { "yes" } else { "no" }.to_string(),
                ];
                if guarded {
                    let guard: Vec<String> = self
                        .guards
                        .iter()
                        .filter(|g| g.rule == r.rule)
                        .map(GuardView::describe)
                        .collect();
                    row.push(if guard.is_empty() {
                        "-".to_string()
                    } else {
                        guard.join("; ")
                    });
                }
                rows.push(row);
            }
            table(&mut out, &rows);
        }
        let _ = writeln!(
            out,
            "\nCandidates  {} (requested {}, service class {})",
            if c.models.is_empty() {
                "none".to_string()
            } else {
                c.models.join(", ")
            },
            c.requested_model,
            c.service_class
        );

        out.push_str("\nEndpoints\n");
        let Some(r) = &self.routing else {
            out.push_str(
                "  live predictions need a proxy: add --proxy <admin URL> (e.g. http://127.0.0.1:4191)\n",
            );
            return out;
        };
        if let Some(live) = &self.live_policy
            && live.revision != p.revision
        {
            let _ = writeln!(
                out,
                "  (the proxy holds policy revision {}; these predictions are over the candidates above)",
                live.revision
            );
        }
        let d = &r.decision;
        if d.candidates.is_empty() {
            out.push_str("  (no ready endpoint)\n");
        } else {
            let mut rows = vec![
                [
                    "ENDPOINT",
                    "MODEL",
                    "PREDICTED",
                    "QUEUE (AGE)",
                    "RUNNING (AGE)",
                    "KV USE (AGE)",
                    "CACHED",
                    "OWN",
                    "STEP",
                    "WAIT",
                    "PREFILL",
                    "CORRECTION",
                    "COST",
                ]
                .map(String::from)
                .to_vec(),
            ];
            for (i, cand) in d.candidates.iter().enumerate() {
                let pr = &cand.prediction;
                let mark = if d.chosen == Some(i) { "*" } else { "" };
                rows.push(vec![
                    format!("{}{mark}", cand.endpoint),
                    cand.model.clone(),
                    secs(pr.predicted_ttft_s),
                    match pr.unpublished_requests {
                        0 => signal(pr.reported_waiting, false),
                        n => format!("{}+{n}", signal(pr.reported_waiting, false)),
                    },
                    signal(pr.reported_running, false),
                    signal(pr.kv_cache_usage, true),
                    format!("{}/{}", pr.cached_tokens, pr.prompt_tokens),
                    (pr.own_awaiting_first_token + pr.own_decoding).to_string(),
                    pr.step_elapsed_s.map_or_else(|| "-".into(), secs),
                    secs(pr.wait_s),
                    secs(pr.prefill_s),
                    format!("x{:.2}", pr.correction),
                    secs(pr.selection_cost_s),
                ]);
            }
            table(&mut out, &rows);
            out.push_str(
                "  (QUEUE, RUNNING, KV USE: scraped, with their age, QUEUE +N: requests vLLM's \
                 GET /load counted since; CACHED: prompt tokens in the endpoint's prefix cache; \
                 OWN: this proxy's requests in flight; STEP: how long the engine step under way \
                 had run, timed by this proxy's streams; CORRECTION: peak-EWMA of \
                 observed/predicted TTFT; COST: what the choice minimises, the TTFT with the \
                 queue as scraped (no work taken as under way) and what the request costs those \
                 queued behind it)\n",
            );
        }
        for e in &d.excluded {
            let _ = writeln!(
                out,
                "  excluded {} ({}): {}",
                e.endpoint,
                e.model,
                e.why.replace('_', " ")
            );
        }

        out.push('\n');
        match self.chosen() {
            Some(c) => {
                let _ = writeln!(
                    out,
                    "Choice    {} ({}), predicted TTFT {}: {}",
                    c.endpoint,
                    c.model,
                    secs(c.prediction.predicted_ttft_s),
                    d.reason.describe(d)
                );
            }
            None => {
                let _ = writeln!(out, "Choice    none: {}", d.reason.describe(d));
            }
        }
        if let Some(o) = &r.objective {
            let _ = writeln!(out, "Objective {}", o.describe(d));
        }
        match (&r.refused, r.order.split_first()) {
            (Some(why), _) => {
                let _ = writeln!(out, "Outcome   refused (503): {why}");
            }
            (None, Some((first, rest))) => {
                let shadow = if p.mode == "shadow" {
                    " (shadow mode: plain balancing over the requested model's pool)"
                } else {
                    ""
                };
                let then = if rest.is_empty() {
                    String::new()
                } else {
                    format!(", then {} on failure", rest.join(", "))
                };
                let _ = writeln!(out, "Sent to   {first}{shadow}{then}");
            }
            (None, None) => {}
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sig(value: f64, age_s: f64, used: bool) -> serde_json::Value {
        json!({"value": value, "age_s": age_s, "used": used})
    }

    fn report() -> serde_json::Value {
        json!({
            "requested_model": "glm-5.3",
            "prompt_tokens": 23,
            "policy": {"revision": "r7", "mode": "enforce", "failure_mode": "fail_open",
                       "freshness_budget_s": 0.5, "tie_window_s": 0.005},
            "explanation": {"tags": [
                {"name": "complexity", "value": "low", "confidence": 0.83,
                 "source": {"kind": "complexity"}, "score": 0.12,
                 "features": [{"feature": "dense:length", "weight": -1.2},
                              {"feature": "keyword#2", "weight": 0.4}]},
                {"name": "pii", "value": "email", "confidence": 1.0,
                 "source": {"kind": "detector", "detail": "pii"}, "score": null, "features": []},
            ]},
            "candidates": {"requested_model": "glm-5.3", "models": ["glm-5.3", "qwen-3.6-27b"],
                           "service_class": "Standard",
                           "rule_trace": [{"rule": "low-complexity-may-use-qwen", "matched": true}]},
            "routing": {
                "models": ["glm-5.3", "qwen-3.6-27b"],
                "decision": {
                    "requested_model": "glm-5.3",
                    "reason": {"kind": "lowest_predicted_ttft"},
                    "chosen": 1,
                    "tie_window_s": 0.005,
                    "candidates": [
                        {"endpoint": "127.0.0.1:8001", "model": "glm-5.3", "prediction": {
                            "prompt_tokens": 23, "cached_tokens": 16,
                            "reported_waiting": sig(3.0, 0.04, true),
                            "reported_running": sig(2.0, 0.04, true),
                            "kv_cache_usage": sig(0.25, 0.04, true),
                            "unpublished_requests": 2, "step_elapsed_s": 0.007,
                            "own_awaiting_first_token": 1, "own_decoding": 0,
                            "wait_s": 0.02, "prefill_s": 0.004, "correction": 1.1,
                            "predicted_ttft_s": 0.031, "selection_cost_s": 0.04, "signals_fresh": true}},
                        {"endpoint": "127.0.0.1:8003", "model": "qwen-3.6-27b", "prediction": {
                            "prompt_tokens": 23, "cached_tokens": 0,
                            "reported_waiting": sig(0.0, 1.5, false),
                            "wait_s": 0.0, "prefill_s": 0.006, "correction": 1.0,
                            "predicted_ttft_s": 0.009, "selection_cost_s": 0.009, "signals_fresh": false}},
                    ],
                    "excluded": [{"endpoint": "127.0.0.1:8004", "model": "qwen-3.6-27b", "why": "not_ready"}],
                },
                "endpoints": [],
                "order": ["127.0.0.1:8003", "127.0.0.1:8001"],
            },
            "source": {"policy": "proxy http://127.0.0.1:4191", "predictions": "proxy http://127.0.0.1:4191"},
        })
    }

    fn render(v: serde_json::Value) -> String {
        serde_json::from_value::<Report>(v).unwrap().render()
    }

    #[test]
    fn a_matched_rules_quality_guard_is_shown_with_what_it_allows() {
        let mut v = report();
        v["guards"] = json!([{"rule": "low-complexity-may-use-qwen", "family": "math",
            "tenant": "default/app", "state": "suspended", "samples": 4, "min_samples": 4,
            "gap": 1.0, "tolerance": 0.1, "capped_share": 0.5}]);
        let text = render(v);
        assert!(
            text.contains("  low-complexity-may-use-qwen  yes      suspended (default/app, family math: gap 1.00 over 4 of 4 samples, tolerance 0.10; moves nothing)\n"),
            "{text}"
        );
        let mut v = report();
        v["guards"] = json!([{"rule": "low-complexity-may-use-qwen", "family": "trivia",
            "tenant": null, "state": "measuring", "samples": 0, "min_samples": 50, "gap": null,
            "tolerance": 0.05, "capped_share": 0.1}]);
        let text = render(v);
        assert!(
            text.contains(
                "measuring (family trivia: no verdicts yet, 50 needed; moves at most 10%)"
            ),
            "{text}"
        );
    }

    #[test]
    fn a_decision_renders_tags_rules_inputs_and_the_choice() {
        let text = render(report());
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "Request   glm-5.3, about 23 prompt tokens");
        assert_eq!(
            lines[1],
            "Policy    proxy http://127.0.0.1:4191, revision r7 (enforce, fail_open, signals fresh for 500.0ms)"
        );
        // The tag table: aligned, with the classifier and the strongest features.
        let head = lines.iter().position(|l| l.starts_with("  TAG")).unwrap();
        assert_eq!(
            lines[head + 1],
            "  complexity  low    0.83        complexity    0.120  dense:length -1.20, keyword#2 +0.40"
        );
        assert_eq!(
            lines[head + 2],
            "  pii         email  1.00        detector/pii  -      -"
        );
        assert!(
            text.contains("  low-complexity-may-use-qwen  yes\n"),
            "{text}"
        );
        assert!(text.contains(
            "Candidates  glm-5.3, qwen-3.6-27b (requested glm-5.3, service class Standard)"
        ));
        // Each endpoint with its inputs and their ages; the chosen one starred; stale marked.
        let glm = lines
            .iter()
            .find(|l| l.starts_with("  127.0.0.1:8001 "))
            .unwrap();
        for cell in [
            "31.0ms",
            "3 (40.0ms)+2",
            "2 (40.0ms)",
            "7.0ms",
            "0.25 (40.0ms)",
            "16/23",
            "x1.10",
        ] {
            assert!(glm.contains(cell), "{cell} not in {glm:?}");
        }
        let qwen = lines
            .iter()
            .find(|l| l.starts_with("  127.0.0.1:8003*"))
            .unwrap();
        assert!(qwen.contains("0 (1.50s stale)  "), "{qwen}");
        assert!(text.contains("  excluded 127.0.0.1:8004 (qwen-3.6-27b): not ready\n"));
        assert!(text.contains(
            "Choice    127.0.0.1:8003 (qwen-3.6-27b), predicted TTFT 9.0ms: lowest predicted TTFT\n"
        ), "{text}");
        assert!(text.ends_with("Sent to   127.0.0.1:8003, then 127.0.0.1:8001 on failure\n"));
    }

    #[test]
    fn the_objective_says_what_it_decided_and_what_it_gave_up() {
        let mut v = report();
        v["routing"]["objective"] = json!({
            "objective": "cheapest_within_slo", "decided_by": "cheapest_within_slo",
            "ttft_slo_s": 2.0, "fastest": 0, "ttft_given_up_s": 0.12,
            "chosen_cost": 0.000013, "fastest_cost": 0.000040,
        });
        let text = render(v.clone());
        assert!(
            text.contains(
                "Objective cheapest within SLO 2.00s: 120.0ms later than the fastest \
                 (127.0.0.1:8001) for 0.000013 instead of 0.000040\n"
            ),
            "{text}"
        );
        v["routing"]["objective"]["decided_by"] = json!("none_within_slo");
        v["routing"]["objective"]["ttft_given_up_s"] = json!(0.0);
        assert!(render(v).contains(
            "Objective cheapest within SLO 2.00s: no candidate is predicted within the SLO: the fastest\n"
        ));
    }

    #[test]
    fn a_declared_policy_without_a_proxy_says_predictions_need_one() {
        let mut v = report();
        v.as_object_mut().unwrap().remove("routing");
        v["source"] =
            json!({"policy": "manifests examples", "target": "llm.default.svc.cluster.local:8000"});
        let text = render(v);
        assert!(text.contains("Target    llm.default.svc.cluster.local:8000\n"));
        assert!(text.ends_with(
            "Endpoints\n  live predictions need a proxy: add --proxy <admin URL> (e.g. http://127.0.0.1:4191)\n"
        ), "{text}");
    }

    #[test]
    fn fallbacks_refusals_ties_and_unknown_models_are_explained() {
        let mut v = report();
        v["routing"]["decision"]["reason"] = json!({"kind": "fallback_stale_signals"});
        v["routing"]["refused"] = json!("endpoint signals are stale and the policy fails closed");
        let text = render(v);
        assert!(text.contains("fallback: every candidate's signals are older than the freshness budget, so peak-EWMA power of two over glm-5.3's endpoints"), "{text}");
        assert!(text.ends_with(
            "Outcome   refused (503): endpoint signals are stale and the policy fails closed\n"
        ));

        let mut v = report();
        v["routing"]["decision"]["reason"] = json!({"kind": "tie_broken", "tied": 2});
        v["policy"]["mode"] = json!("shadow");
        let text = render(v);
        assert!(
            text.contains(
                "2 endpoints predicted within the tie window (5.0ms); of two drawn at random, the \
                 one using less of its KV cache"
            ),
            "{text}"
        );
        assert!(text.contains("Sent to   127.0.0.1:8003 (shadow mode"));

        let mut v = report();
        v.as_object_mut().unwrap().remove("candidates");
        v["requested_model"] = json!("gpt-9");
        v["unavailable_tags"] =
            json!([{"tag": "support", "reason": "no MiniLM encoder was loaded"}]);
        let text = render(v);
        assert!(text.ends_with("Rules\n  gpt-9 is neither a model nor an alias of the policy\n"));
        assert!(
            text.contains("  not computed: support (no MiniLM encoder was loaded)\n"),
            "{text}"
        );
    }
}

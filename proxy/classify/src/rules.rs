//! Keyword and regex rules declared in the resource.
//!
//! A platform team knows words that matter to it ("contract", "diagnosis", an internal project
//! name). Keywords run through one Aho-Corasick automaton per tag and case mode, regexes through one
//! `RegexSet` per tag, both built once when the resource arrives; weights of what matched add up to a
//! confidence `1 - exp(-sum)`, and the tag is set when that reaches the declared minimum.

use crate::{
    ClassifierId,
    definition::{KeywordRule, RegexRule},
    input::View,
    tag::Out,
};
use aho_corasick::AhoCorasick;
use regex::RegexSet;

/// Why a rules tag could not be built.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum RulesError {
    #[error("keyword rule {rule} has no keywords")]
    EmptyKeywords { rule: usize },
    #[error("keyword rule {rule} has an empty keyword")]
    EmptyKeyword { rule: usize },
    #[error("regex rule {rule} has no patterns")]
    EmptyPatterns { rule: usize },
    #[error("regex rule {rule}: invalid pattern {pattern:?}: {error}")]
    InvalidRegex {
        rule: usize,
        pattern: String,
        error: String,
    },
    #[error("rule {rule} has weight {weight}; weights must be in (0, 1]")]
    BadWeight { rule: usize, weight: f32 },
    #[error("the regexes could not be compiled together: {0}")]
    Regexes(String),
    #[error("keywords could not be compiled: {0}")]
    Keywords(String),
    #[error("no keyword or regex rules")]
    NoRules,
    #[error("min confidence {0} is outside [0, 1]")]
    BadMinConfidence(f32),
}

#[derive(Debug)]
struct Automaton {
    ac: AhoCorasick,
    /// Per pattern: its rule's weight and index.
    weights: Vec<(f32, usize)>,
}

/// A compiled rules tag.
#[derive(Debug)]
pub(crate) struct Rules {
    name: String,
    value: String,
    otherwise: Option<String>,
    min_confidence: f32,
    automata: Vec<Automaton>,
    regexes: Option<(RegexSet, Vec<(f32, usize)>)>,
}

impl Rules {
    pub fn new(
        name: &str,
        value: &str,
        otherwise: Option<&str>,
        keywords: &[KeywordRule],
        regexes: &[RegexRule],
        min_confidence: f32,
    ) -> Result<Self, RulesError> {
        if keywords.is_empty() && regexes.is_empty() {
            return Err(RulesError::NoRules);
        }
        if !(0.0..=1.0).contains(&min_confidence) {
            return Err(RulesError::BadMinConfidence(min_confidence));
        }
        let mut automata = Vec::new();
        for case_sensitive in [true, false] {
            let mut patterns = Vec::new();
            let mut weights = Vec::new();
            for (i, r) in keywords.iter().enumerate() {
                if r.values.is_empty() {
                    return Err(RulesError::EmptyKeywords { rule: i });
                }
                check_weight(i, r.weight)?;
                if r.case_sensitive != case_sensitive {
                    continue;
                }
                for v in &r.values {
                    if v.is_empty() {
                        return Err(RulesError::EmptyKeyword { rule: i });
                    }
                    patterns.push(v.as_str());
                    weights.push((r.weight, i));
                }
            }
            if patterns.is_empty() {
                continue;
            }
            let ac = AhoCorasick::builder()
                .ascii_case_insensitive(!case_sensitive)
                .build(&patterns)
                .map_err(|e| RulesError::Keywords(e.to_string()))?;
            automata.push(Automaton { ac, weights });
        }
        let regexes = if regexes.is_empty() {
            None
        } else {
            let mut patterns = Vec::new();
            let mut weights = Vec::new();
            for (i, r) in regexes.iter().enumerate() {
                if r.patterns.is_empty() {
                    return Err(RulesError::EmptyPatterns { rule: i });
                }
                check_weight(i, r.weight)?;
                for p in &r.patterns {
                    // Compile alone first, for a message that names the bad pattern.
                    regex::Regex::new(p).map_err(|e| RulesError::InvalidRegex {
                        rule: i,
                        pattern: p.clone(),
                        error: e.to_string(),
                    })?;
                    patterns.push(p.as_str());
                    weights.push((r.weight, i));
                }
            }
            let set = RegexSet::new(&patterns).map_err(|e| RulesError::Regexes(e.to_string()))?;
            Some((set, weights))
        };
        Ok(Self {
            name: name.to_string(),
            value: value.to_string(),
            otherwise: otherwise.map(str::to_string),
            min_confidence,
            automata,
            regexes,
        })
    }

    /// The product of `1 - weight` over what matched, and per match a feature name (`keyword#i`, `regex#i`).
    fn matches(&self, view: &View<'_>, features: Option<&mut Vec<(String, f32)>>) -> f32 {
        let mut miss = 1.0f32;
        let mut feats = Vec::new();
        for (a, automaton) in self.automata.iter().enumerate() {
            let mut seen = vec![false; automaton.weights.len()];
            for piece in view.last_turn() {
                for m in automaton.ac.find_overlapping_iter(piece) {
                    seen[m.pattern().as_usize()] = true;
                }
            }
            for (p, _) in seen.iter().enumerate().filter(|(_, s)| **s) {
                let (w, rule) = automaton.weights[p];
                miss *= 1.0 - w;
                if features.is_some() {
                    feats.push((format!("keyword:rule{rule}:automaton{a}#{p}"), w));
                }
            }
        }
        if let Some((set, weights)) = &self.regexes {
            let mut seen = vec![false; weights.len()];
            for piece in view.last_turn() {
                for p in set.matches(piece).iter() {
                    seen[p] = true;
                }
            }
            for (p, _) in seen.iter().enumerate().filter(|(_, s)| **s) {
                let (w, rule) = weights[p];
                miss *= 1.0 - w;
                if features.is_some() {
                    feats.push((format!("regex:rule{rule}#{p}"), w));
                }
            }
        }
        if let Some(f) = features {
            *f = feats;
        }
        miss
    }

    pub fn classify(&self, view: &View<'_>, out: &mut Out) {
        let mut feats = Vec::new();
        let miss = self.matches(view, out.explain.then_some(&mut feats));
        let confidence = 1.0 - miss;
        if confidence > 0.0 && confidence >= self.min_confidence {
            out.push(
                &self.name,
                &self.value,
                confidence,
                ClassifierId::Rules,
                Some(confidence),
                || feats,
            );
        } else if let Some(otherwise) = &self.otherwise {
            out.push(
                &self.name,
                otherwise,
                1.0 - confidence,
                ClassifierId::Rules,
                Some(confidence),
                || feats,
            );
        }
    }
}

fn check_weight(rule: usize, weight: f32) -> Result<(), RulesError> {
    if weight > 0.0 && weight <= 1.0 {
        Ok(())
    } else {
        Err(RulesError::BadWeight { rule, weight })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Limits, Prompt};

    fn kw(values: &[&str], weight: f32, case_sensitive: bool) -> KeywordRule {
        KeywordRule {
            values: values.iter().map(|s| s.to_string()).collect(),
            weight,
            case_sensitive,
        }
    }

    fn run(rules: &Rules, text: &str, explain: bool) -> Out {
        let mut out = Out::new(explain);
        rules.classify(
            &View::new(Prompt::Completion(text), Limits::default()),
            &mut out,
        );
        out
    }

    #[test]
    fn keyword_weights_combine_into_confidence() {
        let rules = Rules::new(
            "legal",
            "true",
            None,
            &[
                kw(&["contract", "liability"], 0.5, false),
                kw(&["NDA"], 1.0, true),
            ],
            &[],
            0.3,
        )
        .unwrap();
        let out = run(
            &rules,
            "Review this CONTRACT for liability; contract again.",
            true,
        );
        let t = &out.tags[0];
        assert_eq!(t.tag.value, "true");
        // Two distinct keywords of weight 0.5: 1 - 0.5^2.
        assert!((t.tag.confidence - 0.75).abs() < 1e-6);
        assert_eq!(t.features.len(), 2);
        // Case-sensitive: "nda" does not match "NDA".
        let out = run(&rules, "sign the nda", false);
        assert!(out.tags.is_empty());
        let out = run(&rules, "sign the NDA", false);
        assert!((out.tags[0].tag.confidence - 1.0).abs() < 1e-6);
    }

    #[test]
    fn below_min_confidence_sets_nothing() {
        let contract = [kw(&["contract"], 0.1, false)];
        let rules = Rules::new("legal", "true", None, &contract, &[], 0.5).unwrap();
        assert!(run(&rules, "a contract", false).tags.is_empty());
        assert!(run(&rules, "nothing here", false).tags.is_empty());
        // With an `otherwise` value the tag is always set.
        let rules = Rules::new("legal", "true", Some("false"), &contract, &[], 0.5).unwrap();
        let out = run(&rules, "a contract", false);
        assert_eq!(out.tags[0].tag.value, "false");
        assert!((out.tags[0].tag.confidence - 0.9).abs() < 1e-6);
        let out = run(&rules, "nothing here", false);
        let t = &out.tags[0].tag;
        assert_eq!((t.value.as_str(), t.confidence), ("false", 1.0));
    }

    #[test]
    fn regex_weights() {
        let rules = Rules::new(
            "ticket",
            "jira",
            None,
            &[],
            &[RegexRule {
                patterns: vec![r"\b[A-Z]{2,5}-\d+\b".into(), r"(?i)\bsprint\b".into()],
                weight: 0.6,
            }],
            0.5,
        )
        .unwrap();
        let out = run(&rules, "Fix ABC-123 before the Sprint ends", false);
        assert_eq!(out.tags[0].tag.value, "jira");
        // Two patterns of weight 0.6: 1 - 0.4^2.
        assert!((out.tags[0].tag.confidence - 0.84).abs() < 1e-6);
        assert!(run(&rules, "fix abc-123", false).tags.is_empty());
    }

    #[test]
    fn bad_rules() {
        let err = Rules::new("t", "v", None, &[kw(&[], 1.0, false)], &[], 0.1).unwrap_err();
        assert_eq!(err.to_string(), "keyword rule 0 has no keywords");
        let err = Rules::new(
            "t",
            "v",
            None,
            &[],
            &[RegexRule {
                patterns: vec!["(unclosed".into()],
                weight: 1.0,
            }],
            0.1,
        )
        .unwrap_err();
        assert!(
            err.to_string()
                .starts_with("regex rule 0: invalid pattern \"(unclosed\": regex parse error"),
            "{err}"
        );
        let err = Rules::new("t", "v", None, &[kw(&["x"], 0.0, false)], &[], 0.1).unwrap_err();
        assert_eq!(
            err.to_string(),
            "rule 0 has weight 0; weights must be in (0, 1]"
        );
        let err = Rules::new("t", "v", None, &[kw(&["x"], 1.5, false)], &[], 0.1).unwrap_err();
        assert_eq!(
            err,
            RulesError::BadWeight {
                rule: 0,
                weight: 1.5
            }
        );
        assert_eq!(
            Rules::new("t", "v", None, &[], &[], 0.1).unwrap_err(),
            RulesError::NoRules
        );
        let err = Rules::new("t", "v", None, &[kw(&["x"], 1.0, false)], &[], 1.5).unwrap_err();
        assert_eq!(err, RulesError::BadMinConfidence(1.5));
    }
}

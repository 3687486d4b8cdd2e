//! Rule matching and actions: how a request's candidate models are built.
//!
//! The candidate set starts as the requested model. Each rule, in order, applies when every
//! non-empty part of its match holds (requested model or alias, tags with a minimum confidence,
//! workload), and its action adds models, restricts the set, rewrites it to one model, or sets the
//! service class. The trace of which rules matched goes into the decision record.

use super::{Model, Policy, Workload};
use crate::guard::{Hold, QualityGuard};
use kinference_classify::Tags;
use std::collections::BTreeMap;

#[derive(Clone, Debug, PartialEq)]
pub struct TagMatch {
    pub name: String,
    pub values: Vec<String>,
    pub min_confidence: f32,
}

#[derive(Clone, Debug, PartialEq)]
pub struct LabelExpr {
    pub key: String,
    pub operator: String,
    pub values: Vec<String>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct WorkloadMatch {
    pub namespace: String,
    pub name: String,
    pub match_labels: BTreeMap<String, String>,
    pub match_expressions: Vec<LabelExpr>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Action {
    pub add_models: Vec<String>,
    pub restrict_to: Vec<String>,
    pub rewrite_to: Option<String>,
    pub service_class: Option<String>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Rule {
    pub name: String,
    pub models: Vec<String>,
    pub tags: Vec<TagMatch>,
    pub workloads: Vec<WorkloadMatch>,
    pub action: Action,
    /// Measures the rule's widening on live traffic (see [`crate::guard`]).
    pub guard: Option<QualityGuard>,
}

/// One rule's outcome, for the decision record.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct RuleTrace {
    pub rule: String,
    pub matched: bool,
    /// The rule matched but its quality guard kept its action from applying.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held: Option<Hold>,
}

/// The models allowed to serve one request.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Candidates {
    /// The requested model after alias resolution.
    pub requested_model: String,
    /// Allowed models, in the order they were added (may be empty when a restriction removed all).
    pub models: Vec<String>,
    pub service_class: String,
    pub rule_trace: Vec<RuleTrace>,
}

/// The service class of a request no rule classes.
pub const DEFAULT_SERVICE_CLASS: &str = "Standard";

impl Rule {
    fn matches(&self, requested: &str, model: &Model, tags: &Tags, workload: &Workload) -> bool {
        let model_ok = self.models.is_empty()
            || self
                .models
                .iter()
                .any(|m| m == requested || *m == model.name);
        let tags_ok = self.tags.iter().all(|t| {
            tags.get(&t.name).is_some_and(|tag| {
                tag.confidence >= t.min_confidence
                    && (t.values.is_empty() || t.values.contains(&tag.value))
            })
        });
        let workload_ok =
            self.workloads.is_empty() || self.workloads.iter().any(|w| w.matches(workload));
        model_ok && tags_ok && workload_ok
    }
}

impl WorkloadMatch {
    fn matches(&self, w: &Workload) -> bool {
        (self.namespace.is_empty() || self.namespace == w.namespace)
            && (self.name.is_empty() || self.name == w.name)
            && self
                .match_labels
                .iter()
                .all(|(k, v)| w.label(k) == Some(v.as_str()))
            && self.match_expressions.iter().all(|e| {
                let v = w.label(&e.key);
                match e.operator.as_str() {
                    "In" => v.is_some_and(|v| e.values.iter().any(|x| x == v)),
                    "NotIn" => v.is_none_or(|v| !e.values.iter().any(|x| x == v)),
                    "Exists" => v.is_some(),
                    "DoesNotExist" => v.is_none(),
                    // An unknown operator never matches (the controller validates them).
                    _ => false,
                }
            })
    }
}

pub(super) fn evaluate(
    policy: &Policy,
    requested: &str,
    model: &Model,
    tags: &Tags,
    workload: &Workload,
    held: &dyn Fn(&str) -> Option<Hold>,
) -> Candidates {
    // Action model names may be aliases too; unknown ones are skipped.
    let canonical = |name: &str| policy.resolve(name).map(|m| m.name.clone());
    let mut models = vec![model.name.clone()];
    let mut service_class = DEFAULT_SERVICE_CLASS.to_string();
    let mut rule_trace = Vec::with_capacity(policy.rules.len());
    for rule in &policy.rules {
        let matched = rule.matches(requested, model, tags, workload);
        let hold = if matched { held(&rule.name) } else { None };
        rule_trace.push(RuleTrace {
            rule: rule.name.clone(),
            matched,
            held: hold,
        });
        if !matched || hold.is_some() {
            continue;
        }
        let a = &rule.action;
        for add in a.add_models.iter().filter_map(|m| canonical(m)) {
            if !models.contains(&add) {
                models.push(add);
            }
        }
        if !a.restrict_to.is_empty() {
            let allowed: Vec<String> = a.restrict_to.iter().filter_map(|m| canonical(m)).collect();
            models.retain(|m| allowed.contains(m));
        }
        if let Some(to) = a.rewrite_to.as_deref().and_then(canonical) {
            models = vec![to];
        }
        if let Some(class) = &a.service_class {
            service_class = class.clone();
        }
    }
    Candidates {
        requested_model: model.name.clone(),
        models,
        service_class,
        rule_trace,
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::example;
    use super::*;
    use kinference_classify::{ClassifierId, Tag};

    fn tags(pairs: &[(&str, &str, f32)]) -> Tags {
        let mut t = Tags::new();
        for (name, value, confidence) in pairs {
            t.insert(Tag {
                name: (*name).into(),
                value: (*value).into(),
                confidence: *confidence,
                source: ClassifierId::Rules,
            });
        }
        t
    }

    fn policy_with(rules: Vec<Rule>) -> Policy {
        let mut p = example();
        p.models.push(Model {
            name: "tiny".into(),
            ..p.models[1].clone()
        });
        p.rules = rules;
        p
    }

    fn rule(name: &str, action: Action) -> Rule {
        Rule {
            name: name.into(),
            models: vec![],
            tags: vec![],
            workloads: vec![],
            action,
            guard: None,
        }
    }

    fn app() -> Workload {
        Workload::parse("team-a/chat", vec![("tier".into(), "gold".into())])
    }

    #[test]
    fn example_rule_adds_qwen_only_for_low_complexity_with_confidence() {
        let p = example();
        let low = p
            .candidates("glm-5.3", &tags(&[("complexity", "low", 0.8)]), &app())
            .unwrap();
        assert_eq!(low.models, vec!["glm-5.3", "qwen-3.6-27b"]);
        assert_eq!(
            low.rule_trace,
            vec![RuleTrace {
                rule: "low-complexity-may-use-qwen".into(),
                matched: true,
                held: None,
            }]
        );
        // Through the alias too.
        let via_alias = p
            .candidates("default", &tags(&[("complexity", "low", 0.8)]), &app())
            .unwrap();
        assert_eq!(via_alias.requested_model, "glm-5.3");
        assert_eq!(via_alias.models, vec!["glm-5.3", "qwen-3.6-27b"]);
        let unsure = p
            .candidates("glm-5.3", &tags(&[("complexity", "low", 0.4)]), &app())
            .unwrap();
        assert_eq!(unsure.models, vec!["glm-5.3"]);
        let high = p
            .candidates("glm-5.3", &tags(&[("complexity", "high", 0.99)]), &app())
            .unwrap();
        assert_eq!(high.models, vec!["glm-5.3"]);
        assert!(!high.rule_trace[0].matched);
        // Asking for qwen directly does not match the rule's model list.
        let qwen = p
            .candidates("qwen-3.6-27b", &tags(&[("complexity", "low", 0.9)]), &app())
            .unwrap();
        assert_eq!(qwen.models, vec!["qwen-3.6-27b"]);
        assert!(p.candidates("nope", &Tags::new(), &app()).is_none());
    }

    #[test]
    fn restrict_intersects_and_rewrite_replaces() {
        let p = policy_with(vec![
            rule(
                "add-two",
                Action {
                    add_models: vec!["qwen-3.6-27b".into(), "tiny".into(), "unknown".into()],
                    ..Action::default()
                },
            ),
            rule(
                "restrict",
                Action {
                    restrict_to: vec!["tiny".into(), "glm-5.3".into()],
                    ..Action::default()
                },
            ),
        ]);
        let c = p.candidates("glm-5.3", &Tags::new(), &app()).unwrap();
        assert_eq!(c.models, vec!["glm-5.3", "tiny"]);

        let p = policy_with(vec![rule(
            "rewrite",
            Action {
                rewrite_to: Some("default".into()),
                service_class: Some("Sheddable".into()),
                ..Action::default()
            },
        )]);
        let c = p.candidates("tiny", &Tags::new(), &app()).unwrap();
        assert_eq!(c.models, vec!["glm-5.3"]);
        assert_eq!(c.service_class, "Sheddable");
        let c = p.candidates("glm-5.3", &Tags::new(), &app());
        assert_eq!(c.unwrap().service_class, "Sheddable");
    }

    #[test]
    fn tag_match_needs_every_tag_and_any_value() {
        let mut r = rule(
            "critical-code",
            Action {
                service_class: Some("Critical".into()),
                ..Action::default()
            },
        );
        r.tags = vec![
            TagMatch {
                name: "code".into(),
                values: vec![],
                min_confidence: 0.5,
            },
            TagMatch {
                name: "lang".into(),
                values: vec!["en".into(), "fr".into()],
                min_confidence: 0.0,
            },
        ];
        let p = policy_with(vec![r]);
        let class = |t: &Tags| p.candidates("glm-5.3", t, &app()).unwrap().service_class;
        assert_eq!(
            class(&tags(&[("code", "true", 0.9), ("lang", "fr", 0.1)])),
            "Critical"
        );
        assert_eq!(
            class(&tags(&[("code", "true", 0.9), ("lang", "de", 0.9)])),
            DEFAULT_SERVICE_CLASS
        );
        assert_eq!(
            class(&tags(&[("code", "true", 0.9)])),
            DEFAULT_SERVICE_CLASS
        );
        assert_eq!(
            class(&tags(&[("code", "true", 0.2), ("lang", "en", 1.0)])),
            DEFAULT_SERVICE_CLASS
        );
    }

    #[test]
    fn workload_match_by_namespace_name_labels_and_expressions() {
        let w = |wm: WorkloadMatch| {
            let mut r = rule(
                "w",
                Action {
                    add_models: vec!["tiny".into()],
                    ..Action::default()
                },
            );
            r.workloads = vec![wm];
            policy_with(vec![r])
                .candidates("glm-5.3", &Tags::new(), &app())
                .unwrap()
                .models
                .len()
                == 2
        };
        let base = WorkloadMatch {
            namespace: String::new(),
            name: String::new(),
            match_labels: BTreeMap::new(),
            match_expressions: vec![],
        };
        assert!(w(WorkloadMatch {
            namespace: "team-a".into(),
            ..base.clone()
        }));
        assert!(!w(WorkloadMatch {
            namespace: "team-b".into(),
            ..base.clone()
        }));
        assert!(w(WorkloadMatch {
            namespace: "team-a".into(),
            name: "chat".into(),
            ..base.clone()
        }));
        assert!(!w(WorkloadMatch {
            name: "batch".into(),
            ..base.clone()
        }));
        assert!(w(WorkloadMatch {
            match_labels: BTreeMap::from([("tier".into(), "gold".into())]),
            ..base.clone()
        }));
        assert!(!w(WorkloadMatch {
            match_labels: BTreeMap::from([("tier".into(), "silver".into())]),
            ..base.clone()
        }));
        let expr = |op: &str, values: &[&str], key: &str| WorkloadMatch {
            match_expressions: vec![LabelExpr {
                key: key.into(),
                operator: op.into(),
                values: values.iter().map(|s| s.to_string()).collect(),
            }],
            ..base.clone()
        };
        assert!(w(expr("In", &["gold", "x"], "tier")));
        assert!(!w(expr("In", &["x"], "tier")));
        assert!(w(expr("NotIn", &["x"], "tier")));
        assert!(!w(expr("NotIn", &["gold"], "tier")));
        assert!(w(expr("Exists", &[], "tier")));
        assert!(!w(expr("Exists", &[], "zone")));
        assert!(w(expr("DoesNotExist", &[], "zone")));
        assert!(!w(expr("Bogus", &[], "tier")));
    }
}

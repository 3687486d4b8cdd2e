//! Prompt classification: complexity, detectors, rules, exemplars.

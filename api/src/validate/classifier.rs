//! Validation of an InferenceClassifier: unique, well-formed tags with sound thresholds, weights,
//! patterns, exemplars and external classifiers.

use super::{ErrorKind, Errors, check_name, check_range, check_unique, list};
use crate::{
    InferenceClassifier,
    classifier::{
        ClassifierTag, ComplexityTag, ExemplarsTag, ExternalTag, MAX_EXTERNAL_TIMEOUT, TagSource,
    },
};

/// The longest tag name.
const MAX_TAG_NAME_LEN: usize = 63;

pub(super) fn validate(classifier: &InferenceClassifier, errors: &mut Errors) {
    let tags = &classifier.spec.tags;
    if tags.is_empty() {
        errors.push(
            "spec.tags",
            ErrorKind::Required,
            "at least one tag must be declared",
        );
    }
    check_unique(
        errors,
        "spec.tags",
        "tag",
        tags.iter().map(|t| t.name.as_str()),
    );
    for (i, tag) in tags.iter().enumerate() {
        validate_tag(&format!("spec.tags[{i}]"), tag, errors);
    }
}

fn validate_tag(field: &str, tag: &ClassifierTag, errors: &mut Errors) {
    check_name(errors, &format!("{field}.name"), &tag.name);
    if !tag.name.is_empty() && !is_tag_name(&tag.name) {
        errors.push(
            format!("{field}.name"),
            ErrorKind::Invalid,
            format!(
                "{:?} is not a valid tag name: use at most {MAX_TAG_NAME_LEN} lowercase letters, \
                 digits, '-', '_' and '.', starting and ending with a letter or digit",
                tag.name
            ),
        );
    }

    match &tag.source {
        // Unset thresholds are the model's calibrated ones; set ones must be sound.
        TagSource::Complexity(ComplexityTag {
            thresholds: Some(t),
        }) => {
            let field = format!("{field}.complexity.thresholds");
            check_range(
                errors,
                &format!("{field}.low"),
                t.low,
                0.0,
                false,
                Some(1.0),
            );
            check_range(
                errors,
                &format!("{field}.high"),
                t.high,
                0.0,
                false,
                Some(1.0),
            );
            if t.low.is_finite() && t.high.is_finite() && t.low >= t.high {
                errors.push(
                    field,
                    ErrorKind::Invalid,
                    format!(
                        "low ({}) must be less than high ({}): scores below low are \"low\", \
                         scores at or above high are \"high\"",
                        t.low, t.high
                    ),
                );
            }
        }
        TagSource::Complexity(ComplexityTag { thresholds: None }) | TagSource::Family(_) => {}
        TagSource::Keywords(keywords) => {
            let field = format!("{field}.keywords");
            if keywords.values.is_empty() {
                errors.push(
                    format!("{field}.values"),
                    ErrorKind::Required,
                    "at least one keyword is required",
                );
            }
            for (i, value) in keywords.values.iter().enumerate() {
                if value.trim().is_empty() {
                    errors.push(
                        format!("{field}.values[{i}]"),
                        ErrorKind::Invalid,
                        "a keyword must not be empty or only whitespace",
                    );
                }
            }
            check_range(
                errors,
                &format!("{field}.weight"),
                keywords.weight,
                0.0,
                true,
                Some(1.0),
            );
        }
        TagSource::Regex(regex) => {
            let field = format!("{field}.regex");
            if regex.patterns.is_empty() {
                errors.push(
                    format!("{field}.patterns"),
                    ErrorKind::Required,
                    "at least one pattern is required",
                );
            }
            for (i, pattern) in regex.patterns.iter().enumerate() {
                if pattern.is_empty() {
                    errors.push(
                        format!("{field}.patterns[{i}]"),
                        ErrorKind::Invalid,
                        "a pattern must not be empty: it would match every prompt",
                    );
                } else if let Err(e) = regex::Regex::new(pattern) {
                    errors.push(
                        format!("{field}.patterns[{i}]"),
                        ErrorKind::Invalid,
                        format!(
                            "{pattern:?} is not a valid regular expression: {}",
                            one_line(&e)
                        ),
                    );
                }
            }
            check_range(
                errors,
                &format!("{field}.weight"),
                regex.weight,
                0.0,
                true,
                Some(1.0),
            );
        }
        TagSource::Exemplars(exemplars) => {
            validate_exemplars(&format!("{field}.exemplars"), exemplars, errors);
        }
        TagSource::External(external) => {
            validate_external(&format!("{field}.external"), external, errors);
        }
    }
}

/// The most neighbours an exemplars tag may let vote.
const MAX_K: u32 = 64;

fn validate_exemplars(field: &str, exemplars: &ExemplarsTag, errors: &mut Errors) {
    if exemplars.values.is_empty() {
        errors.push(
            format!("{field}.values"),
            ErrorKind::Required,
            "at least one value with example prompts is required",
        );
    }
    let mut seen: Vec<&str> = Vec::new();
    for (i, v) in exemplars.values.iter().enumerate() {
        let at = format!("{field}.values[{i}]");
        check_value(errors, &format!("{at}.value"), &v.value);
        if let Some(first) = seen.iter().position(|s| *s == v.value) {
            errors.push(
                format!("{at}.value"),
                ErrorKind::Duplicate,
                format!(
                    "value {:?} is already declared at {field}.values[{first}]; put all its \
                     examples there",
                    v.value
                ),
            );
        }
        seen.push(&v.value);
        if v.examples.is_empty() {
            errors.push(
                format!("{at}.examples"),
                ErrorKind::Required,
                format!(
                    "value {:?} has no example prompts: add at least one",
                    v.value
                ),
            );
        }
        for (j, example) in v.examples.iter().enumerate() {
            if example.trim().is_empty() {
                errors.push(
                    format!("{at}.examples[{j}]"),
                    ErrorKind::Invalid,
                    "an example prompt must not be empty or only whitespace",
                );
            }
        }
    }
    if exemplars.k == 0 || exemplars.k > MAX_K {
        errors.push(
            format!("{field}.k"),
            ErrorKind::Invalid,
            format!("{} must be in [1, {MAX_K}]", exemplars.k),
        );
    }
    check_range(
        errors,
        &format!("{field}.minSimilarity"),
        exemplars.min_similarity,
        0.0,
        false,
        Some(1.0),
    );
}

fn validate_external(field: &str, external: &ExternalTag, errors: &mut Errors) {
    if let Err(message) = check_url(&external.url) {
        errors.push(format!("{field}.url"), ErrorKind::Invalid, message);
    }
    match external.timeout.parse() {
        Err(e) => errors.push(
            format!("{field}.timeout"),
            ErrorKind::Invalid,
            e.to_string(),
        ),
        Ok(d) if d.is_zero() => errors.push(
            format!("{field}.timeout"),
            ErrorKind::Invalid,
            "must be greater than 0s: with no budget the classifier could never answer",
        ),
        Ok(d) if d > MAX_EXTERNAL_TIMEOUT => errors.push(
            format!("{field}.timeout"),
            ErrorKind::Invalid,
            format!(
                "{} is more than the largest budget, {}ms: the classifier runs before the \
                 request is routed, so its budget is latency every request may pay",
                external.timeout,
                MAX_EXTERNAL_TIMEOUT.as_millis()
            ),
        ),
        Ok(_) => {}
    }
    if external.values.is_empty() {
        errors.push(
            format!("{field}.values"),
            ErrorKind::Required,
            "at least one value is required: the values the classifier may answer",
        );
    }
    for (i, value) in external.values.iter().enumerate() {
        check_value(errors, &format!("{field}.values[{i}]"), value);
    }
    let mut seen: Vec<&str> = Vec::new();
    for (i, value) in external.values.iter().enumerate() {
        if let Some(first) = seen.iter().position(|s| *s == value) {
            errors.push(
                format!("{field}.values[{i}]"),
                ErrorKind::Duplicate,
                format!("value {value:?} is already declared at {field}.values[{first}]"),
            );
        }
        seen.push(value);
    }
    if external.fallback.is_empty() {
        errors.push(
            format!("{field}.fallback"),
            ErrorKind::Required,
            "a fallback value is required: the tag's value when the classifier does not answer \
             in time",
        );
    } else if !external.values.contains(&external.fallback) {
        errors.push(
            format!("{field}.fallback"),
            ErrorKind::Invalid,
            format!(
                "fallback {:?} is not one of the declared values ({})",
                external.fallback,
                list(external.values.iter().map(String::as_str))
            ),
        );
    }
    check_range(
        errors,
        &format!("{field}.fallbackConfidence"),
        external.fallback_confidence,
        0.0,
        false,
        Some(1.0),
    );
}

/// The longest tag value.
const MAX_VALUE_LEN: usize = 63;

/// A tag value as rules match on it: not empty, not padded, not too long.
fn check_value(errors: &mut Errors, field: &str, value: &str) {
    if value.is_empty() {
        errors.push(field, ErrorKind::Required, "a value is required");
    } else if value.trim() != value || value.len() > MAX_VALUE_LEN {
        errors.push(
            field,
            ErrorKind::Invalid,
            format!(
                "{value:?} is not a valid tag value: use at most {MAX_VALUE_LEN} bytes, without \
                 leading or trailing whitespace"
            ),
        );
    }
}

/// Checks that `url` is `http(s)://host[:port][/path]`, or says what is wrong.
fn check_url(url: &str) -> Result<(), String> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(format!(
            "{url:?} is not a URL: write http://host[:port]/path or https://..."
        ));
    };
    if !matches!(scheme, "http" | "https") {
        return Err(format!(
            "{url:?} has scheme {scheme:?}; an external classifier is an http:// or https:// URL"
        ));
    }
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    if authority.contains('@') {
        return Err(format!(
            "{url:?} has user information; credentials do not belong in a resource"
        ));
    }
    let (host, port) = match authority.rsplit_once(':') {
        // An IPv6 literal's colons are inside brackets.
        Some((h, p)) if !p.contains(']') => (h, Some(p)),
        _ => (authority, None),
    };
    let bad_host = host.is_empty()
        || !host.bytes().all(|b| {
            b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'[' | b']' | b':' | b'_')
        });
    if bad_host {
        return Err(format!("{url:?} has no valid host"));
    }
    if let Some(port) = port
        && port.parse::<u16>().map_or(true, |p| p == 0)
    {
        return Err(format!("{url:?} has an invalid port {port:?}"));
    }
    if url
        .bytes()
        .any(|b| b.is_ascii_whitespace() || b.is_ascii_control())
    {
        return Err(format!("{url:?} contains whitespace"));
    }
    Ok(())
}

/// Whether `name` is a valid tag name.
fn is_tag_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    let edge = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    name.len() <= MAX_TAG_NAME_LEN
        && bytes.first().is_some_and(edge)
        && bytes.last().is_some_and(edge)
        && bytes
            .iter()
            .all(|b| edge(b) || matches!(b, b'-' | b'_' | b'.'))
}

/// The regex crate's errors span several lines (the pattern, a caret, the reason); a status
/// message reads better with the reason alone.
fn one_line(e: &regex::Error) -> String {
    let text = e.to_string();
    text.lines()
        .rev()
        .find(|l| l.trim_start().starts_with("error:"))
        .map(|l| {
            l.trim_start()
                .trim_start_matches("error:")
                .trim()
                .to_string()
        })
        .unwrap_or_else(|| text.split_whitespace().collect::<Vec<_>>().join(" "))
}

#[cfg(test)]
mod tests {
    use super::check_url;

    #[test]
    fn urls() {
        for ok in [
            "http://classifier:8000/classify",
            "http://127.0.0.1:9/x?y=1",
            "http://[::1]:8080/",
            "http://c.ml.svc.cluster.local",
            "https://classifier.example.com/v1/tag",
        ] {
            assert_eq!(check_url(ok), Ok(()), "{ok}");
        }
        for bad in [
            "classifier:8000",
            "ftp://c/x",
            "https://u@c/x",
            "http:///x",
            "http://c:0/",
            "http://c:99999/",
            "http://u:p@c/",
            "http://c/a b",
        ] {
            assert!(check_url(bad).is_err(), "{bad}");
        }
    }
}

//! Durations as the Gateway API writes them (GEP-2257: `50ms`, `2s`, `1m30s`).
//!
//! Kinference's resources sit beside Gateway API resources, so their durations use the same
//! string format a platform engineer already writes in an HTTPRoute's `timeouts`. The value is
//! kept as the string the user wrote, so that a bad duration reaches validation (which reports it
//! with its field path) instead of failing deserialization of the whole resource.

use std::{borrow::Cow, fmt, time::Duration};

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};

/// The pattern GEP-2257 gives for a duration, used in the CRD schema.
pub const PATTERN: &str = "^([0-9]{1,5}(h|m|s|ms)){1,4}$";

/// The most digits one component may have.
const MAX_DIGITS: usize = 5;

/// The most components (`1h`, `30m`, ...) one duration may have.
const MAX_COMPONENTS: usize = 4;

/// A duration in the Gateway API's string format, such as `500ms`, `2s` or `1m30s`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct GatewayDuration(String);

/// Why a string is not a Gateway API duration.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    #[error("a duration must not be empty (write e.g. \"500ms\" or \"2s\")")]
    Empty,

    #[error("{0:?} is negative; durations must not be negative")]
    Negative(String),

    #[error("{0:?} has a fraction; write whole units instead (e.g. \"1s500ms\" for 1.5s)")]
    Fraction(String),

    #[error("{value:?} has a number without a unit at {number:?} (units: h, m, s, ms)")]
    MissingUnit { value: String, number: String },

    #[error("{value:?} has unknown unit {unit:?} (units: h, m, s, ms)")]
    UnknownUnit { value: String, unit: String },

    #[error("{value:?} has a unit without a number before {unit:?}")]
    MissingNumber { value: String, unit: String },

    #[error("{value:?} has a number with more than {MAX_DIGITS} digits ({number:?})")]
    TooManyDigits { value: String, number: String },

    #[error("{0:?} has more than {MAX_COMPONENTS} components")]
    TooManyComponents(String),
}

impl GatewayDuration {
    /// Wraps a string as written in a resource; nothing is checked until [`Self::parse`].
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// Formats a duration in the canonical Gateway API form (`1h2m3s4ms`, `0s` for zero),
    /// truncating below a millisecond.
    pub fn from_duration(duration: Duration) -> Self {
        let mut ms = duration.as_millis();
        if ms == 0 {
            return Self("0s".to_string());
        }
        let mut out = String::new();
        for (unit_ms, unit) in [(3_600_000, "h"), (60_000, "m"), (1_000, "s"), (1, "ms")] {
            let n = ms / unit_ms;
            if n > 0 {
                out.push_str(&format!("{n}{unit}"));
                ms %= unit_ms;
            }
        }
        Self(out)
    }

    /// The string as written.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Parses the string, or says precisely what is wrong with it.
    pub fn parse(&self) -> Result<Duration, DurationError> {
        parse(&self.0)
    }
}

impl fmt::Display for GatewayDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&str> for GatewayDuration {
    fn from(value: &str) -> Self {
        Self::new(value)
    }
}

impl JsonSchema for GatewayDuration {
    fn schema_name() -> Cow<'static, str> {
        "GatewayDuration".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string",
            "pattern": PATTERN,
        })
    }
}

/// Parses a GEP-2257 duration: one to four components, each one to five digits followed by
/// `h`, `m`, `s` or `ms`.
pub fn parse(value: &str) -> Result<Duration, DurationError> {
    if value.is_empty() {
        return Err(DurationError::Empty);
    }
    if value.starts_with('-') {
        return Err(DurationError::Negative(value.to_string()));
    }
    if value.contains('.') {
        return Err(DurationError::Fraction(value.to_string()));
    }

    let bytes = value.as_bytes();
    let mut total = Duration::ZERO;
    let mut components = 0;
    let mut i = 0;
    while i < bytes.len() {
        let digits_start = i;
        while i < bytes.len() && bytes[i].is_ascii_digit() {
            i += 1;
        }
        let number = &value[digits_start..i];
        let unit_start = i;
        while i < bytes.len() && !bytes[i].is_ascii_digit() {
            i += 1;
        }
        let unit = &value[unit_start..i];

        if number.is_empty() {
            return Err(DurationError::MissingNumber {
                value: value.to_string(),
                unit: unit.to_string(),
            });
        }
        if unit.is_empty() {
            return Err(DurationError::MissingUnit {
                value: value.to_string(),
                number: number.to_string(),
            });
        }
        if number.len() > MAX_DIGITS {
            return Err(DurationError::TooManyDigits {
                value: value.to_string(),
                number: number.to_string(),
            });
        }
        let unit_ms: u64 = match unit {
            "h" => 3_600_000,
            "m" => 60_000,
            "s" => 1_000,
            "ms" => 1,
            _ => {
                return Err(DurationError::UnknownUnit {
                    value: value.to_string(),
                    unit: unit.to_string(),
                });
            }
        };
        components += 1;
        if components > MAX_COMPONENTS {
            return Err(DurationError::TooManyComponents(value.to_string()));
        }
        // At most five digits, so this cannot overflow.
        let n: u64 = number.parse().unwrap_or(0);
        total += Duration::from_millis(n * unit_ms);
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_valid_durations() {
        let cases = [
            ("0s", 0),
            ("5ms", 5),
            ("500ms", 500),
            ("2s", 2_000),
            ("1m", 60_000),
            ("1h", 3_600_000),
            ("1m30s", 90_000),
            ("1h2m3s4ms", 3_723_004),
            ("99999ms", 99_999),
        ];
        for (input, ms) in cases {
            assert_eq!(parse(input), Ok(Duration::from_millis(ms)), "{input}");
        }
    }

    #[test]
    fn rejects_invalid_durations_precisely() {
        assert_eq!(parse(""), Err(DurationError::Empty));
        assert_eq!(parse("-1s"), Err(DurationError::Negative("-1s".into())));
        assert_eq!(parse("1.5s"), Err(DurationError::Fraction("1.5s".into())));
        assert_eq!(
            parse("500"),
            Err(DurationError::MissingUnit {
                value: "500".into(),
                number: "500".into()
            })
        );
        assert_eq!(
            parse("5us"),
            Err(DurationError::UnknownUnit {
                value: "5us".into(),
                unit: "us".into()
            })
        );
        assert_eq!(
            parse("ms"),
            Err(DurationError::MissingNumber {
                value: "ms".into(),
                unit: "ms".into()
            })
        );
        assert_eq!(
            parse("100000ms"),
            Err(DurationError::TooManyDigits {
                value: "100000ms".into(),
                number: "100000".into()
            })
        );
        assert_eq!(
            parse("1h1m1s1ms1ms"),
            Err(DurationError::TooManyComponents("1h1m1s1ms1ms".into()))
        );
    }

    #[test]
    fn agrees_with_the_schema_pattern() {
        let pattern = regex::Regex::new(PATTERN).unwrap();
        for input in [
            "0s",
            "5ms",
            "1h2m3s4ms",
            "",
            "-1s",
            "1.5s",
            "500",
            "5us",
            "ms",
            "100000ms",
            "1d",
            "1h1m1s1ms1ms",
            "1 s",
        ] {
            assert_eq!(
                parse(input).is_ok(),
                pattern.is_match(input),
                "parser and schema pattern disagree on {input:?}"
            );
        }
    }

    #[test]
    fn formats_canonically_and_round_trips() {
        for ms in [0, 1, 5, 500, 1_000, 90_000, 3_723_004] {
            let d = Duration::from_millis(ms);
            let formatted = GatewayDuration::from_duration(d);
            assert_eq!(formatted.parse(), Ok(d), "{formatted}");
        }
        assert_eq!(
            GatewayDuration::from_duration(Duration::from_millis(90_500)).as_str(),
            "1m30s500ms"
        );
        assert_eq!(
            GatewayDuration::from_duration(Duration::ZERO).as_str(),
            "0s"
        );
    }
}

//! A rule's quality guard: the widening is trusted only as far as the platform's own traffic
//! shows it to be.
//!
//! A rule such as "complexity=low may be served by the small model" rests on the tag meaning
//! "the small model answers about as well". The guard measures that on live requests: the proxy
//! sends a sampled share of the requests the rule applies to, off the request path, to the
//! other side of the pair (the requested model when the rule moved the request, the rule's
//! model when it did not) and asks a judge which answer is better. Until the measured gap is
//! within tolerance over `minSamples`, the rule moves at most `cappedShare` of the requests it
//! matches; when it drifts out of tolerance, the rule stops moving requests for that tenant and
//! family. See `docs/classification.md`.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::time::Duration;

use crate::duration::{DurationError, GatewayDuration};

pub const DEFAULT_SAMPLE_SHARE: f64 = 0.05;
pub const DEFAULT_TOLERANCE: f64 = 0.05;
pub const DEFAULT_MIN_SAMPLES: u32 = 50;
pub const DEFAULT_CAPPED_SHARE: f64 = 0.1;
pub const DEFAULT_JUDGE_TIMEOUT: Duration = Duration::from_secs(30);
pub const DEFAULT_FAMILY_TAG: &str = "family";

/// QualityGuard measures a rule's widening on live traffic with a judge, caps it until the
/// measurement is in, and suspends it when the moved-to model answers worse than tolerated.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct QualityGuard {
    /// SampleShare of the requests the rule applies to that are also answered by the other
    /// model of the pair, off the request path, and judged. In (0, 1]. Defaults to 0.05.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sample_share: Option<f64>,

    /// Judge compares the two answers.
    pub judge: Judge,

    /// Tolerance is the largest quality gap accepted: the share of judged samples in which the
    /// requested model's answer is better, less the share in which the rule's model's is. In
    /// [0, 1]. Defaults to 0.05.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tolerance: Option<f64>,

    /// MinSamples judged before the gap is trusted, per tenant and prompt family. Defaults to
    /// 50.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub min_samples: Option<u32>,

    /// CappedShare is the most of the requests the rule applies to that it may move while the
    /// gap is not yet measured within tolerance. In [0, 1]. Defaults to 0.1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capped_share: Option<f64>,

    /// Window is how many of the latest samples the gap is measured over, so that drift shows.
    /// At least minSamples. Defaults to 4 × minSamples.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub window: Option<u32>,

    /// FamilyTag names the classifier tag whose value splits the measurement (the built-in
    /// family tag by default). A request without it is measured under "all".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub family_tag: Option<String>,
}

/// Judge is an OpenAI-compatible chat-completions endpoint (a model served by vLLM, say) asked
/// which of two answers to the same prompt is better.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Judge {
    /// URL is the API base, e.g. `http://judge.models.svc:8000/v1`; the proxy posts to
    /// `{url}/chat/completions`. Plain http: in a mesh the sidecars add mTLS.
    #[schemars(length(min = 1))]
    pub url: String,

    /// Model is the judge's model name, as its server serves it.
    #[schemars(length(min = 1))]
    pub model: String,

    /// Timeout bounds one judgement, the mirrored answer included. Defaults to 30s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<GatewayDuration>,
}

impl QualityGuard {
    pub fn sample_share(&self) -> f64 {
        self.sample_share.unwrap_or(DEFAULT_SAMPLE_SHARE)
    }
    pub fn tolerance(&self) -> f64 {
        self.tolerance.unwrap_or(DEFAULT_TOLERANCE)
    }
    pub fn min_samples(&self) -> u32 {
        self.min_samples.unwrap_or(DEFAULT_MIN_SAMPLES)
    }
    pub fn capped_share(&self) -> f64 {
        self.capped_share.unwrap_or(DEFAULT_CAPPED_SHARE)
    }
    pub fn window(&self) -> u32 {
        self.window
            .unwrap_or_else(|| self.min_samples().saturating_mul(4))
    }
    pub fn family_tag(&self) -> &str {
        self.family_tag.as_deref().unwrap_or(DEFAULT_FAMILY_TAG)
    }
    pub fn judge_timeout(&self) -> Result<Duration, DurationError> {
        self.judge
            .timeout
            .as_ref()
            .map_or(Ok(DEFAULT_JUDGE_TIMEOUT), GatewayDuration::parse)
    }
}

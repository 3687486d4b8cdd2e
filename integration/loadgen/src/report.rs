//! What one load run measured, reduced to percentiles and counts, as JSON and CSV.
//!
//! Every latency is kept (a 20 s run at 1,000 requests/s is 20,000 numbers), so percentiles are
//! exact nearest-rank values, not histogram estimates: at these sub-millisecond latencies a
//! bucket's width would be larger than the differences the benchmark looks for.

use serde::Serialize;
use std::collections::BTreeMap;

/// Exact percentiles of a set of durations, in milliseconds.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Percentiles {
    pub count: u64,
    pub mean_ms: f64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub max_ms: f64,
}

impl Percentiles {
    /// From durations in microseconds; all zero when there are none.
    pub fn from_us(samples_us: &[u64]) -> Self {
        if samples_us.is_empty() {
            return Self::default();
        }
        let mut sorted = samples_us.to_vec();
        sorted.sort_unstable();
        let ms = |us: u64| us as f64 / 1_000.0;
        let sum_us: u128 = sorted.iter().map(|&v| u128::from(v)).sum();
        Self {
            count: sorted.len() as u64,
            mean_ms: sum_us as f64 / sorted.len() as f64 / 1_000.0,
            p50_ms: ms(nearest_rank(&sorted, 0.50)),
            p90_ms: ms(nearest_rank(&sorted, 0.90)),
            p99_ms: ms(nearest_rank(&sorted, 0.99)),
            p999_ms: ms(nearest_rank(&sorted, 0.999)),
            max_ms: ms(sorted[sorted.len() - 1]),
        }
    }
}

/// The nearest-rank percentile `q` (in `[0, 1]`) of a sorted, non-empty slice.
pub fn nearest_rank(sorted: &[u64], q: f64) -> u64 {
    let n = sorted.len();
    let rank = (q.clamp(0.0, 1.0) * n as f64).ceil() as usize;
    sorted[rank.clamp(1, n) - 1]
}

/// The result of one load run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Summary {
    /// What was measured, e.g. `direct`, `nginx`, `kinference-proxy`.
    pub target: String,
    /// `non-stream` or `stream`.
    pub mode: String,
    pub url: String,
    pub rate_per_s: f64,
    pub warmup_s: f64,
    pub duration_s: f64,
    /// Requests sent in the measured window (after warm-up).
    pub sent: u64,
    /// Of those, answered in full with a 2xx status (and `[DONE]` when streaming).
    pub ok: u64,
    /// Failures by kind (`status_503`, `connect`, `timeout`, `incomplete_stream`, ...).
    pub errors: BTreeMap<String, u64>,
    /// Measured requests per second completed successfully.
    pub achieved_rate_per_s: f64,
    /// From the intended send time to the last byte of the response.
    pub latency: Percentiles,
    /// From the intended send time to the first SSE `data:` chunk (streaming only).
    pub first_chunk: Option<Percentiles>,
    /// How late the pacer sent requests against the schedule: part of every latency above, the
    /// same for every target.
    pub schedule_lag: Percentiles,
    pub connections_opened: u64,
}

impl Summary {
    pub fn error_count(&self) -> u64 {
        self.errors.values().sum()
    }

    /// The CSV header matching [`Summary::csv_row`].
    pub fn csv_header() -> &'static str {
        "target,mode,rate_per_s,duration_s,sent,ok,errors,achieved_rate_per_s,\
         p50_ms,p90_ms,p99_ms,p999_ms,max_ms,mean_ms,\
         first_chunk_p50_ms,first_chunk_p90_ms,first_chunk_p99_ms,first_chunk_max_ms,\
         schedule_lag_p50_ms,schedule_lag_p99_ms,connections_opened"
    }

    /// One CSV line (no trailing newline).
    pub fn csv_row(&self) -> String {
        let fc = |f: fn(&Percentiles) -> f64| {
            self.first_chunk
                .as_ref()
                .map(|p| format!("{:.4}", f(p)))
                .unwrap_or_default()
        };
        format!(
            "{},{},{},{},{},{},{},{:.1},{:.4},{:.4},{:.4},{:.4},{:.4},{:.4},{},{},{},{},{:.4},{:.4},{}",
            self.target,
            self.mode,
            self.rate_per_s,
            self.duration_s,
            self.sent,
            self.ok,
            self.error_count(),
            self.achieved_rate_per_s,
            self.latency.p50_ms,
            self.latency.p90_ms,
            self.latency.p99_ms,
            self.latency.p999_ms,
            self.latency.max_ms,
            self.latency.mean_ms,
            fc(|p| p.p50_ms),
            fc(|p| p.p90_ms),
            fc(|p| p.p99_ms),
            fc(|p| p.max_ms),
            self.schedule_lag.p50_ms,
            self.schedule_lag.p99_ms,
            self.connections_opened,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(nearest_rank(&v, 0.5), 50);
        assert_eq!(nearest_rank(&v, 0.99), 99);
        assert_eq!(nearest_rank(&v, 1.0), 100);
        assert_eq!(nearest_rank(&v, 0.0), 1);
        assert_eq!(nearest_rank(&[7], 0.99), 7);
    }

    #[test]
    fn percentiles_in_ms() {
        let p = Percentiles::from_us(&[3_000, 1_000, 2_000, 4_000]);
        assert_eq!(p.count, 4);
        assert_eq!(p.p50_ms, 2.0);
        assert_eq!(p.max_ms, 4.0);
        assert_eq!(p.mean_ms, 2.5);
        assert_eq!(Percentiles::from_us(&[]), Percentiles::default());
    }

    #[test]
    fn csv_row_matches_header() {
        let s = Summary {
            first_chunk: Some(Percentiles::from_us(&[10])),
            ..Summary::default()
        };
        assert_eq!(
            s.csv_row().split(',').count(),
            Summary::csv_header().split(',').count()
        );
    }
}

//! Azure's public LLM inference trace (conversation, 2023): real arrival times and lengths, no
//! prefix information.
//!
//! With nothing shared between prompts, cache-aware strategies have nothing to win and only their
//! load balancing counts; this workload shows whether a strategy costs anything when caching
//! cannot help. Each request gets unique random tokens (seeded by its row), and a window of the
//! trace is replayed with its timestamps scaled to the offered load, on `qwen-3.6-27b` endpoints.
//! Each seed replays its own window (`super::window_start`).

use std::{path::Path, sync::Arc};

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use super::{RequestSpec, Size, Workload, WorkloadError, WorkloadKind, random_tokens, shrunk};
use crate::fleet::FleetSpec;

pub const FILE: &str = "AzureLLMInferenceTrace_conv_2023.csv";
pub const ENDPOINTS: usize = 4;
pub const PROFILE: &str = "qwen-3.6-27b";

/// Seconds since midnight of `YYYY-MM-DD HH:MM:SS.fffffff`, plus 86,400 per day of the month.
fn parse_timestamp_s(s: &str) -> Option<f64> {
    let (date, time) = s.trim().split_once(' ')?;
    let day: f64 = date.rsplit('-').next()?.parse().ok()?;
    let mut parts = time.split(':');
    let h: f64 = parts.next()?.parse().ok()?;
    let m: f64 = parts.next()?.parse().ok()?;
    let sec: f64 = parts.next()?.parse().ok()?;
    Some(day * 86_400.0 + h * 3_600.0 + m * 60.0 + sec)
}

/// `window` picks the rows (a seed number), `seed` the token contents.
pub fn build(
    dir: &Path,
    load_rps: f64,
    size: Size,
    window: u64,
    seed: u64,
) -> Result<Workload, WorkloadError> {
    let path = dir.join(FILE);
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(&path).map_err(|source| WorkloadError::Io {
        path: shown.clone(),
        source,
    })?;
    let mut rows: Vec<(f64, usize, u32)> = Vec::new();
    let total = text
        .lines()
        .skip(1)
        .filter(|l| !l.trim().is_empty())
        .count();
    let start = super::window_start(window, total, size.requests);
    for (i, line) in text
        .lines()
        .enumerate()
        .skip(1)
        .filter(|(_, l)| !l.trim().is_empty())
        .skip(start)
    {
        if rows.len() == size.requests {
            break;
        }
        if line.trim().is_empty() {
            continue;
        }
        let bad = |msg: &str| WorkloadError::Parse {
            path: shown.clone(),
            line: i + 1,
            msg: msg.to_owned(),
        };
        let mut f = line.split(',');
        let t = f
            .next()
            .and_then(parse_timestamp_s)
            .ok_or_else(|| bad("bad TIMESTAMP"))?;
        let ctx: usize = f
            .next()
            .and_then(|v| v.trim().parse().ok())
            .ok_or_else(|| bad("bad ContextTokens"))?;
        let gen_tokens: u32 = f
            .next()
            .and_then(|v| v.trim().parse().ok())
            .ok_or_else(|| bad("bad GeneratedTokens"))?;
        rows.push((t, ctx.max(1), gen_tokens.max(1)));
    }
    let (Some(first), Some(last)) = (rows.first(), rows.last()) else {
        return Err(WorkloadError::Empty(shown));
    };
    let span_s = (last.0 - first.0).max(1e-3);
    let scale = (rows.len() as f64 / span_s) / load_rps.max(1e-9);
    let t0 = first.0;
    let requests = rows
        .iter()
        .enumerate()
        .map(|(i, &(t, ctx, out))| {
            let mut rng =
                ChaCha8Rng::seed_from_u64(seed ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
            RequestSpec {
                at_s: (t - t0) * scale,
                prompt: Arc::from(random_tokens(&mut rng, ctx)),
                output_tokens: out,
                pool: 0,
                low_complexity: false,
                service_class: None,
                tenant: 0,
                client: i as u32,
            }
        })
        .collect();
    Ok(Workload {
        kind: WorkloadKind::Azure,
        load_rps,
        fleet: FleetSpec::single(PROFILE, shrunk(ENDPOINTS, size)),
        requests,
        sessions: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_lengths_and_scaling() {
        assert_eq!(
            parse_timestamp_s("2023-11-16 18:15:46.5"),
            Some(16.0 * 86_400.0 + 65_746.5)
        );
        assert_eq!(parse_timestamp_s("garbage"), None);
        let dir = tempfile::tempdir().unwrap();
        let csv = "TIMESTAMP,ContextTokens,GeneratedTokens\n\
                   2023-11-16 23:59:59.0000000,374,44\n\
                   2023-11-17 00:00:01.0000000,396,0\n";
        std::fs::write(dir.path().join(FILE), csv).unwrap();
        let w = build(
            dir.path(),
            2.0,
            Size {
                requests: 100,
                shrink: 1,
            },
            1,
            3,
        )
        .unwrap();
        assert_eq!(w.requests.len(), 2);
        assert_eq!(w.requests[0].prompt.len(), 374);
        assert_eq!(w.requests[1].output_tokens, 1);
        // Two rows 2 s apart (across midnight) = 1 req/s; at 2 req/s the gap is 1 s.
        assert!(
            (w.requests[1].at_s - 1.0).abs() < 1e-6,
            "{}",
            w.requests[1].at_s
        );
        assert_ne!(w.requests[0].prompt[..100], w.requests[1].prompt[..100]);
        std::fs::write(
            dir.path().join(FILE),
            "TIMESTAMP,ContextTokens,GeneratedTokens\nx,1,2\n",
        )
        .unwrap();
        assert!(matches!(
            build(
                dir.path(),
                1.0,
                Size {
                    requests: 1,
                    shrink: 1
                },
                1,
                0
            ),
            Err(WorkloadError::Parse { line: 2, .. })
        ));
    }
}

//! How many requests per arm a rollout needs to detect a regression (docs/rollout.md):
//! `cargo run -p kinference-policy-core --example rollout_sample_sizes`.

use kinference_policy_core::rollout::{Histogram, samples_for_quantile, samples_for_rate};

fn main() {
    println!("| base rate | increase | requests per arm |");
    println!("|---:|---:|---:|");
    for (base, inc) in [
        (0.001, 0.002),
        (0.01, 0.005),
        (0.01, 0.01),
        (0.01, 0.02),
        (0.05, 0.02),
    ] {
        println!(
            "| {:.1}% | +{:.1} pt | {} |",
            base * 100.0,
            inc * 100.0,
            samples_for_rate(base, inc, 0.95, 0.8)
        );
    }
    // TTFT shaped like a lognormal around 400 ms (median) with a long tail, in Prometheus' default
    // TTFT buckets of vLLM (seconds).
    let bounds = [
        0.001,
        0.005,
        0.01,
        0.02,
        0.04,
        0.06,
        0.08,
        0.1,
        0.25,
        0.5,
        0.75,
        1.0,
        2.5,
        5.0,
        7.5,
        10.0,
        20.0,
        40.0,
        80.0,
        160.0,
        640.0,
        2560.0,
        f64::INFINITY,
    ];
    let (median, sigma) = (0.4_f64, 0.6_f64);
    let n = 100_000.0;
    let cdf = |x: f64| {
        if x.is_infinite() {
            return 1.0;
        }
        let z = (x / median).ln() / sigma;
        0.5 * (1.0 + erf(z / std::f64::consts::SQRT_2))
    };
    let h = Histogram {
        buckets: bounds
            .iter()
            .map(|&le| (le, (cdf(le) * n) as u64))
            .collect(),
    };
    println!();
    println!("| quantile | regression | requests per arm |");
    println!("|---|---:|---:|");
    for q in [0.9, 0.99] {
        for ratio in [1.05, 1.1, 1.2, 1.5] {
            let need = samples_for_quantile(&h, q, ratio, 0.95, 0.8)
                .map_or("n/a".to_string(), |n| n.to_string());
            println!(
                "| p{} | +{:.0}% | {need} |",
                (q * 100.0) as u32,
                (ratio - 1.0) * 100.0
            );
        }
    }
}

/// Abramowitz and Stegun 7.1.26.
fn erf(x: f64) -> f64 {
    let t = 1.0 / (1.0 + 0.327_591_1 * x.abs());
    let y = 1.0
        - t * (0.254_829_592
            + t * (-0.284_496_736
                + t * (1.421_413_741 + t * (-1.453_152_027 + t * 1.061_405_429))))
            * (-x * x).exp();
    if x >= 0.0 { y } else { -y }
}

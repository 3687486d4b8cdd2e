use super::*;

/// Buckets of 50 ms up to 2 s, then +Inf.
fn bounds() -> Vec<f64> {
    (1..=40)
        .map(|i| i as f64 * 0.05)
        .chain([f64::INFINITY])
        .collect()
}

/// A histogram of `samples` (seconds).
fn hist(samples: &[f64]) -> Histogram {
    let b = bounds();
    Histogram {
        buckets: b
            .iter()
            .map(|&le| (le, samples.iter().filter(|&&s| s <= le).count() as u64))
            .collect(),
    }
}

/// `n` TTFTs spread evenly over `lo..hi`.
fn spread(n: usize, lo: f64, hi: f64) -> Vec<f64> {
    (0..n)
        .map(|i| lo + (hi - lo) * (i as f64 + 0.5) / n as f64)
        .collect()
}

fn arm(n: u64, errors: u64, ttft: &[f64]) -> ArmStats {
    ArmStats {
        requests: n,
        errors,
        ttft: hist(ttft),
        ..ArmStats::default()
    }
}

fn thresholds() -> Thresholds {
    Thresholds {
        error_rate_increase: Some(0.02),
        ttft_p90_ratio: Some(1.2),
        min_samples: 200,
        ..Thresholds::default()
    }
}

#[test]
fn quantiles_interpolate_within_the_bucket_as_promql_does() {
    let h = hist(&spread(1000, 0.0, 1.0));
    let p90 = h.quantile(0.9).unwrap();
    assert!((p90 - 0.9).abs() < 0.01, "{p90}");
    assert_eq!(Histogram::default().quantile(0.9), None);
    // Everything past the last finite bound answers that bound.
    let h = hist(&[5.0, 6.0]);
    assert_eq!(h.quantile(0.5), Some(2.0));
}

#[test]
fn intervals_are_the_textbook_ones() {
    assert!((z_of(0.95) - 1.96).abs() < 0.001);
    assert!((z_of(0.99) - 2.576).abs() < 0.001);
    // Wilson, 10 of 100 at 95%: (0.0552, 0.1744).
    let (lo, hi) = wilson(10, 100, z_of(0.95));
    assert!(
        (lo - 0.0552).abs() < 5e-4 && (hi - 0.1744).abs() < 5e-4,
        "{lo} {hi}"
    );
    // Newcombe's hybrid interval, 56/70 against 48/80 (his example 1): 0.0524 to 0.3339 for
    // the first minus the second.
    let (d, lo, hi) = rate_difference(48, 80, 56, 70, z_of(0.95));
    assert!((d - 0.2).abs() < 1e-9);
    assert!(
        (lo - 0.0524).abs() < 1e-3 && (hi - 0.3339).abs() < 1e-3,
        "{lo} {hi}"
    );
}

#[test]
fn too_few_requests_are_never_a_rollback() {
    let v = evaluate(
        &thresholds(),
        &arm(150, 0, &spread(150, 0.1, 0.5)),
        &arm(150, 150, &spread(150, 1.0, 2.0)),
        1,
    );
    assert_eq!(
        v,
        Verdict::Insufficient {
            control: 150,
            cohort: 150,
            needed: 200
        }
    );
}

#[test]
fn equal_arms_hold_and_a_slower_cohort_rolls_back_on_p90() {
    let control = arm(1000, 5, &spread(1000, 0.1, 0.5));
    let same = arm(1000, 6, &spread(1000, 0.1, 0.5));
    let Verdict::Hold(all) = evaluate(&thresholds(), &control, &same, 7) else {
        panic!("equal arms hold");
    };
    assert_eq!(all.len(), 2);
    let p90 = all
        .iter()
        .find(|c| c.threshold == Threshold::TtftP90)
        .unwrap();
    assert!(p90.low < 1.0 && p90.high > 1.0, "{p90:?}");
    // 50% slower everywhere: p90's interval is well past 1.2.
    let slow = arm(1000, 5, &spread(1000, 0.15, 0.75));
    match evaluate(&thresholds(), &control, &slow, 7) {
        Verdict::Rollback { crossed, .. } => {
            assert_eq!(crossed.threshold, Threshold::TtftP90);
            assert!((crossed.estimate - 1.5).abs() < 0.05, "{crossed:?}");
            assert!(crossed.low > 1.2);
        }
        v => panic!("{v:?}"),
    }
    // The same verdict for the same seed: the bootstrap is reproducible.
    assert_eq!(
        evaluate(&thresholds(), &control, &slow, 7),
        evaluate(&thresholds(), &control, &slow, 7)
    );
}

#[test]
fn an_error_rate_rise_rolls_back_only_when_its_interval_is_past_the_limit() {
    let ttft = spread(1000, 0.1, 0.5);
    let control = arm(1000, 10, &ttft);
    // 1% against 2.5%: a rise of 1.5 points, under the 2-point limit.
    assert!(matches!(
        evaluate(&thresholds(), &control, &arm(1000, 25, &ttft), 1),
        Verdict::Hold(_)
    ));
    // 1% against 8%: the interval's low end is past 2 points.
    match evaluate(&thresholds(), &control, &arm(1000, 80, &ttft), 1) {
        Verdict::Rollback { crossed, .. } => {
            assert_eq!(crossed.threshold, Threshold::ErrorRate);
            assert!((crossed.estimate - 0.07).abs() < 1e-9);
        }
        v => panic!("{v:?}"),
    }
}

#[test]
fn saturation_is_a_ceiling_on_the_cohort() {
    let t = Thresholds {
        saturation: Some(0.9),
        min_samples: 10,
        ..Thresholds::default()
    };
    let control = arm(100, 0, &spread(100, 0.1, 0.5));
    let mut cohort = control.clone();
    cohort.saturation = 0.95;
    assert!(matches!(
        evaluate(&t, &control, &cohort, 1),
        Verdict::Rollback {
            crossed: Comparison {
                threshold: Threshold::Saturation,
                ..
            },
            ..
        }
    ));
}

#[test]
fn sample_sizes_match_the_normal_approximation() {
    // 1% → 2% at 95% confidence and 80% power: about 2,300 per arm.
    let n = samples_for_rate(0.01, 0.01, 0.95, 0.8);
    assert!((2200..2450).contains(&n), "{n}");
    // A 20% p90 regression on a uniform 0.1-0.5 s arm: hundreds of requests per arm, and a
    // smaller regression needs more.
    let h = hist(&spread(1000, 0.1, 0.5));
    let big = samples_for_quantile(&h, 0.9, 1.2, 0.95, 0.8).unwrap();
    let small = samples_for_quantile(&h, 0.9, 1.05, 0.95, 0.8).unwrap();
    assert!(big < small, "{big} {small}");
    assert!((10..2000).contains(&big), "{big}");
}

#[test]
fn the_bootstrap_detects_what_the_sample_size_says_it_can() {
    // At the size `samples_for_quantile` gives for a 30% regression, a 30% slower cohort is
    // rolled back on most seeds (the power it was sized for is 80%).
    let control_samples = spread(4000, 0.1, 0.5);
    let h = hist(&control_samples);
    let n = samples_for_quantile(&h, 0.9, 1.3, 0.95, 0.8).unwrap() as usize;
    let t = Thresholds {
        ttft_p90_ratio: Some(1.0),
        min_samples: 1,
        ..Thresholds::default()
    };
    let mut rolled = 0;
    for seed in 0..20u64 {
        // Each arm: n draws of a uniform, from the seed.
        let mut r = SplitMix(seed);
        let mut draw = |lo: f64, hi: f64| {
            (0..n)
                .map(|_| lo + (hi - lo) * (r.below(1 << 20) as f64 / (1 << 20) as f64))
                .collect::<Vec<_>>()
        };
        let control = arm(n as u64, 0, &draw(0.1, 0.5));
        let cohort = arm(n as u64, 0, &draw(0.13, 0.65));
        if matches!(
            evaluate(&t, &control, &cohort, seed),
            Verdict::Rollback { .. }
        ) {
            rolled += 1;
        }
    }
    assert!(rolled >= 12, "{rolled} of 20 at n = {n}");
}

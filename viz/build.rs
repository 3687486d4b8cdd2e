//! Finds what this package's tests drive besides Cargo's outputs (the dashboard over a real Prometheus, in headless Chromium):
//! each one missing ignores its tests, which nextest then counts as skipped, and fails the run
//! under CI (see kinference-test-prereqs).

fn main() {
    kinference_test_prereqs::detect(&[
        kinference_test_prereqs::PROMETHEUS,
        kinference_test_prereqs::CHROMIUM,
    ]);
}

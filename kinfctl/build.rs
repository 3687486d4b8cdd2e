//! Finds what this package's tests drive besides Cargo's outputs (`kinfctl viz` over a real Prometheus; the charts rendered by Helm's SDK):
//! each one missing ignores its tests, which nextest then counts as skipped, and fails the run
//! under CI (see kinference-test-prereqs).

fn main() {
    kinference_test_prereqs::detect(&[
        kinference_test_prereqs::PROMETHEUS,
        kinference_test_prereqs::HELM_SDK,
    ]);
}

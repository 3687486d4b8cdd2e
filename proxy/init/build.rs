//! Finds what this package's tests drive besides Cargo's outputs (proxy-init's rules applied in a network namespace with each iptables backend):
//! each one missing ignores its tests, which nextest then counts as skipped, and fails the run
//! under CI (see kinference-test-prereqs).

fn main() {
    kinference_test_prereqs::detect(&[kinference_test_prereqs::NETNS]);
}

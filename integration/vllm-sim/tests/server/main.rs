//! End-to-end tests of the simulated vLLM server over real sockets: the in-process library server
//! on 127.0.0.1:0, and the real `vllm-sim` binary.
//!
//! Every test is bounded by a tokio timeout, so a server that stops answering fails the test
//! instead of hanging it.

mod binary;
mod faults;
mod kv_events;
mod metrics;
mod openai;
mod pause;
mod recorded;
mod support;

kinference_test_prereqs::ci_guard!();

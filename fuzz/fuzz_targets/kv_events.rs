//! vLLM KV-event batches (msgpack, array or map form) as the proxy's ZMQ subscriber decodes them.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| kinference_proxy_signals::fuzzing::kv_events(data));

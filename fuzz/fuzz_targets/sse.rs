//! Response bodies (SSE streams and whole JSON bodies) as the proxy observes them on their way to
//! the client: token events, usage, and the fast reader against the JSON-tree reader.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| kinference_proxy::stream::fuzzing::sse(data));

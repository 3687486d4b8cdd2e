//! OpenAI request bodies (`/v1/chat/completions` and `/v1/completions`) as the proxy parses them.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| kinference_openai::fuzzing::request(data));

//! vLLM `/metrics` expositions (Prometheus text and OpenMetrics) as the proxy's scraper reads them.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| kinference_proxy_signals::fuzzing::prometheus(data));

//! The proxy's performance bench: a load generator that shares no code with the proxy, an
//! upstream that answers instantly, and the driver that measures the proxy against a direct
//! connection and nginx in one run; and the driver that measures it in front of real vLLM and the
//! simulator side by side ([`vllm_latency`]).

pub mod bench;
pub mod clock;
pub mod closed;
pub mod load;
pub mod pool;
pub mod report;
pub mod upstream;
pub mod vllm_latency;

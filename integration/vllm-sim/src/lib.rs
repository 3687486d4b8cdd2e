//! An OpenAI- and vLLM-compatible HTTP server over the simulated engine, with metrics, KV events and fault injection.

//! The engine adapters side by side: vLLM's reads the recorded vLLM 0.32.0 expositions exactly as
//! `parse_vllm_metrics` always has, SGLang's reads the exposition written from SGLang's
//! documentation (`tests/fixtures/sglang/metrics.txt`), and each refuses the other's, so a pool
//! that names the wrong engine shows as failed scrapes instead of as an endpoint with no queue.

use kinference_proxy_signals::{
    Engine, EngineAdapter, ParseError, UnknownEngine, engine::Sglang, engine::Vllm, parse_metrics,
    parse_vllm_metrics,
};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");

fn read(path: &str) -> String {
    let path = format!("{FIXTURES}/{path}");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Every recorded vLLM 0.32.0 exposition.
fn vllm_expositions() -> Vec<(String, String)> {
    let mut out = Vec::new();
    for rec in ["default", "cbor-details"] {
        for at in ["before", "during", "after"] {
            let path = format!("vllm-0.32.0/{rec}/metrics-{at}.txt");
            let text = read(&path);
            out.push((path, text));
        }
    }
    out
}

fn sglang_exposition() -> String {
    read("sglang/metrics.txt")
}

#[test]
fn the_vllm_adapter_reads_the_recordings_exactly_as_parse_vllm_metrics() {
    for (path, text) in vllm_expositions() {
        let old = parse_vllm_metrics(&text).unwrap_or_else(|e| panic!("{path}: {e}"));
        assert_eq!(Vllm.parse_metrics(&text).as_ref(), Ok(&old), "{path}");
        assert_eq!(
            parse_metrics(Engine::Vllm, &text).as_ref(),
            Ok(&old),
            "{path}"
        );
        assert_eq!(Engine::Vllm.adapter().engine(), Engine::Vllm);
        // What the recordings carry, so the comparison is not of two empty structs.
        assert!(old.num_requests_waiting.is_some() && old.kv_cache_usage.is_some());
    }
    // And their errors agree.
    for text in ["", "up 1\n", "vllm:num_requests_running{ 1\n"] {
        assert_eq!(
            Vllm.parse_metrics(text),
            parse_vllm_metrics(text),
            "{text:?}"
        );
    }
}

#[test]
fn the_sglang_adapter_reads_the_documented_exposition() {
    let m = parse_metrics(Engine::Sglang, &sglang_exposition()).unwrap();
    assert_eq!(m.num_requests_waiting, Some(5.0));
    assert_eq!(m.num_requests_running, Some(12.0));
    assert_eq!(m.kv_cache_usage, Some(0.31));
    assert_eq!(Engine::Sglang.adapter().engine(), Engine::Sglang);
    assert_eq!(Sglang.parse_metrics(&sglang_exposition()), Ok(m));
}

#[test]
fn engine_names_round_trip_and_unknown_names_are_refused() {
    for engine in Engine::ALL {
        assert_eq!(Engine::parse(engine.name()), Some(engine));
        assert_eq!(Engine::parse(&engine.to_string()), Some(engine));
        assert_eq!(engine.name().parse::<Engine>(), Ok(engine));
    }
    assert_eq!(Engine::parse("vllm"), Some(Engine::Vllm));
    assert_eq!(Engine::parse("sglang"), Some(Engine::Sglang));
    assert_eq!(Engine::parse("SGLang"), Some(Engine::Sglang));
    assert_eq!(Engine::default(), Engine::Vllm);
    for unknown in ["", "tgi", "trtllm", "vllm ", "sg-lang", "vllm:"] {
        assert_eq!(Engine::parse(unknown), None, "{unknown:?}");
        assert_eq!(
            unknown.parse::<Engine>(),
            Err(UnknownEngine {
                name: unknown.into()
            })
        );
    }
    assert_eq!(
        "tgi".parse::<Engine>().unwrap_err().to_string(),
        "unknown engine \"tgi\" (known: vllm, sglang)"
    );
}

#[test]
fn an_sglang_exposition_read_as_vllm_gives_no_queue_signals() {
    let got = Vllm.parse_metrics(&sglang_exposition());
    assert_eq!(got, Err(ParseError::NoVllmMetrics));
}

#[test]
fn a_vllm_exposition_read_as_sglang_gives_no_queue_signals() {
    for (path, text) in vllm_expositions() {
        assert_eq!(
            Sglang.parse_metrics(&text),
            Err(ParseError::NoEngineMetrics {
                engine: Engine::Sglang
            }),
            "{path}"
        );
    }
}

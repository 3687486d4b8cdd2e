//! KV events: a ZMQ SUB client receives vLLM's multipart messages and decodes them as vLLM's
//! msgspec structs would (the batch array-like, each tagged event a map, as vLLM 0.32 sends them).

use std::time::Duration;

use kinference_vllm_sim::KvEventsConfig;
use rmpv::Value;
use serde_json::json;
use zeromq::{Socket, SocketRecv};

use crate::support::*;

/// One received message: sequence number and decoded batch.
async fn recv(sub: &mut zeromq::SubSocket, topic: &str) -> (u64, Value) {
    let msg = sub.recv().await.unwrap();
    let frames = msg.into_vec();
    assert_eq!(frames.len(), 3, "topic, sequence, payload");
    assert_eq!(&frames[0][..], topic.as_bytes());
    let seq = u64::from_be_bytes(frames[1][..].try_into().expect("8-byte sequence"));
    let batch = rmpv::decode::read_value(&mut &frames[2][..]).unwrap();
    (seq, batch)
}

/// The field `name` of a map-form event.
fn field<'a>(event: &'a Value, name: &str) -> &'a Value {
    event
        .as_map()
        .unwrap_or_else(|| panic!("an event is a map: {event}"))
        .iter()
        .find(|(k, _)| k.as_str() == Some(name))
        .map(|(_, v)| v)
        .unwrap_or_else(|| panic!("{name} in {event}"))
}

/// The keys of a map-form event, in order.
fn keys(event: &Value) -> Vec<&str> {
    event
        .as_map()
        .unwrap()
        .iter()
        .map(|(k, _)| k.as_str().unwrap())
        .collect()
}

fn as_u64s(v: &Value) -> Vec<u64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect()
}

#[tokio::test]
async fn block_stored_events_for_a_prompts_blocks() {
    bounded(30, async {
        // The subscriber binds; the replica connects (vLLM's rule for an address without `*`).
        let mut sub = zeromq::SubSocket::new();
        let endpoint = sub.bind("tcp://127.0.0.1:0").await.unwrap();
        sub.subscribe("").await.unwrap();
        let mut config = small_config();
        config.kv_events = Some(KvEventsConfig {
            endpoint: endpoint.to_string(),
            topic: "kv@sim".into(),
        });
        let replica = start(config).await;
        let base = replica.url();

        // Until the subscription has reached the publisher, PUB drops messages: reset the (empty)
        // prefix cache, and step the engine to publish it, until an AllBlocksCleared arrives.
        let mut last_seq;
        loop {
            reset_and_step(&base).await;
            if let Ok((seq, batch)) =
                tokio::time::timeout(Duration::from_millis(200), recv(&mut sub, "kv@sim")).await
            {
                let b = batch.as_array().unwrap();
                assert_eq!(b.len(), 3, "[ts, events, data_parallel_rank]");
                assert!(b[0].as_f64().unwrap() > 1.6e9, "ts is Unix seconds");
                assert_eq!(
                    b[1].as_array().unwrap()[0],
                    Value::Map(vec![("type".into(), "AllBlocksCleared".into())])
                );
                assert_eq!(b[2].as_u64(), Some(0));
                last_seq = seq;
                break;
            }
        }

        // 100 prompt tokens + 4 output tokens: 6 full blocks of 16 (the 7th is partial).
        let prompt: Vec<u32> = (0..100).map(|i| 1000 + i).collect();
        let (status, body) = post_json(
            &format!("{base}/v1/completions"),
            &json!({"model": MODEL, "prompt": prompt, "max_tokens": 4}),
        )
        .await;
        assert_eq!(status, 200, "{body}");

        let mut hashes = Vec::new();
        let mut tokens = Vec::new();
        let mut parent_of_first = None;
        while hashes.len() < 6 {
            let (seq, batch) = recv(&mut sub, "kv@sim").await;
            assert!(
                seq > last_seq,
                "sequence numbers increase: {seq} after {last_seq}"
            );
            last_seq = seq;
            let b = batch.as_array().unwrap();
            for event in b[1].as_array().unwrap() {
                assert_eq!(
                    keys(event),
                    [
                        "type",
                        "block_hashes",
                        "parent_block_hash",
                        "token_ids",
                        "block_size",
                        "lora_id",
                        "medium",
                        "lora_name",
                        "extra_keys",
                        "group_idx",
                        "kv_cache_spec_kind"
                    ],
                    "{event}"
                );
                assert_eq!(field(event, "type").as_str(), Some("BlockStored"));
                let block_hashes = as_u64s(field(event, "block_hashes"));
                let parent = field(event, "parent_block_hash");
                if hashes.is_empty() {
                    parent_of_first = Some(parent.clone());
                } else {
                    assert_eq!(
                        parent.as_u64(),
                        hashes.last().copied(),
                        "chained to the last block"
                    );
                }
                let token_ids = as_u64s(field(event, "token_ids"));
                assert_eq!(field(event, "block_size").as_u64(), Some(16));
                assert_eq!(token_ids.len(), block_hashes.len() * 16);
                assert_eq!(field(event, "lora_id"), &Value::Nil);
                assert_eq!(field(event, "medium").as_str(), Some("GPU"));
                assert_eq!(field(event, "lora_name"), &Value::Nil);
                assert_eq!(
                    field(event, "extra_keys"),
                    &Value::Array(vec![Value::Nil; block_hashes.len()])
                );
                assert_eq!(field(event, "group_idx").as_u64(), Some(0));
                assert_eq!(
                    field(event, "kv_cache_spec_kind").as_str(),
                    Some("full_attention")
                );
                hashes.extend(block_hashes);
                tokens.extend(token_ids);
            }
        }
        assert_eq!(
            parent_of_first,
            Some(Value::Nil),
            "the first block has no parent"
        );
        assert_eq!(hashes.len(), 6);
        let prompt_u64: Vec<u64> = prompt.iter().map(|&t| u64::from(t)).collect();
        assert_eq!(
            tokens[..96],
            prompt_u64[..96],
            "the prompt's tokens, in order"
        );
        // The hashes are the engine's chained block hashes of the prompt.
        let mut expected = Vec::new();
        kinference_sim::kv::extend_block_hashes(&mut expected, &prompt, 16, None);
        assert_eq!(hashes, expected);
        replica.shutdown().await;
    })
    .await;
}

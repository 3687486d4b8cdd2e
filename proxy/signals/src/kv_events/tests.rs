use super::*;
use kinference_sim::kv::KvEvent as SimEvent;
use kinference_vllm_sim::{driver::KvBatch, kv_events::encode_batch};

fn frames(topic: &str, seq: u64, payload: Vec<u8>) -> ZmqMessage {
    ZmqMessage::try_from(vec![
        Bytes::from(topic.as_bytes().to_vec()),
        Bytes::copy_from_slice(&seq.to_be_bytes()),
        Bytes::from(payload),
    ])
    .unwrap()
}

fn sim_batch() -> Vec<u8> {
    encode_batch(&KvBatch {
        ts_unix_s: 1_752_345_678.25,
        events: vec![
            SimEvent::BlockStored {
                block_hashes: vec![11, u64::MAX],
                parent_block_hash: Some(7),
                token_ids: (0..32).collect(),
                block_size: 16,
                lora_id: Some(1),
            },
            SimEvent::BlockRemoved {
                block_hashes: vec![5, 6],
            },
            SimEvent::AllBlocksCleared,
        ],
        lora_names: vec!["sql-lora".into()],
    })
}

#[test]
fn decodes_the_simulators_batches() {
    let events = decode_batch(&sim_batch()).unwrap();
    assert_eq!(
        events,
        vec![
            KvEvent::BlockStored {
                block_hashes: vec![11, u64::MAX],
                parent_block_hash: Some(7),
                token_ids: (0..32).collect(),
                block_size: 16,
            },
            KvEvent::BlockRemoved {
                block_hashes: vec![5, 6]
            },
            KvEvent::AllBlocksCleared,
        ]
    );
}

fn encode(v: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, v).unwrap();
    out
}

#[test]
fn older_and_newer_shapes_and_other_media() {
    let digest: Vec<u8> = (1..=32).collect();
    let batch = Value::Array(vec![
        Value::F64(1.0),
        Value::Array(vec![
            // vLLM 0.9: no medium, signed Python hash.
            Value::Array(vec![
                "BlockStored".into(),
                Value::Array(vec![Value::from(-1i64)]),
                Value::Nil,
                Value::Array(vec![Value::from(1u32), Value::from(2u32)]),
                Value::from(2u32),
                Value::Nil,
            ]),
            // vLLM 0.11: a sha256 digest, on the CPU tier: skipped.
            Value::Array(vec![
                "BlockStored".into(),
                Value::Array(vec![Value::Binary(digest.clone())]),
                Value::Nil,
                Value::Array(vec![]),
                Value::from(16u32),
                Value::Nil,
                "CPU".into(),
            ]),
            Value::Array(vec![
                "BlockRemoved".into(),
                Value::Array(vec![Value::Binary(digest)]),
                "GPU".into(),
            ]),
            // A future event kind: skipped.
            Value::Array(vec!["BlockPinned".into(), Value::Array(vec![])]),
            // The map form msgspec writes without array_like.
            Value::Map(vec![
                ("type".into(), "BlockRemoved".into()),
                ("block_hashes".into(), Value::Array(vec![Value::from(9u8)])),
            ]),
        ]),
    ]);
    let events = decode_batch(&encode(&batch)).unwrap();
    assert_eq!(
        events,
        vec![
            KvEvent::BlockStored {
                block_hashes: vec![u64::MAX],
                parent_block_hash: None,
                token_ids: vec![1, 2],
                block_size: 2,
            },
            KvEvent::BlockRemoved {
                // The last 8 bytes of 1..=32, big-endian.
                block_hashes: vec![u64::from_be_bytes([25, 26, 27, 28, 29, 30, 31, 32])]
            },
            KvEvent::BlockRemoved {
                block_hashes: vec![9]
            },
        ]
    );
}

#[test]
fn malformed_batches_are_errors() {
    assert!(decode_batch(b"\xc1").is_err());
    assert!(decode_batch(&encode(&Value::from(3u8))).is_err());
    let bad_size = Value::Array(vec![
        Value::F64(1.0),
        Value::Array(vec![Value::Array(vec![
            "BlockStored".into(),
            Value::Array(vec![]),
            Value::Nil,
            Value::Array(vec![]),
            Value::from(-4i64),
        ])]),
    ]);
    assert_eq!(
        decode_batch(&encode(&bad_size)),
        Err("block_size must be a u32".into())
    );
}

#[test]
fn sequence_gaps_and_restarts_are_reported_before_the_batch() {
    let mut last = None;
    let out = handle(frames("kv", 4, sim_batch()), &mut last);
    assert_eq!(out.len(), 1, "the first message sets the sequence");
    assert!(out[0].is_ok());
    assert!(handle(frames("kv", 5, sim_batch()), &mut last)[0].is_ok());

    let out = handle(frames("kv", 8, sim_batch()), &mut last);
    assert_eq!(
        out[0],
        Err(KvEventError::SequenceGap {
            expected: 6,
            received: 8
        })
    );
    assert!(out[0].as_ref().unwrap_err().events_lost());
    assert!(out[1].is_ok(), "the batch after the gap is still delivered");

    // A restarted publisher numbers from 0 again.
    let out = handle(frames("kv", 0, sim_batch()), &mut last);
    assert_eq!(
        out[0],
        Err(KvEventError::SequenceGap {
            expected: 9,
            received: 0
        })
    );

    let out = handle(frames("kv", 1, b"\xc1".to_vec()), &mut last);
    assert!(matches!(
        out[..],
        [Err(KvEventError::Decode { seq: Some(1), .. })]
    ));
}

/// Established TCP connections whose remote port is `port`, from the kernel's tables: the
/// subscriber's side of every connection to the publisher.
#[cfg(target_os = "linux")]
fn connections_to(port: u16) -> usize {
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|path| std::fs::read_to_string(path).ok())
        .flat_map(|table| table.lines().skip(1).map(str::to_owned).collect::<Vec<_>>())
        .filter(|line| {
            let cols: Vec<&str> = line.split_whitespace().collect();
            let remote_port = cols
                .get(2)
                .and_then(|addr| addr.rsplit(':').next())
                .and_then(|p| u16::from_str_radix(p, 16).ok());
            // State 01 is ESTABLISHED.
            remote_port == Some(port) && cols.get(3) == Some(&"01")
        })
        .count()
}

#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_reconnects_close_the_socket_they_replace() {
    use zeromq::{Socket, SocketSend};

    let mut publisher = zeromq::PubSocket::new();
    let bound = publisher.bind("tcp://127.0.0.1:0").await.unwrap();
    let port = match bound {
        zeromq::Endpoint::Tcp(_, port) => port,
        other => panic!("bound {other:?}"),
    };
    let mut config = KvEventsConfig::new(format!("tcp://127.0.0.1:{port}"), "kv");
    config.idle_reconnect = Duration::from_millis(50);
    let mut rx = subscribe_kv_events_with(config);

    // Twenty idle periods: each one replaces the subscription.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let open = connections_to(port);
    assert!(
        open <= 1,
        "{open} connections to the publisher after 20 idle reconnects"
    );

    // The subscription still works after all that.
    let delivered = async {
        let mut seq = 0u64;
        loop {
            publisher
                .send(frames("kv", seq, sim_batch()))
                .await
                .unwrap();
            seq += 1;
            if let Ok(Some(Ok(events))) =
                tokio::time::timeout(Duration::from_millis(20), rx.recv()).await
            {
                return events;
            }
        }
    };
    let events = tokio::time::timeout(Duration::from_secs(10), delivered)
        .await
        .expect("a message arrives after the reconnects");
    assert_eq!(events.len(), 3);
}

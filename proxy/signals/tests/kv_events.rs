//! The KV-event subscriber against the vLLM simulator's real ZMQ publisher, in process.

#[path = "signals/sim.rs"]
mod sim;

use kinference_proxy_signals::{KvEventError, KvEventsConfig, subscribe_kv_events_with};
use kinference_routing::KvEvent;
use kinference_sim::kv::extend_block_hashes;
use std::time::Duration;
use tokio::sync::mpsc;

type Rx = mpsc::Receiver<Result<Vec<KvEvent>, KvEventError>>;

/// The next item, or `None` after `wait` (a retry cadence, not a speed assertion).
async fn next(rx: &mut Rx, wait: Duration) -> Option<Result<Vec<KvEvent>, KvEventError>> {
    tokio::time::timeout(wait, rx.recv()).await.ok().flatten()
}

/// ZMQ drops what is published before a subscription reaches the publisher: send distinct
/// prompts until one batch arrives, then drain.
async fn until_subscribed(replica: &kinference_vllm_sim::Replica, rx: &mut Rx, base: u32) {
    for i in 0..60u32 {
        let tokens: Vec<u32> = (0..64).map(|t| base + i * 1000 + t).collect();
        sim::complete(replica, &tokens).await;
        if next(rx, Duration::from_millis(500)).await.is_some() {
            while next(rx, Duration::from_millis(200)).await.is_some() {}
            return;
        }
    }
    panic!("no KV events after 60 prompts");
}

/// Collects `BlockStored` events until every hash in `want` has been stored.
async fn stored_until(rx: &mut Rx, want: &[u64]) -> Vec<KvEvent> {
    let mut stored = Vec::new();
    let mut hashes = Vec::new();
    while !want.iter().all(|h| hashes.contains(h)) {
        let batch = next(rx, Duration::from_secs(20))
            .await
            .expect("KV events within 20 s")
            .expect("no subscriber error");
        for e in batch {
            if let KvEvent::BlockStored { block_hashes, .. } = &e {
                hashes.extend(block_hashes.iter().copied());
                stored.push(e);
            }
        }
    }
    stored
}

#[tokio::test]
async fn block_stored_hashes_match_the_prompt() {
    let port = sim::free_port();
    let replica = sim::replica(Some(format!("tcp://*:{port}"))).await;
    let mut config = KvEventsConfig::new(format!("tcp://127.0.0.1:{port}"), "kv@sim");
    config.idle_reconnect = Duration::from_secs(60);
    let mut rx = subscribe_kv_events_with(config);
    until_subscribed(&replica, &mut rx, 1_000_000).await;

    let bs = replica.config().engine.block_size;
    let prompt: Vec<u32> = (7..7 + 4 * bs + 3).collect();
    let mut want = Vec::new();
    extend_block_hashes(&mut want, &prompt, bs, None);
    assert_eq!(want.len(), 4);
    sim::complete(&replica, &prompt).await;

    let stored = stored_until(&mut rx, &want).await;
    let KvEvent::BlockStored {
        block_hashes,
        parent_block_hash,
        token_ids,
        block_size,
    } = &stored[0]
    else {
        unreachable!()
    };
    assert_eq!(
        *parent_block_hash, None,
        "the prompt's first block has no parent"
    );
    assert_eq!(block_hashes[0], want[0]);
    assert_eq!(*block_size, bs);
    assert_eq!(token_ids[..bs as usize], prompt[..bs as usize]);
    // Across however many steps prefill took, the stored chain is the prompt's, in order.
    let chain: Vec<u64> = stored
        .iter()
        .flat_map(|e| match e {
            KvEvent::BlockStored { block_hashes, .. } => block_hashes.clone(),
            _ => vec![],
        })
        .collect();
    assert_eq!(chain[..4], want[..]);
    replica.shutdown().await;
}

#[tokio::test]
async fn a_restarted_publisher_is_a_sequence_gap_then_events_flow_again() {
    let port = sim::free_port();
    let endpoint = format!("tcp://*:{port}");
    let replica = sim::replica(Some(endpoint.clone())).await;
    let mut config = KvEventsConfig::new(format!("tcp://127.0.0.1:{port}"), "kv@sim");
    config.idle_reconnect = Duration::from_millis(300);
    config.backoff_min = Duration::from_millis(20);
    let mut rx = subscribe_kv_events_with(config);
    until_subscribed(&replica, &mut rx, 2_000_000).await;
    // Several batches so the sequence is well past 0.
    until_subscribed(&replica, &mut rx, 3_000_000).await;
    replica.shutdown().await;

    // A new replica on the same port numbers its batches from 0 again.
    let replica = sim::replica(Some(endpoint)).await;
    let mut gap = None;
    for i in 0..60u32 {
        let tokens: Vec<u32> = (0..64).map(|t| 4_000_000 + i * 1000 + t).collect();
        sim::complete(&replica, &tokens).await;
        if let Some(item) = next(&mut rx, Duration::from_millis(500)).await {
            gap = Some(item);
            break;
        }
    }
    match gap.expect("events from the new publisher") {
        Err(e @ KvEventError::SequenceGap { received, .. }) => {
            assert!(e.events_lost());
            assert!(
                received < 60,
                "the new publisher's numbering restarted: {received}"
            );
        }
        other => panic!("expected a sequence gap first, got {other:?}"),
    }
    let after = next(&mut rx, Duration::from_secs(20)).await;
    assert!(matches!(after, Some(Ok(_))), "{after:?}");
    replica.shutdown().await;
}

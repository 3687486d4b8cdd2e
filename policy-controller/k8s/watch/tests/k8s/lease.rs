//! The Lease elector, one step at a time, against the API server double.

use crate::fixtures::*;
use http::Method;
use kinference_k8s_api_double::ApiServer;
use kinference_policy_k8s_watch::{LeaseConfig, LeaseElector};
use std::time::Duration;

fn elector(server: &ApiServer, identity: &str, clock: std::sync::Arc<ManualClock>) -> LeaseElector {
    let config = LeaseConfig::new(NS, "leader", identity);
    LeaseElector::new(server.client(identity), config, clock)
}

fn lease(server: &ApiServer) -> serde_json::Value {
    server
        .object("coordination.k8s.io/v1", "Lease", NS, "leader")
        .expect("lease")
}

#[tokio::test]
async fn a_lease_is_created_renewed_refused_and_taken_over_when_expired() {
    let server = ApiServer::start().await;
    let clock = ManualClock::new();
    let mut a = elector(&server, "a", clock.clone());
    let mut b = elector(&server, "b", clock.clone());
    let leader_a = a.subscribe();

    // Absent: A creates it.
    assert!(a.step().await.unwrap());
    assert!(*leader_a.borrow());
    let l = lease(&server);
    assert_eq!(l["spec"]["holderIdentity"], "a");
    assert_eq!(l["spec"]["leaseDurationSeconds"], 15);
    assert_eq!(l["spec"]["leaseTransitions"], 0);
    let created = server
        .requests()
        .iter()
        .filter(|r| r.method == Method::POST && r.path.ends_with("/leases"))
        .count();
    assert_eq!(created, 1);

    // Held and fresh: B is refused and writes nothing.
    clock.advance(Duration::from_secs(10));
    assert!(!b.step().await.unwrap());
    assert!(!b.is_leader());
    assert!(
        server
            .requests()
            .iter()
            .filter(|r| r.client.as_deref() == Some("b"))
            .all(|r| r.method == Method::GET)
    );

    // A renews: renewTime moves with the clock, acquireTime stays.
    let acquired = l["spec"]["acquireTime"].clone();
    assert!(a.step().await.unwrap());
    let renewed = lease(&server);
    assert_eq!(renewed["spec"]["acquireTime"], acquired);
    assert_ne!(renewed["spec"]["renewTime"], l["spec"]["renewTime"]);

    // 15s after the renewal it is still held; a second later it has expired.
    clock.advance(Duration::from_secs(15));
    assert!(!b.step().await.unwrap());
    clock.advance(Duration::from_secs(1));
    assert!(b.step().await.unwrap());
    let l = lease(&server);
    assert_eq!(l["spec"]["holderIdentity"], "b");
    assert_eq!(l["spec"]["leaseTransitions"], 1);

    // A learns it lost the lease.
    assert!(!a.step().await.unwrap());
    assert!(!*leader_a.borrow());
}

//! The discovery client against a scripted controller on loopback: real tonic, real sockets.

#[path = "discovery/support.rs"]
mod support;

use kinference_proxy_discovery::{Discovery, DiscoveryConfig, Endpoint, spawn};
use std::{
    collections::BTreeMap,
    net::SocketAddr,
    sync::{Arc, atomic::AtomicUsize, atomic::Ordering},
    time::Duration,
};
use support::*;

fn config(addr: SocketAddr) -> DiscoveryConfig {
    DiscoveryConfig {
        controller: format!("http://{addr}").parse().unwrap(),
        target: TARGET.into(),
        workload: "apps/web".into(),
        backoff_min: Duration::from_millis(20),
        backoff_max: Duration::from_millis(200),
    }
}

fn pool(eps: &[(&str, &str)]) -> BTreeMap<SocketAddr, String> {
    eps.iter()
        .map(|(a, pod)| (a.parse().unwrap(), pod.to_string()))
        .collect()
}

/// What the client should publish for `pool`: sorted by address, set labels merged in.
fn expected(eps: &[(&str, &str)]) -> Vec<Endpoint> {
    pool(eps)
        .into_iter()
        .map(|(addr, pod)| Endpoint {
            addr,
            labels: BTreeMap::from([
                ("namespace".to_string(), "default".to_string()),
                ("pod".to_string(), pod),
            ]),
        })
        .collect()
}

async fn converge(d: &mut Discovery, want: BTreeMap<String, Vec<Endpoint>>) {
    let what = format!("endpoints {want:?}");
    wait_for(&mut d.endpoints, &what, |e| e.by_backend == want).await;
}

#[tokio::test]
async fn policies_and_endpoints_arrive_and_follow_changes() {
    let script = Script::new();
    script.inference.send_replace(Some(inference_policy(
        "1",
        &[("glm-5.3", GLM), ("qwen-3.6-27b", QWEN)],
    )));
    script
        .outbound
        .send_replace(Some(outbound_policy("http", &[GLM])));
    script.pools.send_replace(BTreeMap::from([(
        GLM.to_string(),
        pool(&[("10.0.0.1:8000", "glm-0"), ("10.0.0.2:8000", "glm-1")]),
    )]));
    let server = Server::start(script.clone(), "127.0.0.1:0".parse().unwrap());
    let mut d = spawn(config(server.addr));

    wait_for(&mut d.inference, "inference policy", |p| {
        p.as_ref().is_some_and(|p| p.revision == "1")
    })
    .await;
    assert_eq!(
        d.inference.borrow().as_deref(),
        script.inference.borrow().as_ref()
    );
    wait_for(&mut d.outbound, "outbound policy", Option::is_some).await;
    assert_eq!(
        d.outbound.borrow().as_deref(),
        script.outbound.borrow().as_ref()
    );
    // QWEN is not served: the controller answers NotFound, which is "no endpoints".
    converge(
        &mut d,
        BTreeMap::from([
            (
                GLM.to_string(),
                expected(&[("10.0.0.1:8000", "glm-0"), ("10.0.0.2:8000", "glm-1")]),
            ),
            (QWEN.to_string(), vec![]),
        ]),
    )
    .await;
    wait_for(&mut d.connected, "connected", |c| *c).await;

    // The client asked as linkerd's proxy does.
    {
        let reqs = script.requests.lock().unwrap();
        let glm = reqs.iter().find(|r| r.path == GLM).expect("a GLM request");
        assert_eq!(glm.scheme, "k8s");
        assert_eq!(glm.context_token, r#"{"ns":"apps"}"#);
        let targets = script.targets.lock().unwrap();
        assert_eq!(targets[0].source_workload, "apps/web");
        assert_eq!(
            targets[0].target,
            Some(
                kinference_proxy_api::inference::inference_target::Target::Authority(TARGET.into())
            )
        );
    }

    // An endpoint is added and another removed: deltas fold into the exact new set.
    script.pools.send_modify(|p| {
        let glm = p.get_mut(GLM).unwrap();
        glm.remove(&"10.0.0.1:8000".parse().unwrap());
        glm.insert("10.0.0.3:8000".parse().unwrap(), "glm-2".into());
    });
    converge(
        &mut d,
        BTreeMap::from([
            (
                GLM.to_string(),
                expected(&[("10.0.0.2:8000", "glm-1"), ("10.0.0.3:8000", "glm-2")]),
            ),
            (QWEN.to_string(), vec![]),
        ]),
    )
    .await;

    // Every endpoint goes: no_endpoints empties the backend.
    script.pools.send_modify(|p| {
        p.get_mut(GLM).unwrap().clear();
    });
    converge(
        &mut d,
        BTreeMap::from([(GLM.to_string(), vec![]), (QWEN.to_string(), vec![])]),
    )
    .await;
    assert!(*d.connected.borrow());
}

#[tokio::test]
async fn controller_outage_keeps_last_state_and_reconverges_on_the_same_port() {
    let script = Script::new();
    script
        .inference
        .send_replace(Some(inference_policy("1", &[("glm-5.3", GLM)])));
    script
        .outbound
        .send_replace(Some(outbound_policy("http", &[GLM])));
    let before = [("10.0.0.1:8000", "glm-0"), ("10.0.0.2:8000", "glm-1")];
    script
        .pools
        .send_replace(BTreeMap::from([(GLM.to_string(), pool(&before))]));
    let server = Server::start(script.clone(), "127.0.0.1:0".parse().unwrap());
    let addr = server.addr;
    let mut d = spawn(config(addr));
    converge(
        &mut d,
        BTreeMap::from([(GLM.to_string(), expected(&before))]),
    )
    .await;
    wait_for(&mut d.connected, "connected", |c| *c).await;

    // Record every endpoint set published from here on: GLM must never be empty or missing.
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut rx = d.endpoints.clone();
    let recorder = {
        let seen = seen.clone();
        tokio::spawn(async move {
            while rx.changed().await.is_ok() {
                let e = rx.borrow_and_update().clone();
                seen.lock().unwrap().push(e);
            }
        })
    };

    server.kill();
    wait_for(&mut d.connected, "disconnected", |c| !*c).await;

    // While the controller is away, a listener on its port counts the client's retries and
    // closes each connection at once. Several retries must change nothing.
    let accepts = Arc::new(AtomicUsize::new(0));
    let refuser = {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_reuseaddr(true).unwrap();
        socket.bind(addr).unwrap();
        let listener = socket.listen(64).unwrap();
        let accepts = accepts.clone();
        tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                accepts.fetch_add(1, Ordering::SeqCst);
                drop(conn);
            }
        })
    };
    let (tx, mut retries) = tokio::sync::watch::channel(0usize);
    let counter = {
        let accepts = accepts.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(10)).await;
                tx.send_replace(accepts.load(Ordering::SeqCst));
            }
        })
    };
    wait_for(&mut retries, "three reconnection attempts", |n| *n >= 3).await;
    counter.abort();
    refuser.abort();
    let _ = refuser.await;
    assert!(!*d.connected.borrow());
    assert_eq!(
        d.endpoints.borrow().by_backend,
        BTreeMap::from([(GLM.to_string(), expected(&before))]),
        "the last good endpoints are kept"
    );
    assert_eq!(
        d.inference.borrow().as_ref().map(|p| p.revision.clone()),
        Some("1".into()),
        "the last good inference policy is kept"
    );
    assert!(d.outbound.borrow().is_some());

    // The controller returns on the same port with new state: the client replaces its own.
    script
        .inference
        .send_replace(Some(inference_policy("2", &[("glm-5.3", GLM)])));
    let after = [("10.0.0.2:8000", "glm-1"), ("10.0.0.9:8000", "glm-9")];
    script
        .pools
        .send_replace(BTreeMap::from([(GLM.to_string(), pool(&after))]));
    let server = Server::start(script.clone(), addr);
    converge(
        &mut d,
        BTreeMap::from([(GLM.to_string(), expected(&after))]),
    )
    .await;
    wait_for(&mut d.inference, "new policy", |p| {
        p.as_ref().is_some_and(|p| p.revision == "2")
    })
    .await;
    wait_for(&mut d.connected, "reconnected", |c| *c).await;

    recorder.abort();
    let seen = seen.lock().unwrap();
    assert!(!seen.is_empty());
    for e in seen.iter() {
        let glm = e.by_backend.get(GLM).expect("GLM never disappears");
        assert!(
            *glm == expected(&before) || *glm == expected(&after),
            "endpoints flapped through {glm:?}"
        );
    }
    drop(server);
}

#[tokio::test]
async fn a_backend_removed_from_policy_stops_its_destination_watch() {
    let script = Script::new();
    script.inference.send_replace(Some(inference_policy(
        "1",
        &[("glm-5.3", GLM), ("qwen-3.6-27b", QWEN)],
    )));
    script
        .outbound
        .send_replace(Some(outbound_policy("http", &[GLM])));
    script.pools.send_replace(BTreeMap::from([
        (GLM.to_string(), pool(&[("10.0.0.1:8000", "glm-0")])),
        (QWEN.to_string(), pool(&[("10.0.1.1:8000", "qwen-0")])),
    ]));
    let server = Server::start(script.clone(), "127.0.0.1:0".parse().unwrap());
    let mut d = spawn(config(server.addr));
    converge(
        &mut d,
        BTreeMap::from([
            (GLM.to_string(), expected(&[("10.0.0.1:8000", "glm-0")])),
            (QWEN.to_string(), expected(&[("10.0.1.1:8000", "qwen-0")])),
        ]),
    )
    .await;
    let mut active = script.active.subscribe();
    wait_for(&mut active, "one stream per backend", |a| {
        a.get(GLM) == Some(&1) && a.get(QWEN) == Some(&1)
    })
    .await;

    // QWEN leaves the inference policy (the outbound policy never named it).
    script
        .inference
        .send_replace(Some(inference_policy("2", &[("glm-5.3", GLM)])));
    wait_for(&mut active, "QWEN's stream closed", |a| {
        a.get(QWEN) == Some(&0)
    })
    .await;
    converge(
        &mut d,
        BTreeMap::from([(GLM.to_string(), expected(&[("10.0.0.1:8000", "glm-0")]))]),
    )
    .await;
    assert_eq!(
        script.active.borrow().get(GLM),
        Some(&1),
        "GLM's watch stays"
    );

    // A backend named only by the outbound policy is watched too.
    script
        .outbound
        .send_replace(Some(outbound_policy("http", &[GLM, QWEN])));
    wait_for(&mut active, "QWEN watched again", |a| {
        a.get(QWEN) == Some(&1)
    })
    .await;
    converge(
        &mut d,
        BTreeMap::from([
            (GLM.to_string(), expected(&[("10.0.0.1:8000", "glm-0")])),
            (QWEN.to_string(), expected(&[("10.0.1.1:8000", "qwen-0")])),
        ]),
    )
    .await;
    assert!(*d.connected.borrow());
}

#[tokio::test]
async fn guard_measurements_are_reported_to_the_controller_as_they_change() {
    use kinference_proxy_api::inference::{GuardStatus, guard_status::State};
    use kinference_proxy_discovery::GuardMeasurements;
    let script = Script::new();
    script
        .inference
        .send_replace(Some(inference_policy("1", &[("glm-5.3", GLM)])));
    let server = Server::start(script.clone(), "127.0.0.1:0".parse().unwrap());
    let d = spawn(config(server.addr));
    let (tx, rx) = tokio::sync::watch::channel(std::sync::Arc::new(GuardMeasurements::default()));
    let _reporter = d.report_guards(rx);
    let status = |state: State| GuardStatus {
        tenant: "apps/chat".into(),
        rule: "low".into(),
        family: "math".into(),
        state: state as i32,
        samples: 4,
        min_samples: 4,
        gap: Some(1.0),
        tolerance: 0.1,
    };
    // Nothing measured: nothing sent. Then each change is reported with the target and revision.
    tx.send_replace(std::sync::Arc::new(GuardMeasurements {
        revision: "1".into(),
        guards: vec![status(State::Measuring)],
    }));
    let mut reports = script.guard_reports.subscribe();
    wait_for(&mut reports, "the first report", |r| !r.is_empty()).await;
    tx.send_replace(std::sync::Arc::new(GuardMeasurements {
        revision: "1".into(),
        guards: vec![status(State::Suspended)],
    }));
    wait_for(&mut reports, "the suspension", |r| {
        r.last()
            .is_some_and(|r| r.guards[0].state == State::Suspended as i32)
    })
    .await;
    let all = script.guard_reports.borrow().clone();
    assert_eq!(all[0].guards[0].state, State::Measuring as i32);
    let last = all.last().unwrap();
    assert_eq!(last.revision, "1");
    let target = last.target.as_ref().unwrap();
    assert_eq!(target.source_workload, config(server.addr).workload);
}

/// The sums of every report received for `rollout`: (cohort, control) requests.
fn reported(
    reports: &[kinference_proxy_api::inference::RolloutReport],
    rollout: &str,
) -> (u64, u64) {
    let arm = |r: &kinference_proxy_api::inference::RolloutReport, cohort: bool| {
        let a = if cohort { &r.cohort } else { &r.control };
        a.as_ref().map_or(0, |a| a.requests)
    };
    reports
        .iter()
        .filter(|r| r.rollout == rollout)
        .fold((0, 0), |(c, k), r| (c + arm(r, true), k + arm(r, false)))
}

#[tokio::test]
async fn rollout_reports_carry_each_arms_deltas_survive_a_failed_send_and_end_with_the_rollout() {
    use kinference_decision::rollout::Arm;
    use kinference_proxy_api::inference as inf;
    use kinference_proxy_discovery::{ArmOutcome, RolloutLedger};
    let script = Script::new();
    let mut policy = inference_policy("1", &[("glm-5.3", GLM)]);
    policy.rollout = Some(inf::Rollout {
        name: "cheaper".into(),
        cohort_basis_points: 1_000,
        control_basis_points: 1_000,
        report_interval: Some(prost_types::Duration {
            seconds: 0,
            nanos: 200_000_000,
        }),
        ..Default::default()
    });
    script.inference.send_replace(Some(policy.clone()));
    let server = Server::start(script.clone(), "127.0.0.1:0".parse().unwrap());
    let addr = server.addr;
    let d = spawn(config(addr));
    let ledger = Arc::new(RolloutLedger::new(&[0.1, 1.0]));
    let results: Arc<std::sync::Mutex<Vec<&'static str>>> = Arc::default();
    let seen = results.clone();
    let _reporter = d.report_rollouts(
        ledger.clone(),
        "default/web-0".into(),
        Arc::new(move |r| seen.lock().unwrap().push(r)),
    );
    let ok = ArmOutcome {
        ttft_s: Some(0.05),
        tokens: 10,
        ..ArmOutcome::default()
    };
    for _ in 0..3 {
        ledger.record("cheaper", Arm::Cohort, &ok);
    }
    ledger.record("cheaper", Arm::Control, &ok);
    ledger.record(
        "cheaper",
        Arm::Control,
        &ArmOutcome {
            error: true,
            ..ArmOutcome::default()
        },
    );
    ledger.record("cheaper", Arm::Rest, &ok);
    let mut reports = script.rollout_reports.subscribe();
    wait_for(&mut reports, "the first arms' report", |r| {
        reported(r, "cheaper") == (3, 2)
    })
    .await;
    {
        let all = script.rollout_reports.borrow();
        let r = all
            .iter()
            .find(|r| r.cohort.as_ref().unwrap().requests > 0)
            .unwrap();
        assert_eq!(
            (r.proxy.as_str(), r.revision.as_str()),
            ("default/web-0", "1")
        );
        assert_eq!(r.target.as_ref().unwrap().source_workload, "apps/web");
        let cohort = r.cohort.as_ref().unwrap();
        assert_eq!(cohort.ttft_bounds_s, vec![0.1, 1.0, f64::INFINITY]);
        assert_eq!(cohort.ttft_counts, vec![3, 3, 3]);
        assert_eq!(cohort.tokens, 30);
        assert_eq!(r.control.as_ref().unwrap().errors, 1);
        let interval = r.interval.unwrap();
        assert!(interval.seconds > 0 || interval.nanos > 0, "{interval:?}");
    }
    // The controller is away: the delta is kept and goes with the first report that arrives.
    server.kill();
    ledger.record("cheaper", Arm::Cohort, &ok);
    let failed = || results.lock().unwrap().contains(&"failed");
    kinference_local::poll::wait_until("a failed report", Duration::from_secs(20), || async {
        failed().then_some(())
    })
    .await;
    let server = Server::start(script.clone(), addr);
    wait_for(&mut reports, "the held delta", |r| {
        reported(r, "cheaper") == (4, 2)
    })
    .await;
    // The rollout leaves the policy: one last report, then none.
    ledger.record("cheaper", Arm::Control, &ok);
    policy.rollout = None;
    policy.revision = "2".into();
    script.inference.send_replace(Some(policy));
    wait_for(&mut reports, "the last report", |r| {
        reported(r, "cheaper") == (4, 3)
    })
    .await;
    let count = script.rollout_reports.borrow().len();
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(
        script.rollout_reports.borrow().len(),
        count,
        "no report after the last"
    );
    assert!(!results.lock().unwrap().contains(&"dropped"));
    drop(server);
}

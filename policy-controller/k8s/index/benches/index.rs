//! Index update cost at 1,000 and 10,000 routes.
//!
//! Each route has its own parent Service and InferencePolicy and sends to one of ten
//! pools; every Service is watched for outbound and inference policy and every pool for
//! endpoints, as if a proxy watched each. A measured update applies one changed
//! resource and publishes every value it changes.
//!
//! Run: `cargo bench -p kinference-policy-k8s-index --bench index`

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use kinference_policy_core::{
    DiscoverEndpoints, DiscoverInferencePolicy, DiscoverOutboundPolicy, ParentTarget, PoolRef,
};
use kinference_policy_k8s_index::{Index, Resource, SharedIndex};
use std::{hint::black_box, time::Duration};

const POOLS: usize = 10;

fn res(yaml: &str) -> Resource {
    let value: serde_yaml::Value = serde_yaml::from_str(yaml).expect("yaml");
    Resource::from_yaml(value, "default")
        .expect("valid")
        .expect("known kind")
}

fn pool(i: usize, second_port: bool) -> Resource {
    let ports = if second_port {
        "[{number: 8000}, {number: 8001}]"
    } else {
        "[{number: 8000}]"
    };
    res(&format!(
        "{{apiVersion: inference.networking.k8s.io/v1, kind: InferencePool, metadata: {{name: pool-{i}}},
          spec: {{selector: {{matchLabels: {{pool: p{i}}}}}, targetPorts: {ports}}}}}"
    ))
}

fn slice(i: usize, ready: bool) -> Resource {
    res(&format!(
        "{{apiVersion: discovery.k8s.io/v1, kind: EndpointSlice,
          metadata: {{name: slice-{i}, labels: {{pool: p{i}, kinference.io/model: m{i}}}}},
          addressType: IPv4,
          endpoints: [{{addresses: [10.0.{i}.1], conditions: {{ready: {ready}}}}}, {{addresses: [10.0.{i}.2]}}],
          ports: [{{port: 8000}}]}}"
    ))
}

fn service(i: usize) -> Resource {
    res(&format!(
        "{{apiVersion: v1, kind: Service, metadata: {{name: svc-{i}}}, spec: {{ports: [{{port: 80}}]}}}}"
    ))
}

fn route(i: usize, weight: u32) -> Resource {
    let p = i % POOLS;
    res(&format!(
        "{{apiVersion: gateway.networking.k8s.io/v1, kind: HTTPRoute, metadata: {{name: route-{i}}},
          spec: {{parentRefs: [{{group: '', kind: Service, name: svc-{i}, port: 80}}],
                  rules: [{{matches: [{{path: {{type: PathPrefix, value: /v1}}}}],
                            backendRefs: [{{group: inference.networking.k8s.io, kind: InferencePool, name: pool-{p}, weight: {weight}}}]}}]}}}}"
    ))
}

fn policy(i: usize, min_confidence: f64) -> Resource {
    let p = i % POOLS;
    let q = (i + 1) % POOLS;
    res(&format!(
        "{{apiVersion: policy.kinference.io/v1alpha1, kind: InferencePolicy, metadata: {{name: policy-{i}}},
          spec: {{targetRef: {{group: gateway.networking.k8s.io, kind: HTTPRoute, name: route-{i}}},
                  classifierRef: {{name: classifier}},
                  models: [{{name: m{p}, poolRef: {{name: pool-{p}}}, prior: {{prefillTokensPerSecond: 1000, timePerOutputTokenMs: 20}}}},
                           {{name: m{q}, poolRef: {{name: pool-{q}}}, prior: {{prefillTokensPerSecond: 2000, timePerOutputTokenMs: 10}}}}],
                  rules: [{{name: low, match: {{tags: [{{name: complexity, values: [low], minConfidence: {min_confidence}}}]}},
                            action: {{addModels: [m{q}]}}}}]}}}}"
    ))
}

const CLASSIFIER: &str = "{apiVersion: policy.kinference.io/v1alpha1, kind: InferenceClassifier,
  metadata: {name: classifier}, spec: {tags: [{name: complexity, complexity: {thresholds: {low: 0.3, high: 0.7}}}]}}";

struct Fixture {
    index: SharedIndex,
    // Held so every target stays watched.
    _watches: Vec<Box<dyn std::any::Any>>,
}

fn build(routes: usize) -> Fixture {
    let index = Index::shared();
    let mut watches: Vec<Box<dyn std::any::Any>> = Vec::new();
    {
        let mut w = index.write();
        w.apply(res(CLASSIFIER));
        for i in 0..POOLS {
            w.apply(pool(i, false));
            w.apply(slice(i, true));
        }
        for i in 0..routes {
            w.apply(service(i));
            w.apply(route(i, 1));
            w.apply(policy(i, 0.5));
        }
    }
    for i in 0..routes {
        let t = ParentTarget {
            namespace: "default".into(),
            name: format!("svc-{i}"),
            port: 80,
        };
        watches.push(Box::new(index.watch_outbound_policy(&t)));
        let rx = index.watch_inference_policy(&t).expect("watch");
        assert!(rx.borrow().policy().is_some(), "policy {i} is served");
        watches.push(Box::new(rx));
    }
    for i in 0..POOLS {
        watches.push(Box::new(
            index.watch_endpoints(&PoolRef::new("default", &format!("pool-{i}"))),
        ));
    }
    Fixture {
        index,
        _watches: watches,
    }
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("index_update");
    group
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    for routes in [1_000, 10_000] {
        let f = build(routes);
        let mut flip = false;
        group.bench_with_input(BenchmarkId::new("route_change", routes), &routes, |b, _| {
            b.iter_batched(
                || {
                    flip = !flip;
                    route(0, if flip { 2 } else { 1 })
                },
                |r| f.index.write().apply(black_box(r)),
                criterion::BatchSize::SmallInput,
            )
        });
        group.bench_with_input(
            BenchmarkId::new("policy_change", routes),
            &routes,
            |b, _| {
                b.iter_batched(
                    || {
                        flip = !flip;
                        policy(0, if flip { 0.8 } else { 0.5 })
                    },
                    |r| f.index.write().apply(black_box(r)),
                    criterion::BatchSize::SmallInput,
                )
            },
        );
        group.bench_with_input(
            BenchmarkId::new("endpoint_change", routes),
            &routes,
            |b, _| {
                b.iter_batched(
                    || {
                        flip = !flip;
                        slice(0, flip)
                    },
                    |r| f.index.write().apply(black_box(r)),
                    criterion::BatchSize::SmallInput,
                )
            },
        );
        // A pool's spec (its target ports) changes its endpoints only: routes and
        // policies use its name.
        group.bench_with_input(BenchmarkId::new("pool_change", routes), &routes, |b, _| {
            b.iter_batched(
                || {
                    flip = !flip;
                    pool(0, flip)
                },
                |r| f.index.write().apply(black_box(r)),
                criterion::BatchSize::SmallInput,
            )
        });
        // A pool deleted and created again: each recomputes, through the reverse maps,
        // the parents whose routes send to it (1 in 10) or whose policy's models use
        // it (2 in 10), and no others.
        let pool_key = pool(0, false).key();
        group.bench_with_input(
            BenchmarkId::new("pool_delete_recreate", routes),
            &routes,
            |b, _| {
                b.iter_batched(
                    || pool(0, false),
                    |r| {
                        let mut index = f.index.write();
                        index.delete(&pool_key);
                        index.apply(black_box(r));
                    },
                    criterion::BatchSize::SmallInput,
                )
            },
        );
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);

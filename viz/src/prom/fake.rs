//! A fake Prometheus for the unit tests: a real HTTP server on loopback that answers the query
//! endpoints from a closure and records what it was asked.
//!
//! Why not a mock of the client: the handlers' tests then cover the whole path the dashboard
//! takes (form encoding, the answer's JSON, errors), and a test can assert on the exact PromQL
//! and time span a handler sent, which is what the numbers on the page depend on.

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper_util::{
    rt::{TokioExecutor, TokioIo},
    server::conn::auto,
};
use serde_json::Value;
use std::{
    collections::BTreeMap,
    convert::Infallible,
    sync::{Arc, Mutex},
};

/// One request the fake answered.
#[derive(Clone, Debug)]
pub struct Asked {
    pub path: String,
    /// The form (`query`, and `start`, `end`, `step` for a range query).
    pub form: BTreeMap<String, String>,
}

type Answer = dyn Fn(&str, &BTreeMap<String, String>) -> Value + Send + Sync;

/// The server, stopped when dropped.
#[derive(Debug)]
pub struct FakePrometheus {
    pub url: String,
    asked: Arc<Mutex<Vec<Asked>>>,
    task: tokio::task::JoinHandle<()>,
}

impl FakePrometheus {
    /// Serves `answer(path, form)` as the JSON body of every request.
    pub async fn start(
        answer: impl Fn(&str, &BTreeMap<String, String>) -> Value + Send + Sync + 'static,
    ) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let asked = Arc::new(Mutex::new(Vec::new()));
        let answer: Arc<Answer> = Arc::new(answer);
        let log = asked.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let (answer, log) = (answer.clone(), log.clone());
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(
                        move |req: http::Request<hyper::body::Incoming>| {
                            let (answer, log) = (answer.clone(), log.clone());
                            async move {
                                let path = req.uri().path().to_string();
                                let query = req.uri().query().map(str::to_string);
                                let body = req.into_body().collect().await.unwrap().to_bytes();
                                let mut form = crate::server::parse_query(query.as_deref());
                                form.extend(crate::server::parse_query(Some(
                                    &String::from_utf8_lossy(&body),
                                )));
                                let v = answer(&path, &form);
                                log.lock().unwrap().push(Asked { path, form });
                                let mut rsp =
                                    http::Response::new(Full::new(Bytes::from(v.to_string())));
                                rsp.headers_mut().insert(
                                    http::header::CONTENT_TYPE,
                                    http::HeaderValue::from_static("application/json"),
                                );
                                Ok::<_, Infallible>(rsp)
                            }
                        },
                    );
                    let _ = auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Self { url, asked, task }
    }

    /// Every request so far, in order.
    pub fn asked(&self) -> Vec<Asked> {
        self.asked.lock().unwrap().clone()
    }
}

impl Drop for FakePrometheus {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// An instant-vector answer.
pub fn vector(samples: &[(Labels<'_>, f64)]) -> Value {
    let result: Vec<Value> = samples
        .iter()
        .map(|(labels, v)| {
            let metric: BTreeMap<&str, &str> = labels.iter().copied().collect();
            serde_json::json!({"metric": metric, "value": [1000.0, v.to_string()]})
        })
        .collect();
    serde_json::json!({"status": "success", "data": {"resultType": "vector", "result": result}})
}

/// Labels, as `(name, value)` pairs.
pub type Labels<'a> = &'a [(&'a str, &'a str)];

/// A matrix answer: each series' labels and its `(time, value)` points.
pub fn matrix(series: &[(Labels<'_>, &[(f64, &str)])]) -> Value {
    let result: Vec<Value> = series
        .iter()
        .map(|(labels, points)| {
            let metric: BTreeMap<&str, &str> = labels.iter().copied().collect();
            let values: Vec<Value> = points
                .iter()
                .map(|(t, v)| serde_json::json!([t, v]))
                .collect();
            serde_json::json!({"metric": metric, "values": values})
        })
        .collect();
    serde_json::json!({"status": "success", "data": {"resultType": "matrix", "result": result}})
}

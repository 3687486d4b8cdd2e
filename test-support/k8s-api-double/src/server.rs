//! The HTTP side of the double: a hyper server on loopback that records every request and
//! answers it from the store, and the handle tests hold to preload, change and inspect it.

use crate::store::{
    Collection, State, Watcher, collection_of, event_line, id_of, is_cluster_scoped, merge, status,
};
use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::TokioIo;
use parking_lot::Mutex;
use serde_json::{Value, json};
use std::{convert::Infallible, net::SocketAddr, sync::Arc, time::Duration};
use tokio::sync::{mpsc, watch};

type Body = BoxBody<Bytes, Infallible>;

/// One request the double served.
#[derive(Clone, Debug)]
pub struct Recorded {
    pub method: Method,
    pub path: String,
    pub query: String,
    /// The `x-test-client` header, naming which test client sent it.
    pub client: Option<String>,
    pub content_type: Option<String>,
    pub body: Value,
}

/// A service-account token the double's TokenReview authenticates, as the API server would a
/// projected token the kubelet wrote for a pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceAccountToken {
    pub namespace: String,
    pub service_account: String,
    /// The audiences it was issued for; a review for another is refused.
    pub audiences: Vec<String>,
    /// The pod it is bound to (`authentication.kubernetes.io/pod-name` and `pod-uid`), if any.
    pub pod: Option<(String, String)>,
}

/// A running double; it stops when dropped.
#[derive(Debug)]
pub struct ApiServer {
    pub addr: SocketAddr,
    state: Arc<Mutex<State>>,
    changed: watch::Sender<u64>,
    version: Arc<Mutex<Value>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What `/version` answers unless a test changes it.
fn default_version() -> Value {
    json!({
        "major": "1", "minor": "34", "gitVersion": "v1.34.0", "gitCommit": "double",
        "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.24",
        "compiler": "gc", "platform": "linux/amd64",
    })
}

impl ApiServer {
    /// An empty API server on a free loopback port.
    pub async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let state = Arc::new(Mutex::new(State::default()));
        let version = Arc::new(Mutex::new(default_version()));
        let (changed, _) = watch::channel(0);
        let task = {
            let state = state.clone();
            let changed = changed.clone();
            let version = version.clone();
            tokio::spawn(async move {
                loop {
                    let Ok((stream, _)) = listener.accept().await else {
                        return;
                    };
                    let state = state.clone();
                    let changed = changed.clone();
                    let version = version.clone();
                    tokio::spawn(async move {
                        let svc = hyper::service::service_fn(move |req| {
                            let state = state.clone();
                            let changed = changed.clone();
                            let version = version.clone();
                            async move {
                                Ok::<_, Infallible>(handle(req, &state, &changed, &version).await)
                            }
                        });
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), svc)
                            .await;
                    });
                }
            })
        };
        Self {
            addr,
            state,
            changed,
            version,
            task,
        }
    }

    /// An API server holding `objects` (each with apiVersion, kind and metadata.name).
    pub async fn with_objects(objects: impl IntoIterator<Item = Value>) -> Self {
        let server = Self::start().await;
        for obj in objects {
            server.put(obj);
        }
        server
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A kube client for this server; `client` is sent as `x-test-client`.
    pub fn client(&self, client: &str) -> kube::Client {
        let mut config = kube::Config::new(self.url().parse().expect("uri"));
        config.headers.push((
            http::HeaderName::from_static("x-test-client"),
            http::HeaderValue::from_str(client).expect("header"),
        ));
        config.read_timeout = None;
        kube::Client::try_from(config).expect("client")
    }

    /// A kubeconfig file's contents that points at this server.
    pub fn kubeconfig(&self) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: double\n  cluster:\n    server: {}\n\
             users:\n- name: double\n  user: {{}}\ncontexts:\n- name: double\n  context:\n    \
             cluster: double\n    user: double\ncurrent-context: double\n",
            self.url()
        )
    }

    fn bump(&self) {
        self.changed.send_modify(|n| *n += 1);
    }

    /// Creates or replaces an object, as `kubectl apply` would; returns it as stored.
    pub fn put(&self, obj: Value) -> Value {
        let stored = self.state.lock().store(obj);
        self.bump();
        stored
    }

    /// Makes `token` authenticate, in TokenReviews, as `identity`.
    pub fn add_token(&self, token: &str, identity: ServiceAccountToken) {
        self.state.lock().tokens.insert(token.to_string(), identity);
    }

    /// Replaces what `/version` answers.
    pub fn set_version(&self, version: Value) {
        *self.version.lock() = version;
    }

    /// Answers every request to exactly `path` (no query) with `code` and a Status body.
    pub fn fail(&self, path: &str, code: u16) {
        self.state.lock().failures.insert(path.to_string(), code);
    }

    /// Deletes an object and tells watchers. `ns` is ignored for cluster-scoped kinds.
    pub fn delete(&self, api_version: &str, kind: &str, ns: &str, name: &str) {
        let collection = collection_of(&json!({"apiVersion": api_version, "kind": kind}));
        let id = key(&collection, ns, name);
        let mut state = self.state.lock();
        let removed = state
            .objects
            .get_mut(&collection)
            .and_then(|o| o.remove(&id));
        if let Some(mut obj) = removed {
            let rv = state.next_rv();
            obj["metadata"]["resourceVersion"] = json!(rv.to_string());
            state.emit(&collection, rv, "DELETED", &obj);
        }
        drop(state);
        self.bump();
    }

    /// Deletes an object without telling watchers, as if its event were compacted away,
    /// then expires every watch: each gets an ERROR event with code 410 and is closed,
    /// and a watch from an older resourceVersion is refused with 410 until a relist.
    pub fn delete_unseen_and_expire(&self, api_version: &str, kind: &str, ns: &str, name: &str) {
        let collection = collection_of(&json!({"apiVersion": api_version, "kind": kind}));
        let id = key(&collection, ns, name);
        let mut state = self.state.lock();
        let removed = state
            .objects
            .get_mut(&collection)
            .and_then(|o| o.remove(&id));
        assert!(removed.is_some(), "{kind} {ns}/{name} does not exist");
        let rv = state.next_rv();
        let collections: Vec<Collection> = state.objects.keys().cloned().collect();
        for c in collections {
            state.compacted.insert(c, rv);
        }
        let gone = event_line("ERROR", &status(410, "Expired", "too old resource version"));
        for w in state.watchers.drain(..) {
            let _ = w.tx.send(gone.clone());
        }
        drop(state);
        self.bump();
    }

    /// Closes every open watch connection; watchers must reconnect.
    pub fn drop_watches(&self) {
        self.state.lock().watchers.clear();
        self.bump();
    }

    /// An object as stored. `ns` is ignored for cluster-scoped kinds.
    pub fn object(&self, api_version: &str, kind: &str, ns: &str, name: &str) -> Option<Value> {
        let collection = collection_of(&json!({"apiVersion": api_version, "kind": kind}));
        let id = key(&collection, ns, name);
        self.state
            .lock()
            .objects
            .get(&collection)
            .and_then(|o| o.get(&id))
            .cloned()
    }

    /// Every object of a kind, in every namespace.
    pub fn objects(&self, api_version: &str, kind: &str) -> Vec<Value> {
        let collection = collection_of(&json!({"apiVersion": api_version, "kind": kind}));
        self.state
            .lock()
            .objects
            .get(&collection)
            .map(|o| o.values().cloned().collect())
            .unwrap_or_default()
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.state.lock().requests.clone()
    }

    /// Waits (at most `timeout`) until `f` holds of the server's requests and objects.
    pub async fn wait_for<T>(
        &self,
        timeout: Duration,
        what: &str,
        mut f: impl FnMut(&Self) -> Option<T>,
    ) -> T {
        let mut rx = self.changed.subscribe();
        let wait = async {
            loop {
                if let Some(t) = f(self) {
                    return t;
                }
                rx.changed().await.expect("server alive");
            }
        };
        tokio::time::timeout(timeout, wait)
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "timed out waiting for {what}; requests: {:#?}",
                    self.summary()
                )
            })
    }

    fn summary(&self) -> Vec<String> {
        self.requests()
            .iter()
            .map(|r| format!("{} {}?{} ({:?})", r.method, r.path, r.query, r.client))
            .collect()
    }
}

fn key(collection: &Collection, ns: &str, name: &str) -> (String, String) {
    let ns = if is_cluster_scoped(&collection.1) {
        ""
    } else {
        ns
    };
    (ns.to_string(), name.to_string())
}

fn respond(code: StatusCode, body: &Value) -> Response<Body> {
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(serde_json::to_vec(body).expect("json"))).boxed())
        .expect("response")
}

/// What a request path names.
struct Target {
    collection: Collection,
    ns: Option<String>,
    name: Option<String>,
    sub: Option<String>,
}

/// Splits `/api/v1/...` or `/apis/g/v/...` into collection, namespace, name and subresource.
fn route(path: &str) -> Option<Target> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (prefix, rest) = match *segs.first()? {
        "api" => (
            segs[..2.min(segs.len())].join("/"),
            &segs[2.min(segs.len())..],
        ),
        "apis" => (
            segs[..3.min(segs.len())].join("/"),
            &segs[3.min(segs.len())..],
        ),
        _ => return None,
    };
    let (ns, rest) = match rest {
        ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some(ns.to_string()), rest),
        rest => (None, rest),
    };
    let (plural, name, sub) = match rest {
        [plural] => (plural, None, None),
        [plural, name] => (plural, Some(name.to_string()), None),
        [plural, name, sub] => (plural, Some(name.to_string()), Some(sub.to_string())),
        _ => return None,
    };
    Some(Target {
        collection: (prefix, plural.to_string()),
        ns,
        name,
        sub,
    })
}

fn query_param<'q>(query: &'q str, key: &str) -> Option<&'q str> {
    query
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v)
}

async fn handle(
    req: Request<Incoming>,
    state: &Arc<Mutex<State>>,
    changed: &watch::Sender<u64>,
    version: &Arc<Mutex<Value>>,
) -> Response<Body> {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or_default().to_string();
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let client = header("x-test-client");
    let content_type = header("content-type");
    let bytes = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    let failure = {
        let mut s = state.lock();
        s.requests.push(Recorded {
            method: method.clone(),
            path: path.clone(),
            query: query.clone(),
            client,
            content_type,
            body: body.clone(),
        });
        s.failures.get(&path).copied()
    };
    let response = match failure {
        Some(code) => respond(
            StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            &status(code, "InternalError", "failure injected by the test"),
        ),
        None if path == "/version" && method == Method::GET => {
            respond(StatusCode::OK, &version.lock().clone())
        }
        None if path == TOKEN_REVIEWS && method == Method::POST => token_review(&body, state),
        None => serve(&method, &path, &query, body, state),
    };
    changed.send_modify(|n| *n += 1);
    response
}

/// Where TokenReviews are created (`authentication.k8s.io/v1`, cluster-scoped, never stored).
const TOKEN_REVIEWS: &str = "/apis/authentication.k8s.io/v1/tokenreviews";

/// Answers a TokenReview as the API server does for service-account tokens: unknown tokens and
/// tokens for none of the requested audiences are not authenticated; a known one names its
/// service account and, when bound to a pod, the pod in `extra`.
fn token_review(body: &Value, state: &Arc<Mutex<State>>) -> Response<Body> {
    let token = body["spec"]["token"].as_str().unwrap_or_default();
    let wanted: Vec<String> = body["spec"]["audiences"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|a| a.as_str().map(str::to_string))
        .collect();
    let known = state.lock().tokens.get(token).cloned();
    let status = match known {
        None => json!({"authenticated": false, "error": "invalid bearer token"}),
        Some(t) if !wanted.is_empty() && !wanted.iter().any(|a| t.audiences.contains(a)) => json!({
            "authenticated": false,
            "error": "invalid bearer token, token audiences is invalid for the target audiences",
        }),
        Some(t) => {
            let audiences: Vec<&String> = if wanted.is_empty() {
                t.audiences.iter().collect()
            } else {
                wanted.iter().filter(|a| t.audiences.contains(a)).collect()
            };
            let mut extra = serde_json::Map::new();
            if let Some((pod, uid)) = &t.pod {
                extra.insert("authentication.kubernetes.io/pod-name".into(), json!([pod]));
                extra.insert("authentication.kubernetes.io/pod-uid".into(), json!([uid]));
            }
            json!({
                "authenticated": true,
                "audiences": audiences,
                "user": {
                    "username": format!("system:serviceaccount:{}:{}", t.namespace, t.service_account),
                    "uid": format!("uid-of-{}-{}", t.namespace, t.service_account),
                    "groups": ["system:serviceaccounts", format!("system:serviceaccounts:{}", t.namespace), "system:authenticated"],
                    "extra": extra,
                },
            })
        }
    };
    let mut review = body.clone();
    review["status"] = status;
    respond(StatusCode::CREATED, &review)
}

fn serve(
    method: &Method,
    path: &str,
    query: &str,
    body: Value,
    state: &Arc<Mutex<State>>,
) -> Response<Body> {
    let Some(Target {
        collection,
        ns,
        name,
        sub,
    }) = route(path)
    else {
        return respond(StatusCode::NOT_FOUND, &status(404, "NotFound", path));
    };
    let mut s = state.lock();
    match (method, name) {
        (&Method::GET, None) if query_param(query, "watch") == Some("true") => {
            let from: u64 = query_param(query, "resourceVersion")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            let (tx, rx) = mpsc::unbounded_channel();
            if from < s.compacted.get(&collection).copied().unwrap_or(0) {
                let _ = tx.send(event_line(
                    "ERROR",
                    &status(410, "Expired", "too old resource version"),
                ));
                drop(tx);
            } else {
                for (rv, type_, obj) in s.history.get(&collection).into_iter().flatten() {
                    let in_ns =
                        ns.is_none() || obj["metadata"]["namespace"].as_str() == ns.as_deref();
                    if *rv > from && in_ns {
                        let _ = tx.send(event_line(type_, obj));
                    }
                }
                s.watchers.push(Watcher {
                    collection,
                    namespace: ns,
                    tx,
                });
            }
            let stream = futures::stream::unfold(rx, |mut rx| async move {
                rx.recv().await.map(|b| (Ok(Frame::data(b)), rx))
            });
            Response::builder()
                .status(StatusCode::OK)
                .header("content-type", "application/json")
                .body(StreamBody::new(stream).boxed())
                .expect("response")
        }
        (&Method::GET, None) => {
            let items: Vec<Value> = s
                .objects
                .get(&collection)
                .into_iter()
                .flat_map(|o| o.iter())
                .filter(|((ons, _), _)| ns.is_none() || ns.as_deref() == Some(ons.as_str()))
                .map(|(_, v)| v.clone())
                .collect();
            let list = json!({
                "apiVersion": collection.0.trim_start_matches("apis/").trim_start_matches("api/"),
                "kind": "List",
                "metadata": {"resourceVersion": s.rv.to_string()},
                "items": items,
            });
            respond(StatusCode::OK, &list)
        }
        (&Method::GET, Some(name)) => {
            let id = key(&collection, ns.as_deref().unwrap_or_default(), &name);
            match s.objects.get(&collection).and_then(|o| o.get(&id)) {
                Some(obj) => respond(StatusCode::OK, obj),
                None => respond(StatusCode::NOT_FOUND, &status(404, "NotFound", &id.1)),
            }
        }
        (&Method::POST, None) => {
            let mut obj = body;
            if let Some(ns) = ns {
                obj["metadata"]["namespace"] = json!(ns);
            }
            let id = id_of(&collection, &obj);
            if !id.1.is_empty()
                && s.objects
                    .get(&collection)
                    .is_some_and(|o| o.contains_key(&id))
            {
                return respond(StatusCode::CONFLICT, &status(409, "AlreadyExists", &id.1));
            }
            let stored = s.store(obj);
            respond(StatusCode::CREATED, &stored)
        }
        (&Method::PUT, Some(name)) => {
            let id = key(&collection, ns.as_deref().unwrap_or_default(), &name);
            let Some(current) = s.objects.get(&collection).and_then(|o| o.get(&id)) else {
                return respond(StatusCode::NOT_FOUND, &status(404, "NotFound", &id.1));
            };
            let sent = &body["metadata"]["resourceVersion"];
            if !sent.is_null() && *sent != current["metadata"]["resourceVersion"] {
                return respond(StatusCode::CONFLICT, &status(409, "Conflict", &id.1));
            }
            let mut obj = body;
            if !is_cluster_scoped(&collection.1) {
                obj["metadata"]["namespace"] = json!(id.0);
            }
            let stored = s.store(obj);
            respond(StatusCode::OK, &stored)
        }
        (&Method::PATCH, Some(name)) => {
            let id = key(&collection, ns.as_deref().unwrap_or_default(), &name);
            let Some(mut obj) = s.objects.get(&collection).and_then(|o| o.get(&id)).cloned() else {
                return respond(StatusCode::NOT_FOUND, &status(404, "NotFound", &id.1));
            };
            let sent = &body["metadata"]["resourceVersion"];
            if !sent.is_null() && *sent != obj["metadata"]["resourceVersion"] {
                return respond(StatusCode::CONFLICT, &status(409, "Conflict", &id.1));
            }
            if sub.as_deref() == Some("status") {
                // The status subresource changes status only.
                let mut status = obj["status"].take();
                merge(&mut status, &body["status"]);
                obj["status"] = status;
            } else {
                merge(&mut obj, &body);
            }
            let stored = s.store(obj);
            respond(StatusCode::OK, &stored)
        }
        _ => respond(
            StatusCode::METHOD_NOT_ALLOWED,
            &status(405, "MethodNotAllowed", path),
        ),
    }
}

/// Whether a recorded request is a watch of `plural`.
pub fn is_watch(r: &Recorded, plural: &str) -> bool {
    r.method == Method::GET
        && r.path.ends_with(&format!("/{plural}"))
        && query_param(&r.query, "watch") == Some("true")
}

/// Whether a recorded request is a list of `plural`.
pub fn is_list(r: &Recorded, plural: &str) -> bool {
    r.method == Method::GET
        && r.path.ends_with(&format!("/{plural}"))
        && query_param(&r.query, "watch") != Some("true")
}

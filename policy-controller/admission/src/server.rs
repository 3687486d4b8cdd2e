//! The HTTPS server: TLS on each connection, then HTTP/1.1 or HTTP/2, then a route:
//! `/validate` for the validating webhook, `/inject` for the proxy injector.

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper_util::{
    rt::{TokioExecutor, TokioIo},
    server::conn::auto,
};
use std::{convert::Infallible, future::Future, sync::Arc};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use crate::injector::{InjectReviewError, Injector};
use kube::core::{DynamicObject, admission::AdmissionReview};

/// The API server sends AdmissionReviews of at most a few MiB.
const MAX_BODY_BYTES: usize = 8 * 1024 * 1024;

/// Why the server stopped.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("accepting a connection: {0}")]
    Accept(#[source] std::io::Error),
}

/// Serves the validating webhook alone on `listener` until `shutdown` completes
/// (`/inject` answers 404); see [`serve_with_injector`].
pub async fn serve(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), Error> {
    serve_with_injector(listener, tls, None, shutdown).await
}

/// Serves the webhooks on `listener` until `shutdown` completes.
///
/// Routes: `POST /validate` (InferencePolicy, InferenceClassifier) and, with an
/// injector, `POST /inject` (Pods). A TLS or HTTP failure on one connection is logged
/// and does not stop the server.
pub async fn serve_with_injector(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    injector: Option<Injector>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), Error> {
    let acceptor = TlsAcceptor::from(tls);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (tcp, peer) = tokio::select! {
            res = listener.accept() => res.map_err(Error::Accept)?,
            () = &mut shutdown => return Ok(()),
        };
        let acceptor = acceptor.clone();
        let injector = injector.clone();
        tokio::spawn(async move {
            let stream = match acceptor.accept(tcp).await {
                Ok(stream) => stream,
                Err(error) => {
                    tracing::debug!(%peer, %error, "TLS handshake failed");
                    return;
                }
            };
            let service = hyper::service::service_fn(move |req| route(req, injector.clone()));
            if let Err(error) = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                tracing::debug!(%peer, %error, "connection failed");
            }
        });
    }
}

async fn route(
    req: Request<Incoming>,
    injector: Option<Injector>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let response = match (req.method(), req.uri().path(), injector) {
        (&Method::POST, "/validate", _) => match body(req).await {
            Ok(body) => {
                answer(crate::review(&body).map_err(|e| (StatusCode::BAD_REQUEST, e.to_string())))
            }
            Err(response) => response,
        },
        (&Method::POST, "/inject", Some(injector)) => match body(req).await {
            Ok(body) => answer(injector.review(&body).await.map_err(|e| {
                let status = match e {
                    InjectReviewError::Namespace { .. } => StatusCode::INTERNAL_SERVER_ERROR,
                    _ => StatusCode::BAD_REQUEST,
                };
                (status, e.to_string())
            })),
            Err(response) => response,
        },
        (_, "/validate", _) | (_, "/inject", Some(_)) => {
            text(StatusCode::METHOD_NOT_ALLOWED, "use POST")
        }
        _ => text(StatusCode::NOT_FOUND, "not found"),
    };
    Ok(response)
}

async fn body(req: Request<Incoming>) -> Result<Bytes, Response<Full<Bytes>>> {
    match Limited::new(req.into_body(), MAX_BODY_BYTES)
        .collect()
        .await
    {
        Ok(body) => Ok(body.to_bytes()),
        Err(error) => Err(text(
            StatusCode::BAD_REQUEST,
            &format!("reading the body: {error}"),
        )),
    }
}

fn answer(
    review: Result<AdmissionReview<DynamicObject>, (StatusCode, String)>,
) -> Response<Full<Bytes>> {
    match review {
        Ok(review) => match serde_json::to_vec(&review) {
            Ok(json) => Response::builder()
                .status(StatusCode::OK)
                .header(http::header::CONTENT_TYPE, "application/json")
                .body(Full::new(Bytes::from(json)))
                .unwrap_or_else(|_| text(StatusCode::INTERNAL_SERVER_ERROR, "response")),
            Err(error) => text(StatusCode::INTERNAL_SERVER_ERROR, &error.to_string()),
        },
        Err((status, message)) => {
            if status.is_server_error() {
                tracing::warn!(%message, "admission review failed");
            }
            text(status, &message)
        }
    }
}

fn text(status: StatusCode, message: &str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(format!("{message}\n"))));
    *response.status_mut() = status;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

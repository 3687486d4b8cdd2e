//! The HTTPS server: TLS on each connection, then HTTP/1.1 or HTTP/2, then a route.

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

/// The API server sends AdmissionReviews of at most a few MiB.
const MAX_BODY_BYTES: usize = 8 * 1024 * 1024;

/// Why the server stopped.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("accepting a connection: {0}")]
    Accept(#[source] std::io::Error),
}

/// Serves the webhooks on `listener` until `shutdown` completes.
///
/// Routes: `POST /validate` (InferencePolicy, InferenceClassifier). A TLS or HTTP
/// failure on one connection is logged and does not stop the server.
pub async fn serve(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
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
        tokio::spawn(async move {
            let stream = match acceptor.accept(tcp).await {
                Ok(stream) => stream,
                Err(error) => {
                    tracing::debug!(%peer, %error, "TLS handshake failed");
                    return;
                }
            };
            let service = hyper::service::service_fn(route);
            if let Err(error) = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                tracing::debug!(%peer, %error, "connection failed");
            }
        });
    }
}

async fn route(req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    // The mutating injector's path goes here beside /validate.
    let response = match (req.method(), req.uri().path()) {
        (&Method::POST, "/validate") => validate(req).await,
        (_, "/validate") => text(StatusCode::METHOD_NOT_ALLOWED, "use POST"),
        _ => text(StatusCode::NOT_FOUND, "not found"),
    };
    Ok(response)
}

async fn validate(req: Request<Incoming>) -> Response<Full<Bytes>> {
    let body = match Limited::new(req.into_body(), MAX_BODY_BYTES)
        .collect()
        .await
    {
        Ok(body) => body.to_bytes(),
        Err(error) => {
            return text(
                StatusCode::BAD_REQUEST,
                &format!("reading the body: {error}"),
            );
        }
    };
    match crate::review(&body) {
        Ok(review) => match serde_json::to_vec(&review) {
            Ok(json) => Response::builder()
                .status(StatusCode::OK)
                .header(http::header::CONTENT_TYPE, "application/json")
                .body(Full::new(Bytes::from(json)))
                .unwrap_or_else(|_| text(StatusCode::INTERNAL_SERVER_ERROR, "response")),
            Err(error) => text(StatusCode::INTERNAL_SERVER_ERROR, &error.to_string()),
        },
        Err(error) => text(StatusCode::BAD_REQUEST, &error.to_string()),
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

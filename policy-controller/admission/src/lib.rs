//! The policy controller's admission webhooks, served over TLS to the API server.
//!
//! A resource that fails Kinference's validation is refused when it is written, with
//! every problem and its field path, rather than accepted and then reported in status.
//! The same validation ([`kinference_api::validate`]) runs here and in the controller,
//! so both say the same thing. The server routes by path so that the sidecar injector
//! (a mutating webhook) can be added beside `/validate`.

mod review;
mod server;
mod tls;

pub use self::{
    review::{ReviewError, review},
    server::{Error, serve},
    tls::{TlsError, load_tls},
};

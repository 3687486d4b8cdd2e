//! The policy controller's admission webhooks, served over TLS to the API server.
//!
//! A resource that fails Kinference's validation is refused when it is written, with
//! every problem and its field path, rather than accepted and then reported in status.
//! The same validation ([`kinference_api::validate`]) runs here and in the controller,
//! so both say the same thing. Beside it, at `/inject`, the sidecar injector adds the
//! proxy to pods that ask for it ([`inject`] decides, [`Injector`] answers the webhook).

mod events;
#[doc(hidden)]
pub mod fuzzing;
pub mod inject;
mod injector;
mod review;
mod server;
mod tls;

pub use self::{
    events::{EventRecorder, InjectionEvent, KubeEventRecorder},
    inject::{Config as InjectConfig, ProxyConfig},
    injector::{InjectReviewError, Injector},
    review::{ReviewError, review},
    server::{Error, serve, serve_with_injector},
    tls::{TlsError, load_tls},
};

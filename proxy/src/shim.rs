//! Temporary stand-ins for `kinference-proxy-discovery` and `kinference-proxy-signals`.
//!
//! Those crates are written at the same time as this one, to a fixed interface. Until they land,
//! these modules implement the part of that interface the proxy uses, with the same names and
//! types, so that switching is a change of `use` lines in `app.rs` and `signals.rs`. They are real
//! implementations (gRPC watches, HTTP scrapes), not stubs: the end-to-end tests run on them.

pub mod discovery;
pub mod signals;

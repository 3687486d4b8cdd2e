//! kinference-viz: Kinference's observability extension, in the manner of Linkerd viz.
//!
//! Platform teams ask "which model served each application, how fast and at what cost"; operators
//! ask "why did this request go there". This crate answers both from what already exists: the
//! proxies' metrics, read through Prometheus ([`prom`], [`queries`]), the proxies' decision records
//! ([`decisions`]), the policies in force ([`policies`]) and, for a rollout, the what-if replay
//! reports ([`replay`]). [`api`] turns them into the JSON views that the dashboard, `kinfctl viz`
//! and tests read; [`server`] serves them with the single-page dashboard. (`kinference-local`
//! serves it beside the local stack.)

pub mod api;
pub mod clock;
pub mod decisions;
pub mod policies;
pub mod prom;
pub mod queries;
pub mod replay;
pub mod server;

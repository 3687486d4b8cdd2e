//! kinference-viz: Kinference's observability extension, in the manner of Linkerd viz.
//!
//! Platform teams ask "which model served each application, how fast and at what cost"; operators
//! ask "why did this request go there". This crate answers both from what already exists: the
//! proxies' metrics, read through Prometheus ([`prom`], [`queries`]), the proxies' decision records
//! ([`decisions`]) and the policies in force ([`policies`]). [`api`] turns them into the JSON views
//! that the dashboard, `kinfctl viz` and tests read; [`server`] serves them with the single-page
//! dashboard. (`kinference-local` serves it beside the local stack.)

pub mod api;
pub mod decisions;
pub mod policies;
pub mod prom;
pub mod queries;
pub mod server;

//! The wall clock, read in one place (the workspace's clippy rule): the charts' time span is
//! calendar time, since Prometheus' range queries are in unix seconds. Handlers take the time as
//! an argument, so their tests pass a fixed one.

/// Seconds since the Unix epoch.
#[allow(clippy::disallowed_methods)] // This is the crate's clock module.
pub fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

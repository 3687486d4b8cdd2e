//! The crate's one reading of the calendar.
//!
//! Certificates are valid between two calendar dates, so issuing one, scheduling its refresh and
//! closing a connection when its peer's certificate expires all need the wall clock. Everything
//! else takes the time as an argument; the durations derived from it are slept on tokio's clock.

use std::time::SystemTime;

/// Now, on the calendar.
#[allow(
    clippy::disallowed_methods,
    reason = "certificate validity is calendar time: this is the crate's one read of it"
)]
pub fn calendar_now() -> SystemTime {
    SystemTime::now()
}

//! Per-tenant token budgets: reserve a request's estimate when it is admitted, settle on the
//! usage its response reports.
//!
//! A policy's `tenantBudgets` give a tenant (the calling workload) so many prompt plus
//! completion tokens per fixed window. The route layer reserves the request's estimate (its
//! prompt and `max_tokens`); a request that would take the window's count over the budget is
//! answered 429 with `Retry-After` (the window's end). When the answer ends the reservation is
//! settled: on the usage the server reported, else kept at the estimate for an answered
//! request, else (a failed request) released. Each proxy counts its own requests; the budget is
//! per sidecar (see `docs/policy.md`). Time is tokio's, so tests can pause it.

use kinference_decision::TenantBudget;
use parking_lot::Mutex;
use std::{collections::HashMap, sync::Arc, time::Duration};
use tokio::time::Instant;

/// Each tenant's current window.
#[derive(Clone, Debug, Default)]
pub struct Budgets {
    windows: Arc<Mutex<HashMap<String, Window>>>,
}

#[derive(Debug)]
struct Window {
    start: Instant,
    /// Settled and reserved tokens in the window.
    used: u64,
}

/// Tokens held for one request until its usage is known.
#[derive(Debug)]
pub struct Reservation {
    budgets: Budgets,
    tenant: String,
    window_start: Instant,
    reserved: u64,
    settled: bool,
}

impl Budgets {
    /// Reserves `tokens` of `tenant`'s `budget` at `now`; when they do not fit, how long until
    /// the window ends.
    pub fn reserve(
        &self,
        tenant: &str,
        budget: &TenantBudget,
        tokens: u64,
        now: Instant,
    ) -> Result<Reservation, Duration> {
        let mut windows = self.windows.lock();
        let w = windows.entry(tenant.to_string()).or_insert(Window {
            start: now,
            used: 0,
        });
        let len = budget.window.max(Duration::from_millis(1));
        if now >= w.start + len {
            // Fixed windows: the one `now` falls in.
            let elapsed = now.saturating_duration_since(w.start).as_nanos();
            let k = elapsed / len.as_nanos();
            w.start += Duration::from_nanos((k * len.as_nanos()) as u64);
            w.used = 0;
        }
        if w.used.saturating_add(tokens) > budget.tokens {
            return Err((w.start + len).saturating_duration_since(now));
        }
        w.used += tokens;
        Ok(Reservation {
            budgets: self.clone(),
            tenant: tenant.to_string(),
            window_start: w.start,
            reserved: tokens,
            settled: false,
        })
    }

    /// `tenant`'s tokens counted in its current window.
    pub fn used(&self, tenant: &str) -> u64 {
        self.windows.lock().get(tenant).map_or(0, |w| w.used)
    }

    fn adjust(&self, tenant: &str, window_start: Instant, reserved: u64, actual: u64) {
        let mut windows = self.windows.lock();
        // A window that has rolled over since started from zero: nothing to give back.
        if let Some(w) = windows.get_mut(tenant)
            && w.start == window_start
        {
            w.used = w.used.saturating_sub(reserved).saturating_add(actual);
        }
    }
}

impl Reservation {
    /// The tokens reserved.
    pub fn reserved(&self) -> u64 {
        self.reserved
    }

    /// Counts `actual` tokens in place of the reservation.
    pub fn settle(mut self, actual: u64) {
        self.settled = true;
        self.budgets
            .adjust(&self.tenant, self.window_start, self.reserved, actual);
    }
}

impl Drop for Reservation {
    /// An unsettled reservation (the request failed) is released.
    fn drop(&mut self) {
        if !self.settled {
            self.budgets
                .adjust(&self.tenant, self.window_start, self.reserved, 0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(tokens: u64) -> TenantBudget {
        TenantBudget {
            tenant: "*".into(),
            tokens,
            window: Duration::from_secs(60),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn reservations_settle_on_usage_release_on_failure_and_reset_with_the_window() {
        let b = Budgets::default();
        let t0 = Instant::now();
        let first = b.reserve("a", &budget(300), 200, t0).unwrap();
        // 200 reserved: another 200 does not fit, and waits for the window's end.
        let wait = b.reserve("a", &budget(300), 200, t0).unwrap_err();
        assert_eq!(wait, Duration::from_secs(60));
        // The first used only 80: 220 are left.
        first.settle(80);
        assert_eq!(b.used("a"), 80);
        let second = b.reserve("a", &budget(300), 200, t0).unwrap();
        // A failed request gives its reservation back.
        drop(second);
        assert_eq!(b.used("a"), 80);
        // Tenants are counted apart.
        assert!(b.reserve("b", &budget(300), 300, t0).is_ok());
        // The next window starts from zero.
        tokio::time::advance(Duration::from_secs(61)).await;
        let wait = b
            .reserve("a", &budget(300), 400, Instant::now())
            .unwrap_err();
        assert_eq!(wait, Duration::from_secs(59));
        assert!(b.reserve("a", &budget(300), 300, Instant::now()).is_ok());
    }
}

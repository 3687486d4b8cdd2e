//! A Lease-based leader elector, so that only one controller replica writes status.
//!
//! Every replica watches and serves policy, but status written by several replicas at
//! once would flap. kube-rs has no leader elector, so this is a small one over a
//! `coordination.k8s.io/v1` Lease, with client-go's rules: a candidate acquires the
//! Lease when it is absent, unheld or expired (its `renewTime` plus
//! `leaseDurationSeconds` is in the past); the holder renews it every retry period and
//! steps down when it has not renewed for `renew_deadline`. Writes use the Lease's
//! `resourceVersion`, so two candidates racing for an expired Lease cannot both win.
//!
//! The wall clock is behind [`Clock`] so tests expire a Lease by moving a clock, not by
//! sleeping for its duration.

use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta},
    jiff::{SignedDuration, Timestamp},
};
use kube::{
    Api, Client,
    api::{PostParams, ResourceExt},
};
use std::{sync::Arc, time::Duration};
use tokio::sync::watch;

/// The source of wall-clock time for Lease expiry and status timestamps.
pub trait Clock: Send + Sync + std::fmt::Debug + 'static {
    fn now(&self) -> Timestamp;
}

/// The system's clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        Timestamp::now()
    }
}

/// Where the Lease is and how it is held.
#[derive(Clone, Debug)]
pub struct LeaseConfig {
    pub namespace: String,
    pub name: String,
    /// This replica's identity, written to `holderIdentity`: the pod name.
    pub identity: String,
    /// How long a Lease stays valid after its last renewal (`leaseDurationSeconds`).
    pub lease_duration: Duration,
    /// How long the holder keeps acting as leader without a successful renewal.
    pub renew_deadline: Duration,
    /// How often the holder renews and a candidate retries.
    pub retry_period: Duration,
}

impl LeaseConfig {
    /// client-go's defaults: 15s lease, 10s renew deadline, 2s retry period.
    pub fn new(namespace: &str, name: &str, identity: &str) -> Self {
        Self {
            namespace: namespace.to_string(),
            name: name.to_string(),
            identity: identity.to_string(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }

    fn lease_duration_s(&self) -> i32 {
        i32::try_from(self.lease_duration.as_secs().max(1)).unwrap_or(i32::MAX)
    }
}

/// Why one election step failed.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    #[error("reading Lease {0}: {1}")]
    Get(String, #[source] kube::Error),
    #[error("writing Lease {0}: {1}")]
    Write(String, #[source] kube::Error),
}

/// Acquires and renews the Lease, and publishes whether this replica leads.
#[derive(Debug)]
pub struct LeaseElector {
    api: Api<Lease>,
    config: LeaseConfig,
    clock: Arc<dyn Clock>,
    /// When (by `clock`) this replica last renewed successfully, while it leads.
    renewed_at: Option<Timestamp>,
    leader: watch::Sender<bool>,
}

impl LeaseElector {
    pub fn new(client: Client, config: LeaseConfig, clock: Arc<dyn Clock>) -> Self {
        Self {
            api: Api::namespaced(client, &config.namespace),
            config,
            clock,
            renewed_at: None,
            leader: watch::Sender::new(false),
        }
    }

    /// Whether this replica leads, now and as it changes.
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.leader.subscribe()
    }

    pub fn is_leader(&self) -> bool {
        *self.leader.borrow()
    }

    /// Runs the election until the task is dropped.
    pub async fn run(mut self) {
        loop {
            if let Err(error) = self.step().await {
                tracing::warn!(%error, lease = %self.config.name, "leader election step failed");
            }
            tokio::time::sleep(self.config.retry_period).await;
        }
    }

    /// One attempt to acquire or renew. Returns whether this replica leads afterwards.
    pub async fn step(&mut self) -> Result<bool, LeaseError> {
        let result = self.try_acquire_or_renew().await;
        let now = self.clock.now();
        let leads = match &result {
            Ok(true) => {
                self.renewed_at = Some(now);
                true
            }
            Ok(false) => {
                self.renewed_at = None;
                false
            }
            // An API error: keep leading until the renew deadline passes.
            Err(_) => self
                .renewed_at
                .is_some_and(|at| now.duration_since(at) < signed(self.config.renew_deadline)),
        };
        if !leads {
            self.renewed_at = None;
        }
        self.leader.send_if_modified(|cur| {
            if *cur == leads {
                return false;
            }
            tracing::info!(identity = %self.config.identity, leader = leads, "leadership changed");
            *cur = leads;
            true
        });
        result.map(|_| leads)
    }

    async fn try_acquire_or_renew(&self) -> Result<bool, LeaseError> {
        let name = &self.config.name;
        let now = self.clock.now();
        let current = self
            .api
            .get_opt(name)
            .await
            .map_err(|e| LeaseError::Get(name.clone(), e))?;
        let Some(mut lease) = current else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    namespace: Some(self.config.namespace.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(self.held_spec(now, now, 0)),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                // Another candidate created it first.
                Err(e) if is_conflict(&e) => Ok(false),
                Err(e) => Err(LeaseError::Write(name.clone(), e)),
            };
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.as_deref().unwrap_or_default();
        let transitions = spec.lease_transitions.unwrap_or(0);
        let next = if holder == self.config.identity {
            let acquired = spec.acquire_time.map_or(now, |t| t.0);
            self.held_spec(acquired, now, transitions)
        } else if holder.is_empty() || expired(&spec, now) {
            tracing::info!(previous = %holder, identity = %self.config.identity, "taking over an expired lease");
            self.held_spec(now, now, transitions.saturating_add(1))
        } else {
            return Ok(false);
        };
        lease.spec = Some(next);
        // `replace` sends the resourceVersion we read: a concurrent write makes it fail.
        match self.api.replace(name, &PostParams::default(), &lease).await {
            Ok(_) => Ok(true),
            Err(e) if is_conflict(&e) => Ok(false),
            Err(e) => Err(LeaseError::Write(lease.name_any(), e)),
        }
    }

    fn held_spec(&self, acquired: Timestamp, renewed: Timestamp, transitions: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(self.config.identity.clone()),
            lease_duration_seconds: Some(self.config.lease_duration_s()),
            acquire_time: Some(MicroTime(acquired)),
            renew_time: Some(MicroTime(renewed)),
            lease_transitions: Some(transitions),
            ..LeaseSpec::default()
        }
    }
}

/// Whether a Lease's holder has let it lapse by `now`.
fn expired(spec: &LeaseSpec, now: Timestamp) -> bool {
    let Some(renewed) = spec.renew_time.as_ref().or(spec.acquire_time.as_ref()) else {
        return true;
    };
    let duration_s = i64::from(spec.lease_duration_seconds.unwrap_or(0).max(0));
    now.duration_since(renewed.0) > SignedDuration::from_secs(duration_s)
}

fn signed(d: Duration) -> SignedDuration {
    SignedDuration::try_from(d).unwrap_or(SignedDuration::MAX)
}

fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(status) if status.code == 409)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(renewed_s: i64, duration_s: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some("a".into()),
            renew_time: Some(MicroTime(Timestamp::from_second(renewed_s).unwrap())),
            lease_duration_seconds: Some(duration_s),
            ..LeaseSpec::default()
        }
    }

    #[test]
    fn a_lease_expires_after_its_duration_from_the_last_renewal() {
        let at = |s| Timestamp::from_second(s).unwrap();
        assert!(!expired(&spec(100, 15), at(100)));
        assert!(!expired(&spec(100, 15), at(115)));
        assert!(expired(&spec(100, 15), at(116)));
        // A lease that was never renewed nor acquired is free.
        assert!(expired(&LeaseSpec::default(), at(0)));
    }
}

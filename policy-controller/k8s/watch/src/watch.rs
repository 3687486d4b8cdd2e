//! kube-rs watchers that feed the index, one per kind.
//!
//! The index is the same one the manifest-directory source feeds; this module is the
//! seam between the Kubernetes API's list-and-watch protocol and its `apply`/`delete`.
//! A watcher restart (a dropped connection the API cannot resume, a `410 Gone`) relists
//! the kind: the relisted objects replace what this watcher applied before, under one
//! index lock, and objects missing from the relist are deleted, since their deletion
//! events were lost.

use crate::status::Inputs;
use futures::StreamExt;
use gateway_api::apis::standard::httproutes::HttpRoute;
use k8s_openapi::api::{
    core::v1::{Pod, Service},
    discovery::v1::EndpointSlice,
};
use kinference_api::{InferenceClassifier, InferencePolicy, InferencePool};
use kinference_policy_k8s_index::{Resource, ResourceKey, ResourceKind, SharedIndex};
use kube::{
    Api,
    runtime::{
        WatchStreamExt,
        utils::ResetTimerBackoff,
        watcher::{self, ExponentialBackoff},
    },
};
use parking_lot::Mutex;
use serde::de::DeserializeOwned;
use std::{collections::BTreeSet, fmt::Debug, sync::Arc, time::Duration};
use tokio::sync::watch;

/// The watched types, as the index's [`Resource`].
pub trait IndexedResource:
    kube::Resource + Clone + Debug + DeserializeOwned + Send + Sync + 'static
{
    const KIND: ResourceKind;
    fn into_resource(self) -> Resource;
}

macro_rules! indexed {
    ($ty:ty, $kind:ident) => {
        impl IndexedResource for $ty {
            const KIND: ResourceKind = ResourceKind::$kind;
            fn into_resource(self) -> Resource {
                Resource::$kind(Box::new(self))
            }
        }
    };
}

indexed!(Service, Service);
indexed!(HttpRoute, HttpRoute);
indexed!(InferencePool, InferencePool);
indexed!(EndpointSlice, EndpointSlice);
indexed!(Pod, Pod);
indexed!(InferencePolicy, InferencePolicy);
indexed!(InferenceClassifier, InferenceClassifier);

/// How long a watcher waits before retrying after an error: kube-runtime's exponential
/// backoff with jitter, a step doubling from `min` up to `max` and each delay up to one step
/// more (`[step, 2 step)`), back to `min` once events flow again or after
/// [`BACKOFF_RESET_AFTER`] without a retry. The default is kube-runtime's `DefaultBackoff`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    pub min: Duration,
    pub max: Duration,
}

/// A quiet spell after which a watcher's backoff starts again from `min` (kube-runtime's).
pub const BACKOFF_RESET_AFTER: Duration = Duration::from_secs(120);

impl Default for Backoff {
    /// client-go's reflector, as kube-runtime's `DefaultBackoff`: 800ms doubling to 30s.
    fn default() -> Self {
        Self {
            min: Duration::from_millis(800),
            max: Duration::from_secs(30),
        }
    }
}

impl Backoff {
    /// The delays, as kube-runtime's `DefaultBackoff` builds them, over these bounds.
    fn delays(self) -> ResetTimerBackoff<ExponentialBackoff> {
        let builder = backon::ExponentialBuilder::default()
            .with_min_delay(self.min)
            .with_max_delay(self.max)
            .with_factor(2.0)
            .with_jitter()
            .without_max_times();
        ResetTimerBackoff::new(ExponentialBackoff::from(builder), BACKOFF_RESET_AFTER)
    }
}

/// Reports when every watched kind has been listed once: the index then holds the
/// cluster as it was when the controller started, and may be served.
#[derive(Debug)]
pub struct InitialSync {
    pending: Mutex<BTreeSet<ResourceKind>>,
    synced: watch::Sender<bool>,
}

impl InitialSync {
    /// Waits for a first list of each of `kinds`; `synced` turns true after the last.
    pub fn new(kinds: impl IntoIterator<Item = ResourceKind>, synced: watch::Sender<bool>) -> Self {
        let pending: BTreeSet<_> = kinds.into_iter().collect();
        if pending.is_empty() {
            synced.send_replace(true);
        }
        Self {
            pending: Mutex::new(pending),
            synced,
        }
    }

    fn listed(&self, kind: ResourceKind) {
        let mut pending = self.pending.lock();
        if pending.remove(&kind) && pending.is_empty() {
            tracing::info!("every kind listed; the index is synced");
            self.synced.send_replace(true);
        }
    }
}

/// Where watch events go: the index, and the status writer's inputs.
#[derive(Clone, Debug)]
pub struct Sink {
    index: SharedIndex,
    inputs: Arc<Inputs>,
    initial_sync: Option<Arc<InitialSync>>,
}

impl Sink {
    pub fn new(index: SharedIndex, inputs: Arc<Inputs>) -> Self {
        Self {
            index,
            inputs,
            initial_sync: None,
        }
    }

    /// Reports each kind's first complete list to `sync`.
    pub fn with_initial_sync(mut self, sync: Arc<InitialSync>) -> Self {
        self.initial_sync = Some(sync);
        self
    }

    fn apply(&self, resource: Resource) {
        self.index.write().apply(resource.clone());
        self.inputs.apply(resource);
    }

    fn delete(&self, key: &ResourceKey) {
        self.index.write().delete(key);
        self.inputs.delete(key);
    }

    /// Replaces every object of one kind that this watcher applied with a relist.
    fn replace(&self, known: &mut BTreeSet<ResourceKey>, listed: Vec<Resource>) {
        let listed_keys: BTreeSet<ResourceKey> = listed.iter().map(Resource::key).collect();
        let gone: Vec<ResourceKey> = known.difference(&listed_keys).cloned().collect();
        {
            let mut index = self.index.write();
            for key in &gone {
                index.delete(key);
            }
            for res in &listed {
                index.apply(res.clone());
            }
        }
        self.inputs.replace(&gone, listed);
        if !gone.is_empty() {
            tracing::debug!(
                deleted = gone.len(),
                "relist removed objects deleted while unwatched"
            );
        }
        *known = listed_keys;
    }
}

/// Watches one kind in every namespace and feeds `sink` until the task is dropped.
pub async fn watch_kind<K: IndexedResource>(api: Api<K>, sink: Sink, backoff: Backoff) {
    let stream = watcher::watcher(api, watcher::Config::default()).backoff(backoff.delays());
    let mut stream = std::pin::pin!(stream);
    let mut known = BTreeSet::new();
    let mut listing: Option<Vec<Resource>> = None;
    while let Some(event) = stream.next().await {
        match event {
            Ok(watcher::Event::Init) => listing = Some(Vec::new()),
            Ok(watcher::Event::InitApply(obj)) => match listing.as_mut() {
                Some(listed) => listed.push(obj.into_resource()),
                None => {
                    let res = obj.into_resource();
                    known.insert(res.key());
                    sink.apply(res);
                }
            },
            Ok(watcher::Event::InitDone) => {
                let listed = listing.take().unwrap_or_default();
                tracing::debug!(kind = %K::KIND, objects = listed.len(), "listed");
                sink.replace(&mut known, listed);
                if let Some(sync) = &sink.initial_sync {
                    sync.listed(K::KIND);
                }
            }
            Ok(watcher::Event::Apply(obj)) => {
                let res = obj.into_resource();
                known.insert(res.key());
                sink.apply(res);
            }
            Ok(watcher::Event::Delete(obj)) => {
                let key = obj.into_resource().key();
                known.remove(&key);
                sink.delete(&key);
            }
            Err(error) => {
                tracing::warn!(kind = %K::KIND, %error, "watch failed; retrying");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::utils::Backoff as _;

    #[tokio::test(start_paused = true)]
    async fn the_backoff_doubles_with_jitter_and_restarts_after_events_or_a_quiet_spell() {
        let ms = Duration::from_millis;
        let mut delays = Backoff {
            min: ms(100),
            max: ms(1000),
        }
        .delays();
        // Steps 100, 200, 400, 800, 1000, 1000; each delay in [step, 2 step).
        for step in [100, 200, 400, 800, 1000, 1000].map(ms) {
            let d = delays.next().unwrap();
            assert!(d >= step && d < step * 2, "{d:?} for a step of {step:?}");
        }
        // Events flowed again: the watcher resets it.
        delays.reset();
        assert!(delays.next().unwrap() < ms(200));
        delays.next();
        delays.next();
        // A retry after two quiet minutes starts from `min` again; one sooner does not.
        tokio::time::advance(Duration::from_secs(60)).await;
        assert!(delays.next().unwrap() >= ms(800));
        tokio::time::advance(BACKOFF_RESET_AFTER + ms(1)).await;
        assert!(delays.next().unwrap() < ms(200));
    }

    #[test]
    fn initial_sync_turns_true_only_after_every_kind_listed_once() {
        let (tx, rx) = watch::channel(false);
        let sync = InitialSync::new([ResourceKind::Service, ResourceKind::Pod], tx);
        sync.listed(ResourceKind::Service);
        // A relist of a kind already listed does not count twice.
        sync.listed(ResourceKind::Service);
        assert!(!*rx.borrow());
        sync.listed(ResourceKind::Pod);
        assert!(*rx.borrow());

        let (tx, rx) = watch::channel(false);
        let _none = InitialSync::new([], tx);
        assert!(*rx.borrow());
    }
}

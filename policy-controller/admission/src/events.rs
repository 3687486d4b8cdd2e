//! Events that say what the injector did, attached to the pod's owner so that
//! `kubectl describe` shows them. Behind a small trait so that the decision logic is tested
//! with a recording fake and production publishes through kube's events Recorder.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

/// One event to publish.
#[derive(Clone, Debug, PartialEq)]
pub struct InjectionEvent {
    pub regarding: ObjectReference,
    /// `Injected`.
    pub reason: String,
    /// `Inject`.
    pub action: String,
    /// e.g. `Injected kinference-proxy into pod apps/web-7d4b9c8f6d-* (Deployment apps/web)`.
    pub note: String,
    pub warning: bool,
}

/// Where injection events go. `record` must not block the admission answer.
pub trait EventRecorder: Send + Sync + std::fmt::Debug + 'static {
    fn record(&self, event: InjectionEvent);
}

/// Publishes events through the API (`events.k8s.io/v1`) in the background.
#[derive(Clone)]
pub struct KubeEventRecorder {
    recorder: Recorder,
}

impl std::fmt::Debug for KubeEventRecorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeEventRecorder").finish_non_exhaustive()
    }
}

impl KubeEventRecorder {
    /// `instance` is the controller's pod name (`POD_NAME`).
    pub fn new(client: kube::Client, instance: Option<String>) -> Self {
        let reporter = Reporter {
            controller: "kinference-proxy-injector".into(),
            instance,
        };
        Self {
            recorder: Recorder::new(client, reporter),
        }
    }
}

impl EventRecorder for KubeEventRecorder {
    fn record(&self, event: InjectionEvent) {
        let recorder = self.recorder.clone();
        tokio::spawn(async move {
            let ev = Event {
                type_: if event.warning {
                    EventType::Warning
                } else {
                    EventType::Normal
                },
                reason: event.reason,
                note: Some(event.note),
                action: event.action,
                secondary: None,
            };
            if let Err(error) = recorder.publish(&ev, &event.regarding).await {
                tracing::warn!(%error, "publishing an injection event failed");
            }
        });
    }
}

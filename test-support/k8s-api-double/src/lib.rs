//! A Kubernetes API server test double: list, watch, get, create, replace and merge-patch
//! over real HTTP/1.1 on loopback, with resourceVersions, so that kube-rs's own client and
//! watcher (and any other HTTP client) run against it unchanged.
//!
//! It exists so that every crate that talks to the API (the controller's watchers and status
//! writer, the injector's namespace lookups and events, `kinfctl check`) is tested against
//! one double with one behaviour, instead of each growing its own. It serves any collection
//! by path (`/api/v1/...`, `/apis/GROUP/VERSION/...`), namespaced or cluster-scoped, plus
//! `/version`; tests preload objects, make a watch expire (`410 Gone`), drop watch
//! connections, make a path fail, and read back every request it served. TokenReviews
//! (`authentication.k8s.io/v1`) authenticate the service-account tokens a test registers
//! ([`ApiServer::add_token`]), bound to a pod or not, for the audiences it names.

mod server;
mod store;

pub use self::server::{ApiServer, Recorded, ServiceAccountToken, is_list, is_watch};
pub use self::store::{collection_of, plural};

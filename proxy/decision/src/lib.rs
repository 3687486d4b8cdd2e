//! The inference decision as one pure call: a request's tags and shape in, where it goes and why
//! out.
//!
//! [`decide`] evaluates the policy's rules over the tags (the candidate models), predicts every
//! ready endpoint's time to first token with `kinference-routing`, chooses by the policy's
//! objective (the first token soonest, or the cheapest within the service class's SLO), and
//! applies the balancer settings (mode, failure mode, retry order) to give a [`Plan`] whose
//! serialized form is the decision record. It does no I/O and reads no clock: time, randomness and the router's state are
//! arguments. The proxy's route layer, `POST /debug/explain`, `kinfctl explain` and the fleet
//! benchmark all call it, so what is measured and explained is what the sidecar does.

pub mod admission;
pub mod explain;
pub mod guard;
pub mod objective;
pub mod plan;
pub mod policy;
pub mod rollout;

pub use self::{
    objective::{DecidedBy, ObjectiveOutcome},
    plan::{
        Input, Passthrough, Plan, Refusal, UnknownModel, decide, decide_among, decide_among_with,
        passthrough,
    },
    policy::{
        Balancer, Candidates, DEFAULT_SERVICE_CLASS, FailureMode, KvEvents, KvEventsPort, Mode,
        Model, Objective, Policy, Price, Rollout, RuleTrace, ServiceClass, TenantBudget, Timeouts,
        Workload,
    },
};

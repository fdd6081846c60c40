//! Deltafin's Kubernetes operator: reconciles `DeltafinModel` resources (`deltafin.dev/v1alpha1`)
//! into a weights volume, a resumable setup Job, a server Deployment (strategy Recreate) and a
//! Service, and reports progress and conditions in status.
//!
//! Layout (controller-rs shape): [`crd`] holds the resource types (the source of the CRD YAML),
//! [`model`] resolves a resource against the operator settings, [`resources`] are pure builders
//! of child objects, [`plan`] is the pure decision core (observed state in; writes, status and
//! events out), [`controller`] is the thin I/O shell and the kube-runtime wiring, [`metrics`] and
//! [`web`] serve the operator's own `/metrics`, `/livez` and `/readyz`; [`version`] decides which
//! Kubernetes versions are supported and which optional fields a server gets; [`cache`] holds the
//! reflector stores reconciles read, [`requests`] counts the requests sent to the API server, [`queue`] mirrors the reconcile queue
//! for its depth metric.

pub mod cache;
pub mod conditions;
pub mod controller;
pub mod crd;
pub mod drift;
mod error;
pub mod metrics;
pub mod model;
pub mod names;
pub mod plan;
pub mod progress;
pub mod queue;
pub mod requests;
pub mod resources;
pub mod version;
pub mod web;

pub use error::{Error, Result};

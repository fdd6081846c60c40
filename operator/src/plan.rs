//! The decision core, free of I/O: given a `DeltafinModel` and what exists in the cluster
//! ([`Observed`]), compute the writes to make, the next status and the events to publish
//! ([`Plan`]). The controller observes, calls [`plan`], and executes the result.
//!
//! Order: resolve the spec -> storage (create the PVC, or wait for an existing claim) -> weights
//! marker check -> setup reporter identity and setup Job (progress from `status.setupProgress`,
//! which the Job writes; on success, write the marker) -> pre-flight
//! Job when the spec's image differs from the image the marker records -> server Deployment with
//! the verified image -> Service -> ServiceMonitor -> status. The Deployment, Service and
//! ServiceMonitor (and the setup reporter's ServiceAccount, Role, RoleBinding) are server-side
//! applied whenever the cached server object does not hold what
//! the operator sets ([`crate::drift`]: drift is repaired, a no-op reconcile writes nothing); the
//! PVC and Jobs are applied only while absent (their specs are immutable); the marker only when
//! an install or a pre-flight completes.

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::jiff::Timestamp;
use kube::api::DynamicObject;
use kube::{Resource, ResourceExt};

use crate::conditions::{self, READY, SERVER_READY, Status, UPGRADING, WEIGHTS_READY};
use crate::crd::{
    DeltafinModel, DeltafinModelStatus, DraftStatus, EndpointStatus, FailureStatus, Phase,
    ServiceMonitorMode, WeightsStatus,
};
use crate::drift;
use crate::model::{Model, Settings, Storage, resolve};
use crate::names;
use crate::progress;
use crate::resources::{self, Marker};

/// Requeue while something is in progress (setup, pre-flight, server start).
pub const REQUEUE_BUSY: Duration = Duration::from_secs(15);
/// Requeue in steady state (drift detection).
pub const REQUEUE_IDLE: Duration = Duration::from_secs(300);

/// What the controller read from the cluster for one DeltafinModel.
#[derive(Clone, Debug, Default)]
pub struct Observed {
    /// Time of the observation (used for condition transition times).
    pub now: Timestamp,
    /// The weights claim (operator-created or existing), when the storage is a PVC.
    pub claim: Option<PersistentVolumeClaim>,
    /// The weights marker ConfigMap `<name>-weights`.
    pub marker: Option<ConfigMap>,
    /// Jobs labelled with the model.
    pub jobs: Vec<Job>,
    /// Pods labelled with the model (setup, pre-flight, server).
    pub pods: Vec<Pod>,
    /// The setup reporter's ServiceAccount `<name>-setup`.
    pub setup_account: Option<ServiceAccount>,
    /// The setup reporter's Role `<name>-setup`.
    pub setup_role: Option<Role>,
    /// The setup reporter's RoleBinding `<name>-setup`.
    pub setup_role_binding: Option<RoleBinding>,
    /// The server Deployment.
    pub deployment: Option<Deployment>,
    /// The Service.
    pub service: Option<Service>,
    /// The ServiceMonitor (only read when the CRD is served).
    pub service_monitor: Option<DynamicObject>,
}

/// An object to server-side apply.
#[derive(Clone, Debug, PartialEq)]
pub enum Child {
    /// The weights PVC (created once).
    Pvc(Box<PersistentVolumeClaim>),
    /// The weights marker.
    Marker(Box<ConfigMap>),
    /// A setup or pre-flight Job (created once).
    Job(Box<Job>),
    /// The server Deployment.
    Deployment(Box<Deployment>),
    /// The Service.
    Service(Box<Service>),
    /// The ServiceMonitor.
    ServiceMonitor(Box<DynamicObject>),
    /// The setup Job's ServiceAccount.
    ServiceAccount(Box<ServiceAccount>),
    /// The setup Job's Role (patch on its model's status).
    Role(Box<Role>),
    /// Binds that Role to that ServiceAccount.
    RoleBinding(Box<RoleBinding>),
}

impl Child {
    /// Kind, for logs and metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Pvc(_) => "PersistentVolumeClaim",
            Self::Marker(_) => "ConfigMap",
            Self::Job(_) => "Job",
            Self::Deployment(_) => "Deployment",
            Self::Service(_) => "Service",
            Self::ServiceMonitor(_) => "ServiceMonitor",
            Self::ServiceAccount(_) => "ServiceAccount",
            Self::Role(_) => "Role",
            Self::RoleBinding(_) => "RoleBinding",
        }
    }

    /// Object name.
    pub fn name(&self) -> String {
        match self {
            Self::Pvc(o) => o.name_any(),
            Self::Marker(o) => o.name_any(),
            Self::Job(o) => o.name_any(),
            Self::Deployment(o) => o.name_any(),
            Self::Service(o) => o.name_any(),
            Self::ServiceMonitor(o) => o.name_any(),
            Self::ServiceAccount(o) => o.name_any(),
            Self::Role(o) => o.name_any(),
            Self::RoleBinding(o) => o.name_any(),
        }
    }
}

/// One write.
#[derive(Clone, Debug, PartialEq)]
pub enum Write {
    /// Server-side apply (field manager `deltafin-operator`, forced).
    Apply(Child),
    /// Delete a Job of an outdated install or image (background propagation).
    DeleteJob(String),
    /// Delete the ServiceMonitor (metrics.serviceMonitor changed to Disabled).
    DeleteServiceMonitor(String),
}

/// An event to publish on the DeltafinModel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventSpec {
    /// Warning (else Normal).
    pub warning: bool,
    /// CamelCase reason.
    pub reason: String,
    /// Human note.
    pub note: String,
    /// The condition type that transitioned.
    pub action: String,
}

/// The outcome of [`plan`].
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// Writes, in order.
    pub writes: Vec<Write>,
    /// The next status.
    pub status: DeltafinModelStatus,
    /// Events for condition transitions.
    pub events: Vec<EventSpec>,
    /// When to look again.
    pub requeue: Duration,
}

/// State of a Job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JobState {
    /// Pods are running or pending.
    Running,
    /// Completed successfully.
    Succeeded,
    /// Failed for good: (Job condition reason, message).
    Failed(String, String),
}

/// Reads a Job's state from its conditions and counters.
pub fn job_state(job: &Job) -> JobState {
    let Some(st) = &job.status else {
        return JobState::Running;
    };
    for c in st.conditions.iter().flatten() {
        if c.status != "True" {
            continue;
        }
        match c.type_.as_str() {
            "Complete" | "SuccessCriteriaMet" => return JobState::Succeeded,
            "Failed" | "FailureTarget" => {
                return JobState::Failed(
                    c.reason.clone().unwrap_or_default(),
                    c.message.clone().unwrap_or_default(),
                );
            }
            _ => {}
        }
    }
    if st.succeeded.unwrap_or(0) >= 1 {
        JobState::Succeeded
    } else {
        JobState::Running
    }
}

fn job_pods<'a>(pods: &'a [Pod], job: &str) -> Vec<&'a Pod> {
    let mut v: Vec<&Pod> = pods
        .iter()
        .filter(|p| {
            let l = p.labels();
            l.get("job-name")
                .or_else(|| l.get("batch.kubernetes.io/job-name"))
                .map(String::as_str)
                == Some(job)
        })
        .collect();
    v.sort_by_key(|p| p.creation_timestamp().map(|t| t.0));
    v
}

fn server_pods(pods: &[Pod]) -> Vec<&Pod> {
    pods.iter()
        .filter(|p| p.labels().get("app.kubernetes.io/component").map(String::as_str) == Some("server"))
        .collect()
}

/// Whether the live Deployment does not run the desired spec yet (replicas or images differ):
/// the server status then says the new spec is being applied. Only for status; whether the
/// Deployment is applied is [`crate::drift::already_applied`]'s.
fn deployment_differs(desired: &Deployment, live: Option<&Deployment>) -> bool {
    let Some(live) = live else {
        return true;
    };
    let shape = |d: &Deployment| {
        let spec = d.spec.as_ref();
        let images: Vec<Option<String>> = spec
            .and_then(|s| s.template.spec.as_ref())
            .map(|p| p.containers.iter().map(|c| c.image.clone()).collect())
            .unwrap_or_default();
        (spec.and_then(|s| s.replicas), images)
    };
    shape(desired) != shape(live)
}

fn image_of(job: &Job) -> Option<String> {
    job.spec
        .as_ref()?
        .template
        .spec
        .as_ref()?
        .containers
        .first()?
        .image
        .clone()
}

struct Builder<'o> {
    status: DeltafinModelStatus,
    generation: Option<i64>,
    obs: &'o Observed,
    writes: Vec<Write>,
    busy: bool,
}

impl Builder<'_> {
    fn cond(&mut self, type_: &str, status: Status, reason: &str, message: impl Into<String>) {
        conditions::set(
            &mut self.status.conditions,
            type_,
            status,
            reason,
            message,
            self.generation,
            self.obs.now,
        );
    }

    fn cond_of(&self, type_: &str) -> Option<(bool, String, String)> {
        conditions::get(&self.status.conditions, type_)
            .map(|c| (c.status == "True", c.reason.clone(), c.message.clone()))
    }
}

/// Computes the writes, the next status and the events for one DeltafinModel.
pub fn plan(cr: &DeltafinModel, settings: &Settings, obs: &Observed) -> Plan {
    let old = cr.status.clone().unwrap_or_default();
    let mut b = Builder {
        status: DeltafinModelStatus {
            observed_generation: cr.meta().generation,
            conditions: old.conditions.clone(),
            last_failure: old.last_failure.clone(),
            image: old.image.clone(),
            // The setup Job's field: carried as it is, never written by the operator.
            setup_progress: old.setup_progress.clone(),
            ..Default::default()
        },
        generation: cr.meta().generation,
        obs,
        writes: Vec::new(),
        busy: false,
    };
    match resolve(cr, settings) {
        Ok(m) => plan_model(&mut b, &m, &old, settings),
        Err(msg) => {
            b.status.weights = old.weights.clone();
            b.status.endpoint = old.endpoint.clone();
            b.cond(READY, Status::False, "InvalidSpec", msg);
            b.status.phase = Some(Phase::Failed);
        }
    }
    let events = conditions::transitions(&old.conditions, &b.status.conditions)
        .into_iter()
        .filter(|c| c.type_ != READY || c.reason == "InvalidSpec")
        .map(|c| EventSpec {
            warning: conditions::is_failure(&c.reason),
            reason: c.reason.clone(),
            note: if c.message.is_empty() {
                format!("{} is {}", c.type_, c.status)
            } else {
                c.message.clone()
            },
            action: c.type_.clone(),
        })
        .collect();
    Plan {
        writes: b.writes,
        status: b.status,
        events,
        requeue: if b.busy { REQUEUE_BUSY } else { REQUEUE_IDLE },
    }
}

fn plan_model(b: &mut Builder<'_>, m: &Model<'_>, old: &DeltafinModelStatus, settings: &Settings) {
    let obs = b.obs;

    // Storage.
    let mut storage_ready = true;
    let mut storage_uid = None;
    match (&m.storage, &obs.claim) {
        (Storage::Pvc { .. }, None) => {
            if let Some(pvc) = resources::pvc(m) {
                b.writes.push(Write::Apply(Child::Pvc(Box::new(pvc))));
            }
        }
        (Storage::ExistingClaim { claim }, None) => {
            storage_ready = false;
            b.cond(
                WEIGHTS_READY,
                Status::False,
                "AwaitingStorage",
                format!(
                    "PersistentVolumeClaim {claim} does not exist in namespace {}",
                    m.namespace
                ),
            );
        }
        (_, Some(c)) => storage_uid = c.metadata.uid.clone(),
        (Storage::HostPath { .. }, None) => {}
    }

    // Weights: the marker records the last complete install.
    let marker = obs.marker.as_ref().and_then(Marker::from_config_map);
    let installed = marker
        .clone()
        .filter(|mk| mk.key == m.key && (mk.storage_uid.is_none() || mk.storage_uid == storage_uid));
    // The claim the weights were written to was replaced (deleted and re-created): a finished
    // setup Job describes the old volume, so it must run again.
    let volume_replaced = storage_ready
        && marker.as_ref().is_some_and(|mk| {
            mk.key == m.key
                && mk.storage_uid.is_some()
                && storage_uid.is_some()
                && mk.storage_uid != storage_uid
        });
    let mut weights = WeightsStatus {
        key: Some(m.key.clone()),
        dir: Some(m.dir.clone()),
        ..Default::default()
    };
    if let Some(ow) = &old.weights
        && ow.key.as_deref() == Some(&m.key)
    {
        weights = ow.clone();
    }
    let setup_name = names::setup_job(&m.name, &m.key);
    let setup = obs.jobs.iter().find(|j| j.name_any() == setup_name);
    let mut setup_blocked = false;
    if let Some(j) = setup
        && (j.meta().deletion_timestamp.is_some() || volume_replaced && job_state(j) == JobState::Succeeded)
    {
        let msg = if j.meta().deletion_timestamp.is_none() {
            b.writes.push(Write::DeleteJob(setup_name.clone()));
            format!("the weights volume was replaced; setup Job {setup_name} runs again")
        } else {
            format!("waiting for the deleted setup Job {setup_name} to go away")
        };
        b.busy = true;
        setup_blocked = true;
        b.cond(WEIGHTS_READY, Status::False, "Downloading", msg);
    }
    let mut verified = installed.clone();
    if verified.is_none() && storage_ready && !setup_blocked {
        verified = plan_setup(b, m, setup, &setup_name, &mut weights, storage_uid.clone());
    }
    if let Some(mk) = &verified {
        weights.stage = Some("done".into());
        weights.percent = Some(100);
        weights.percent_text = Some("100%".into());
        if let Some(t) = mk.bytes_total.or(weights.bytes_total) {
            weights.bytes_total = Some(t);
            weights.bytes_done = Some(t);
        }
        weights.message = None;
        b.cond(
            WEIGHTS_READY,
            Status::True,
            "Installed",
            format!("weights installed in {}", m.dir),
        );
    }
    b.status.weights = Some(weights);
    let draft_state = |enabled: bool| {
        if !enabled {
            "Disabled"
        } else if verified.is_some() {
            "Ready"
        } else {
            "Pending"
        }
    };
    let dspark = &m.cr.spec.drafts.dspark;
    b.status.drafts = vec![
        DraftStatus {
            name: "dspark".into(),
            state: if dspark.enabled && dspark.source.is_none() {
                "NoSource".into()
            } else {
                draft_state(dspark.enabled).into()
            },
        },
        DraftStatus {
            name: "qwen".into(),
            state: draft_state(m.cr.spec.drafts.qwen.enabled).into(),
        },
    ];

    // Image: the server runs the image the marker verified; a different spec image is checked
    // by a pre-flight Job first.
    let preflight_name = names::preflight_job(&m.name, &m.image);
    let deploy_image = verified
        .as_ref()
        .map(|mk| plan_upgrade(b, m, mk, &preflight_name, storage_uid.clone()));

    // Jobs of other installs or images are outdated.
    for j in &obs.jobs {
        let n = j.name_any();
        if n != setup_name && n != preflight_name && j.meta().deletion_timestamp.is_none() {
            b.writes.push(Write::DeleteJob(n));
        }
    }

    // Server: Deployment, Service and ServiceMonitor exist once weights are installed. While a
    // new install is in progress, the objects of the previous one are left as they are.
    let mut pending = false;
    if let Some(image) = &deploy_image {
        // Applied whenever the cached server object does not hold every field the operator
        // sets (`drift`): a hand edit or a deletion is repaired by the next reconcile, and a
        // no-op reconcile writes nothing.
        let d = resources::deployment(m, image);
        pending = deployment_differs(&d, obs.deployment.as_ref());
        if !drift::already_applied(&d, obs.deployment.as_ref()) {
            b.writes.push(Write::Apply(Child::Deployment(Box::new(d))));
        }
        let service = resources::service(m);
        if !drift::already_applied(&service, obs.service.as_ref()) {
            b.writes.push(Write::Apply(Child::Service(Box::new(service))));
        }
        if settings.service_monitors {
            // Auto and Enabled both create it where the CRD is served (Enabled is "always").
            if m.cr.spec.metrics.service_monitor != ServiceMonitorMode::Disabled {
                let sm = resources::service_monitor(m);
                if !drift::already_applied(&sm, obs.service_monitor.as_ref()) {
                    b.writes.push(Write::Apply(Child::ServiceMonitor(Box::new(sm))));
                }
            } else if let Some(sm) = &obs.service_monitor {
                b.writes.push(Write::DeleteServiceMonitor(sm.name_any()));
            }
        }
        b.status.image = Some(image.clone());
    }
    if deploy_image.is_some() || obs.service.is_some() {
        b.status.endpoint = Some(EndpointStatus { url: m.url() });
    }
    plan_server_status(b, m, deploy_image.is_some(), pending);

    // Summary.
    let weights_ok = verified.is_some();
    let server = b.cond_of(SERVER_READY);
    let weights_c = b.cond_of(WEIGHTS_READY);
    match (weights_ok, &server) {
        (true, Some((true, _, _))) => {
            b.cond(READY, Status::True, "Serving", format!("serving at {}", m.url()))
        }
        (false, _) => {
            let (_, reason, msg) = weights_c
                .clone()
                .unwrap_or((false, "Pending".into(), String::new()));
            let msg = if obs.deployment.is_some() {
                format!("{msg} (the previous install keeps serving meanwhile)")
            } else {
                msg
            };
            b.cond(READY, Status::False, &reason, msg);
        }
        (true, s) => {
            let (_, reason, msg) = s.clone().unwrap_or((false, "Starting".into(), String::new()));
            b.cond(READY, Status::False, &reason, msg);
        }
    }
    let failing = [WEIGHTS_READY, SERVER_READY]
        .iter()
        .filter_map(|t| b.cond_of(t))
        .any(|(ok, reason, _)| !ok && conditions::is_failure(&reason));
    let upgrading = b.cond_of(UPGRADING).is_some_and(|(ok, _, _)| ok);
    let server_ok = server.as_ref().is_some_and(|(ok, _, _)| *ok);
    b.status.phase = Some(if m.cr.spec.paused && weights_ok {
        Phase::Paused
    } else if failing {
        Phase::Failed
    } else if !weights_ok {
        match weights_c.as_ref().map(|(_, r, _)| r.as_str()) {
            Some("Downloading") => Phase::Downloading,
            Some("Verifying") => Phase::Verifying,
            _ => Phase::Pending,
        }
    } else if upgrading {
        Phase::Upgrading
    } else if server_ok {
        Phase::Ready
    } else {
        Phase::Starting
    });
}

/// Setup Job handling; returns the new marker when the Job just succeeded.
fn plan_setup(
    b: &mut Builder<'_>,
    m: &Model<'_>,
    setup: Option<&Job>,
    setup_name: &str,
    weights: &mut WeightsStatus,
    storage_uid: Option<String>,
) -> Option<Marker> {
    let obs = b.obs;
    let verb = if m.source_uri.is_some() {
        "Downloading"
    } else {
        "Verifying"
    };
    if m.source_uri.is_some() {
        plan_setup_reporter(b, m);
    }
    let Some(job) = setup else {
        b.writes
            .push(Write::Apply(Child::Job(Box::new(resources::setup_job(
                m, &m.image,
            )))));
        b.busy = true;
        b.cond(
            WEIGHTS_READY,
            Status::False,
            verb,
            format!("setup Job {setup_name} created"),
        );
        return None;
    };
    let pods = job_pods(&obs.pods, setup_name);
    match job_state(job) {
        JobState::Running => {
            b.busy = true;
            let p = progress::reported_by(b.status.setup_progress.as_ref(), setup_name);
            if let Some(p) = &p {
                p.apply_to(weights);
            }
            let reason = match weights.stage.as_deref() {
                Some("verify") => "Verifying",
                _ => verb,
            };
            let msg = match &p {
                Some(p) => format!("{}: {}", setup_name, p.summary()),
                None => format!("setup Job {setup_name} running"),
            };
            if job.status.as_ref().and_then(|s| s.failed).unwrap_or(0) > 0
                && let Some(f) = progress::container_failure(&pods, "setup", "SetupFailed")
            {
                b.status.last_failure = Some(f);
            }
            b.cond(WEIGHTS_READY, Status::False, reason, msg);
            None
        }
        JobState::Succeeded => {
            let marker = Marker {
                key: m.key.clone(),
                image: image_of(job).unwrap_or_else(|| m.image.clone()),
                storage_uid,
                bytes_total: weights.bytes_total,
            };
            b.writes
                .push(Write::Apply(Child::Marker(Box::new(resources::marker(
                    m, &marker,
                )))));
            Some(marker)
        }
        JobState::Failed(job_reason, job_msg) => {
            let f =
                progress::container_failure(&pods, "setup", "SetupFailed").unwrap_or_else(|| FailureStatus {
                    component: "setup".into(),
                    reason: if job_reason == "DeadlineExceeded" {
                        job_reason.clone()
                    } else {
                        "SetupFailed".into()
                    },
                    exit_code: None,
                    message: job_msg.clone(),
                    time: None,
                });
            b.cond(
                WEIGHTS_READY,
                Status::False,
                &f.reason,
                format!(
                    "setup Job {setup_name} failed: {}; fix the cause and delete the Job to retry",
                    f.message
                ),
            );
            b.status.last_failure = Some(f);
            None
        }
    }
}

/// The setup Job's identity (ServiceAccount, Role, RoleBinding), applied while it is missing or
/// drifted, before the Job that runs as it.
fn plan_setup_reporter(b: &mut Builder<'_>, m: &Model<'_>) {
    let obs = b.obs;
    let sa = resources::setup_service_account(m);
    if !drift::already_applied(&sa, obs.setup_account.as_ref()) {
        b.writes.push(Write::Apply(Child::ServiceAccount(Box::new(sa))));
    }
    let role = resources::setup_role(m);
    if !drift::already_applied(&role, obs.setup_role.as_ref()) {
        b.writes.push(Write::Apply(Child::Role(Box::new(role))));
    }
    let binding = resources::setup_role_binding(m);
    if !drift::already_applied(&binding, obs.setup_role_binding.as_ref()) {
        b.writes.push(Write::Apply(Child::RoleBinding(Box::new(binding))));
    }
}

/// Image handling; returns the image the Deployment runs.
fn plan_upgrade(
    b: &mut Builder<'_>,
    m: &Model<'_>,
    mk: &Marker,
    preflight_name: &str,
    storage_uid: Option<String>,
) -> String {
    if mk.image == m.image {
        b.cond(
            UPGRADING,
            Status::False,
            "UpToDate",
            format!("running {}", m.image),
        );
        return m.image.clone();
    }
    let obs = b.obs;
    match obs.jobs.iter().find(|j| j.name_any() == preflight_name) {
        None => {
            b.writes
                .push(Write::Apply(Child::Job(Box::new(resources::preflight_job(
                    m, &m.image,
                )))));
            b.busy = true;
            b.cond(
                UPGRADING,
                Status::True,
                "PreflightRunning",
                format!(
                    "checking {} with deltafin doctor before it replaces {}",
                    m.image, mk.image
                ),
            );
            mk.image.clone()
        }
        Some(job) => {
            match job_state(job) {
                JobState::Running => {
                    b.busy = true;
                    b.cond(
                        UPGRADING,
                        Status::True,
                        "PreflightRunning",
                        format!(
                            "checking {} with deltafin doctor before it replaces {}",
                            m.image, mk.image
                        ),
                    );
                    mk.image.clone()
                }
                JobState::Succeeded => {
                    let marker = Marker {
                        image: m.image.clone(),
                        storage_uid,
                        ..mk.clone()
                    };
                    b.writes
                        .push(Write::Apply(Child::Marker(Box::new(resources::marker(
                            m, &marker,
                        )))));
                    b.cond(
                        UPGRADING,
                        Status::False,
                        "UpToDate",
                        format!("pre-flight passed; running {} (was {})", m.image, mk.image),
                    );
                    m.image.clone()
                }
                JobState::Failed(job_reason, job_msg) => {
                    let pods = job_pods(&obs.pods, preflight_name);
                    let f = progress::container_failure(&pods, "preflight", "PreflightFailed")
                        .unwrap_or_else(|| FailureStatus {
                            component: "preflight".into(),
                            reason: if job_reason == "DeadlineExceeded" {
                                job_reason
                            } else {
                                "PreflightFailed".into()
                            },
                            exit_code: None,
                            message: job_msg,
                            time: None,
                        });
                    b.cond(
                    UPGRADING,
                    Status::False,
                    "PreflightFailed",
                    format!(
                        "pre-flight of {} failed ({}: {}); still running {}. Fix the image, or delete Job {} to retry",
                        m.image, f.reason, f.message, mk.image, preflight_name
                    ),
                );
                    b.status.last_failure = Some(f);
                    mk.image.clone()
                }
            }
        }
    }
}

fn plan_server_status(b: &mut Builder<'_>, m: &Model<'_>, weights_ok: bool, pending: bool) {
    let obs = b.obs;
    if m.cr.spec.paused {
        b.cond(
            SERVER_READY,
            Status::False,
            "Paused",
            "spec.paused is true: the server is scaled to zero",
        );
        return;
    }
    let Some(d) = &obs.deployment else {
        if weights_ok {
            b.busy = true;
            b.cond(
                SERVER_READY,
                Status::False,
                "Starting",
                format!("Deployment {} created", names::server(&m.name)),
            );
        } else {
            b.cond(
                SERVER_READY,
                Status::False,
                "AwaitingWeights",
                "the server starts once the weights are installed",
            );
        }
        return;
    };
    let st = d.status.clone().unwrap_or_default();
    let rolled_out = st.observed_generation >= d.metadata.generation
        && st.updated_replicas.unwrap_or(0) >= 1
        && st.ready_replicas.unwrap_or(0) >= 1
        && st.replicas.unwrap_or(0) <= 1;
    if rolled_out && !pending {
        b.cond(
            SERVER_READY,
            Status::True,
            "Serving",
            "the server answers /readyz",
        );
        return;
    }
    b.busy = true;
    if pending {
        b.cond(
            SERVER_READY,
            Status::False,
            "Starting",
            "applying the new server spec (Recreate)",
        );
        return;
    }
    let pods = server_pods(&obs.pods);
    let gpu = m.gpu.as_ref().map(|g| g.resource_name.as_str());
    if let Some((reason, msg)) = progress::stuck_waiting(&pods) {
        if let Some(f) = progress::container_failure(&pods, "server", &reason) {
            b.status.last_failure = Some(f);
        } else {
            b.status.last_failure = Some(FailureStatus {
                component: "server".into(),
                reason: reason.clone(),
                exit_code: None,
                message: msg.clone(),
                time: None,
            });
        }
        let reason = match b.status.last_failure.as_ref() {
            Some(f) if f.reason == "OOMKilled" => "OOMKilled".to_string(),
            _ => reason,
        };
        b.cond(SERVER_READY, Status::False, &reason, msg);
    } else if let Some((reason, msg)) = progress::unschedulable(&pods, gpu) {
        b.cond(SERVER_READY, Status::False, &reason, msg);
    } else if pods
        .iter()
        .any(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
    {
        b.cond(
            SERVER_READY,
            Status::False,
            "Loading",
            "the server is loading the model (/readyz is 503)",
        );
    } else {
        b.cond(
            SERVER_READY,
            Status::False,
            "Starting",
            "waiting for the server pod",
        );
    }
}

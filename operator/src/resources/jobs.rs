//! The setup Job (`deltafin setup`, or `deltafin doctor` for preloaded weights) and the
//! pre-flight Job (`deltafin doctor` with a new image before it replaces the running one).

use std::collections::BTreeMap;

use k8s_openapi::api::batch::v1::{
    Job, JobSpec, PodFailurePolicy, PodFailurePolicyOnPodConditionsPattern, PodFailurePolicyRule,
};
use k8s_openapi::api::core::v1::{Container, PodSpec, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::{
    base_env, container_security_context, hf_env, owned_meta, pod_security_context, pull_secrets,
    scratch_mounts, scratch_volumes, weights_mount, weights_volume,
};
use crate::crd::SetupMode;
use crate::model::Model;
use crate::names::{self, Component, WEIGHTS_KEY};

/// Default deadline of a pre-flight Job.
pub const PREFLIGHT_TIMEOUT_SECONDS: i64 = 900;

/// Arguments of the setup container.
pub fn setup_args(m: &Model<'_>) -> Vec<String> {
    let Some(source) = &m.source_uri else {
        // Preloaded weights: check them (hashes included, once), never download.
        return vec![
            "doctor".into(),
            "--dir".into(),
            m.dir.clone(),
            "--verify".into(),
            "--json".into(),
        ];
    };
    let mut a = vec![
        "setup".into(),
        "--source".into(),
        source.clone(),
        "--dir".into(),
        m.dir.clone(),
    ];
    a.push(match m.mode() {
        SetupMode::Full => "--full".into(),
        SetupMode::Stream => "--stream".into(),
    });
    let d = &m.cr.spec.drafts;
    if let (true, Some(src)) = (d.dspark.enabled, &d.dspark.source) {
        a.push("--draft".into());
        a.push(format!("dspark={src}"));
    }
    if d.qwen.enabled {
        a.push("--include-qwen".into());
    }
    // Progress for the operator (the model's status, watched) and for `kubectl logs` (stdout).
    a.push("--report-status".into());
    a.push(format!("{}/{}", m.namespace, m.name));
    a.push("--report-job".into());
    a.push(names::setup_job(&m.name, &m.key));
    a.push("--progress-file".into());
    a.push("/dev/stdout".into());
    a
}

/// The setup Job `<name>-setup-<key>` for the current content key, run with `image`.
pub fn setup_job(m: &Model<'_>, image: &str) -> Job {
    let spec = &m.cr.spec.setup;
    let mut env = base_env();
    env.extend(hf_env(m));
    env.extend(spec.env.iter().cloned());
    let container = Container {
        name: "setup".into(),
        image: Some(image.into()),
        image_pull_policy: m.cr.spec.image_pull_policy.map(|p| p.as_str().into()),
        command: Some(vec!["deltafin".into()]),
        args: Some(setup_args(m)),
        env: Some(env),
        resources: spec.resources.clone(),
        volume_mounts: Some([vec![weights_mount(false)], scratch_mounts()].concat()),
        security_context: Some(container_security_context()),
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        ..Default::default()
    };
    let name = names::setup_job(&m.name, &m.key);
    let mut job = job(
        m,
        name,
        Component::Setup,
        image,
        container,
        spec.backoff_limit,
        spec.active_deadline_seconds,
        true,
    );
    if m.source_uri.is_some()
        && let Some(pod) = job.spec.as_mut().and_then(|s| s.template.spec.as_mut())
    {
        // The token of `<name>-setup`, whose only right is patching this model's status.
        pod.service_account_name = Some(names::setup_reporter(&m.name));
        pod.automount_service_account_token = Some(true);
    }
    job
}

/// The pre-flight Job `<name>-preflight-<hash(image)>`: `deltafin doctor` with the new image on
/// the installed weights (mounted read-only).
pub fn preflight_job(m: &Model<'_>, image: &str) -> Job {
    let container = Container {
        name: "preflight".into(),
        image: Some(image.into()),
        image_pull_policy: m.cr.spec.image_pull_policy.map(|p| p.as_str().into()),
        command: Some(vec!["deltafin".into()]),
        args: Some(vec![
            "doctor".into(),
            "--dir".into(),
            m.dir.clone(),
            "--json".into(),
        ]),
        env: Some(base_env()),
        volume_mounts: Some([vec![weights_mount(true)], scratch_mounts()].concat()),
        security_context: Some(container_security_context()),
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        ..Default::default()
    };
    let deadline =
        m.cr.spec
            .upgrade
            .preflight_timeout_seconds
            .unwrap_or(PREFLIGHT_TIMEOUT_SECONDS);
    let name = names::preflight_job(&m.name, image);
    job(
        m,
        name,
        Component::Preflight,
        image,
        container,
        0,
        Some(deadline),
        false,
    )
}

#[allow(clippy::too_many_arguments)]
fn job(
    m: &Model<'_>,
    name: String,
    component: Component,
    image: &str,
    container: Container,
    backoff_limit: i32,
    deadline: Option<i64>,
    ignore_disruptions: bool,
) -> Job {
    let mut meta = owned_meta(m, name, component, Some(image));
    meta.annotations = Some(BTreeMap::from([(WEIGHTS_KEY.to_string(), m.key.clone())]));
    let sched = &m.cr.spec.scheduling;
    let pod = PodSpec {
        restart_policy: Some("Never".into()),
        containers: vec![container],
        volumes: Some([vec![weights_volume(m)], scratch_volumes()].concat()),
        security_context: Some(pod_security_context()),
        automount_service_account_token: Some(false),
        enable_service_links: Some(false),
        image_pull_secrets: pull_secrets(m),
        node_selector: (!sched.node_selector.is_empty()).then(|| sched.node_selector.clone()),
        tolerations: (!sched.tolerations.is_empty()).then(|| sched.tolerations.clone()),
        ..Default::default()
    };
    // Evictions and preemptions do not count against the retry budget: setup resumes. Left out
    // where the server does not serve the field (before 1.26; see crate::version).
    let pod_failure_policy = (ignore_disruptions && m.served.pod_failure_policy).then(|| PodFailurePolicy {
        rules: vec![PodFailurePolicyRule {
            action: "Ignore".into(),
            on_pod_conditions: Some(vec![PodFailurePolicyOnPodConditionsPattern {
                type_: "DisruptionTarget".into(),
                status: "True".into(),
            }]),
            on_exit_codes: None,
        }],
    });
    Job {
        metadata: meta.clone(),
        spec: Some(JobSpec {
            backoff_limit: Some(backoff_limit),
            active_deadline_seconds: deadline,
            pod_failure_policy,
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: meta.labels.clone(),
                    ..Default::default()
                }),
                spec: Some(pod),
            },
            ..Default::default()
        }),
        status: None,
    }
}

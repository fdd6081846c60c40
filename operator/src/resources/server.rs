//! The server Deployment, its Service and the ServiceMonitor.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec, DeploymentStrategy};
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, HTTPGetAction, KeyToPath, PodSpec, PodTemplateSpec, Probe,
    ResourceRequirements, SecretVolumeSource, Service, ServicePort, ServiceSpec, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use serde_json::json;

use super::{
    base_env, container_security_context, hf_env, owned_meta, pod_security_context, pull_secrets,
    scratch_mounts, scratch_volumes, weights_mount, weights_volume,
};
use crate::crd::SetupMode;
use crate::model::Model;
use crate::names::{self, Component, SERVER_PORT};

/// Default budget for the process to answer `/livez` after start.
pub const STARTUP_TIMEOUT_SECONDS: i32 = 600;
const API_KEY_DIR: &str = "/etc/deltafin/api-key";

/// Arguments of `deltafin serve`.
pub fn server_args(m: &Model<'_>) -> Vec<String> {
    let s = &m.cr.spec.server;
    let mut a: Vec<String> = vec![
        "serve".into(),
        "--model".into(),
        m.dir.clone(),
        "--host".into(),
        "0.0.0.0".into(),
        "--port".into(),
        SERVER_PORT.to_string(),
    ];
    // Clients name the model as the DeltafinModel is named (the directory's name is a revision),
    // unless extraArgs choose another name.
    if !s.extra_args.iter().any(|x| x.starts_with("--served-model-name")) {
        a.extend(["--served-model-name".into(), m.name.clone()]);
    }
    let mut opt = |flag: &str, v: Option<String>| {
        if let Some(v) = v {
            a.push(flag.into());
            a.push(v);
        }
    };
    opt("--max-tokens", s.max_tokens.map(|v| v.to_string()));
    opt("--max-queue", s.max_queue.map(|v| v.to_string()));
    opt("--context-limit", s.context_limit.map(|v| v.to_string()));
    opt("--memory-budget", m.memory_budget.map(|v| v.to_string()));
    // A CUDA model runs its matrix products on the GPU its pod is given (as `cuda:0` inside the
    // container: the device plugin exposes only the allocated GPUs).
    opt("--device", m.gpu.as_ref().map(|_| "cuda".to_string()));
    opt(
        "--api-key-file",
        s.api_key_secret
            .as_ref()
            .map(|_| format!("{API_KEY_DIR}/api-key")),
    );
    a.extend(s.extra_args.iter().cloned());
    a
}

/// Resources of the server container: the spec's, plus the GPU limit for CUDA.
pub fn server_resources(m: &Model<'_>) -> Option<ResourceRequirements> {
    let mut r = m.cr.spec.resources.clone();
    if let Some(gpu) = &m.gpu {
        let r = r.get_or_insert_with(Default::default);
        r.limits
            .get_or_insert_with(BTreeMap::new)
            .insert(gpu.resource_name.clone(), Quantity(gpu.count.to_string()));
    }
    r
}

fn http_probe(path: &str, period: i32, timeout: i32, failures: i32) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::String("http".into()),
            ..Default::default()
        }),
        period_seconds: Some(period),
        timeout_seconds: Some(timeout),
        failure_threshold: Some(failures),
        ..Default::default()
    }
}

/// The server Deployment: one replica (zero when paused), strategy Recreate (one GPU, one copy
/// of the spine in RAM: never two pods at once), weights read-only in Full mode.
pub fn deployment(m: &Model<'_>, image: &str) -> Deployment {
    let spec = &m.cr.spec;
    let s = &spec.server;
    let mut env = base_env();
    if m.mode() == SetupMode::Stream {
        // Stream mode fetches experts on first use: the server needs the source credentials.
        env.extend(hf_env(m));
    }
    env.extend(s.env.iter().cloned());
    let mut mounts = vec![weights_mount(m.mode() == SetupMode::Full)];
    mounts.extend(scratch_mounts());
    let mut volumes = vec![weights_volume(m)];
    volumes.extend(scratch_volumes());
    if let Some(k) = &s.api_key_secret {
        volumes.push(Volume {
            name: "api-key".into(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(k.name.clone()),
                items: Some(vec![KeyToPath {
                    key: k.key.clone(),
                    path: "api-key".into(),
                    mode: None,
                }]),
                default_mode: Some(0o440),
                optional: Some(false),
            }),
            ..Default::default()
        });
        mounts.push(VolumeMount {
            name: "api-key".into(),
            mount_path: API_KEY_DIR.into(),
            read_only: Some(true),
            ..Default::default()
        });
    }
    let startup = s.startup_timeout_seconds.unwrap_or(STARTUP_TIMEOUT_SECONDS);
    let container = Container {
        name: "server".into(),
        image: Some(image.into()),
        image_pull_policy: spec.image_pull_policy.map(|p| p.as_str().into()),
        command: Some(vec!["deltafin".into()]),
        args: Some(server_args(m)),
        env: Some(env),
        ports: Some(vec![ContainerPort {
            name: Some("http".into()),
            container_port: SERVER_PORT,
            protocol: Some("TCP".into()),
            ..Default::default()
        }]),
        // The process answers /livez as soon as it listens; loading the model is covered by
        // readiness (/readyz is 503 until loaded), which never restarts the pod.
        startup_probe: Some(http_probe("/livez", 5, 3, (startup + 4) / 5)),
        readiness_probe: Some(http_probe("/readyz", 10, 5, 3)),
        liveness_probe: Some(http_probe("/livez", 20, 10, 6)),
        resources: server_resources(m),
        volume_mounts: Some(mounts),
        security_context: Some(container_security_context()),
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        ..Default::default()
    };
    let sched = &spec.scheduling;
    let mut meta = owned_meta(m, names::server(&m.name), Component::Server, Some(image));
    meta.annotations = Some(BTreeMap::from([(names::WEIGHTS_KEY.to_string(), m.key.clone())]));
    let pod_labels = names::labels(&m.name, Component::Server, Some(image));
    Deployment {
        metadata: meta,
        spec: Some(DeploymentSpec {
            replicas: Some(if spec.paused { 0 } else { 1 }),
            strategy: Some(DeploymentStrategy {
                type_: Some("Recreate".into()),
                rolling_update: None,
            }),
            revision_history_limit: Some(3),
            selector: LabelSelector {
                match_labels: Some(names::selector_labels(&m.name, Component::Server)),
                ..Default::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(pod_labels),
                    annotations: Some(BTreeMap::from([
                        ("prometheus.io/scrape".to_string(), "true".to_string()),
                        ("prometheus.io/port".to_string(), SERVER_PORT.to_string()),
                        ("prometheus.io/path".to_string(), "/metrics".to_string()),
                    ])),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    containers: vec![container],
                    volumes: Some(volumes),
                    security_context: Some(pod_security_context()),
                    automount_service_account_token: Some(false),
                    enable_service_links: Some(false),
                    termination_grace_period_seconds: Some(60),
                    image_pull_secrets: pull_secrets(m),
                    runtime_class_name: m.gpu.as_ref().and_then(|g| g.runtime_class_name.clone()),
                    node_selector: (!sched.node_selector.is_empty()).then(|| sched.node_selector.clone()),
                    tolerations: (!sched.tolerations.is_empty()).then(|| sched.tolerations.clone()),
                    priority_class_name: sched.priority_class_name.clone(),
                    ..Default::default()
                }),
            },
            ..Default::default()
        }),
        status: None,
    }
}

/// The Service `<name>`: port `http` (default 8000) to the server pod.
pub fn service(m: &Model<'_>) -> Service {
    let s = &m.cr.spec.service;
    Service {
        metadata: owned_meta(m, names::server(&m.name), Component::Server, None),
        spec: Some(ServiceSpec {
            type_: Some(s.kind.as_str().into()),
            selector: Some(names::selector_labels(&m.name, Component::Server)),
            ports: Some(vec![ServicePort {
                name: Some("http".into()),
                port: s.port,
                target_port: Some(IntOrString::String("http".into())),
                protocol: Some("TCP".into()),
                app_protocol: Some("http".into()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        status: None,
    }
}

/// `monitoring.coreos.com/v1` ServiceMonitor.
pub fn service_monitor_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("monitoring.coreos.com", "v1", "ServiceMonitor"),
        "servicemonitors",
    )
}

/// The ServiceMonitor `<name>` scraping the Service's `/metrics`.
pub fn service_monitor(m: &Model<'_>) -> DynamicObject {
    let metrics = &m.cr.spec.metrics;
    let mut meta = owned_meta(m, names::service_monitor(&m.name), Component::Server, None);
    if let Some(l) = meta.labels.as_mut() {
        l.extend(metrics.labels.clone());
    }
    let mut obj = DynamicObject::new(&names::service_monitor(&m.name), &service_monitor_resource())
        .within(&m.namespace);
    obj.metadata = meta;
    obj.data = json!({
        "spec": {
            "selector": {"matchLabels": names::selector_labels(&m.name, Component::Server)},
            "namespaceSelector": {"matchNames": [m.namespace]},
            "endpoints": [{"port": "http", "path": "/metrics", "interval": metrics.interval}],
        }
    });
    obj
}

//! Pure builders: a resolved [`Model`] in, typed Kubernetes objects out. No I/O here; the
//! controller applies what these return, and the tests snapshot them.

mod jobs;
mod reporter;
mod server;
mod storage;

pub use jobs::{preflight_job, setup_job};
pub use reporter::{setup_role, setup_role_binding, setup_service_account};
pub use server::{deployment, service, service_monitor, service_monitor_resource};
pub use storage::{Marker, marker, marker_data, pvc};

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Capabilities, EmptyDirVolumeSource, EnvVar, EnvVarSource, HostPathVolumeSource, LocalObjectReference,
    PersistentVolumeClaimVolumeSource, PodSecurityContext, SeccompProfile, SecretKeySelector,
    SecurityContext, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Resource;

use crate::model::{Model, Storage};
use crate::names::{self, Component, RUN_AS, WEIGHTS_MOUNT};

/// Pod-level security context of every pod (Pod Security Standard *restricted*).
pub fn pod_security_context() -> PodSecurityContext {
    PodSecurityContext {
        run_as_non_root: Some(true),
        run_as_user: Some(RUN_AS),
        run_as_group: Some(RUN_AS),
        fs_group: Some(RUN_AS),
        fs_group_change_policy: Some("OnRootMismatch".into()),
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".into(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Container security context of every container: no privilege escalation, no capabilities,
/// read-only root filesystem (writable paths are volumes).
pub fn container_security_context() -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        read_only_root_filesystem: Some(true),
        run_as_non_root: Some(true),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".into()]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The weights volume (`weights`).
pub fn weights_volume(m: &Model<'_>) -> Volume {
    match &m.storage {
        Storage::Pvc { claim } | Storage::ExistingClaim { claim } => Volume {
            name: "weights".into(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: claim.clone(),
                read_only: None,
            }),
            ..Default::default()
        },
        Storage::HostPath { path } => Volume {
            name: "weights".into(),
            host_path: Some(HostPathVolumeSource {
                path: path.clone(),
                type_: Some("DirectoryOrCreate".into()),
            }),
            ..Default::default()
        },
    }
}

/// Mount of the weights volume at `/weights`.
pub fn weights_mount(read_only: bool) -> VolumeMount {
    VolumeMount {
        name: "weights".into(),
        mount_path: WEIGHTS_MOUNT.into(),
        read_only: Some(read_only),
        ..Default::default()
    }
}

/// `tmp` (`/tmp`) and `cache` (`/cache`, `DELTAFIN_CACHE_DIR`) scratch volumes.
pub fn scratch_volumes() -> Vec<Volume> {
    ["tmp", "cache"]
        .into_iter()
        .map(|n| Volume {
            name: n.into(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Default::default()
        })
        .collect()
}

/// Mounts of [`scratch_volumes`].
pub fn scratch_mounts() -> Vec<VolumeMount> {
    vec![
        VolumeMount {
            name: "tmp".into(),
            mount_path: "/tmp".into(),
            ..Default::default()
        },
        VolumeMount {
            name: "cache".into(),
            mount_path: "/cache".into(),
            ..Default::default()
        },
    ]
}

/// Environment every Deltafin container gets.
pub fn base_env() -> Vec<EnvVar> {
    vec![env("DELTAFIN_CACHE_DIR", "/cache"), env("HOME", "/tmp")]
}

/// `HF_TOKEN` and `HF_ENDPOINT` for a Hugging Face source.
pub fn hf_env(m: &Model<'_>) -> Vec<EnvVar> {
    let mut out = Vec::new();
    if let Some(hf) = &m.cr.spec.source.hugging_face {
        if let Some(t) = &hf.token_secret {
            out.push(EnvVar {
                name: "HF_TOKEN".into(),
                value_from: Some(EnvVarSource {
                    secret_key_ref: Some(SecretKeySelector {
                        name: t.name.clone(),
                        key: t.key.clone(),
                        optional: Some(false),
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            });
        }
        if let Some(e) = &hf.endpoint {
            out.push(env("HF_ENDPOINT", e));
        }
    }
    out
}

/// A plain environment variable.
pub fn env(name: &str, value: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: Some(value.into()),
        ..Default::default()
    }
}

/// `imagePullSecrets` of the spec.
pub fn pull_secrets(m: &Model<'_>) -> Option<Vec<LocalObjectReference>> {
    let s = &m.cr.spec.image_pull_secrets;
    (!s.is_empty()).then(|| {
        s.iter()
            .map(|n| LocalObjectReference { name: n.clone() })
            .collect()
    })
}

/// Metadata of an owned child: name, namespace, labels and a controller owner reference.
pub fn owned_meta(m: &Model<'_>, name: String, component: Component, image: Option<&str>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        namespace: Some(m.namespace.clone()),
        labels: Some(names::labels(&m.name, component, image)),
        owner_references: m.cr.controller_owner_ref(&()).map(|o| vec![o]),
        ..Default::default()
    }
}

/// Metadata of a retained object (weights PVC, marker): no owner reference.
pub fn retained_meta(m: &Model<'_>, name: String) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        namespace: Some(m.namespace.clone()),
        labels: Some(names::labels(&m.name, Component::Weights, None)),
        ..Default::default()
    }
}

/// A JSON value with object keys sorted recursively.
pub fn canonical(v: serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match v {
        Value::Object(m) => {
            let sorted: BTreeMap<String, Value> = m.into_iter().map(|(k, v)| (k, canonical(v))).collect();
            Value::Object(sorted.into_iter().collect())
        }
        Value::Array(a) => Value::Array(a.into_iter().map(canonical).collect()),
        other => other,
    }
}

/// The owner references of an object (for tests and invariants).
pub fn owners<K: Resource>(obj: &K) -> &[OwnerReference] {
    obj.meta().owner_references.as_deref().unwrap_or_default()
}

//! Names, labels and content keys of everything the operator creates.
//!
//! Child names are derived from the DeltafinModel name (at most [`crate::crd::MAX_NAME_LEN`]
//! characters, enforced by CEL) so they stay valid DNS labels. Selectors use only the immutable
//! `name`/`instance`/`component` labels.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

/// Field manager of every server-side apply, and the `managed-by` label value.
pub const MANAGER: &str = "deltafin-operator";
/// Finalizer on every DeltafinModel: cleanup records retained weights or deletes them.
pub const FINALIZER: &str = "deltafin.dev/cleanup";
/// Label that ties children, the weights PVC and the marker to their DeltafinModel.
pub const MODEL_LABEL: &str = "deltafin.dev/model";
/// Annotation on Jobs and the marker: the content key of the install.
pub const WEIGHTS_KEY: &str = "deltafin.dev/weights-key";
/// Version of the directory layout the operator asks `deltafin setup` for; part of the key.
pub const LAYOUT_VERSION: u32 = 1;
/// Port the server listens on inside the pod.
pub const SERVER_PORT: i32 = 8000;
/// Where the weights volume is mounted in server, setup and pre-flight containers.
pub const WEIGHTS_MOUNT: &str = "/weights";
/// Non-root uid/gid of every container (distroless `nonroot`).
pub const RUN_AS: i64 = 65532;

/// The `app.kubernetes.io/component` of a child.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Component {
    /// The server Deployment, its pods and the Service.
    Server,
    /// The setup Job.
    Setup,
    /// The pre-flight Job run on image change.
    Preflight,
    /// The weights PVC and marker ConfigMap.
    Weights,
}

impl Component {
    /// Label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Server => "server",
            Self::Setup => "setup",
            Self::Preflight => "preflight",
            Self::Weights => "weights",
        }
    }
}

/// Labels used in selectors (immutable).
pub fn selector_labels(model: &str, component: Component) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".to_string(), "deltafin".to_string()),
        ("app.kubernetes.io/instance".to_string(), model.to_string()),
        (
            "app.kubernetes.io/component".to_string(),
            component.as_str().to_string(),
        ),
    ])
}

/// The recommended labels of every child: selector labels plus `part-of`, `managed-by`, the model
/// label and, when the image tag is a valid label value, `version`.
pub fn labels(model: &str, component: Component, image: Option<&str>) -> BTreeMap<String, String> {
    let mut l = selector_labels(model, component);
    l.insert("app.kubernetes.io/part-of".into(), "deltafin".into());
    l.insert("app.kubernetes.io/managed-by".into(), MANAGER.into());
    l.insert(MODEL_LABEL.into(), model.into());
    if let Some(v) = image.and_then(image_version) {
        l.insert("app.kubernetes.io/version".into(), v);
    }
    l
}

/// The tag of an image reference when it is a valid label value (`repo:tag` or `repo:tag@digest`).
pub fn image_version(image: &str) -> Option<String> {
    let without_digest = image.split('@').next().unwrap_or(image);
    let last = without_digest.rsplit('/').next()?;
    let (_, tag) = last.split_once(':')?;
    let ok = !tag.is_empty()
        && tag.len() <= 63
        && tag
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && tag.starts_with(|c: char| c.is_ascii_alphanumeric())
        && tag.ends_with(|c: char| c.is_ascii_alphanumeric());
    ok.then(|| tag.to_string())
}

/// Hex SHA-256 prefix of `data` (`len` hex digits).
pub fn short_hash(data: &[u8], len: usize) -> String {
    let digest = Sha256::digest(data);
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    hex[..len.min(hex.len())].to_string()
}

/// Name of the server Deployment and Service.
pub fn server(model: &str) -> String {
    model.to_string()
}

/// Name of the operator-created PVC and of the weights marker ConfigMap.
pub fn weights(model: &str) -> String {
    format!("{model}-weights")
}

/// Name of the setup Job for one content key.
pub fn setup_job(model: &str, key: &str) -> String {
    format!("{model}-setup-{}", &key[..key.len().min(10)])
}

/// Name of the setup Job's ServiceAccount, Role and RoleBinding (its progress reports).
pub fn setup_reporter(model: &str) -> String {
    format!("{model}-setup")
}

/// Name of the pre-flight Job for one image.
pub fn preflight_job(model: &str, image: &str) -> String {
    format!("{model}-preflight-{}", short_hash(image.as_bytes(), 10))
}

/// Name of the ServiceMonitor.
pub fn service_monitor(model: &str) -> String {
    model.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_version_takes_valid_tags_only() {
        assert_eq!(
            image_version("ghcr.io/deltafin/deltafin:0.1.0").as_deref(),
            Some("0.1.0")
        );
        assert_eq!(image_version("localhost:5000/deltafin:v2").as_deref(), Some("v2"));
        assert_eq!(image_version("localhost:5000/deltafin").as_deref(), None);
        let digest = format!("ghcr.io/x/y:1.2@sha256:{}", "a".repeat(64));
        assert_eq!(image_version(&digest).as_deref(), Some("1.2"));
        assert_eq!(image_version(&format!("x/y@sha256:{}", "a".repeat(64))), None);
    }

    #[test]
    fn child_names_fit_in_a_label() {
        let name = "a".repeat(crate::crd::MAX_NAME_LEN);
        for n in [
            setup_job(&name, &"f".repeat(64)),
            preflight_job(&name, "img:1"),
            weights(&name),
        ] {
            assert!(n.len() <= 63, "{n} is {} characters", n.len());
        }
    }
}

//! A `DeltafinModel` resolved against the operator's settings: defaults filled in, the spec
//! checked beyond what CEL rules enforce, and the content key of the install computed.

use kube::ResourceExt;
use sha2::{Digest, Sha256};

use crate::crd::{DeltafinModel, DeviceKind, GpuSpec, RetainPolicy, SetupMode};
use crate::names::{self, LAYOUT_VERSION, WEIGHTS_MOUNT};
use crate::version::ServedFields;

/// Operator-wide settings (command-line flags of `deltafin-operator run`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    /// Server image when `spec.image` is unset and the device is CPU.
    pub default_image: String,
    /// Server image when `spec.image` is unset and the device is CUDA.
    pub default_cuda_image: String,
    /// Whether `monitoring.coreos.com/v1` ServiceMonitor is served (checked at start).
    pub service_monitors: bool,
    /// The optional fields the server serves (from its version, read at start).
    pub served: ServedFields,
}

impl Settings {
    /// Defaults matching the chart: `ghcr.io/deltafin/deltafin:<version>` and its `-cuda` tag.
    pub fn with_version(version: &str) -> Self {
        Self {
            default_image: format!("ghcr.io/deltafin/deltafin:{version}"),
            default_cuda_image: format!("ghcr.io/deltafin/deltafin:{version}-cuda"),
            service_monitors: false,
            served: ServedFields::ALL,
        }
    }
}

/// The volume holding the weights.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Storage {
    /// A PVC created by the operator (`<name>-weights`).
    Pvc {
        /// Claim name.
        claim: String,
    },
    /// A PVC the user created.
    ExistingClaim {
        /// Claim name.
        claim: String,
    },
    /// A node directory.
    HostPath {
        /// Absolute path.
        path: String,
    },
}

impl Storage {
    /// The claim, for PVC-backed storage.
    pub fn claim(&self) -> Option<&str> {
        match self {
            Self::Pvc { claim } | Self::ExistingClaim { claim } => Some(claim),
            Self::HostPath { .. } => None,
        }
    }

    fn identity(&self) -> String {
        match self {
            Self::Pvc { claim } => format!("pvc:{claim}"),
            Self::ExistingClaim { claim } => format!("claim:{claim}"),
            Self::HostPath { path } => format!("hostPath:{path}"),
        }
    }
}

/// A resolved `DeltafinModel`.
#[derive(Clone, Debug)]
pub struct Model<'a> {
    /// The resource.
    pub cr: &'a DeltafinModel,
    /// `metadata.name`.
    pub name: String,
    /// `metadata.namespace`.
    pub namespace: String,
    /// Desired server image.
    pub image: String,
    /// `hf://ORG/REPO[@REV]` or `oci://REF`; `None` for preloaded weights.
    pub source_uri: Option<String>,
    /// Directory inside the weights volume.
    pub sub_path: String,
    /// Model directory in the containers (`/weights/<subPath>`).
    pub dir: String,
    /// Weights volume.
    pub storage: Storage,
    /// Retain policy.
    pub retain: RetainPolicy,
    /// GPU request (CUDA only).
    pub gpu: Option<GpuSpec>,
    /// `--memory-budget` in bytes.
    pub memory_budget: Option<u64>,
    /// Content key (64 hex digits): layout version, source, mode, drafts, storage, directory.
    pub key: String,
    /// The optional fields the server serves ([`Settings::served`]).
    pub served: ServedFields,
}

impl Model<'_> {
    /// Setup mode.
    pub fn mode(&self) -> SetupMode {
        self.cr.spec.setup.mode
    }

    /// In-cluster URL of the OpenAI-compatible API.
    pub fn url(&self) -> String {
        format!(
            "http://{}.{}.svc:{}/v1",
            names::server(&self.name),
            self.namespace,
            self.cr.spec.service.port
        )
    }
}

/// Resolves a resource; `Err` carries an `InvalidSpec` message naming the field.
pub fn resolve<'a>(cr: &'a DeltafinModel, settings: &Settings) -> Result<Model<'a>, String> {
    let name = cr.name_any();
    let namespace = cr.namespace().ok_or("metadata.namespace is missing")?;
    if name.len() > crate::crd::MAX_NAME_LEN {
        return Err(format!(
            "metadata.name must be at most {} characters",
            crate::crd::MAX_NAME_LEN
        ));
    }
    let spec = &cr.spec;
    let s = &spec.source;
    let (source_uri, default_sub) = match (&s.hugging_face, &s.oci, &s.preloaded) {
        (Some(hf), None, None) => {
            let rev = hf.revision.as_deref();
            let uri = match rev {
                Some(r) => format!("hf://{}@{r}", hf.repo),
                None => format!("hf://{}", hf.repo),
            };
            (
                Some(uri),
                format!("hf/{}/{}", hf.repo, sanitize(rev.unwrap_or("main"))),
            )
        }
        (None, Some(oci), None) => (
            Some(format!("oci://{}", oci.reference)),
            format!("oci/{}", sanitize(&oci.reference)),
        ),
        (None, None, Some(_)) => (None, String::new()),
        _ => return Err("set exactly one of source.huggingFace, source.oci, source.preloaded".into()),
    };
    let st = &spec.storage;
    let storage = match (&st.pvc, &st.existing_claim, &st.host_path) {
        (Some(_), None, None) => Storage::Pvc {
            claim: names::weights(&name),
        },
        (None, Some(c), None) => Storage::ExistingClaim {
            claim: c.name.clone(),
        },
        (None, None, Some(h)) => {
            if !h.path.starts_with('/') {
                return Err("storage.hostPath.path must be absolute".into());
            }
            Storage::HostPath { path: h.path.clone() }
        }
        _ => return Err("set exactly one of storage.pvc, storage.existingClaim, storage.hostPath".into()),
    };
    let retain = st.retain_policy.unwrap_or_default();
    if retain == RetainPolicy::Delete && !matches!(storage, Storage::Pvc { .. }) {
        return Err("retainPolicy: Delete applies only to storage.pvc".into());
    }
    let sub_path = st.sub_path.clone().unwrap_or(default_sub);
    if sub_path.split('/').any(|p| p == ".." || p == ".") || sub_path.starts_with('/') {
        return Err("storage.subPath must be relative without '.' or '..' components".into());
    }
    let dir = if sub_path.is_empty() {
        WEIGHTS_MOUNT.to_string()
    } else {
        format!("{WEIGHTS_MOUNT}/{sub_path}")
    };
    let gpu = match spec.device.kind {
        DeviceKind::Cpu if spec.device.gpu.is_some() => {
            return Err("device.gpu requires device.type: Cuda".into());
        }
        DeviceKind::Cpu => None,
        DeviceKind::Cuda => Some(spec.device.gpu.clone().unwrap_or_default()),
    };
    let image = match (&spec.image, spec.device.kind) {
        (Some(i), _) => i.clone(),
        (None, DeviceKind::Cpu) => settings.default_image.clone(),
        (None, DeviceKind::Cuda) => settings.default_cuda_image.clone(),
    };
    let memory_budget = match &spec.server.memory_budget {
        Some(q) => {
            Some(parse_quantity(q).ok_or_else(|| format!("server.memoryBudget: {q:?} is not a quantity"))?)
        }
        None => None,
    };
    let d = &spec.drafts;
    let key_text = format!(
        "layout={LAYOUT_VERSION}\nsource={}\nmode={:?}\ndspark={}:{}\nqwen={}\nstorage={}\ndir={sub_path}\n",
        source_uri.as_deref().unwrap_or("preloaded"),
        spec.setup.mode,
        d.dspark.enabled,
        d.dspark.source.as_deref().unwrap_or("default"),
        d.qwen.enabled,
        storage.identity(),
    );
    let key = Sha256::digest(key_text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    Ok(Model {
        cr,
        name,
        namespace,
        image,
        source_uri,
        sub_path,
        dir,
        storage,
        retain,
        gpu,
        memory_budget,
        key,
        served: settings.served,
    })
}

/// Path component from a revision or reference: keeps `[A-Za-z0-9._-]`, maps the rest to `_`.
fn sanitize(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '/') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Parses a Kubernetes quantity without fractions (`200Gi`, `1T`, `123`) into bytes.
pub fn parse_quantity(q: &str) -> Option<u64> {
    let split = q.find(|c: char| !c.is_ascii_digit()).unwrap_or(q.len());
    let (num, suffix) = q.split_at(split);
    let n: u64 = num.parse().ok()?;
    let mult: u64 = match suffix {
        "" => 1,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        "P" => 1_000_000_000_000_000,
        "E" => 1_000_000_000_000_000_000,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "Pi" => 1 << 50,
        "Ei" => 1 << 60,
        _ => return None,
    };
    n.checked_mul(mult)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities() {
        assert_eq!(parse_quantity("200Gi"), Some(200 << 30));
        assert_eq!(parse_quantity("3T"), Some(3_000_000_000_000));
        assert_eq!(parse_quantity("17"), Some(17));
        assert_eq!(parse_quantity("1.5Gi"), None);
        assert_eq!(parse_quantity("Gi"), None);
        assert_eq!(parse_quantity("20000Ei"), None);
    }

    #[test]
    fn sanitize_keeps_paths_safe() {
        assert_eq!(sanitize("registry:5000/m/k2:v1"), "registry_5000/m/k2_v1");
    }
}

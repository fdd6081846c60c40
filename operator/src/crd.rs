//! The `DeltafinModel` custom resource (`deltafin.dev/v1alpha1`).
//!
//! These Rust types are the single source of truth for the CRD: `deltafin-operator crd` prints
//! the YAML generated from them, and a test fails when the committed copy in the Helm chart
//! (`charts/deltafin/files/crd.yaml`) is stale. Invariants the apiserver can check are CEL rules
//! (`x-kubernetes-validations`) next to the field they constrain; the operator re-checks the rest
//! in [`crate::plan`] and reports `InvalidSpec`.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{EnvVar, ResourceRequirements, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// API group of the custom resource.
pub const GROUP: &str = "deltafin.dev";
/// Served and stored version.
pub const VERSION: &str = "v1alpha1";
/// Longest accepted resource name: child names append up to 23 characters
/// (`-preflight-` plus a 10-character hash) and must stay valid 63-character labels.
pub const MAX_NAME_LEN: usize = 40;

/// One model served by Deltafin: where its weights come from, where they are stored, and how the
/// server runs. The operator downloads the weights with a resumable setup Job, then runs the
/// server as a single-replica Deployment (strategy Recreate) behind a Service on port 8000.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "deltafin.dev",
    version = "v1alpha1",
    kind = "DeltafinModel",
    plural = "deltafinmodels",
    singular = "deltafinmodel",
    shortname = "dfm",
    category = "deltafin",
    namespaced,
    status = "DeltafinModelStatus",
    derive = "PartialEq",
    doc = "A model served by Deltafin (exact weights, one server per model).",
    printcolumn(name = "Mode", type_ = "string", json_path = ".spec.setup.mode"),
    printcolumn(name = "Weights", type_ = "string", json_path = ".status.weights.percentText"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Reason",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].reason"
    ),
    printcolumn(name = "Image", type_ = "string", json_path = ".status.image", priority = 1),
    printcolumn(name = "URL", type_ = "string", json_path = ".status.endpoint.url", priority = 1),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    validation = Rule::new("self.metadata.name.size() <= 40")
        .message("metadata.name must be at most 40 characters (child object names extend it)")
)]
#[serde(rename_all = "camelCase")]
pub struct DeltafinModelSpec {
    /// Where the weights come from: exactly one of `huggingFace`, `oci` or `preloaded`.
    pub source: ModelSource,
    /// How the weights are installed.
    #[serde(default)]
    pub setup: SetupSpec,
    /// Draft models for speculative decoding (they change speed, never output).
    #[serde(default)]
    pub drafts: DraftsSpec,
    /// The volume that holds the weights.
    pub storage: StorageSpec,
    /// Server image (default: the operator's `--default-image`, or `--default-cuda-image` for
    /// `device.type: Cuda`). Changing it runs a pre-flight Job (`deltafin doctor`) with the new
    /// image before the server is swapped; the weights are never downloaded again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub image: Option<String>,
    /// Pull policy for the server, setup and pre-flight containers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<PullPolicy>,
    /// Secrets holding registry credentials for the image.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub image_pull_secrets: Vec<String>,
    /// CPU or CUDA, and the GPU request.
    #[serde(default)]
    pub device: DeviceSpec,
    /// Resources of the server container. GPU limits from `device.gpu` are added to these. Set a
    /// memory limit: the server sizes its expert cache from its cgroup limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// Options passed to `deltafin serve`.
    #[serde(default)]
    pub server: ServerSpec,
    /// Image upgrades.
    #[serde(default)]
    pub upgrade: UpgradeSpec,
    /// Node selection for the server, setup and pre-flight pods.
    #[serde(default)]
    pub scheduling: SchedulingSpec,
    /// The Service in front of the server.
    #[serde(default)]
    pub service: ServiceSpec,
    /// Prometheus scraping of the server's `/metrics`.
    #[serde(default)]
    pub metrics: MetricsSpec,
    /// Scale the server to zero (frees the GPU and the memory); weights and Service stay.
    #[serde(default)]
    pub paused: bool,
}

/// Where the weights come from.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new(
    "(has(self.huggingFace) ? 1 : 0) + (has(self.oci) ? 1 : 0) + (has(self.preloaded) ? 1 : 0) == 1"
).message("set exactly one of source.huggingFace, source.oci, source.preloaded"))]
pub struct ModelSource {
    /// A Hugging Face repository, pinned to a revision for reproducible installs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hugging_face: Option<HuggingFaceSource>,
    /// An OCI artifact pushed with `deltafin push`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oci: Option<OciSource>,
    /// The weights are already on the volume (air-gapped installs): the operator only checks
    /// them with `deltafin doctor` and never downloads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preloaded: Option<PreloadedSource>,
}

/// A Hugging Face model repository.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HuggingFaceSource {
    /// `ORG/REPO`, e.g. `moonshotai/Kimi-K2-Instruct`.
    #[schemars(regex(pattern = r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$"))]
    pub repo: String,
    /// Branch, tag or commit. Pin a commit: a moving branch makes the install irreproducible.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,127}$"))]
    pub revision: Option<String>,
    /// Secret key holding a Hugging Face token, passed to the setup Job as `HF_TOKEN` (and to the
    /// server in Stream mode, which fetches experts on demand).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_secret: Option<SecretKeyRef>,
    /// Mirror endpoint, passed as `HF_ENDPOINT` (e.g. an in-cluster mirror for air-gapped sites).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^https?://"))]
    pub endpoint: Option<String>,
}

/// An OCI artifact reference.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OciSource {
    /// `REGISTRY/REPO:TAG` (without `oci://`), e.g. `registry.lan:5000/models/kimi-k2:v1`.
    #[schemars(regex(
        pattern = r"^[a-z0-9][a-z0-9.-]*(:[0-9]+)?/[a-z0-9._/-]+(:[A-Za-z0-9._-]+|@sha256:[a-f0-9]{64})$"
    ))]
    pub reference: String,
}

/// Weights already present on the volume.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PreloadedSource {}

/// A key of a Secret in the resource's namespace.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretKeyRef {
    /// Secret name.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Key in the Secret.
    #[serde(default = "default_token_key")]
    #[schemars(length(min = 1))]
    pub key: String,
}

fn default_token_key() -> String {
    "token".into()
}

/// How the weights are installed.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SetupSpec {
    /// `Full` downloads every tensor; `Stream` installs the resident set and fetches experts on
    /// first use (the server then needs the volume read-write and network access to the source).
    #[serde(default)]
    pub mode: SetupMode,
    /// Pod retries of the setup Job; setup is resumable, so a retry continues the download.
    #[serde(default = "default_backoff_limit")]
    #[schemars(range(min = 0, max = 100))]
    pub backoff_limit: i32,
    /// Deadline for the whole setup Job (unset: none; a full Kimi K3 download takes hours).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 60))]
    pub active_deadline_seconds: Option<i64>,
    /// Resources of the setup container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// Extra environment of the setup container (e.g. proxy settings).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVar>,
}

impl Default for SetupSpec {
    fn default() -> Self {
        Self {
            mode: SetupMode::default(),
            backoff_limit: default_backoff_limit(),
            active_deadline_seconds: None,
            resources: None,
            env: Vec::new(),
        }
    }
}

fn default_backoff_limit() -> i32 {
    6
}

/// Install mode of `deltafin setup`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum SetupMode {
    /// Every tensor on local disk; the server mounts the weights read-only.
    #[default]
    Full,
    /// Resident set up front, experts fetched on first use into the same directory.
    Stream,
}

/// Draft models (speculative decoding).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DraftsSpec {
    /// DSpark draft (on by default).
    #[serde(default)]
    pub dspark: DsparkDraft,
    /// Qwen raw-completion drafter (opt-in; helps `/v1/completions` only).
    #[serde(default)]
    pub qwen: QwenDraft,
}

/// The DSpark draft.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DsparkDraft {
    /// Install the DSpark draft with the weights.
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// Where the draft comes from (`hf://ORG/REPO[@REV]` or `oci://...`). Required to install
    /// it: `deltafin setup` has no built-in DSpark source, so without one nothing is installed
    /// and `status.drafts` reports `NoSource`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^(hf|oci)://"))]
    pub source: Option<String>,
}

impl Default for DsparkDraft {
    fn default() -> Self {
        Self {
            enabled: true,
            source: None,
        }
    }
}

fn default_true() -> bool {
    true
}

/// The Qwen drafter.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct QwenDraft {
    /// Install the Qwen drafter (`deltafin setup --include-qwen`).
    #[serde(default)]
    pub enabled: bool,
}

/// The volume holding the weights: exactly one of `pvc`, `existingClaim`, `hostPath`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new(
        "(has(self.pvc) ? 1 : 0) + (has(self.existingClaim) ? 1 : 0) + (has(self.hostPath) ? 1 : 0) == 1"
    ).message("set exactly one of storage.pvc, storage.existingClaim, storage.hostPath"),
    validation = Rule::new("!has(self.retainPolicy) || self.retainPolicy == 'Retain' || has(self.pvc)")
        .message("retainPolicy: Delete applies only to a PVC the operator creates (storage.pvc)"),
    validation = Rule::new(
        "has(self.pvc) == has(oldSelf.pvc) && has(self.existingClaim) == has(oldSelf.existingClaim) && has(self.hostPath) == has(oldSelf.hostPath)"
    ).message("the kind of storage is immutable; create a new DeltafinModel to move the weights")
)]
pub struct StorageSpec {
    /// A new PersistentVolumeClaim `<name>-weights`, created by the operator and never owned by
    /// the DeltafinModel (kept on delete unless `retainPolicy: Delete`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pvc: Option<PvcStorage>,
    /// An existing PersistentVolumeClaim in the same namespace (never deleted by the operator).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub existing_claim: Option<ExistingClaimStorage>,
    /// A directory on the node (single-node clusters). It must be writable by uid 65532; the
    /// operator never deletes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_path: Option<HostPathStorage>,
    /// Directory inside the volume that holds this model (default: derived from the source,
    /// e.g. `hf/moonshotai/Kimi-K2-Instruct/<revision>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*$"))]
    #[x_kube(validation = Rule::new("!self.split('/').exists(p, p == '..' || p == '.')")
        .message("storage.subPath must not contain '.' or '..' components"))]
    pub sub_path: Option<String>,
    /// What happens to the weights when the DeltafinModel is deleted (default `Retain`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retain_policy: Option<RetainPolicy>,
}

/// A PVC created by the operator.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new(
    "!has(oldSelf.storageClassName) ? !has(self.storageClassName) : (has(self.storageClassName) && self.storageClassName == oldSelf.storageClassName)"
).message("storage.pvc.storageClassName is immutable"))]
pub struct PvcStorage {
    /// Requested size, e.g. `2Ti` (a full Kimi K3 install needs about 1.9 TB).
    #[schemars(regex(pattern = r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$"))]
    pub size: String,
    /// StorageClass (unset: the cluster default, `local-path` on k3s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_class_name: Option<String>,
    /// Access modes (default `[ReadWriteOnce]`; all pods run on one node).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub access_modes: Vec<String>,
}

/// An existing PVC.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ExistingClaimStorage {
    /// Claim name.
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = Rule::new("self == oldSelf").message("storage.existingClaim.name is immutable"))]
    pub name: String,
}

/// A node directory.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HostPathStorage {
    /// Absolute path on the node, e.g. `/srv/deltafin`.
    #[schemars(regex(pattern = r"^/[^\x00]*$"))]
    #[x_kube(validation = Rule::new("self == oldSelf").message("storage.hostPath.path is immutable"))]
    pub path: String,
}

/// Fate of the weights when the resource is deleted.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum RetainPolicy {
    /// Keep the volume and the weights marker; a new DeltafinModel with the same source and
    /// storage reuses them without downloading.
    #[default]
    Retain,
    /// Delete the operator-created PVC (and with it, on most provisioners, the data).
    Delete,
}

/// Image pull policy.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum PullPolicy {
    /// Always pull.
    Always,
    /// Pull when absent.
    IfNotPresent,
    /// Never pull (pre-loaded images, air-gapped nodes).
    Never,
}

impl PullPolicy {
    /// The Kubernetes spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Always => "Always",
            Self::IfNotPresent => "IfNotPresent",
            Self::Never => "Never",
        }
    }
}

/// Compute device.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.type == 'Cuda' || !has(self.gpu)")
    .message("device.gpu requires device.type: Cuda"))]
pub struct DeviceSpec {
    /// `Cpu` or `Cuda`.
    #[serde(default, rename = "type")]
    pub kind: DeviceKind,
    /// GPU request for `Cuda` (default: one `nvidia.com/gpu`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<GpuSpec>,
}

/// Backend the server runs on.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum DeviceKind {
    /// CPU backend.
    #[default]
    Cpu,
    /// CUDA backend (image built with `--features cuda`).
    Cuda,
}

/// GPU request.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GpuSpec {
    /// Number of GPUs (the server is one process on one node).
    #[serde(default = "default_gpu_count")]
    #[schemars(range(min = 1, max = 16))]
    pub count: i32,
    /// Extended resource name.
    #[serde(default = "default_gpu_resource")]
    #[schemars(length(min = 1))]
    pub resource_name: String,
    /// RuntimeClass (k3s with the NVIDIA toolkit: `nvidia`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_class_name: Option<String>,
}

impl Default for GpuSpec {
    fn default() -> Self {
        Self {
            count: default_gpu_count(),
            resource_name: default_gpu_resource(),
            runtime_class_name: None,
        }
    }
}

fn default_gpu_count() -> i32 {
    1
}

fn default_gpu_resource() -> String {
    "nvidia.com/gpu".into()
}

/// Options of `deltafin serve`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServerSpec {
    /// `--max-tokens`: upper bound on generated tokens per request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_tokens: Option<i64>,
    /// `--max-queue`: queued requests beyond which the server answers 429.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub max_queue: Option<i64>,
    /// `--context-limit`: longest prompt plus generation, in tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub context_limit: Option<i64>,
    /// `--memory-budget` as a quantity (e.g. `200Gi`); unset: the server uses its cgroup limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9]+(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$"))]
    pub memory_budget: Option<String>,
    /// Secret key with the API key clients must send (mounted as a file, `--api-key-file`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_secret: Option<SecretKeyRef>,
    /// Longest time for the process to start answering `/livez` (default 600 s). Model loading
    /// itself is covered by readiness (`/readyz`), which never restarts the pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 10, max = 86400))]
    pub startup_timeout_seconds: Option<i32>,
    /// Extra arguments appended to `deltafin serve`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extra_args: Vec<String>,
    /// Extra environment of the server container.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVar>,
}

/// Image upgrades.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UpgradeSpec {
    /// Deadline of the pre-flight Job (default 900 s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 30, max = 86400))]
    pub preflight_timeout_seconds: Option<i64>,
}

/// Node selection.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SchedulingSpec {
    /// Node labels the pods require.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// Tolerations (e.g. for a tainted GPU node).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
    /// PriorityClass of the server pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class_name: Option<String>,
}

/// The server's Service.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServiceSpec {
    /// Service type.
    #[serde(default, rename = "type")]
    pub kind: ServiceKind,
    /// Service port (the container always listens on 8000, port name `http`).
    #[serde(default = "default_port")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,
}

impl Default for ServiceSpec {
    fn default() -> Self {
        Self {
            kind: ServiceKind::default(),
            port: default_port(),
        }
    }
}

fn default_port() -> i32 {
    8000
}

/// Service type.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum ServiceKind {
    /// In-cluster only.
    #[default]
    ClusterIP,
    /// A port on every node.
    NodePort,
    /// A load balancer (k3s: ServiceLB).
    LoadBalancer,
}

impl ServiceKind {
    /// The Kubernetes spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ClusterIP => "ClusterIP",
            Self::NodePort => "NodePort",
            Self::LoadBalancer => "LoadBalancer",
        }
    }
}

/// Prometheus scraping.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MetricsSpec {
    /// `Auto` creates a ServiceMonitor when the Prometheus Operator CRD exists.
    #[serde(default)]
    pub service_monitor: ServiceMonitorMode,
    /// Scrape interval.
    #[serde(default = "default_interval")]
    #[schemars(regex(pattern = r"^[0-9]+(ms|s|m|h)$"))]
    pub interval: String,
    /// Extra labels on the ServiceMonitor (e.g. `release: kube-prometheus-stack`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

impl Default for MetricsSpec {
    fn default() -> Self {
        Self {
            service_monitor: ServiceMonitorMode::default(),
            interval: default_interval(),
            labels: BTreeMap::new(),
        }
    }
}

fn default_interval() -> String {
    "30s".into()
}

/// Whether to create a ServiceMonitor.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum ServiceMonitorMode {
    /// When `monitoring.coreos.com/v1` ServiceMonitor is served.
    #[default]
    Auto,
    /// Always (the status reports an error when the CRD is missing).
    Enabled,
    /// Never.
    Disabled,
}

/// Observed state, written by the operator, except `setupProgress`, which the setup Job writes.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeltafinModelStatus {
    /// `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Summary for humans; conditions are the source of truth.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,
    /// Weights install state and download progress.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weights: Option<WeightsStatus>,
    /// Per-draft state.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub drafts: Vec<DraftStatus>,
    /// Image the server runs (the last one that passed setup or pre-flight).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// In-cluster address of the OpenAI-compatible API.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<EndpointStatus>,
    /// The most recent failure of the setup Job, the pre-flight Job or the server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_failure: Option<FailureStatus>,
    /// `WeightsReady`, `ServerReady`, `Upgrading`, `Ready`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "conditions_schema")]
    pub conditions: Vec<Condition>,
    /// What the running setup Job last reported (`deltafin setup --report-status`, a JSON merge
    /// patch of this field under the model's own `<name>-setup` Role). The operator reads it into
    /// `weights` and the conditions and never writes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub setup_progress: Option<SetupProgress>,
}

/// One progress report of `deltafin setup` (the `--progress-file` record, camelCase, with the
/// Job that sent it so a report of an earlier Job is never taken for the current one). The
/// snake_case names of the JSON-lines records on stdout are read too (termination messages).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SetupProgress {
    /// The setup Job that reported.
    #[serde(default)]
    pub job: String,
    /// `resolve`, `download`, `verify`, `done` or `error`.
    #[serde(default)]
    pub phase: String,
    /// Bytes installed so far.
    #[serde(default, alias = "bytes_done")]
    pub bytes_done: i64,
    /// Bytes of the complete install (0 while unknown).
    #[serde(default, alias = "bytes_total")]
    pub bytes_total: i64,
    /// Files installed so far.
    #[serde(default, alias = "files_done")]
    pub files_done: i64,
    /// Files of the complete install.
    #[serde(default, alias = "files_total")]
    pub files_total: i64,
    /// Last message.
    #[serde(default)]
    pub message: String,
}

/// Human summary of where the model stands.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum Phase {
    /// Waiting for storage or for the first reconcile.
    Pending,
    /// The setup Job is downloading.
    Downloading,
    /// The setup Job is verifying checksums (or checking preloaded weights).
    Verifying,
    /// Weights are ready; the server is loading.
    Starting,
    /// The server answers `/readyz`.
    Ready,
    /// A pre-flight Job is checking a new image.
    Upgrading,
    /// Scaled to zero by `spec.paused`.
    Paused,
    /// Setup failed, the spec is invalid, or the server cannot start.
    Failed,
}

/// Weights install state.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WeightsStatus {
    /// Content key of the install (source, mode, drafts, directory); the weights marker
    /// ConfigMap `<name>-weights` records the key of the last complete install.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Model directory inside the server and setup containers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dir: Option<String>,
    /// Last progress phase reported by `deltafin setup` (`resolve`, `download`, `verify`,
    /// `done`, `error`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage: Option<String>,
    /// Bytes installed so far.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_done: Option<i64>,
    /// Bytes of the complete install.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_total: Option<i64>,
    /// Files installed so far.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub files_done: Option<i64>,
    /// Files of the complete install.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub files_total: Option<i64>,
    /// `bytesDone / bytesTotal` in percent, rounded down.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub percent: Option<i32>,
    /// `percent` as text for the printer column (`"38%"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub percent_text: Option<String>,
    /// Last progress message of `deltafin setup`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// State of one draft model.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DraftStatus {
    /// `dspark` or `qwen`.
    pub name: String,
    /// `Disabled`, `NoSource`, `Pending` or `Ready` (drafts are installed by the setup Job).
    pub state: String,
}

/// Address of the API.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EndpointStatus {
    /// `http://<name>.<namespace>.svc:<port>/v1`.
    pub url: String,
}

/// A failure with its cause.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FailureStatus {
    /// `setup`, `preflight` or `server`.
    pub component: String,
    /// CamelCase cause: `OOMKilled`, `ChecksumMismatch`, `DiskFull`, `SourceNotFound`,
    /// `Unauthorized`, `SetupFailed`, `PreflightFailed`, `CrashLoopBackOff`, `ImagePullBackOff`, ...
    pub reason: String,
    /// Container exit code, when it exited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// The one-line cause printed by the command, or the kubelet's message.
    pub message: String,
    /// When the container finished (RFC 3339), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<String>,
}

/// Schema of `status.conditions`: a list-map keyed by `type`, so server-side apply merges
/// conditions one by one.
fn conditions_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "array",
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["type"],
        "items": {
            "type": "object",
            "required": ["lastTransitionTime", "message", "reason", "status", "type"],
            "properties": {
                "lastTransitionTime": {"type": "string", "format": "date-time"},
                "message": {"type": "string", "maxLength": 32768},
                "observedGeneration": {"type": "integer", "format": "int64", "minimum": 0},
                "reason": {"type": "string", "maxLength": 1024, "minLength": 1,
                           "pattern": "^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"},
                "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
                "type": {"type": "string", "maxLength": 316,
                         "pattern": "^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"}
            }
        }
    })
}

/// The CRD as YAML, exactly as `deltafin-operator crd` prints it.
pub fn crd_yaml() -> Result<String, serde_yaml::Error> {
    use kube::CustomResourceExt;
    serde_yaml::to_string(&DeltafinModel::crd())
}

/// The CRD without its CEL rules (`x-kubernetes-validations`), as `deltafin-operator crd
/// --without-cel` prints it: for Kubernetes before 1.25, which does not run them, and before
/// 1.23 refuses them in a server-side apply ("field not declared in schema"). The OpenAPI checks
/// (enum, minimum, required) stay.
pub fn crd_yaml_without_cel() -> Result<String, serde_yaml::Error> {
    use kube::CustomResourceExt;
    let mut v = serde_json::to_value(DeltafinModel::crd())
        .map_err(<serde_yaml::Error as serde::de::Error>::custom)?;
    strip_cel(&mut v);
    serde_yaml::to_string(&v)
}

/// Removes every `x-kubernetes-validations` key, recursively.
fn strip_cel(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Object(m) => {
            m.remove("x-kubernetes-validations");
            m.values_mut().for_each(strip_cel);
        }
        serde_json::Value::Array(a) => a.iter_mut().for_each(strip_cel),
        _ => {}
    }
}

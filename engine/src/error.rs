//! The engine's one error type. Every variant names what was wrong (a file, a tensor, a config
//! field, a request argument) so a user can act on the message; `kind()` is a stable label for
//! metrics and for mapping to exit codes / HTTP statuses at the edges.

use std::path::PathBuf;

/// Result alias used throughout the engine.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong inside the engine.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An operating-system I/O failure on a named file.
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },

    /// A JSON file that does not parse.
    #[error("{path}: invalid JSON: {source}")]
    Json {
        path: PathBuf,
        source: serde_json::Error,
    },

    /// `model_type` names an architecture this build does not implement.
    #[error("{path}: unknown model_type `{model_type}` (supported: {supported})")]
    UnknownModelType {
        path: PathBuf,
        model_type: String,
        supported: String,
    },

    /// A config field is missing, out of range or inconsistent with another field.
    #[error("{path}: config field `{field}`: {reason}")]
    Config {
        path: PathBuf,
        field: String,
        reason: String,
    },

    /// A safetensors file whose header or layout is malformed.
    #[error("{path}: malformed safetensors file: {reason}")]
    Safetensors { path: PathBuf, reason: String },

    /// Weight bytes could not be read as the checkpoint's own while running: an I/O error, a
    /// short read, a file changed under the process, or a checksum mismatch. Nothing read was
    /// used; the same read is tried again by the next pass that needs it.
    #[error("weights unavailable: {path}: {reason}")]
    WeightsUnavailable { path: PathBuf, reason: String },

    /// A safetensors file shorter than its header says (a truncated download).
    #[error("{path}: truncated: tensor `{tensor}` ends at byte {needed} but the file has {actual} bytes")]
    Truncated {
        path: PathBuf,
        tensor: String,
        needed: u64,
        actual: u64,
    },

    /// A tensor the architecture needs is absent from every shard.
    #[error("{dir}: tensor `{name}` not found in any safetensors shard")]
    MissingTensor { dir: PathBuf, name: String },

    /// A tensor exists but has the wrong shape.
    #[error("{path}: tensor `{name}` has shape {found:?}, expected {expected:?}")]
    TensorShape {
        path: PathBuf,
        name: String,
        expected: Vec<usize>,
        found: Vec<usize>,
    },

    /// A tensor exists but its dtype is not one this position accepts.
    #[error("{path}: tensor `{name}` has dtype {found}, expected {expected}")]
    TensorDtype {
        path: PathBuf,
        name: String,
        expected: String,
        found: String,
    },

    /// A tokenizer file is missing or malformed.
    #[error("{path}: tokenizer: {reason}")]
    Tokenizer { path: PathBuf, reason: String },

    /// A chat template failed to compile or render.
    #[error("chat template: {0}")]
    Template(String),

    /// A caller-supplied argument is invalid (generation settings, prompt, ...).
    #[error("invalid argument `{field}`: {reason}")]
    InvalidArgument { field: &'static str, reason: String },

    /// A memory budget too small for what must be resident, or an invalid cache setting.
    #[error("memory budget: {0}")]
    Budget(String),

    /// The sequence would exceed the model's (or the configured) context length.
    #[error("context length exceeded: {needed} tokens needed, limit is {limit}")]
    ContextOverflow { needed: usize, limit: usize },

    /// Bytes of a weight file that are not local yet could not be made local (stream installs
    /// fetch routed experts on first use; see [`crate::weights::RangeSource`]).
    #[error("{file}: bytes {start}..{end} are not local and could not be fetched: {reason}")]
    Remote {
        file: String,
        start: u64,
        end: u64,
        reason: String,
    },

    /// A compute device could not be opened or used (no driver, no such device, not built in).
    #[error("device {device}: {reason}")]
    Device { device: String, reason: String },

    /// A grammar or JSON schema that cannot be compiled into a constraint, or a constraint
    /// that rejected its input during decoding.
    #[error("constraint: {0}")]
    Constraint(String),
}

impl Error {
    /// A stable, low-cardinality label for metrics and exit-code mapping.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::Io { .. } => "io",
            Error::Json { .. } => "json",
            Error::WeightsUnavailable { .. } => "weights_unavailable",
            Error::UnknownModelType { .. } | Error::Config { .. } => "config",
            Error::Safetensors { .. } | Error::Truncated { .. } => "checkpoint",
            Error::MissingTensor { .. } | Error::TensorShape { .. } | Error::TensorDtype { .. } => {
                "checkpoint"
            }
            Error::Tokenizer { .. } | Error::Template(_) => "tokenizer",
            Error::InvalidArgument { .. } => "invalid_argument",
            Error::ContextOverflow { .. } => "context_overflow",
            Error::Budget(_) => "budget",
            Error::Remote { .. } => "remote",
            Error::Device { .. } => "device",
            Error::Constraint(_) => "constraint",
        }
    }

    /// Helper for I/O errors on a path.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }

    /// Helper for config-field errors.
    pub fn config(path: impl Into<PathBuf>, field: impl Into<String>, reason: impl Into<String>) -> Self {
        Error::Config {
            path: path.into(),
            field: field.into(),
            reason: reason.into(),
        }
    }
}

/// A command-line choice that is not one of the accepted words (`--read-mode`, `--cache-policy`,
/// `--spec`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} `{input}` (expected one of: {expected})")]
pub struct UnknownChoice {
    /// What was being chosen.
    pub what: &'static str,
    /// What was given.
    pub input: String,
    /// The accepted words.
    pub expected: &'static str,
}

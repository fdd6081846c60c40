//! The operator's error type.

/// Everything a reconcile can fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A call to the Kubernetes API failed.
    #[error("kubernetes API: {0}")]
    Kube(#[source] kube::Error),
    /// Adding or removing the finalizer, or the reconcile inside it, failed.
    #[error("finalizer: {0}")]
    Finalizer(#[source] Box<kube::runtime::finalizer::Error<Error>>),
    /// An object could not be converted to or from JSON.
    #[error("serialization: {0}")]
    Serialization(#[source] serde_json::Error),
    /// The resource has no namespace or no name (the API always sets both).
    #[error("DeltafinModel without {0}")]
    MissingMetadata(&'static str),
}

impl Error {
    /// Stable label for the `error` label of `deltafin_operator_reconcile_errors_total`.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::Kube(_) => "kube",
            Self::Finalizer(_) => "finalizer",
            Self::Serialization(_) => "serialization",
            Self::MissingMetadata(_) => "missing_metadata",
        }
    }
}

impl From<kube::Error> for Error {
    fn from(e: kube::Error) -> Self {
        Self::Kube(e)
    }
}

impl From<serde_json::Error> for Error {
    fn from(e: serde_json::Error) -> Self {
        Self::Serialization(e)
    }
}

/// Result with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

//! Which Kubernetes versions the operator supports, and which optional fields a given server
//! serves. Pure: the controller reads `/version` once at start, calls [`capabilities`], and the
//! builders consult the resulting [`ServedFields`]; nothing here does I/O.
//!
//! Supported: [`MIN_SUPPORTED`] (1.20, the envtest server) and newer. A field that a newer
//! Kubernetes added and the operator only uses as an improvement (see [`OPTIONAL_FIELDS`]) is left
//! out on an older server, because server-side apply refuses an object with a field the server's
//! schema does not declare ("field not declared in schema"), which would fail every reconcile.

use std::fmt;

use k8s_openapi::apimachinery::pkg::version::Info;

/// A Kubernetes `major.minor` version.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct KubeVersion {
    /// Major version (1).
    pub major: u32,
    /// Minor version.
    pub minor: u32,
}

impl KubeVersion {
    /// `major.minor`.
    pub const fn new(major: u32, minor: u32) -> Self {
        Self { major, minor }
    }

    /// Reads `/version`: `major`/`minor` (`"20+"` on some distributions), else `gitVersion`
    /// (`v1.20.2`, `v1.33.1+k3s1`).
    pub fn from_info(info: &Info) -> Result<Self, VersionError> {
        let leading = |s: &str| -> Option<u32> {
            let digits: String = s.chars().take_while(char::is_ascii_digit).collect();
            digits.parse().ok()
        };
        if let (Some(major), Some(minor)) = (leading(&info.major), leading(&info.minor)) {
            return Ok(Self { major, minor });
        }
        let git = info.git_version.trim_start_matches('v');
        let mut parts = git.split('.');
        match (parts.next().and_then(leading), parts.next().and_then(leading)) {
            (Some(major), Some(minor)) => Ok(Self { major, minor }),
            _ => Err(VersionError::Unparsable(format!(
                "major {:?}, minor {:?}, gitVersion {:?}",
                info.major, info.minor, info.git_version
            ))),
        }
    }
}

impl fmt::Display for KubeVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// The oldest Kubernetes the operator supports (the chart's `kubeVersion` says the same).
pub const MIN_SUPPORTED: KubeVersion = KubeVersion::new(1, 20);

/// A field the operator writes only where the server serves it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OptionalField {
    /// Where it sits, e.g. `Job.spec.podFailurePolicy`.
    pub field: &'static str,
    /// The first Kubernetes version that serves it by default.
    pub since: KubeVersion,
    /// What is lost without it.
    pub without: &'static str,
}

/// `Job.spec.podFailurePolicy` (beta and on by default from 1.26).
pub const POD_FAILURE_POLICY: OptionalField = OptionalField {
    field: "Job.spec.podFailurePolicy",
    since: KubeVersion::new(1, 26),
    without: "evictions and preemptions of the setup pod count against spec.setup.backoffLimit",
};

/// Every optional field, in the order the notice lists them.
pub const OPTIONAL_FIELDS: [OptionalField; 1] = [POD_FAILURE_POLICY];

/// Which optional fields the builders may write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServedFields {
    /// [`POD_FAILURE_POLICY`].
    pub pod_failure_policy: bool,
}

impl ServedFields {
    /// Everything (a current server; the default of [`crate::model::Settings`]).
    pub const ALL: Self = Self {
        pod_failure_policy: true,
    };
}

impl Default for ServedFields {
    fn default() -> Self {
        Self::ALL
    }
}

/// What a server supports, as decided by [`capabilities`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Capabilities {
    /// The server's version.
    pub server: KubeVersion,
    /// The optional fields to write.
    pub served: ServedFields,
    /// The optional fields left out, for the notice.
    pub omitted: Vec<OptionalField>,
}

impl Capabilities {
    /// One sentence for the event and the log when fields are left out; `None` when none are.
    pub fn notice(&self) -> Option<String> {
        if self.omitted.is_empty() {
            return None;
        }
        let list: Vec<String> = self
            .omitted
            .iter()
            .map(|f| format!("{} (Kubernetes {}+; without it {})", f.field, f.since, f.without))
            .collect();
        Some(format!(
            "Kubernetes {} does not serve {}: the operator leaves it out",
            self.server,
            list.join("; ")
        ))
    }
}

/// A server the operator cannot work with.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum VersionError {
    /// Older than [`MIN_SUPPORTED`].
    #[error(
        "Kubernetes {server} is not supported: the Deltafin operator needs Kubernetes {min} or newer \
         (it uses server-side apply, events.k8s.io/v1 and apiextensions.k8s.io/v1)"
    )]
    TooOld {
        /// The server's version.
        server: KubeVersion,
        /// [`MIN_SUPPORTED`].
        min: KubeVersion,
    },
    /// `/version` could not be read as a version.
    #[error("cannot read the Kubernetes version from /version ({0})")]
    Unparsable(String),
}

/// Decides what the operator writes on a server of version `server`, or refuses it.
pub fn capabilities(server: KubeVersion) -> Result<Capabilities, VersionError> {
    if server < MIN_SUPPORTED {
        return Err(VersionError::TooOld {
            server,
            min: MIN_SUPPORTED,
        });
    }
    let omitted: Vec<OptionalField> = OPTIONAL_FIELDS
        .iter()
        .copied()
        .filter(|f| server < f.since)
        .collect();
    let served = ServedFields {
        pod_failure_policy: !omitted.contains(&POD_FAILURE_POLICY),
    };
    Ok(Capabilities {
        server,
        served,
        omitted,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(major: &str, minor: &str, git: &str) -> Info {
        Info {
            major: major.into(),
            minor: minor.into(),
            git_version: git.into(),
            ..Default::default()
        }
    }

    #[test]
    fn parses_plain_suffixed_and_git_only_versions() {
        let v = |i: Info| KubeVersion::from_info(&i).unwrap();
        assert_eq!(v(info("1", "20", "v1.20.2")), KubeVersion::new(1, 20));
        assert_eq!(
            v(info("1", "27+", "v1.27.3-eks-a5565ad")),
            KubeVersion::new(1, 27)
        );
        assert_eq!(v(info("", "", "v1.33.1+k3s1")), KubeVersion::new(1, 33));
        assert!(matches!(
            KubeVersion::from_info(&info("", "", "")),
            Err(VersionError::Unparsable(_))
        ));
    }

    #[test]
    fn too_old_is_refused_with_the_supported_minimum() {
        let err = capabilities(KubeVersion::new(1, 19)).unwrap_err();
        assert_eq!(
            err,
            VersionError::TooOld {
                server: KubeVersion::new(1, 19),
                min: MIN_SUPPORTED
            }
        );
        assert!(
            err.to_string().contains("needs Kubernetes 1.20 or newer"),
            "{err}"
        );
    }

    #[test]
    fn pod_failure_policy_is_left_out_before_1_26_and_said_once() {
        let old = capabilities(KubeVersion::new(1, 20)).unwrap();
        assert!(!old.served.pod_failure_policy);
        assert_eq!(old.omitted, vec![POD_FAILURE_POLICY]);
        let notice = old.notice().unwrap();
        assert!(
            notice.starts_with("Kubernetes 1.20 does not serve Job.spec.podFailurePolicy (Kubernetes 1.26+"),
            "{notice}"
        );

        let edge = capabilities(KubeVersion::new(1, 25)).unwrap();
        assert!(!edge.served.pod_failure_policy);
        for v in [26, 33, 37] {
            let c = capabilities(KubeVersion::new(1, v)).unwrap();
            assert_eq!(c.served, ServedFields::ALL, "1.{v}");
            assert_eq!(c.notice(), None, "1.{v}");
        }
    }
}

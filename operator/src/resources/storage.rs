//! The weights PVC and the weights marker ConfigMap: the two objects that outlive a
//! DeltafinModel (no owner reference), so deleting and recreating a model with the same source
//! and storage reuses the installed weights.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    ConfigMap, PersistentVolumeClaim, PersistentVolumeClaimSpec, VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::retained_meta;
use crate::model::{Model, Storage};
use crate::names;

/// The operator-created PVC (`storage.pvc`), or `None` for other storage kinds. Created once;
/// never patched afterwards (most PVC fields are immutable).
pub fn pvc(m: &Model<'_>) -> Option<PersistentVolumeClaim> {
    let Storage::Pvc { claim } = &m.storage else {
        return None;
    };
    let spec = m.cr.spec.storage.pvc.as_ref()?;
    let access_modes = if spec.access_modes.is_empty() {
        vec!["ReadWriteOnce".to_string()]
    } else {
        spec.access_modes.clone()
    };
    Some(PersistentVolumeClaim {
        metadata: retained_meta(m, claim.clone()),
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(access_modes),
            storage_class_name: spec.storage_class_name.clone(),
            volume_mode: Some("Filesystem".into()),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([(
                    "storage".to_string(),
                    Quantity(spec.size.clone()),
                )])),
                ..Default::default()
            }),
            ..Default::default()
        }),
        status: None,
    })
}

/// What the marker records about the last complete install.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Marker {
    /// Content key of the install.
    pub key: String,
    /// Image that installed the weights or last passed pre-flight on them: the server runs it.
    pub image: String,
    /// UID of the claim the weights were written to (`None` for hostPath).
    pub storage_uid: Option<String>,
    /// Size of the install in bytes, when setup reported it.
    pub bytes_total: Option<i64>,
}

impl Marker {
    /// Reads a marker ConfigMap.
    pub fn from_config_map(cm: &ConfigMap) -> Option<Self> {
        let d = cm.data.as_ref()?;
        Some(Self {
            key: d.get("key")?.clone(),
            image: d.get("image")?.clone(),
            storage_uid: d.get("storageUid").cloned(),
            bytes_total: d.get("bytesTotal").and_then(|b| b.parse().ok()),
        })
    }
}

/// The data of a marker for model `m`.
pub fn marker_data(m: &Model<'_>, marker: &Marker) -> BTreeMap<String, String> {
    let mut d = BTreeMap::from([
        ("key".to_string(), marker.key.clone()),
        ("image".to_string(), marker.image.clone()),
        (
            "source".to_string(),
            m.source_uri.clone().unwrap_or_else(|| "preloaded".into()),
        ),
        ("mode".to_string(), format!("{:?}", m.mode())),
        ("dir".to_string(), m.dir.clone()),
    ]);
    if let Some(u) = &marker.storage_uid {
        d.insert("storageUid".into(), u.clone());
    }
    if let Some(b) = marker.bytes_total {
        d.insert("bytesTotal".into(), b.to_string());
    }
    d
}

/// The marker ConfigMap `<name>-weights`.
pub fn marker(m: &Model<'_>, marker: &Marker) -> ConfigMap {
    let mut meta = retained_meta(m, names::weights(&m.name));
    meta.annotations = Some(BTreeMap::from([(
        names::WEIGHTS_KEY.to_string(),
        marker.key.clone(),
    )]));
    ConfigMap {
        metadata: meta,
        data: Some(marker_data(m, marker)),
        ..Default::default()
    }
}

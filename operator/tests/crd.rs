//! The CRD: the committed YAML equals the generated one, its structure is what kubectl and
//! server-side apply need, and its CEL rules accept good specs and reject bad ones (evaluated
//! client-side with kube's `cel` feature, the same rules the apiserver runs).

mod support;

use deltafin_operator::crd::{DeltafinModel, RetainPolicy, crd_yaml};
use kube::CustomResourceExt;
use kube::core::cel::{validate_cel, validate_cel_update};
use serde_json::{Value, json};
use support::{EXAMPLES, crate_path, example};

const COMMITTED: &str = "../charts/deltafin/files/crd.yaml";

#[test]
fn committed_crd_is_current() {
    let generated = crd_yaml().unwrap();
    let path = crate_path(COMMITTED);
    if std::env::var_os("UPDATE_SNAPSHOTS").is_some() {
        std::fs::write(&path, &generated).unwrap();
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "{} is stale: run `cargo run -p deltafin-operator -- crd > charts/deltafin/files/crd.yaml`",
        path.display()
    );
}

fn crd_json() -> Value {
    serde_json::to_value(DeltafinModel::crd()).unwrap()
}

#[test]
fn crd_structure() {
    let crd = crd_json();
    assert_eq!(crd["metadata"]["name"], "deltafinmodels.deltafin.dev");
    assert_eq!(crd["spec"]["scope"], "Namespaced");
    assert_eq!(crd["spec"]["names"]["shortNames"], json!(["dfm"]));
    let v = &crd["spec"]["versions"][0];
    assert_eq!(v["name"], "v1alpha1");
    assert_eq!(v["subresources"]["status"], json!({}), "status subresource");
    let schema = &v["schema"]["openAPIV3Schema"];
    assert!(schema.get("x-kubernetes-preserve-unknown-fields").is_none());
    let conds = &schema["properties"]["status"]["properties"]["conditions"];
    assert_eq!(
        conds["x-kubernetes-list-type"], "map",
        "SSA merges conditions per type"
    );
    assert_eq!(conds["x-kubernetes-list-map-keys"], json!(["type"]));
    let cols: Vec<&str> = v["additionalPrinterColumns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        cols,
        [
            "Mode", "Weights", "Phase", "Ready", "Reason", "Image", "URL", "Age"
        ]
    );
    let spec = &schema["properties"]["spec"];
    assert_eq!(spec["required"], json!(["source", "storage"]));
    let rules = serde_json::to_string(&crd).unwrap();
    for needle in [
        "exactly one of source",
        "exactly one of storage",
        "retainPolicy: Delete",
        "at most 40 characters",
    ] {
        assert!(rules.contains(needle), "CEL rule '{needle}' missing");
    }
}

#[test]
fn examples_pass_cel() {
    for name in EXAMPLES {
        let m = example(name);
        validate_cel(&m).unwrap_or_else(|e| panic!("{name}: {e:?}"));
    }
}

/// `example(kimi-k2-pvc)` with a JSON merge applied to the whole object.
fn variant(patch: Value) -> DeltafinModel {
    let mut v = serde_json::to_value(example("kimi-k2-pvc")).unwrap();
    json_patch::merge(&mut v, &patch);
    serde_json::from_value(v).unwrap()
}

/// Asserts that the CEL rules reject `m` with a message containing `expect`.
fn rejected(m: &DeltafinModel, why: &str, expect: &str) {
    match validate_cel(m) {
        Ok(()) => panic!("accepted a spec with {why}"),
        Err(e) => {
            let text = format!("{e:?}");
            assert!(text.contains(expect), "{why}: expected '{expect}' in {text}");
        }
    }
}

#[test]
fn cel_rejects_bad_specs() {
    rejected(
        &variant(json!({"spec": {"source": {"oci": {"reference": "registry.lan/m/k2:v1"}}}})),
        "two sources",
        "exactly one of source",
    );
    rejected(
        &variant(json!({"spec": {"source": {"huggingFace": null}}})),
        "no source",
        "exactly one of source",
    );
    rejected(
        &variant(json!({"spec": {"storage": {"hostPath": {"path": "/srv/x"}}}})),
        "two storage kinds",
        "exactly one of storage",
    );
    rejected(
        &variant(
            json!({"spec": {"storage": {"pvc": null, "hostPath": {"path": "/srv/x"}, "retainPolicy": "Delete"}}}),
        ),
        "Delete on a hostPath",
        "retainPolicy: Delete applies only",
    );
    rejected(
        &variant(
            json!({"spec": {"storage": {"pvc": null, "existingClaim": {"name": "m"}, "retainPolicy": "Delete"}}}),
        ),
        "Delete on an existing claim",
        "retainPolicy: Delete applies only",
    );
    rejected(
        &variant(json!({"spec": {"device": {"type": "Cpu", "gpu": {"count": 1}}}})),
        "gpu on a CPU device",
        "device.gpu requires",
    );
    rejected(
        &variant(json!({"spec": {"storage": {"subPath": "a/../b"}}})),
        "a '..' subPath",
        "must not contain",
    );
    rejected(
        &variant(json!({"metadata": {"name": "x".repeat(41)}})),
        "a 41-character name",
        "at most 40 characters",
    );
}

#[test]
fn cel_accepts_good_variants() {
    for patch in [
        json!({"spec": {"storage": {"retainPolicy": "Delete"}}}),
        json!({"spec": {"device": {"type": "Cuda", "gpu": {"count": 2, "resourceName": "nvidia.com/gpu"}}}}),
        json!({"spec": {"device": {"type": "Cuda"}}}),
        json!({"spec": {"source": {"huggingFace": null, "preloaded": {}}}}),
        json!({"metadata": {"name": "x".repeat(40)}}),
    ] {
        let m = variant(patch.clone());
        validate_cel(&m).unwrap_or_else(|e| panic!("{patch}: {e:?}"));
    }
}

#[test]
fn cel_transition_rules() {
    let old = example("kimi-k2-pvc");
    // Changing the revision (a new install) or the image (an upgrade) is allowed.
    let new = variant(json!({"spec": {"source": {"huggingFace": {"revision": "abc123"}}, "image": "x/y:2"}}));
    validate_cel_update(&new, &old).unwrap();
    // The kind of storage and the storage class are fixed.
    let moved = variant(json!({"spec": {"storage": {"pvc": null, "hostPath": {"path": "/srv/x"}}}}));
    let err = format!(
        "{:?}",
        validate_cel_update(&moved, &old).expect_err("storage kind change accepted")
    );
    assert!(err.contains("kind of storage is immutable"), "{err}");
    let class = variant(json!({"spec": {"storage": {"pvc": {"storageClassName": "fast"}}}}));
    let err = format!(
        "{:?}",
        validate_cel_update(&class, &old).expect_err("storageClassName change accepted")
    );
    assert!(err.contains("storageClassName is immutable"), "{err}");
    let host = example("kimi-k3-cuda-hostpath");
    let mut moved = host.clone();
    moved.spec.storage.host_path.as_mut().unwrap().path = "/mnt/other".into();
    let err = format!(
        "{:?}",
        validate_cel_update(&moved, &host).expect_err("hostPath change accepted")
    );
    assert!(err.contains("hostPath.path is immutable"), "{err}");
    let mut retained = host.clone();
    retained.spec.storage.retain_policy = Some(RetainPolicy::Retain);
    validate_cel_update(&retained, &host).unwrap();
}

//! Shared test fixtures: example resources and the fake API server.
#![allow(dead_code)]

pub mod fake_api;

use std::path::PathBuf;

use deltafin_operator::cache::Writers;
use deltafin_operator::crd::DeltafinModel;
use deltafin_operator::model::Settings;
use kube::Resource;
use kube::runtime::reflector::store::Writer;
use kube::runtime::watcher;
use serde::de::DeserializeOwned;

/// Path relative to the crate root.
pub fn crate_path(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(rel)
}

/// Settings as the chart sets them, with ServiceMonitors served.
pub fn settings() -> Settings {
    let mut s = Settings::with_version("0.1.0");
    s.service_monitors = true;
    s
}

/// An example resource from `operator/examples/<name>.yaml`, with server-side metadata.
pub fn example(name: &str) -> DeltafinModel {
    let text = std::fs::read_to_string(crate_path(&format!("examples/{name}.yaml"))).expect("example");
    let mut m: DeltafinModel = serde_yaml::from_str(&text).expect("example parses as a DeltafinModel");
    m.metadata.uid = Some(format!("uid-{name}"));
    m.metadata.generation = Some(1);
    m
}

/// All example names.
pub const EXAMPLES: [&str; 3] = ["kimi-k2-pvc", "kimi-k3-cuda-hostpath", "preloaded-existing-claim"];

/// Compares `actual` with the snapshot file `tests/snapshots/<name>`; `UPDATE_SNAPSHOTS=1`
/// rewrites it.
pub fn assert_snapshot(name: &str, actual: &str) {
    let path = crate_path(&format!("tests/snapshots/{name}"));
    if std::env::var_os("UPDATE_SNAPSHOTS").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|_| panic!("missing snapshot {}: run with UPDATE_SNAPSHOTS=1", path.display()));
    if expected != actual {
        let diff: Vec<String> = expected
            .lines()
            .zip(actual.lines())
            .enumerate()
            .filter(|(_, (a, b))| a != b)
            .take(10)
            .map(|(i, (a, b))| format!("line {}:\n  - {a}\n  + {b}", i + 1))
            .collect();
        panic!(
            "snapshot {} differs ({} vs {} lines); rerun with UPDATE_SNAPSHOTS=1 if intended:\n{}",
            path.display(),
            expected.lines().count(),
            actual.lines().count(),
            diff.join("\n")
        );
    }
}

/// Refills every store from the fake's objects (what the watches would deliver), so a reconcile
/// reads the fake's current state from the caches as it reads a real server's.
pub fn sync_stores(w: &mut Writers, fake: &fake_api::FakeApi) {
    fill(&mut w.jobs, fake, "/jobs");
    fill(&mut w.pods, fake, "/pods");
    fill(&mut w.deployments, fake, "/deployments");
    fill(&mut w.services, fake, "/services");
    fill(&mut w.claims, fake, "/persistentvolumeclaims");
    fill(&mut w.markers, fake, "/configmaps");
    fill(&mut w.accounts, fake, "/serviceaccounts");
    fill(&mut w.roles, fake, "/roles");
    fill(&mut w.role_bindings, fake, "/rolebindings");
    if let Some(sm) = w.service_monitors.as_mut() {
        fill(sm, fake, "/servicemonitors");
    }
}

fn fill<K>(w: &mut Writer<K>, fake: &fake_api::FakeApi, suffix: &str)
where
    K: Resource + DeserializeOwned + Clone + 'static,
    K::DynamicType: Clone + Eq + std::hash::Hash,
{
    let objects: Vec<K> = {
        let state = fake.state.lock().unwrap();
        state
            .objects
            .iter()
            .filter(|(collection, _)| collection.ends_with(suffix))
            .flat_map(|(_, by_name)| by_name.values())
            .map(|v| serde_json::from_value(v.clone()).expect("stored object parses"))
            .collect()
    };
    w.apply_watcher_event(&watcher::Event::Init);
    for o in objects {
        w.apply_watcher_event(&watcher::Event::InitApply(o));
    }
    w.apply_watcher_event(&watcher::Event::InitDone);
}

//! Reconcile scenarios against the scripted fake API server (`support::fake_api`): the real
//! `controller::reconcile` (finalizer, observe, plan, execute) drives a `kube::Client` whose HTTP
//! requests are answered by the fake, and the tests assert the exact requests.
//!
//! Every behaviour a real API server can show runs against one in the envtest tier
//! (`operator/envtest/`, `scripts/test-operator-envtest`). Only what a real server cannot be made
//! to show stays here:
//! - the order of the writes inside one reconcile (finalizer first; then the PVC, the setup
//!   identity and the Job), and the exact request list of a reconcile: a server shows results,
//!   not the order or the bodies of the requests that made them;
//! - that the operator's own status apply never carries the setup Job's `setupProgress` (a
//!   request body), and that an earlier Job's report is ignored;
//! - a weights volume replaced under a finished install: deleting a bound PVC finishes only when
//!   the controller-manager removes its `pvc-protection` finalizer, and envtest has none.

mod support;

use std::sync::Arc;

use deltafin_operator::cache::{self, Writers};
use deltafin_operator::controller::{self, Context};
use deltafin_operator::crd::{DeltafinModel, Phase};
use deltafin_operator::metrics::Metrics;
use deltafin_operator::names;
use serde_json::{Value, json};
use support::fake_api::{FakeApi, Recorded};
use support::{example, settings, sync_stores};

const NS: &str = "ai";
const OLD_IMAGE: &str = "ghcr.io/deltafin/deltafin:0.1.0";

fn models() -> String {
    FakeApi::collection("deltafin.dev/v1alpha1", NS, "deltafinmodels")
}
fn jobs() -> String {
    FakeApi::collection("batch/v1", NS, "jobs")
}
fn deployments() -> String {
    FakeApi::collection("apps/v1", NS, "deployments")
}
fn pvcs() -> String {
    FakeApi::collection("v1", NS, "persistentvolumeclaims")
}
fn pods() -> String {
    FakeApi::collection("v1", NS, "pods")
}
fn events() -> String {
    FakeApi::collection("events.k8s.io/v1", NS, "events")
}

struct World {
    fake: FakeApi,
    ctx: Arc<Context>,
    writers: std::sync::Mutex<Writers>,
}

impl World {
    fn new(service_monitors: bool) -> Self {
        let (client, fake) = FakeApi::start();
        let mut s = settings();
        s.service_monitors = service_monitors;
        let (stores, writers) = cache::stores(service_monitors);
        let ctx = Arc::new(Context::new(
            client,
            s,
            Arc::new(Metrics::default()),
            Some("test".into()),
            stores,
        ));
        World {
            fake,
            ctx,
            writers: std::sync::Mutex::new(writers),
        }
    }

    fn create(&self, mut cr: DeltafinModel) {
        cr.metadata.uid = None;
        cr.metadata.generation = None;
        cr.status = None;
        self.fake.put(&models(), serde_json::to_value(&cr).unwrap());
    }

    fn cr(&self, name: &str) -> Option<DeltafinModel> {
        self.fake
            .get(&models(), name)
            .map(|v| serde_json::from_value(v).unwrap())
    }

    /// Runs one reconcile of the stored resource and returns the requests it made.
    async fn reconcile(&self, name: &str) -> Vec<Recorded> {
        let cr = self.cr(name).expect("model stored");
        sync_stores(&mut self.writers.lock().unwrap(), &self.fake);
        self.fake.take_requests();
        controller::reconcile(Arc::new(cr), self.ctx.clone())
            .await
            .expect("reconcile");
        self.fake.take_requests()
    }

    fn condition(&self, name: &str, type_: &str) -> (String, String, String) {
        let cr = self.cr(name).unwrap();
        let c = cr
            .status
            .unwrap()
            .conditions
            .into_iter()
            .find(|c| c.type_ == type_)
            .expect(type_);
        (c.status, c.reason, c.message)
    }

    fn phase(&self, name: &str) -> Option<Phase> {
        self.cr(name).unwrap().status.unwrap().phase
    }

    fn job_named(&self, prefix: &str) -> Vec<String> {
        self.fake
            .list(&jobs())
            .iter()
            .map(|j| j["metadata"]["name"].as_str().unwrap().to_string())
            .filter(|n| n.starts_with(prefix))
            .collect()
    }

    fn finish_job(&self, name: &str, ok: bool) {
        self.fake.edit(&jobs(), name, |j| {
            j["status"] = if ok {
                json!({"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]})
            } else {
                json!({"failed": 1, "conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": "Job has reached the specified backoff limit"}]})
            };
        });
    }

    fn add_job_pod(&self, job: &str, model: &str, status: Value) -> String {
        let pod = format!("{job}-abcde");
        self.fake.put(
            &pods(),
            json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": pod, "namespace": NS, "labels": {"job-name": job, names::MODEL_LABEL: model}},
                "spec": {"containers": [{"name": "setup"}]},
                "status": status,
            }),
        );
        pod
    }

    fn ready_deployment(&self, name: &str) {
        self.fake.edit(&deployments(), name, |d| {
            let generation = d["metadata"]["generation"].clone();
            d["status"] = json!({"observedGeneration": generation, "replicas": 1, "updatedReplicas": 1, "readyReplicas": 1, "availableReplicas": 1});
        });
    }

    /// New model -> finalizer -> setup Job done -> Deployment ready: returns the model name.
    async fn ready_model(&self) -> String {
        let mut cr = example("kimi-k2-pvc");
        cr.spec.image = Some(OLD_IMAGE.into());
        self.create(cr);
        let name = "kimi-k2".to_string();
        self.reconcile(&name).await; // finalizer
        self.reconcile(&name).await; // PVC + setup Job + Service
        let setup = self.job_named("kimi-k2-setup-").pop().unwrap();
        self.finish_job(&setup, true);
        self.reconcile(&name).await; // marker + Deployment
        self.ready_deployment(&name);
        self.reconcile(&name).await; // status Ready
        assert_eq!(self.condition(&name, "Ready").0, "True");
        name
    }
}

fn writes(reqs: &[Recorded]) -> Vec<String> {
    reqs.iter()
        .filter(|r| r.is_write())
        .map(Recorded::summary)
        .collect()
}

fn is_apply(r: &Recorded) -> bool {
    r.method == "PATCH"
        && r.content_type.starts_with("application/apply-patch")
        && r.query.contains("fieldManager=deltafin-operator")
        && r.query.contains("force=true")
}

#[tokio::test]
async fn new_resource_gets_finalizer_then_pvc_and_setup_job() {
    let w = World::new(false);
    w.create(example("kimi-k2-pvc"));

    // First reconcile: only the finalizer (JSON patch on the resource).
    let reqs = w.reconcile("kimi-k2").await;
    assert_eq!(writes(&reqs), [format!("PATCH {}/kimi-k2", models())]);
    let patch = reqs.iter().find(|r| r.is_write()).unwrap();
    assert!(patch.content_type.starts_with("application/json-patch"));
    assert_eq!(
        w.cr("kimi-k2").unwrap().metadata.finalizers,
        Some(vec![names::FINALIZER.to_string()])
    );

    // Second: PVC, setup Job (server-side apply), status, events. No server objects yet.
    let reqs = w.reconcile("kimi-k2").await;
    let ws = writes(&reqs);
    let pvc_at = ws
        .iter()
        .position(|r| r == &format!("PATCH {}/kimi-k2-weights", pvcs()))
        .expect("PVC applied");
    let job_at = ws
        .iter()
        .position(|r| r.starts_with(&format!("PATCH {}/kimi-k2-setup-", jobs())))
        .expect("Job applied");
    let status_at = ws
        .iter()
        .position(|r| r == &format!("PATCH {}/kimi-k2/status", models()))
        .expect("status");
    assert!(pvc_at < job_at && job_at < status_at, "{ws:#?}");
    assert!(
        !ws.iter()
            .any(|r| r.contains("/deployments/") || r.contains("/services/")),
        "no server before the weights: {ws:#?}"
    );
    assert!(
        reqs.iter()
            .filter(|r| r.method == "PATCH" && !r.path.ends_with("/status"))
            .all(is_apply)
    );
    assert!(
        ws.iter().any(|r| r == &format!("POST {}", events())),
        "an event for the transition"
    );

    let pvc = w.fake.get(&pvcs(), "kimi-k2-weights").unwrap();
    assert!(
        pvc["metadata"].get("ownerReferences").is_none(),
        "weights PVC is not owned"
    );
    assert_eq!(pvc["spec"]["resources"]["requests"]["storage"], "2Ti");
    let (st, reason, msg) = w.condition("kimi-k2", "WeightsReady");
    assert_eq!((st.as_str(), reason.as_str()), ("False", "Downloading"), "{msg}");
    assert_eq!(w.phase("kimi-k2"), Some(Phase::Downloading));
    let status = w.cr("kimi-k2").unwrap().status.unwrap();
    assert_eq!(status.observed_generation, Some(1));
    assert!(status.endpoint.is_none(), "no URL before there is a Service");
    let job = w.job_named("kimi-k2-setup-").pop().unwrap();
    let j = w.fake.get(&jobs(), &job).unwrap();
    assert_eq!(j["metadata"]["ownerReferences"][0]["kind"], "DeltafinModel");
    let args = &j["spec"]["template"]["spec"]["containers"][0]["args"];
    assert_eq!(args[0], "setup");
    assert_eq!(args[2], "hf://moonshotai/Kimi-K2-Instruct@main");
}

#[tokio::test]
async fn setup_progress_comes_from_the_status_the_setup_job_patches() {
    let w = World::new(false);
    w.create(example("kimi-k2-pvc"));
    let first = w.reconcile("kimi-k2").await;
    let second = w.reconcile("kimi-k2").await;
    let created: Vec<String> = [first, second]
        .concat()
        .iter()
        .filter(|r| r.method == "PATCH")
        .map(|r| r.path.clone())
        .collect();
    for kind in [
        "serviceaccounts/kimi-k2-setup",
        "roles/kimi-k2-setup",
        "rolebindings/kimi-k2-setup",
    ] {
        assert!(
            created.iter().any(|p| p.ends_with(kind)),
            "{kind} applied: {created:?}"
        );
    }
    let job = w.job_named("kimi-k2-setup-").pop().unwrap();
    w.add_job_pod(&job, "kimi-k2", json!({"phase": "Running"}));
    // What `deltafin setup --report-status` sends: a merge patch of its own field.
    let report = |job: &str, phase: &str, done: i64| {
        let p = json!({"job": job, "phase": phase, "bytesDone": done,
            "bytesTotal": 1_870_000_000_000i64, "filesDone": 10, "filesTotal": 64, "message": "model-00011"});
        w.fake
            .edit(&models(), "kimi-k2", |o| o["status"]["setupProgress"] = p);
    };
    report(&job, "download", 712_000_000_000);
    let reqs = w.reconcile("kimi-k2").await;
    assert!(
        reqs.iter().all(|r| r.method != "GET"),
        "no log or object reads: {:?}",
        reqs.iter().map(|r| &r.path).collect::<Vec<_>>()
    );
    assert_eq!(
        writes(&reqs),
        [format!("PATCH {}/kimi-k2/status", models())],
        "only the status changes"
    );
    let applied = reqs.iter().find(|r| r.path.ends_with("/status")).unwrap();
    let body = applied.body.as_ref().unwrap();
    assert!(
        body["status"].get("setupProgress").is_none(),
        "the operator never writes the Job's field"
    );
    let status = w.cr("kimi-k2").unwrap().status.unwrap();
    assert_eq!(
        status.setup_progress.as_ref().unwrap().bytes_done,
        712_000_000_000,
        "the report is kept"
    );
    let weights = status.weights.unwrap();
    assert_eq!(weights.percent, Some(38));
    assert_eq!(weights.percent_text.as_deref(), Some("38%"));
    assert_eq!(weights.bytes_total, Some(1_870_000_000_000));
    let (_, reason, msg) = w.condition("kimi-k2", "WeightsReady");
    assert_eq!(reason, "Downloading");
    assert!(msg.contains("38% (712.0/1870.0 GB"), "{msg}");
    // Same report, same state: nothing to write.
    assert!(writes(&w.reconcile("kimi-k2").await).is_empty());
    // A report of another Job (an earlier content key) is not this Job's progress.
    report("kimi-k2-setup-0000000000", "verify", 1);
    w.reconcile("kimi-k2").await;
    assert_eq!(
        w.cr("kimi-k2").unwrap().status.unwrap().weights.unwrap().percent,
        Some(38)
    );
    // Verify stage.
    report(&job, "verify", 1_870_000_000_000);
    w.reconcile("kimi-k2").await;
    assert_eq!(w.condition("kimi-k2", "WeightsReady").1, "Verifying");
    assert_eq!(w.phase("kimi-k2"), Some(Phase::Verifying));
}

/// `metrics.serviceMonitor: Enabled` ("always") creates the ServiceMonitor like `Auto` does.
#[tokio::test]
async fn a_replaced_weights_volume_reruns_setup_instead_of_trusting_the_marker() {
    let w = World::new(false);
    let name = w.ready_model().await;
    let setup = w.job_named("kimi-k2-setup-").pop().unwrap();
    // Someone deletes the PVC and it is re-created empty (new uid).
    w.fake
        .state
        .lock()
        .unwrap()
        .objects
        .get_mut(&pvcs())
        .unwrap()
        .remove("kimi-k2-weights");
    w.fake.put(
        &pvcs(),
        json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
               "metadata": {"name": "kimi-k2-weights", "namespace": NS, "uid": "uid-new-claim"}, "spec": {}}),
    );
    let ws = writes(&w.reconcile(&name).await);
    assert!(ws.contains(&format!("DELETE {}/{setup}", jobs())), "{ws:#?}");
    assert!(
        !ws.iter().any(|r| r.contains("/configmaps/")),
        "marker not rewritten: {ws:#?}"
    );
    assert_eq!(w.condition(&name, "WeightsReady").0, "False");
    assert!(w.fake.get(&jobs(), &setup).is_none());
    // Next round: a fresh setup Job for the new volume.
    let ws = writes(&w.reconcile(&name).await);
    assert!(ws.contains(&format!("PATCH {}/{setup}", jobs())), "{ws:#?}");
}

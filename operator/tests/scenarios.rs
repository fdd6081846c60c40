//! Reconcile scenarios against the scripted fake API server (`support::fake_api`): the real
//! `controller::reconcile` (finalizer, observe, plan, execute) drives a `kube::Client` whose HTTP
//! requests are answered by the fake; the tests play the Job and Deployment controllers and the
//! kubelet by editing stored objects, and assert the exact writes.

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
const NEW_IMAGE: &str = "ghcr.io/deltafin/deltafin:0.2.0";

fn models() -> String {
    FakeApi::collection("deltafin.dev/v1alpha1", NS, "deltafinmodels")
}
fn jobs() -> String {
    FakeApi::collection("batch/v1", NS, "jobs")
}
fn deployments() -> String {
    FakeApi::collection("apps/v1", NS, "deployments")
}
fn services() -> String {
    FakeApi::collection("v1", NS, "services")
}
fn pvcs() -> String {
    FakeApi::collection("v1", NS, "persistentvolumeclaims")
}
fn configmaps() -> String {
    FakeApi::collection("v1", NS, "configmaps")
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

    fn edit_spec(&self, name: &str, f: impl FnOnce(&mut DeltafinModel)) {
        let mut cr = self.cr(name).unwrap();
        f(&mut cr);
        // Through `put`, so the generation bumps like the apiserver's.
        self.fake.put(&models(), serde_json::to_value(&cr).unwrap());
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

    fn deployment_image(&self, name: &str) -> String {
        let d = self.fake.get(&deployments(), name).expect("deployment");
        d["spec"]["template"]["spec"]["containers"][0]["image"]
            .as_str()
            .unwrap()
            .to_string()
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

/// Writes other than the server-side applies of the Deployment, Service and ServiceMonitor, which
/// every reconcile makes once the weights are installed (an unchanged apply changes nothing).
fn changes(reqs: &[Recorded]) -> Vec<String> {
    let steady = |r: &Recorded| {
        is_apply(r)
            && ["/deployments/", "/services/", "/servicemonitors/"]
                .iter()
                .any(|k| r.path.contains(k))
    };
    reqs.iter()
        .filter(|r| r.is_write() && !steady(r))
        .map(Recorded::summary)
        .collect()
}

/// The images of every Deployment applied in `reqs`.
fn applied_images(reqs: &[Recorded]) -> Vec<String> {
    reqs.iter()
        .filter(|r| is_apply(r) && r.path.contains("/deployments/"))
        .map(|r| {
            let body = r.body.as_ref().expect("apply body");
            body["spec"]["template"]["spec"]["containers"][0]["image"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
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
async fn service_monitor_enabled_creates_it() {
    let w = World::new(true);
    let mut cr = example("kimi-k2-pvc");
    cr.spec.metrics.service_monitor = deltafin_operator::crd::ServiceMonitorMode::Enabled;
    w.create(cr);
    w.reconcile("kimi-k2").await;
    w.reconcile("kimi-k2").await;
    let job = w.job_named("kimi-k2-setup-").pop().unwrap();
    w.finish_job(&job, true);
    let ws = writes(&w.reconcile("kimi-k2").await);
    let monitors = FakeApi::collection("monitoring.coreos.com/v1", NS, "servicemonitors");
    assert!(
        ws.contains(&format!("PATCH {monitors}/kimi-k2")),
        "ServiceMonitor: {ws:#?}"
    );
}

#[tokio::test]
async fn job_done_creates_deployment_then_ready_and_a_second_reconcile_reads_no_api_and_changes_nothing() {
    let w = World::new(true);
    w.create(example("kimi-k2-pvc"));
    w.reconcile("kimi-k2").await;
    w.reconcile("kimi-k2").await;
    let job = w.job_named("kimi-k2-setup-").pop().unwrap();
    w.finish_job(&job, true);

    let reqs = w.reconcile("kimi-k2").await;
    let ws = writes(&reqs);
    let marker_at = ws
        .iter()
        .position(|r| r == &format!("PATCH {}/kimi-k2-weights", configmaps()))
        .expect("marker");
    let deploy_at = ws
        .iter()
        .position(|r| r == &format!("PATCH {}/kimi-k2", deployments()))
        .expect("deployment");
    let service_at = ws
        .iter()
        .position(|r| r == &format!("PATCH {}/kimi-k2", services()))
        .expect("service");
    assert!(marker_at < deploy_at && deploy_at < service_at, "{ws:#?}");
    let monitors = FakeApi::collection("monitoring.coreos.com/v1", NS, "servicemonitors");
    assert!(
        ws.contains(&format!("PATCH {monitors}/kimi-k2")),
        "ServiceMonitor: {ws:#?}"
    );
    let sm = w.fake.get(&monitors, "kimi-k2").unwrap();
    assert_eq!(sm["spec"]["endpoints"][0]["port"], "http");
    let status = w.cr("kimi-k2").unwrap().status.unwrap();
    assert_eq!(status.endpoint.unwrap().url, "http://kimi-k2.ai.svc:8000/v1");
    assert_eq!(w.condition("kimi-k2", "WeightsReady").0, "True");
    assert_eq!(w.condition("kimi-k2", "ServerReady").1, "Starting");
    let marker = w.fake.get(&configmaps(), "kimi-k2-weights").unwrap();
    assert!(marker["metadata"].get("ownerReferences").is_none());
    assert_eq!(marker["data"]["image"], "ghcr.io/deltafin/deltafin:0.1.0");

    w.ready_deployment("kimi-k2");
    let ws = changes(&w.reconcile("kimi-k2").await);
    assert!(
        ws.iter().all(|r| r.ends_with("/status") || r.contains("/events")),
        "{ws:#?}"
    );
    let (st, reason, _) = w.condition("kimi-k2", "Ready");
    assert_eq!((st.as_str(), reason.as_str()), ("True", "Serving"));
    assert_eq!(w.phase("kimi-k2"), Some(Phase::Ready));

    // Nothing changed: no reads (the caches), no status, no event, and no write: the cached
    // server objects already hold everything the operator would apply (envtest checks the
    // same on a real server, and that a hand edit is repaired).
    let reqs = w.reconcile("kimi-k2").await;
    assert!(changes(&reqs).is_empty(), "{:#?}", changes(&reqs));
    assert!(
        reqs.iter().all(|r| r.method != "GET"),
        "reads come from the caches: {reqs:#?}"
    );
    assert!(writes(&reqs).is_empty(), "{:#?}", writes(&reqs));
    let _ = monitors;
}

#[tokio::test]
async fn image_change_runs_preflight_before_the_deployment_changes() {
    let w = World::new(false);
    let name = w.ready_model().await;
    let setup_jobs = w.job_named("kimi-k2-setup-");
    w.edit_spec(&name, |cr| cr.spec.image = Some(NEW_IMAGE.into()));

    let reqs = w.reconcile(&name).await;
    let ws = writes(&reqs);
    assert!(
        ws.iter()
            .any(|r| r.starts_with(&format!("PATCH {}/kimi-k2-preflight-", jobs()))),
        "{ws:#?}"
    );
    assert!(
        !applied_images(&reqs).iter().any(|i| i == NEW_IMAGE),
        "the Deployment keeps the old image during pre-flight"
    );
    assert!(
        !ws.iter().any(|r| r.contains("-setup-")),
        "no new setup Job: {ws:#?}"
    );
    assert_eq!(w.deployment_image(&name), OLD_IMAGE);
    let (st, reason, _) = w.condition(&name, "Upgrading");
    assert_eq!((st.as_str(), reason.as_str()), ("True", "PreflightRunning"));
    assert_eq!(w.phase(&name), Some(Phase::Upgrading));
    let pf = w.job_named("kimi-k2-preflight-").pop().unwrap();
    let pj = w.fake.get(&jobs(), &pf).unwrap();
    let c = &pj["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(c["image"], NEW_IMAGE);
    assert_eq!(c["args"][0], "doctor");

    w.finish_job(&pf, true);
    let ws = writes(&w.reconcile(&name).await);
    let marker_at = ws
        .iter()
        .position(|r| r.ends_with("/configmaps/kimi-k2-weights"))
        .expect("marker records the new image");
    let deploy_at = ws
        .iter()
        .position(|r| r.ends_with("/deployments/kimi-k2"))
        .expect("then the swap");
    assert!(marker_at < deploy_at);
    assert_eq!(w.deployment_image(&name), NEW_IMAGE);
    assert_eq!(w.condition(&name, "Upgrading").1, "UpToDate");
    assert_eq!(
        w.job_named("kimi-k2-setup-"),
        setup_jobs,
        "weights never downloaded again"
    );
    let status = w.cr(&name).unwrap().status.unwrap();
    assert_eq!(status.image.as_deref(), Some(NEW_IMAGE));
}

#[tokio::test]
async fn failed_preflight_keeps_the_old_image_and_says_why() {
    let w = World::new(false);
    let name = w.ready_model().await;
    w.edit_spec(&name, |cr| cr.spec.image = Some(NEW_IMAGE.into()));
    w.reconcile(&name).await;
    let pf = w.job_named("kimi-k2-preflight-").pop().unwrap();
    w.add_job_pod(
        &pf,
        &name,
        json!({"phase": "Failed", "containerStatuses": [{
            "name": "preflight", "image": NEW_IMAGE, "imageID": "", "ready": false, "restartCount": 0,
            "state": {"terminated": {"exitCode": 1, "reason": "Error", "finishedAt": "2026-01-01T01:00:00Z",
                      "message": "error: layout version 3 is newer than this image understands"}}}]}),
    );
    w.finish_job(&pf, false);

    let reqs = w.reconcile(&name).await;
    assert!(!applied_images(&reqs).iter().any(|i| i == NEW_IMAGE));
    assert_eq!(w.deployment_image(&name), OLD_IMAGE, "old image kept");
    let (st, reason, msg) = w.condition(&name, "Upgrading");
    assert_eq!((st.as_str(), reason.as_str()), ("False", "PreflightFailed"));
    assert!(
        msg.contains("layout version 3") && msg.contains(OLD_IMAGE),
        "{msg}"
    );
    assert_eq!(
        w.condition(&name, "Ready").0,
        "True",
        "the old image keeps serving"
    );
    let status = w.cr(&name).unwrap().status.unwrap();
    let f = status.last_failure.unwrap();
    assert_eq!(
        (f.component.as_str(), f.reason.as_str(), f.exit_code),
        ("preflight", "PreflightFailed", Some(1))
    );
    assert_eq!(status.image.as_deref(), Some(OLD_IMAGE));
    let ev = reqs
        .iter()
        .find(|r| r.method == "POST" && r.path == events())
        .expect("event");
    let body = ev.body.as_ref().unwrap();
    assert_eq!(
        (body["type"].as_str(), body["reason"].as_str()),
        (Some("Warning"), Some("PreflightFailed"))
    );
    // Stable: nothing more to change.
    assert!(changes(&w.reconcile(&name).await).is_empty());
}

#[tokio::test]
async fn setup_failure_reports_the_cause() {
    let w = World::new(false);
    w.create(example("kimi-k2-pvc"));
    w.reconcile("kimi-k2").await;
    w.reconcile("kimi-k2").await;
    let job = w.job_named("kimi-k2-setup-").pop().unwrap();
    w.add_job_pod(
        &job,
        "kimi-k2",
        json!({"phase": "Failed", "containerStatuses": [{
            "name": "setup", "image": OLD_IMAGE, "imageID": "", "ready": false, "restartCount": 0,
            "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled", "finishedAt": "2026-01-01T02:00:00Z"}}}]}),
    );
    w.finish_job(&job, false);
    w.reconcile("kimi-k2").await;
    let (st, reason, msg) = w.condition("kimi-k2", "WeightsReady");
    assert_eq!((st.as_str(), reason.as_str()), ("False", "OOMKilled"), "{msg}");
    assert!(msg.contains("delete the Job to retry"), "{msg}");
    assert_eq!(w.phase("kimi-k2"), Some(Phase::Failed));
    let f = w.cr("kimi-k2").unwrap().status.unwrap().last_failure.unwrap();
    assert_eq!(
        (f.component.as_str(), f.exit_code, f.time.as_deref()),
        ("setup", Some(137), Some("2026-01-01T02:00:00Z"))
    );
    assert!(w.fake.get(&deployments(), "kimi-k2").is_none());
}

#[tokio::test]
async fn delete_with_retain_keeps_the_weights_and_a_new_model_reuses_them() {
    let w = World::new(false);
    let name = w.ready_model().await;
    let pvc_uid = w.fake.get(&pvcs(), "kimi-k2-weights").unwrap()["metadata"]["uid"].clone();
    w.fake.edit(&models(), &name, |m| {
        m["metadata"]["deletionTimestamp"] = json!("2026-01-02T00:00:00Z")
    });

    let reqs = w.reconcile(&name).await;
    let ws = writes(&reqs);
    assert!(
        !ws.iter().any(|r| r.starts_with("DELETE")),
        "Retain deletes nothing: {ws:#?}"
    );
    assert!(
        ws.contains(&format!("PATCH {}/kimi-k2", models())),
        "finalizer removed: {ws:#?}"
    );
    assert!(
        w.cr(&name).is_none(),
        "resource gone once the finalizer is removed"
    );
    let ev = reqs
        .iter()
        .find(|r| r.method == "POST" && r.path == events())
        .unwrap();
    assert_eq!(ev.body.as_ref().unwrap()["reason"], "WeightsRetained");
    assert_eq!(
        w.fake.get(&pvcs(), "kimi-k2-weights").unwrap()["metadata"]["uid"],
        pvc_uid
    );
    assert!(w.fake.get(&configmaps(), "kimi-k2-weights").is_some());

    // The garbage collector removes the owned children; a new model with the same spec finds
    // the marker and the same claim, and starts the server without a setup Job.
    for c in [jobs(), deployments(), services()] {
        for o in w.fake.list(&c) {
            let n = o["metadata"]["name"].as_str().unwrap().to_string();
            w.fake
                .state
                .lock()
                .unwrap()
                .objects
                .get_mut(&c)
                .unwrap()
                .remove(&n);
        }
    }
    let mut cr = example("kimi-k2-pvc");
    cr.spec.image = Some(OLD_IMAGE.into());
    w.create(cr);
    w.reconcile(&name).await;
    let ws = writes(&w.reconcile(&name).await);
    assert!(!ws.iter().any(|r| r.contains("/jobs/")), "no download: {ws:#?}");
    assert!(
        ws.contains(&format!("PATCH {}/kimi-k2", deployments())),
        "{ws:#?}"
    );
    assert_eq!(w.condition(&name, "WeightsReady").0, "True");
}

#[tokio::test]
async fn delete_with_delete_policy_removes_pvc_and_marker() {
    let w = World::new(false);
    let mut cr = example("kimi-k2-pvc");
    cr.spec.storage.retain_policy = Some(deltafin_operator::crd::RetainPolicy::Delete);
    w.create(cr);
    w.reconcile("kimi-k2").await;
    w.reconcile("kimi-k2").await;
    let job = w.job_named("kimi-k2-setup-").pop().unwrap();
    w.finish_job(&job, true);
    w.reconcile("kimi-k2").await;
    assert!(w.fake.get(&configmaps(), "kimi-k2-weights").is_some());
    w.fake.edit(&models(), "kimi-k2", |m| {
        m["metadata"]["deletionTimestamp"] = json!("2026-01-02T00:00:00Z")
    });

    let reqs = w.reconcile("kimi-k2").await;
    let ws = writes(&reqs);
    assert!(
        ws.contains(&format!("DELETE {}/kimi-k2-weights", pvcs())),
        "{ws:#?}"
    );
    assert!(
        ws.contains(&format!("DELETE {}/kimi-k2-weights", configmaps())),
        "{ws:#?}"
    );
    assert!(w.fake.get(&pvcs(), "kimi-k2-weights").is_none());
    assert!(w.cr("kimi-k2").is_none());
    let ev = reqs
        .iter()
        .find(|r| r.method == "POST" && r.path == events())
        .unwrap();
    assert_eq!(ev.body.as_ref().unwrap()["reason"], "WeightsDeleted");
}

#[tokio::test]
async fn missing_existing_claim_waits_without_a_job() {
    let w = World::new(false);
    w.create(example("preloaded-existing-claim"));
    w.reconcile("deepseek-v3").await;
    let ws = writes(&w.reconcile("deepseek-v3").await);
    assert!(
        !ws.iter()
            .any(|r| r.contains("/jobs/") || r.contains("persistentvolumeclaims")),
        "{ws:#?}"
    );
    let (st, reason, msg) = w.condition("deepseek-v3", "WeightsReady");
    assert_eq!((st.as_str(), reason.as_str()), ("False", "AwaitingStorage"));
    assert!(msg.contains("models"), "{msg}");

    // The claim appears: a doctor Job checks the preloaded weights.
    w.fake.put(&pvcs(), json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "models", "namespace": NS}, "spec": {}}));
    let ws = writes(&w.reconcile("deepseek-v3").await);
    assert!(
        ws.iter().any(|r| r.contains("/jobs/deepseek-v3-setup-")),
        "{ws:#?}"
    );
    let job = w.job_named("deepseek-v3-setup-").pop().unwrap();
    let j = w.fake.get(&jobs(), &job).unwrap();
    assert_eq!(
        j["spec"]["template"]["spec"]["containers"][0]["args"][0],
        "doctor"
    );
    assert_eq!(w.condition("deepseek-v3", "WeightsReady").1, "Verifying");
}

#[tokio::test]
async fn a_new_revision_replaces_the_setup_job_while_the_old_server_keeps_serving() {
    let w = World::new(false);
    let name = w.ready_model().await;
    let old_job = w.job_named("kimi-k2-setup-").pop().unwrap();
    w.edit_spec(&name, |cr| {
        cr.spec.source.hugging_face.as_mut().unwrap().revision = Some("abc123".into())
    });
    let ws = writes(&w.reconcile(&name).await);
    assert!(
        ws.contains(&format!("DELETE {}/{old_job}", jobs())),
        "outdated Job removed: {ws:#?}"
    );
    assert!(
        ws.iter()
            .any(|r| r.starts_with(&format!("PATCH {}/kimi-k2-setup-", jobs())) && !r.ends_with(&old_job))
    );
    assert!(
        !ws.iter().any(|r| r.contains("/deployments/")),
        "the previous install keeps serving: {ws:#?}"
    );
    let (st, reason, msg) = w.condition(&name, "Ready");
    assert_eq!((st.as_str(), reason.as_str()), ("False", "Downloading"));
    assert!(msg.contains("previous install keeps serving"), "{msg}");
    assert_eq!(w.condition(&name, "ServerReady").0, "True");
}

#[tokio::test]
async fn paused_scales_to_zero() {
    let w = World::new(false);
    let name = w.ready_model().await;
    w.edit_spec(&name, |cr| cr.spec.paused = true);
    let ws = writes(&w.reconcile(&name).await);
    assert!(
        ws.contains(&format!("PATCH {}/kimi-k2", deployments())),
        "{ws:#?}"
    );
    let d = w.fake.get(&deployments(), &name).unwrap();
    assert_eq!(d["spec"]["replicas"], 0);
    assert_eq!(w.phase(&name), Some(Phase::Paused));
    assert_eq!(w.condition(&name, "ServerReady").1, "Paused");
}

#[tokio::test]
async fn server_crash_is_reported_as_the_last_failure() {
    let w = World::new(false);
    let name = w.ready_model().await;
    w.fake
        .edit(&deployments(), &name, |d| d["status"]["readyReplicas"] = json!(0));
    w.fake.put(
        &pods(),
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": "kimi-k2-5d9c-xyz", "namespace": NS,
                            "labels": {"app.kubernetes.io/component": "server", names::MODEL_LABEL: "kimi-k2"}},
               "spec": {"containers": [{"name": "server"}]},
               "status": {"phase": "Running", "containerStatuses": [{
                   "name": "server", "image": OLD_IMAGE, "imageID": "", "ready": false, "restartCount": 3,
                   "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s"}},
                   "lastState": {"terminated": {"exitCode": 137, "reason": "OOMKilled", "finishedAt": "2026-01-01T03:00:00Z"}}}]}}),
    );
    w.reconcile(&name).await;
    let (st, reason, _) = w.condition(&name, "ServerReady");
    assert_eq!((st.as_str(), reason.as_str()), ("False", "OOMKilled"));
    assert_eq!(w.phase(&name), Some(Phase::Failed));
    let f = w.cr(&name).unwrap().status.unwrap().last_failure.unwrap();
    assert_eq!((f.component.as_str(), f.reason.as_str()), ("server", "OOMKilled"));
}

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

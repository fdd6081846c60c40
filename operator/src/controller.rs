//! The I/O shell around [`crate::plan`]: observe the cluster, plan, execute; the finalizer; the
//! kube-runtime `Controller` wiring.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Service};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, LogParams, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::finalizer::{Event as FinalizerEvent, finalizer};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use serde_json::json;
use tracing::{debug, info, warn};

use crate::crd::{DeltafinModel, RetainPolicy};
use crate::error::{Error, Result};
use crate::metrics::Metrics;
use crate::model::Settings;
use crate::names::{self, FINALIZER, MANAGER, MODEL_LABEL};
use crate::plan::{self, Child, EventSpec, Observed, Plan, Write};
use crate::resources;

/// Requeue after a failed reconcile.
pub const ERROR_REQUEUE: Duration = Duration::from_secs(30);

/// Shared by every reconcile.
#[derive(Clone)]
pub struct Context {
    /// API client.
    pub client: Client,
    /// Operator settings.
    pub settings: Settings,
    /// Event recorder (reporting controller `deltafin-operator`).
    pub recorder: Recorder,
    /// Operator metrics.
    pub metrics: Arc<Metrics>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl Context {
    /// A context for `client`; `instance` names the reporting pod in events.
    pub fn new(client: Client, settings: Settings, metrics: Arc<Metrics>, instance: Option<String>) -> Self {
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: MANAGER.into(),
                instance,
            },
        );
        Self {
            client,
            settings,
            recorder,
            metrics,
        }
    }
}

/// Reconciles one DeltafinModel: adds the finalizer on first sight, then observe -> plan ->
/// execute; on deletion, cleans up according to the retain policy.
pub async fn reconcile(obj: Arc<DeltafinModel>, ctx: Arc<Context>) -> Result<Action> {
    let _timer = ctx.metrics.reconcile();
    let ns = obj.namespace().ok_or(Error::MissingMetadata("namespace"))?;
    let api: Api<DeltafinModel> = Api::namespaced(ctx.client.clone(), &ns);
    finalizer(&api, FINALIZER, obj, |event| async {
        match event {
            FinalizerEvent::Apply(o) => apply(&o, &ctx).await,
            FinalizerEvent::Cleanup(o) => cleanup(&o, &ctx).await,
        }
    })
    .await
    .map_err(|e| Error::Finalizer(Box::new(e)))
}

/// Requeues a failed reconcile after [`ERROR_REQUEUE`] and counts the failure.
pub fn error_policy(obj: Arc<DeltafinModel>, err: &Error, ctx: Arc<Context>) -> Action {
    warn!(model = %obj.name_any(), error = %err, "reconcile failed");
    ctx.metrics.failure(err);
    Action::requeue(ERROR_REQUEUE)
}

async fn apply(obj: &DeltafinModel, ctx: &Context) -> Result<Action> {
    let observed = observe(obj, ctx).await?;
    let plan = plan::plan(obj, &ctx.settings, &observed);
    execute(obj, ctx, &plan).await?;
    Ok(Action::requeue(plan.requeue))
}

/// Reads everything [`plan::plan`] needs.
pub async fn observe(obj: &DeltafinModel, ctx: &Context) -> Result<Observed> {
    let ns = obj.namespace().ok_or(Error::MissingMetadata("namespace"))?;
    let name = obj.name_any();
    let client = ctx.client.clone();
    let lp = ListParams::default().labels(&format!("{MODEL_LABEL}={name}"));
    let claim = match crate::model::resolve(obj, &ctx.settings)
        .ok()
        .and_then(|m| m.storage.claim().map(String::from))
    {
        Some(c) => {
            Api::<PersistentVolumeClaim>::namespaced(client.clone(), &ns)
                .get_opt(&c)
                .await?
        }
        None => None,
    };
    let marker = Api::<ConfigMap>::namespaced(client.clone(), &ns)
        .get_opt(&names::weights(&name))
        .await?;
    let jobs = Api::<Job>::namespaced(client.clone(), &ns).list(&lp).await?.items;
    let pods_api = Api::<Pod>::namespaced(client.clone(), &ns);
    let pods = pods_api.list(&lp).await?.items;
    let deployment = Api::<Deployment>::namespaced(client.clone(), &ns)
        .get_opt(&names::server(&name))
        .await?;
    let service = Api::<Service>::namespaced(client.clone(), &ns)
        .get_opt(&names::server(&name))
        .await?;
    let service_monitor = if ctx.settings.service_monitors {
        Api::<DynamicObject>::namespaced_with(client.clone(), &ns, &resources::service_monitor_resource())
            .get_opt(&names::service_monitor(&name))
            .await?
    } else {
        None
    };
    let setup_log = match plan::setup_log_pod(obj, &ctx.settings, &jobs, &pods) {
        Some(pod) => {
            let lp = LogParams {
                container: Some("setup".into()),
                tail_lines: Some(20),
                ..Default::default()
            };
            // A pod that has not started yet has no log; progress then stays as it was.
            pods_api
                .logs(&pod, &lp)
                .await
                .map_err(|e| debug!(%pod, error = %e, "no setup log yet"))
                .ok()
        }
        None => None,
    };
    let now = Timestamp::from_second(Timestamp::now().as_second()).unwrap_or_else(|_| Timestamp::now());
    Ok(Observed {
        now,
        claim,
        marker,
        jobs,
        pods,
        setup_log,
        deployment,
        service,
        service_monitor,
    })
}

/// Executes a plan: the writes in order, the status (only when it changed), then the events.
pub async fn execute(obj: &DeltafinModel, ctx: &Context, plan: &Plan) -> Result<()> {
    let ns = obj.namespace().ok_or(Error::MissingMetadata("namespace"))?;
    let name = obj.name_any();
    let client = ctx.client.clone();
    let pp = PatchParams::apply(MANAGER).force();
    for w in &plan.writes {
        match w {
            Write::Apply(child) => {
                apply_child(&client, &ns, child, &pp).await?;
                info!(model = %name, kind = child.kind(), object = %child.name(), "applied");
                ctx.metrics.write(child.kind());
            }
            Write::DeleteJob(job) => {
                ignore_not_found(
                    Api::<Job>::namespaced(client.clone(), &ns)
                        .delete(job, &DeleteParams::background())
                        .await,
                )?;
                info!(model = %name, job = %job, "deleted outdated Job");
                ctx.metrics.write("Job");
            }
            Write::DeleteServiceMonitor(sm) => {
                let api = Api::<DynamicObject>::namespaced_with(
                    client.clone(),
                    &ns,
                    &resources::service_monitor_resource(),
                );
                ignore_not_found(api.delete(sm, &DeleteParams::default()).await)?;
                ctx.metrics.write("ServiceMonitor");
            }
        }
    }
    if obj.status.as_ref() != Some(&plan.status) {
        let api: Api<DeltafinModel> = Api::namespaced(client.clone(), &ns);
        let body = json!({
            "apiVersion": DeltafinModel::api_version(&()),
            "kind": DeltafinModel::kind(&()),
            "status": plan.status,
        });
        api.patch_status(&name, &pp, &Patch::Apply(&body)).await?;
        ctx.metrics.write("status");
    }
    for e in &plan.events {
        publish(ctx, obj, e).await;
    }
    if let Some(w) = &plan.status.weights {
        ctx.metrics.set_weights(&ns, &name, w.bytes_done, w.bytes_total);
    }
    Ok(())
}

async fn apply_child(client: &Client, ns: &str, child: &Child, pp: &PatchParams) -> Result<()> {
    let name = child.name();
    match child {
        Child::Pvc(o) => {
            Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns)
                .patch(&name, pp, &Patch::Apply(o))
                .await?;
        }
        Child::Marker(o) => {
            Api::<ConfigMap>::namespaced(client.clone(), ns)
                .patch(&name, pp, &Patch::Apply(o))
                .await?;
        }
        Child::Job(o) => {
            Api::<Job>::namespaced(client.clone(), ns)
                .patch(&name, pp, &Patch::Apply(o))
                .await?;
        }
        Child::Deployment(o) => {
            Api::<Deployment>::namespaced(client.clone(), ns)
                .patch(&name, pp, &Patch::Apply(o))
                .await?;
        }
        Child::Service(o) => {
            Api::<Service>::namespaced(client.clone(), ns)
                .patch(&name, pp, &Patch::Apply(o))
                .await?;
        }
        Child::ServiceMonitor(o) => {
            Api::<DynamicObject>::namespaced_with(client.clone(), ns, &resources::service_monitor_resource())
                .patch(&name, pp, &Patch::Apply(o))
                .await?;
        }
    }
    Ok(())
}

fn ignore_not_found<T>(r: std::result::Result<T, kube::Error>) -> Result<()> {
    match r {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

async fn publish(ctx: &Context, obj: &DeltafinModel, e: &EventSpec) {
    let ev = Event {
        type_: if e.warning {
            EventType::Warning
        } else {
            EventType::Normal
        },
        reason: e.reason.clone(),
        note: Some(e.note.chars().take(1000).collect()),
        action: e.action.clone(),
        secondary: None,
    };
    // Events are best effort: a rejected event must not fail the reconcile.
    match ctx.recorder.publish(&ev, &obj.object_ref(&())).await {
        Ok(()) => ctx.metrics.write("Event"),
        Err(err) => warn!(model = %obj.name_any(), error = %err, "could not publish event"),
    }
}

/// Deletion: with `retainPolicy: Delete`, delete the operator-created PVC and the marker; else
/// keep both and say so. Owned children (Deployment, Service, Jobs, ServiceMonitor) are removed
/// by the garbage collector.
async fn cleanup(obj: &DeltafinModel, ctx: &Context) -> Result<Action> {
    let ns = obj.namespace().ok_or(Error::MissingMetadata("namespace"))?;
    let name = obj.name_any();
    let storage = &obj.spec.storage;
    let marker = names::weights(&name);
    let e = if storage.retain_policy == Some(RetainPolicy::Delete) && storage.pvc.is_some() {
        let pvcs = Api::<PersistentVolumeClaim>::namespaced(ctx.client.clone(), &ns);
        let claim = names::weights(&name);
        if let Some(p) = pvcs.get_opt(&claim).await? {
            // Only a claim this operator created for this model.
            if p.labels().get(MODEL_LABEL) == Some(&name)
                && p.labels().get("app.kubernetes.io/managed-by").map(String::as_str) == Some(MANAGER)
            {
                ignore_not_found(pvcs.delete(&claim, &DeleteParams::default()).await)?;
                ctx.metrics.write("PersistentVolumeClaim");
            }
        }
        ignore_not_found(
            Api::<ConfigMap>::namespaced(ctx.client.clone(), &ns)
                .delete(&marker, &DeleteParams::default())
                .await,
        )?;
        ctx.metrics.write("ConfigMap");
        EventSpec {
            warning: false,
            reason: "WeightsDeleted".into(),
            note: format!(
                "retainPolicy Delete: deleted PersistentVolumeClaim {claim} and ConfigMap {marker}"
            ),
            action: "Cleanup".into(),
        }
    } else {
        let volume = match (&storage.pvc, &storage.existing_claim, &storage.host_path) {
            (Some(_), _, _) => format!("PersistentVolumeClaim {}", names::weights(&name)),
            (_, Some(c), _) => format!("PersistentVolumeClaim {}", c.name),
            (_, _, Some(h)) => format!("hostPath {}", h.path),
            _ => "the weights volume".into(),
        };
        EventSpec {
            warning: false,
            reason: "WeightsRetained".into(),
            note: format!(
                "kept {volume} and ConfigMap {marker}: a DeltafinModel with the same source and storage reuses them without downloading"
            ),
            action: "Cleanup".into(),
        }
    };
    info!(model = %name, reason = %e.reason, "{}", e.note);
    publish(ctx, obj, &e).await;
    ctx.metrics.forget(&ns, &name);
    Ok(Action::await_change())
}

fn model_ref<K: Resource>(obj: &K) -> Option<ObjectRef<DeltafinModel>> {
    let name = obj.meta().labels.as_ref()?.get(MODEL_LABEL)?;
    Some(ObjectRef::new(name).within(obj.meta().namespace.as_deref()?))
}

/// Checks that the CRD is installed (lists one DeltafinModel).
pub async fn check_crd(client: &Client, namespace: Option<&str>) -> Result<()> {
    let api: Api<DeltafinModel> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    api.list(&ListParams::default().limit(1)).await?;
    Ok(())
}

/// Whether `monitoring.coreos.com/v1` serves ServiceMonitors.
pub async fn service_monitors_served(client: &Client) -> bool {
    match client.list_api_group_resources("monitoring.coreos.com/v1").await {
        Ok(list) => list.resources.iter().any(|r| r.name == "servicemonitors"),
        Err(_) => false,
    }
}

/// Runs the controller until SIGTERM/SIGINT; `ready` turns true once it watches.
pub async fn run(ctx: Arc<Context>, namespace: Option<String>, ready: Arc<AtomicBool>) {
    let client = ctx.client.clone();
    fn api<K>(client: &Client, ns: Option<&str>) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        K::DynamicType: Default,
    {
        match ns {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        }
    }
    let ns = namespace.as_deref();
    let managed = watcher::Config::default().labels(&format!("app.kubernetes.io/managed-by={MANAGER}"));
    let weights = watcher::Config::default().labels(&format!(
        "app.kubernetes.io/managed-by={MANAGER},app.kubernetes.io/component=weights"
    ));
    let controller = Controller::new(
        api::<DeltafinModel>(&client, ns),
        watcher::Config::default().any_semantic(),
    )
    .owns(api::<Deployment>(&client, ns), managed.clone())
    .owns(api::<Job>(&client, ns), managed.clone())
    .owns(api::<Service>(&client, ns), managed)
    .watches(api::<ConfigMap>(&client, ns), weights.clone(), |o| model_ref(&o))
    .watches(api::<PersistentVolumeClaim>(&client, ns), weights, |o| {
        model_ref(&o)
    })
    .shutdown_on_signal();
    ready.store(true, Ordering::SeqCst);
    info!(namespace = ns.unwrap_or("<all>"), "controller started");
    controller
        .run(reconcile, error_policy, ctx)
        .for_each(|r| async move {
            match r {
                Ok((o, _)) => debug!(model = %o.name, "reconciled"),
                Err(e) => debug!(error = %e, "reconcile error"),
            }
        })
        .await;
    ready.store(false, Ordering::SeqCst);
    info!("controller stopped");
}

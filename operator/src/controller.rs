//! The I/O shell around [`crate::plan`]: observe (from the reflector stores of [`crate::cache`],
//! no API reads), plan, execute; the finalizer; the kube-runtime `Controller` wiring, whose
//! watches fill those stores.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::finalizer::{Event as FinalizerEvent, finalizer};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::reflector::reflector;
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use serde_json::json;
use tracing::{debug, info, warn};

use crate::cache::{self, Stores, Writers};
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
    /// What reconciles read (filled by the watches of [`run`]).
    pub stores: Stores,
    /// Said once per DeltafinModel (and process) in an event: the optional fields this
    /// server's version does not serve ([`crate::version::Capabilities::notice`]).
    notice: Option<String>,
    /// UIDs of the DeltafinModels that got [`Self::notice`].
    noticed: Arc<Mutex<HashSet<String>>>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl Context {
    /// A context for `client` reading `stores`; `instance` names the reporting pod in events.
    pub fn new(
        client: Client,
        settings: Settings,
        metrics: Arc<Metrics>,
        instance: Option<String>,
        stores: Stores,
    ) -> Self {
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
            stores,
            notice: None,
            noticed: Arc::default(),
        }
    }

    /// Sets the version notice (see [`crate::version::Capabilities::notice`]).
    pub fn with_notice(mut self, notice: Option<String>) -> Self {
        self.notice = notice;
        self
    }

    /// The version notice, when `obj` has not had it from this process yet.
    fn notice_for(&self, obj: &DeltafinModel) -> Option<EventSpec> {
        let note = self.notice.as_ref()?;
        let uid = obj.uid()?;
        let mut seen = self.noticed.lock().unwrap_or_else(|p| p.into_inner());
        seen.insert(uid).then(|| EventSpec {
            warning: true,
            reason: "KubernetesFieldsOmitted".into(),
            note: note.clone(),
            action: "Reconcile".into(),
        })
    }
}

/// Reconciles one DeltafinModel: adds the finalizer on first sight, then observe -> plan ->
/// execute; on deletion, cleans up according to the retain policy.
pub async fn reconcile(obj: Arc<DeltafinModel>, ctx: Arc<Context>) -> Result<Action> {
    let _timer = ctx.metrics.reconcile();
    let ns = obj.namespace().ok_or(Error::MissingMetadata("namespace"))?;
    ctx.metrics.started(&ObjectRef::from_obj(&*obj));
    let api: Api<DeltafinModel> = Api::namespaced(ctx.client.clone(), &ns);
    ctx.stores.ready().await;
    let action = finalizer(&api, FINALIZER, obj, |event| async {
        match event {
            FinalizerEvent::Apply(o) => apply(&o, &ctx).await,
            FinalizerEvent::Cleanup(o) => cleanup(&o, &ctx).await,
        }
    })
    .await
    .map_err(|e| Error::Finalizer(Box::new(e)))?;
    ctx.metrics.success();
    Ok(action)
}

/// Requeues a failed reconcile after [`ERROR_REQUEUE`] and counts the failure.
pub fn error_policy(obj: Arc<DeltafinModel>, err: &Error, ctx: Arc<Context>) -> Action {
    warn!(model = %obj.name_any(), error = %err, "reconcile failed");
    ctx.metrics.failure(err);
    ctx.metrics.requeued(&ObjectRef::from_obj(&*obj), ERROR_REQUEUE);
    Action::requeue(ERROR_REQUEUE)
}

async fn apply(obj: &DeltafinModel, ctx: &Context) -> Result<Action> {
    let observed = observe(obj, ctx).await?;
    let plan = plan::plan(obj, &ctx.settings, &observed);
    execute(obj, ctx, &plan).await?;
    if let Some(e) = ctx.notice_for(obj) {
        publish(ctx, obj, &e).await;
    }
    ctx.metrics.requeued(&ObjectRef::from_obj(obj), plan.requeue);
    Ok(Action::requeue(plan.requeue))
}

/// Reads everything [`plan::plan`] needs from the stores: no API request. Setup progress comes
/// with the DeltafinModel itself (`status.setupProgress`, written by the setup Job).
pub async fn observe(obj: &DeltafinModel, ctx: &Context) -> Result<Observed> {
    let ns = obj.namespace().ok_or(Error::MissingMetadata("namespace"))?;
    let name = obj.name_any();
    let st = &ctx.stores;
    let claim = crate::model::resolve(obj, &ctx.settings)
        .ok()
        .and_then(|m| m.storage.claim().map(String::from))
        .and_then(|c| st.claim(&ns, &c));
    let jobs = st.jobs_of(&ns, &name);
    let pods = st.pods_of(&ns, &name);
    let service_monitor = if ctx.settings.service_monitors {
        st.service_monitor(&ns, &names::service_monitor(&name))
    } else {
        None
    };
    let (setup_account, setup_role, setup_role_binding) = st.setup_reporter(&ns, &name);
    let now = Timestamp::from_second(Timestamp::now().as_second()).unwrap_or_else(|_| Timestamp::now());
    Ok(Observed {
        now,
        claim,
        marker: st.marker(&ns, &names::weights(&name)),
        jobs,
        pods,
        setup_account,
        setup_role,
        setup_role_binding,
        deployment: st.deployment(&ns, &names::server(&name)),
        service: st.service(&ns, &names::server(&name)),
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
        let mut body = json!({
            "apiVersion": DeltafinModel::api_version(&()),
            "kind": DeltafinModel::kind(&()),
            "status": plan.status,
        });
        // `setupProgress` is the setup Job's: applying the copy read with the object could put
        // back an older report over a newer one.
        if let Some(s) = body["status"].as_object_mut() {
            s.remove("setupProgress");
        }
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
        Child::Pvc(o) => ssa::<PersistentVolumeClaim>(client, ns, &name, pp, o).await,
        Child::Marker(o) => ssa::<ConfigMap>(client, ns, &name, pp, o).await,
        Child::Job(o) => ssa::<Job>(client, ns, &name, pp, o).await,
        Child::Deployment(o) => ssa::<Deployment>(client, ns, &name, pp, o).await,
        Child::Service(o) => ssa::<Service>(client, ns, &name, pp, o).await,
        Child::ServiceAccount(o) => ssa::<ServiceAccount>(client, ns, &name, pp, o).await,
        Child::Role(o) => ssa::<Role>(client, ns, &name, pp, o).await,
        Child::RoleBinding(o) => ssa::<RoleBinding>(client, ns, &name, pp, o).await,
        Child::ServiceMonitor(o) => {
            Api::<DynamicObject>::namespaced_with(client.clone(), ns, &resources::service_monitor_resource())
                .patch(&name, pp, &Patch::Apply(o))
                .await?;
            Ok(())
        }
    }
}

/// Server-side apply of one namespaced object of a built-in kind.
async fn ssa<K>(client: &Client, ns: &str, name: &str, pp: &PatchParams, obj: &K) -> Result<()>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + serde::Serialize
        + serde::de::DeserializeOwned
        + Clone
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    Api::<K>::namespaced(client.clone(), ns)
        .patch(name, pp, &Patch::Apply(obj))
        .await?;
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
        if let Some(p) = ctx.stores.claim(&ns, &claim) {
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

/// The DeltafinModel that controls `obj` (its controller owner reference).
fn owner_model<K: Resource>(obj: &K) -> Option<ObjectRef<DeltafinModel>> {
    let ns = obj.meta().namespace.as_deref()?;
    obj.meta()
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true) && o.kind == "DeltafinModel")
        .map(|o| ObjectRef::new(&o.name).within(ns))
}

fn model_ref<K: Resource>(obj: &K) -> Option<ObjectRef<DeltafinModel>> {
    let name = obj.meta().labels.as_ref()?.get(MODEL_LABEL)?;
    Some(ObjectRef::new(name).within(obj.meta().namespace.as_deref()?))
}

/// The models a claim concerns: the one its label names (a claim the operator created), and
/// those whose `storage.existingClaim` is this claim (the user's, unlabelled: a model waiting for
/// it starts as soon as it appears).
pub fn claim_models(
    pvc: &PersistentVolumeClaim,
    models: &[Arc<DeltafinModel>],
) -> Vec<ObjectRef<DeltafinModel>> {
    let ns = pvc.namespace();
    let name = pvc.name_any();
    let mut refs: Vec<ObjectRef<DeltafinModel>> = models
        .iter()
        .filter(|m| {
            m.namespace() == ns
                && m.spec.storage.existing_claim.as_ref().map(|c| c.name.as_str()) == Some(name.as_str())
        })
        .map(|m| ObjectRef::from_obj(m.as_ref()))
        .collect();
    refs.extend(model_ref(pvc));
    refs
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

/// Runs the controller until SIGTERM/SIGINT; `ready` turns true once it watches. The watches
/// fill `writers` (the stores of `ctx`) and trigger reconciles.
pub async fn run(ctx: Arc<Context>, writers: Writers, namespace: Option<String>, ready: Arc<AtomicBool>) {
    let client = ctx.client.clone();
    let ns = namespace.as_deref();
    let managed = watcher::Config::default().labels(&cache::managed_selector());
    let weights = watcher::Config::default().labels(&cache::weights_selector());
    let Writers {
        jobs,
        pods,
        deployments,
        services,
        claims,
        markers,
        accounts,
        roles,
        role_bindings,
        service_monitors,
    } = writers;
    let (models, models_w) = kube::runtime::reflector::store();
    ctx.metrics.set_models(models.clone());
    let w = Watches {
        client: client.clone(),
        ns: namespace.clone(),
        metrics: ctx.metrics.clone(),
    };
    let own = |o: &DeltafinModel| Some(ObjectRef::from_obj(o));
    let models_cfg = watcher::Config::default().any_semantic();
    let mut controller = Controller::for_stream(w.watch(models_w, models_cfg, own), models.clone())
        .owns_stream(w.watch(deployments, managed.clone(), owner_model))
        .owns_stream(w.watch(jobs, managed.clone(), owner_model))
        .owns_stream(w.watch(services, managed.clone(), owner_model))
        .owns_stream(w.watch(accounts, managed.clone(), owner_model))
        .owns_stream(w.watch(roles, managed.clone(), owner_model))
        .owns_stream(w.watch(role_bindings, managed.clone(), owner_model))
        .watches_stream(w.watch(pods, managed.clone(), model_ref), |o: Pod| model_ref(&o))
        .watches_stream(w.watch(markers, weights, model_ref), |o: ConfigMap| model_ref(&o));
    let waiting = models.clone();
    let claims_of = move |o: &PersistentVolumeClaim| claim_models(o, &waiting.state());
    let claims = w.watch_with(claims, watcher::Config::default(), claims_of);
    controller = controller.watches_stream(claims, move |o: PersistentVolumeClaim| {
        claim_models(&o, &models.state())
    });
    if let Some(sm) = service_monitors {
        let ar = resources::service_monitor_resource();
        let sm_api = match ns {
            Some(ns) => Api::<DynamicObject>::namespaced_with(client.clone(), ns, &ar),
            None => Api::<DynamicObject>::all_with(client.clone(), &ar),
        };
        let queued = w.queued(owner_model::<DynamicObject>);
        let stream = reflector(sm, watcher(sm_api, managed))
            .default_backoff()
            .touched_objects()
            .inspect(move |r| r.iter().for_each(&queued));
        controller = controller.owns_stream_with(stream, ar);
    }
    ready.store(true, Ordering::SeqCst);
    info!(namespace = ns.unwrap_or("<all>"), "controller started");
    controller
        .shutdown_on_signal()
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

/// A namespaced built-in or custom kind the controller watches.
trait Watched:
    Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
    + Clone
    + serde::de::DeserializeOwned
    + std::fmt::Debug
    + Send
    + Sync
    + 'static
{
}

impl<K> Watched for K where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static
{
}

/// The watches of [`run`]: each fills its store, and every object it touches queues the models
/// it concerns in the queue-depth mirror ([`Metrics::triggered`]; models that no longer exist
/// are dropped there, as the controller skips them).
struct Watches {
    client: Client,
    ns: Option<String>,
    metrics: Arc<Metrics>,
}

impl Watches {
    /// A watch of `K` whose objects concern the model `model_of` names.
    fn watch<K: Watched>(
        &self,
        w: kube::runtime::reflector::store::Writer<K>,
        cfg: watcher::Config,
        model_of: fn(&K) -> Option<ObjectRef<DeltafinModel>>,
    ) -> impl futures::Stream<Item = std::result::Result<K, watcher::Error>> + Send + 'static {
        self.watch_with(w, cfg, move |o: &K| model_of(o).into_iter().collect())
    }

    /// A watch of `K` whose objects concern the models `models_of` names.
    fn watch_with<K: Watched>(
        &self,
        w: kube::runtime::reflector::store::Writer<K>,
        cfg: watcher::Config,
        models_of: impl Fn(&K) -> Vec<ObjectRef<DeltafinModel>> + Send + Sync + 'static,
    ) -> impl futures::Stream<Item = std::result::Result<K, watcher::Error>> + Send + 'static {
        let queued = self.queued_many(models_of);
        reflector(w, watcher(api(&self.client, self.ns.as_deref()), cfg))
            .default_backoff()
            .touched_objects()
            .inspect(move |r| r.iter().for_each(&queued))
    }

    /// Queues the model `model_of` names.
    fn queued<K: 'static>(
        &self,
        model_of: fn(&K) -> Option<ObjectRef<DeltafinModel>>,
    ) -> impl Fn(&K) + Send + 'static {
        self.queued_many(move |o: &K| model_of(o).into_iter().collect())
    }

    fn queued_many<K>(
        &self,
        models_of: impl Fn(&K) -> Vec<ObjectRef<DeltafinModel>> + Send + 'static,
    ) -> impl Fn(&K) + Send + 'static {
        let metrics = self.metrics.clone();
        move |o| {
            for r in models_of(o) {
                metrics.triggered(&r);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(ns: &str, name: &str, storage: serde_json::Value) -> Arc<DeltafinModel> {
        Arc::new(
            serde_json::from_value(json!({
                "apiVersion": "deltafin.dev/v1alpha1", "kind": "DeltafinModel",
                "metadata": {"name": name, "namespace": ns},
                "spec": {"source": {"preloaded": {}}, "storage": storage},
            }))
            .expect("model"),
        )
    }

    #[test]
    fn a_user_claim_wakes_the_models_waiting_for_it_and_a_labelled_claim_its_model() {
        let models = [
            model("a", "waits", json!({"existingClaim": {"name": "mine"}})),
            model("b", "elsewhere", json!({"existingClaim": {"name": "mine"}})),
            model("a", "own", json!({"pvc": {"size": "1Gi"}})),
        ];
        let pvc = |name: &str, label: Option<&str>| {
            let mut p = PersistentVolumeClaim::default();
            p.metadata.name = Some(name.into());
            p.metadata.namespace = Some("a".into());
            if let Some(l) = label {
                p.metadata.labels = Some([(MODEL_LABEL.to_string(), l.to_string())].into());
            }
            p
        };
        let names = |refs: Vec<ObjectRef<DeltafinModel>>| -> Vec<String> {
            refs.into_iter()
                .map(|r| format!("{}/{}", r.namespace.unwrap_or_default(), r.name))
                .collect()
        };
        assert_eq!(names(claim_models(&pvc("mine", None), &models)), ["a/waits"]);
        assert_eq!(
            names(claim_models(&pvc("own-weights", Some("own")), &models)),
            ["a/own"]
        );
        assert!(claim_models(&pvc("other", None), &models).is_empty());
    }
}

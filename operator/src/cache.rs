//! Reflector stores of every kind a reconcile reads, so that [`crate::controller::observe`]
//! makes no API request: the controller's watches fill the stores (the same watches that trigger
//! reconciles), and a reconcile reads the stores.
//!
//! Scope of each watch (the chart's RBAC grants list/watch on exactly these):
//! - Jobs, Deployments, Services, Pods and the setup reporter's ServiceAccounts, Roles and
//!   RoleBindings labelled `app.kubernetes.io/managed-by=deltafin-operator`
//!   (every child and its pods carry the label);
//! - weights marker ConfigMaps (`component=weights`, managed by the operator);
//! - every PersistentVolumeClaim (a `storage.existingClaim` is the user's, without our labels);
//! - ServiceMonitors (managed by the operator), only where the Prometheus Operator CRD is served.

use std::sync::Arc;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{ApiResource, DynamicObject};
use kube::runtime::reflector::{self, ObjectRef, Store, store::Writer};
use kube::{Resource, ResourceExt};
use tokio::sync::OnceCell;

use crate::names::{MANAGER, MODEL_LABEL};
use crate::resources;

/// Label selector of the operator's children (and of their pods).
pub fn managed_selector() -> String {
    format!("app.kubernetes.io/managed-by={MANAGER}")
}

/// Label selector of the weights marker ConfigMaps.
pub fn weights_selector() -> String {
    format!("app.kubernetes.io/managed-by={MANAGER},app.kubernetes.io/component=weights")
}

/// The read side: what reconciles read.
#[derive(Clone)]
pub struct Stores {
    /// Jobs (setup, pre-flight).
    pub jobs: Store<Job>,
    /// Pods of the Jobs and of the server.
    pub pods: Store<Pod>,
    /// Server Deployments.
    pub deployments: Store<Deployment>,
    /// Services.
    pub services: Store<Service>,
    /// All claims.
    pub claims: Store<PersistentVolumeClaim>,
    /// Weights markers.
    pub markers: Store<ConfigMap>,
    /// The setup reporters' ServiceAccounts.
    pub accounts: Store<ServiceAccount>,
    /// The setup reporters' Roles.
    pub roles: Store<Role>,
    /// The setup reporters' RoleBindings.
    pub role_bindings: Store<RoleBinding>,
    /// ServiceMonitors, where served.
    pub service_monitors: Option<Store<DynamicObject>>,
    /// Set once every store has listed. One waiter per store: a store's own readiness future
    /// wakes only the task that polled it last, so concurrent reconciles must not each wait on it.
    ready: Arc<OnceCell<()>>,
}

/// The write side, handed to the watches ([`crate::controller::run`]) or, in tests, filled by hand.
pub struct Writers {
    /// See [`Stores::jobs`].
    pub jobs: Writer<Job>,
    /// See [`Stores::pods`].
    pub pods: Writer<Pod>,
    /// See [`Stores::deployments`].
    pub deployments: Writer<Deployment>,
    /// See [`Stores::services`].
    pub services: Writer<Service>,
    /// See [`Stores::claims`].
    pub claims: Writer<PersistentVolumeClaim>,
    /// See [`Stores::markers`].
    pub markers: Writer<ConfigMap>,
    /// See [`Stores::accounts`].
    pub accounts: Writer<ServiceAccount>,
    /// See [`Stores::roles`].
    pub roles: Writer<Role>,
    /// See [`Stores::role_bindings`].
    pub role_bindings: Writer<RoleBinding>,
    /// See [`Stores::service_monitors`].
    pub service_monitors: Option<Writer<DynamicObject>>,
}

impl std::fmt::Debug for Writers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writers").finish_non_exhaustive()
    }
}

impl std::fmt::Debug for Stores {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stores")
            .field("jobs", &self.jobs.len())
            .field("pods", &self.pods.len())
            .field("deployments", &self.deployments.len())
            .finish_non_exhaustive()
    }
}

/// New empty stores; `service_monitors` when the ServiceMonitor CRD is served.
pub fn stores(service_monitors: bool) -> (Stores, Writers) {
    let (jobs, jobs_w) = reflector::store();
    let (pods, pods_w) = reflector::store();
    let (deployments, deployments_w) = reflector::store();
    let (services, services_w) = reflector::store();
    let (claims, claims_w) = reflector::store();
    let (markers, markers_w) = reflector::store();
    let (accounts, accounts_w) = reflector::store();
    let (roles, roles_w) = reflector::store();
    let (role_bindings, role_bindings_w) = reflector::store();
    let sm_w = service_monitors.then(|| Writer::new(resources::service_monitor_resource()));
    let stores = Stores {
        jobs,
        pods,
        deployments,
        services,
        claims,
        markers,
        accounts,
        roles,
        role_bindings,
        service_monitors: sm_w.as_ref().map(Writer::as_reader),
        ready: Arc::default(),
    };
    let writers = Writers {
        jobs: jobs_w,
        pods: pods_w,
        deployments: deployments_w,
        services: services_w,
        claims: claims_w,
        markers: markers_w,
        accounts: accounts_w,
        roles: roles_w,
        role_bindings: role_bindings_w,
        service_monitors: sm_w,
    };
    (stores, writers)
}

/// Whether `obj` lives in `ns` and carries the model label `name`.
fn of_model<K: Resource>(obj: &K, ns: &str, name: &str) -> bool {
    obj.meta().namespace.as_deref() == Some(ns)
        && obj.labels().get(MODEL_LABEL).map(String::as_str) == Some(name)
}

fn named<K>(store: &Store<K>, ns: &str, name: &str) -> Option<K>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    store.get(&ObjectRef::new(name).within(ns)).map(|o| (*o).clone())
}

impl Stores {
    /// Waits until every watch has listed once (a reconcile before that would see nothing).
    pub async fn ready(&self) {
        self.ready.get_or_init(|| self.wait_all()).await;
    }

    async fn wait_all(&self) {
        // A dropped writer means the controller is shutting down; nothing to wait for then.
        let _ = self.jobs.wait_until_ready().await;
        let _ = self.pods.wait_until_ready().await;
        let _ = self.deployments.wait_until_ready().await;
        let _ = self.services.wait_until_ready().await;
        let _ = self.claims.wait_until_ready().await;
        let _ = self.markers.wait_until_ready().await;
        let _ = self.accounts.wait_until_ready().await;
        let _ = self.roles.wait_until_ready().await;
        let _ = self.role_bindings.wait_until_ready().await;
        if let Some(s) = &self.service_monitors {
            let _ = s.wait_until_ready().await;
        }
    }

    /// The claim `name` in `ns`.
    pub fn claim(&self, ns: &str, name: &str) -> Option<PersistentVolumeClaim> {
        named(&self.claims, ns, name)
    }

    /// The marker ConfigMap `name` in `ns`.
    pub fn marker(&self, ns: &str, name: &str) -> Option<ConfigMap> {
        named(&self.markers, ns, name)
    }

    /// The Deployment `name` in `ns`.
    pub fn deployment(&self, ns: &str, name: &str) -> Option<Deployment> {
        named(&self.deployments, ns, name)
    }

    /// The Service `name` in `ns`.
    pub fn service(&self, ns: &str, name: &str) -> Option<Service> {
        named(&self.services, ns, name)
    }

    /// The setup reporter of model `name` in `ns`: its ServiceAccount, Role and RoleBinding.
    pub fn setup_reporter(
        &self,
        ns: &str,
        name: &str,
    ) -> (Option<ServiceAccount>, Option<Role>, Option<RoleBinding>) {
        let n = crate::names::setup_reporter(name);
        (
            named(&self.accounts, ns, &n),
            named(&self.roles, ns, &n),
            named(&self.role_bindings, ns, &n),
        )
    }

    /// The ServiceMonitor `name` in `ns` (none where not served).
    pub fn service_monitor(&self, ns: &str, name: &str) -> Option<DynamicObject> {
        let store = self.service_monitors.as_ref()?;
        let ar: ApiResource = resources::service_monitor_resource();
        store
            .get(&ObjectRef::new_with(name, ar).within(ns))
            .map(|o| (*o).clone())
    }

    /// The Jobs of model `name` in `ns`, by name.
    pub fn jobs_of(&self, ns: &str, name: &str) -> Vec<Job> {
        let mut v: Vec<Job> = self
            .jobs
            .state_filter(|j| of_model(j, ns, name))
            .into_iter()
            .map(|j| (*j).clone())
            .collect();
        v.sort_by_key(ResourceExt::name_any);
        v
    }

    /// The pods of model `name` in `ns`, by name.
    pub fn pods_of(&self, ns: &str, name: &str) -> Vec<Pod> {
        let mut v: Vec<Pod> = self
            .pods
            .state_filter(|p| of_model(p, ns, name))
            .into_iter()
            .map(|p| (*p).clone())
            .collect();
        v.sort_by_key(ResourceExt::name_any);
        v
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use kube::runtime::watcher::Event;

    use super::*;

    fn list_empty<K>(w: &mut Writer<K>)
    where
        K: Resource + Clone + 'static,
        K::DynamicType: Clone + Eq + std::hash::Hash,
    {
        w.apply_watcher_event(&Event::Init);
        w.apply_watcher_event(&Event::InitDone);
    }

    /// Many reconciles wait at once (every model at start): all of them must wake.
    #[tokio::test]
    async fn every_concurrent_waiter_wakes_when_the_stores_are_listed() {
        let (stores, mut w) = stores(false);
        let waiters: Vec<_> = (0..8)
            .map(|_| {
                let s = stores.clone();
                tokio::spawn(async move { s.ready().await })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(50)).await;
        list_empty(&mut w.jobs);
        list_empty(&mut w.pods);
        list_empty(&mut w.deployments);
        list_empty(&mut w.services);
        list_empty(&mut w.claims);
        list_empty(&mut w.markers);
        list_empty(&mut w.accounts);
        list_empty(&mut w.roles);
        list_empty(&mut w.role_bindings);
        for h in waiters {
            tokio::time::timeout(Duration::from_secs(5), h)
                .await
                .expect("a waiter was not woken")
                .expect("waiter task");
        }
    }
}

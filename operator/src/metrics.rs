//! The operator's own Prometheus metrics (`deltafin_operator_*`), served on `/metrics`.

use std::sync::{Mutex, OnceLock};
use std::time::Instant;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use kube::runtime::reflector::{ObjectRef, Store};

use crate::crd::DeltafinModel;
use crate::queue::WorkQueue;

/// Label of `deltafin_operator_reconcile_errors_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    /// [`crate::Error::metric_label`].
    pub error: String,
}

/// Label of `deltafin_operator_writes_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WriteLabels {
    /// Object kind (or `status`, `event`).
    pub kind: String,
}

/// Labels of `deltafin_operator_api_requests_total` ([`crate::requests::classify`]).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ApiLabels {
    /// `get`, `list`, `watch`, `log`, `create`, `patch`, `update`, `delete`, `discovery`.
    pub verb: String,
    /// Plural resource (`jobs`, `deltafinmodels/status`).
    pub resource: String,
}

/// Labels of `deltafin_operator_weights_bytes`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WeightsLabels {
    /// DeltafinModel namespace.
    pub namespace: String,
    /// DeltafinModel name.
    pub name: String,
    /// `done` or `total`.
    pub kind: String,
}

/// All operator metrics and their registry.
#[derive(Debug)]
pub struct Metrics {
    registry: Mutex<Registry>,
    /// `deltafin_operator_reconciliations_total`.
    pub reconciliations: Counter,
    /// `deltafin_operator_reconcile_errors_total{error}`.
    pub errors: Family<ErrorLabels, Counter>,
    /// `deltafin_operator_reconcile_duration_seconds`.
    pub duration: Histogram,
    /// `deltafin_operator_writes_total{kind}`: writes sent, every server-side apply included (an
    /// unchanged apply changes nothing on the server; see `api_requests` for all requests).
    pub writes: Family<WriteLabels, Counter>,
    /// `deltafin_operator_weights_bytes{namespace,name,kind}`: download progress.
    pub weights_bytes: Family<WeightsLabels, Gauge>,
    /// `deltafin_operator_api_requests_total{verb,resource}`: every request to the API server.
    pub api_requests: Family<ApiLabels, Counter>,
    /// `deltafin_operator_last_success_timestamp_seconds`: end of the last successful reconcile
    /// (its age is `time() - ...`).
    pub last_success: Gauge,
    /// `deltafin_operator_queue_depth`: models due for a reconcile that has not started
    /// ([`crate::queue`]), computed when scraped.
    pub queue_depth: Gauge,
    queue: Mutex<WorkQueue<ObjectRef<DeltafinModel>>>,
    models: OnceLock<Store<DeltafinModel>>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("deltafin_operator");
        let reconciliations = Counter::default();
        let errors = Family::<ErrorLabels, Counter>::default();
        let duration = Histogram::new([0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0]);
        let writes = Family::<WriteLabels, Counter>::default();
        let weights_bytes = Family::<WeightsLabels, Gauge>::default();
        let api_requests = Family::<ApiLabels, Counter>::default();
        let last_success = Gauge::default();
        let queue_depth = Gauge::default();
        registry.register(
            "queue_depth",
            "DeltafinModels due for a reconcile that has not started (watch events and due requeues, one per model)",
            queue_depth.clone(),
        );
        registry.register(
            "api_requests",
            "Requests to the Kubernetes API server, by verb and resource",
            api_requests.clone(),
        );
        registry.register(
            "last_success_timestamp_seconds",
            "Unix time of the end of the last successful reconcile",
            last_success.clone(),
        );
        registry.register("reconciliations", "Reconciles started", reconciliations.clone());
        registry.register(
            "reconcile_errors",
            "Reconciles that failed, by error kind",
            errors.clone(),
        );
        registry.register(
            "reconcile_duration_seconds",
            "Duration of one reconcile",
            duration.clone(),
        );
        registry.register("writes", "Writes to the Kubernetes API, by kind", writes.clone());
        registry.register(
            "weights_bytes",
            "Weights install progress in bytes",
            weights_bytes.clone(),
        );
        Self {
            registry: Mutex::new(registry),
            reconciliations,
            errors,
            duration,
            writes,
            weights_bytes,
            api_requests,
            last_success,
            queue_depth,
            queue: Mutex::default(),
            models: OnceLock::new(),
        }
    }
}

impl Metrics {
    /// Counts a reconcile and returns a guard that observes its duration when dropped (so an
    /// early return cannot skip the sample).
    pub fn reconcile(&self) -> ReconcileTimer<'_> {
        self.reconciliations.inc();
        ReconcileTimer {
            metrics: self,
            start: Instant::now(),
        }
    }

    /// A watch event concerns `model`: it is queued now.
    pub fn triggered(&self, model: &ObjectRef<DeltafinModel>) {
        self.queue().schedule(model, Instant::now());
    }

    /// The reconcile of `model` started.
    pub fn started(&self, model: &ObjectRef<DeltafinModel>) {
        self.queue().start(model);
    }

    /// The reconcile of `model` ended and asked to run again after `after`.
    pub fn requeued(&self, model: &ObjectRef<DeltafinModel>, after: std::time::Duration) {
        self.queue().schedule(model, Instant::now() + after);
    }

    /// The models that exist (the controller's store): the queue depth counts only those.
    pub fn set_models(&self, models: Store<DeltafinModel>) {
        let _ = self.models.set(models);
    }

    fn queue(&self) -> std::sync::MutexGuard<'_, WorkQueue<ObjectRef<DeltafinModel>>> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts a failed reconcile.
    pub fn failure(&self, error: &crate::Error) {
        self.errors
            .get_or_create(&ErrorLabels {
                error: error.metric_label().into(),
            })
            .inc();
    }

    /// Counts a request to the API server.
    pub fn api_request(&self, verb: &str, resource: &str) {
        self.api_requests
            .get_or_create(&ApiLabels {
                verb: verb.into(),
                resource: resource.into(),
            })
            .inc();
    }

    /// Records the end of a successful reconcile.
    pub fn success(&self) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        self.last_success.set(i64::try_from(now).unwrap_or(i64::MAX));
    }

    /// Counts a write.
    pub fn write(&self, kind: &str) {
        self.writes
            .get_or_create(&WriteLabels { kind: kind.into() })
            .inc();
    }

    /// Sets download progress of one model.
    pub fn set_weights(&self, namespace: &str, name: &str, done: Option<i64>, total: Option<i64>) {
        for (kind, v) in [("done", done), ("total", total)] {
            let l = WeightsLabels {
                namespace: namespace.into(),
                name: name.into(),
                kind: kind.into(),
            };
            self.weights_bytes.get_or_create(&l).set(v.unwrap_or(0));
        }
    }

    /// Forgets a deleted model's gauges.
    pub fn forget(&self, namespace: &str, name: &str) {
        for kind in ["done", "total"] {
            let l = WeightsLabels {
                namespace: namespace.into(),
                name: name.into(),
                kind: kind.into(),
            };
            self.weights_bytes.remove(&l);
        }
    }

    /// Text exposition (OpenMetrics).
    pub fn render(&self) -> String {
        let exists =
            |model: &ObjectRef<DeltafinModel>| self.models.get().is_none_or(|s| s.get(model).is_some());
        let depth = self.queue().depth(Instant::now(), exists);
        self.queue_depth.set(i64::try_from(depth).unwrap_or(i64::MAX));
        let mut out = String::new();
        let registry = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &registry);
        out
    }
}

/// Observes the reconcile duration on drop.
#[derive(Debug)]
pub struct ReconcileTimer<'a> {
    metrics: &'a Metrics,
    start: Instant,
}

impl Drop for ReconcileTimer<'_> {
    fn drop(&mut self) {
        self.metrics.duration.observe(self.start.elapsed().as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_operator_metrics() {
        let m = Metrics::default();
        drop(m.reconcile());
        m.write("Job");
        m.set_weights("ai", "k2", Some(5), Some(10));
        let model = |name: &str| ObjectRef::<DeltafinModel>::new(name).within("ai");
        m.triggered(&model("k2"));
        m.triggered(&model("k3"));
        m.started(&model("k3"));
        m.requeued(&model("k3"), std::time::Duration::from_secs(300));
        let text = m.render();
        for needle in [
            "deltafin_operator_reconciliations_total 1",
            "deltafin_operator_reconcile_duration_seconds_count 1",
            "deltafin_operator_writes_total{kind=\"Job\"} 1",
            "deltafin_operator_weights_bytes{namespace=\"ai\",name=\"k2\",kind=\"total\"} 10",
            "deltafin_operator_queue_depth 1",
        ] {
            assert!(text.contains(needle), "{needle} missing from\n{text}");
        }
    }
}

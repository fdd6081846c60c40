//! Counts every request the operator's client sends to the API server, by verb and resource
//! (`deltafin_operator_api_requests_total`): a tower layer in front of the kube client. This is
//! how "a no-op reconcile reads nothing but caches" is measured, in the envtest tier and in a
//! cluster. [`classify`] is pure and tested here.

use std::sync::Arc;
use std::task::{Context, Poll};

use crate::metrics::Metrics;

/// `(verb, resource)` of a request: verbs are `get`, `list`, `watch`, `log`, `create`, `patch`,
/// `update`, `delete`, or `discovery` (paths outside `/api/v1` and `/apis/G/V`, e.g. `/version`).
/// The resource is the plural (`jobs`), with `/status` for that subresource.
pub fn classify(method: &str, path: &str, query: &str) -> (&'static str, String) {
    let rest = if let Some(r) = path.strip_prefix("/api/v1/") {
        r
    } else if let Some(r) = path.strip_prefix("/apis/") {
        // group/version/...
        match r.splitn(3, '/').nth(2) {
            Some(r) => r,
            None => return ("discovery", String::new()),
        }
    } else {
        return ("discovery", String::new());
    };
    let segs: Vec<&str> = rest.split('/').filter(|s| !s.is_empty()).collect();
    // namespaces/NS/RESOURCE[/NAME[/SUB]] or RESOURCE[/NAME[/SUB]] (namespaces itself included).
    let tail: &[&str] = match segs.as_slice() {
        ["namespaces", _, tail @ ..] if !tail.is_empty() => tail,
        all => all,
    };
    let resource = match tail {
        [r] | [r, _] => (*r).to_string(),
        [r, _, sub, ..] => format!("{r}/{sub}"),
        [] => String::new(),
    };
    let named = tail.len() >= 2;
    let watch = query.split('&').any(|kv| kv == "watch=true" || kv == "watch=1");
    let verb = match method {
        "GET" if watch => "watch",
        "GET" if tail.get(2) == Some(&"log") => "log",
        "GET" if named => "get",
        "GET" => "list",
        "POST" => "create",
        "PATCH" => "patch",
        "PUT" => "update",
        "DELETE" => "delete",
        _ => "other",
    };
    (verb, resource)
}

/// The layer: `ClientBuilder::with_layer(&CountRequests::new(metrics))`.
#[derive(Clone, Debug)]
pub struct CountRequests {
    metrics: Arc<Metrics>,
}

impl CountRequests {
    /// Counts into `metrics`.
    pub fn new(metrics: Arc<Metrics>) -> Self {
        Self { metrics }
    }
}

impl<S> tower::Layer<S> for CountRequests {
    type Service = Counted<S>;

    fn layer(&self, inner: S) -> Counted<S> {
        Counted {
            inner,
            metrics: self.metrics.clone(),
        }
    }
}

/// The service [`CountRequests`] wraps around the client's.
#[derive(Clone, Debug)]
pub struct Counted<S> {
    inner: S,
    metrics: Arc<Metrics>,
}

impl<S, B> tower::Service<http::Request<B>> for Counted<S>
where
    S: tower::Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let uri = req.uri();
        let (verb, resource) = classify(req.method().as_str(), uri.path(), uri.query().unwrap_or(""));
        self.metrics.api_request(verb, &resource);
        self.inner.call(req)
    }
}

#[cfg(test)]
mod tests {
    use super::classify;

    #[test]
    fn verbs_and_resources() {
        let c = |m, p, q| {
            let (v, r) = classify(m, p, q);
            format!("{v} {r}")
        };
        assert_eq!(
            c("GET", "/apis/batch/v1/namespaces/a/jobs", "labelSelector=x"),
            "list jobs"
        );
        assert_eq!(
            c("GET", "/apis/batch/v1/jobs", "watch=true&resourceVersion=1"),
            "watch jobs"
        );
        assert_eq!(c("GET", "/api/v1/namespaces/a/services/s", ""), "get services");
        assert_eq!(
            c("GET", "/api/v1/namespaces/a/pods/p/log", "container=setup"),
            "log pods/log"
        );
        assert_eq!(
            c(
                "PATCH",
                "/apis/deltafin.dev/v1alpha1/namespaces/a/deltafinmodels/m/status",
                "fieldManager=x"
            ),
            "patch deltafinmodels/status"
        );
        assert_eq!(
            c("POST", "/apis/events.k8s.io/v1/namespaces/a/events", ""),
            "create events"
        );
        assert_eq!(
            c("DELETE", "/apis/batch/v1/namespaces/a/jobs/j", ""),
            "delete jobs"
        );
        assert_eq!(c("GET", "/api/v1/namespaces", ""), "list namespaces");
        assert_eq!(c("GET", "/version", ""), "discovery ");
        assert_eq!(c("GET", "/apis/monitoring.coreos.com/v1", ""), "discovery ");
    }
}

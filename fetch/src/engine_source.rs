//! The engine's view of a stream install: [`EngineSource`] owns a [`StreamStore`] together with
//! the async runtime its fetches run on, and implements the engine's
//! [`RangeSource`](deltafin_engine::weights::RangeSource), so the out-of-core expert store makes
//! routed experts local through the store's coalesced, crash-safe, verify-on-completion path.
//! The engine itself never sees HTTP.
//!
//! [`EngineSource::remote_weights`] is what `deltafin run` / `serve` put into
//! `OocOptions::remote`: every shard with the file to read it from now (the staged partial until
//! the shard completes; publication is a rename, so the engine's open files stay valid).

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use deltafin_engine::cache::RemoteWeights;
use deltafin_engine::weights::{RangeSource, ShardFile};

use crate::error::{Error, Result};
use crate::manifest::{Manifest, Mode};
use crate::retry::RetryPolicy;
use crate::source::Remote;
use crate::stream::StreamStore;

/// Whether `dir` holds a stream install that still has remote bytes (its manifest says `stream`;
/// a stream install whose every shard arrived is recorded as `full`). `None` without a manifest.
pub fn stream_manifest(dir: &Path) -> Result<Option<Manifest>> {
    Ok(Manifest::load(dir)?.filter(|m| m.mode == Mode::Stream))
}

/// A [`StreamStore`] with its own runtime, usable from plain threads (holds the directory lock).
#[derive(Debug)]
pub struct EngineSource {
    store: StreamStore,
    runtime: Option<tokio::runtime::Runtime>,
}

impl EngineSource {
    /// Open the stream install in `dir` (made from `remote`) and check that every byte it keeps
    /// locally is present. Fetches run on a private two-thread runtime.
    pub fn open(dir: &Path, remote: Remote, policy: RetryPolicy) -> Result<Arc<EngineSource>> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("deltafin-fetch")
            .enable_all()
            .build()
            .map_err(|e| Error::io("the fetch runtime", e))?;
        let store = StreamStore::open(dir, remote, runtime.handle().clone(), policy)?;
        store.check_resident()?;
        Ok(Arc::new(EngineSource {
            store,
            runtime: Some(runtime),
        }))
    }

    /// The underlying store (stats, catalog, `ensure_*`).
    pub fn store(&self) -> &StreamStore {
        &self.store
    }

    /// The checkpoint's shards (`*.safetensors` at the top of the directory, by name) and the
    /// file each is read from now.
    pub fn shards(&self) -> Vec<ShardFile> {
        let mut names: Vec<String> = self
            .store
            .files()
            .into_iter()
            .map(|(path, _)| path)
            .filter(|p| p.ends_with(".safetensors") && !p.contains('/'))
            .collect();
        names.sort();
        names
            .into_iter()
            .filter_map(|name| {
                let path = self.store.local_path(&name)?;
                Some(ShardFile { name, path })
            })
            .collect()
    }

    /// What the engine's out-of-core loader needs: the shards and this source, fetching up to
    /// `parallel` missing ranges at once.
    pub fn remote_weights(self: &Arc<Self>, parallel: usize) -> RemoteWeights {
        RemoteWeights {
            shards: self.shards(),
            source: self.clone(),
            parallel,
        }
    }
}

impl RangeSource for EngineSource {
    fn is_local(&self, file: &str, range: &Range<u64>) -> bool {
        self.store.is_local(file, range)
    }

    fn make_local(&self, file: &str, range: &Range<u64>) -> deltafin_engine::Result<PathBuf> {
        use crate::stream::ExpertSource;
        self.store
            .ensure_range(file, range.clone())
            .map_err(|e| deltafin_engine::Error::Remote {
                file: file.to_string(),
                start: range.start,
                end: range.end,
                reason: e.to_string(),
            })
    }
}

impl Drop for EngineSource {
    fn drop(&mut self) {
        // The last owner may be dropped inside another runtime (a server shutting down), where
        // a blocking shutdown would panic.
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

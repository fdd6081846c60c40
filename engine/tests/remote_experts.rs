//! The out-of-core expert store over a partly remote checkpoint, with a fake [`RangeSource`] (no
//! network): only the ranges of routed experts are asked for, each once, before they are read;
//! results are bit-identical; a failing source is a `remote` error; a source that puts the bytes
//! in another file than the one being read is refused.

use std::collections::BTreeSet;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use deltafin_engine::arch::{self, Model};
use deltafin_engine::cache::{OocOptions, RemoteWeights};
use deltafin_engine::generate::{Flow, GenerateOptions, generate};
use deltafin_engine::synth::{DeepseekSynth, ExpertFormat};
use deltafin_engine::weights::{RangeSource, ShardFile};
use deltafin_engine::{Error, Result};

/// Every byte is "remote" until asked for; then it is local.
#[derive(Debug)]
struct Fake {
    dir: PathBuf,
    local: Mutex<Vec<(String, Range<u64>)>>,
    asked: Mutex<Vec<(String, Range<u64>)>>,
    fail: bool,
    wrong_path: Option<PathBuf>,
}

impl RangeSource for Fake {
    fn is_local(&self, file: &str, range: &Range<u64>) -> bool {
        self.local
            .lock()
            .unwrap()
            .iter()
            .any(|(f, r)| f == file && r.start <= range.start && range.end <= r.end)
    }

    fn make_local(&self, file: &str, range: &Range<u64>) -> Result<PathBuf> {
        self.asked.lock().unwrap().push((file.to_string(), range.clone()));
        if self.fail {
            return Err(Error::Remote {
                file: file.into(),
                start: range.start,
                end: range.end,
                reason: "HTTP 503".into(),
            });
        }
        self.local.lock().unwrap().push((file.to_string(), range.clone()));
        Ok(self.wrong_path.clone().unwrap_or_else(|| self.dir.join(file)))
    }
}

fn model_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    DeepseekSynth {
        experts: 32,
        ..DeepseekSynth::tiny(ExpertFormat::Bf16)
    }
    .write(dir.path())
    .unwrap();
    dir
}

fn load(dir: &Path, fake: Arc<Fake>) -> (Box<dyn Model>, deltafin_engine::cache::OocRuntime) {
    let mut shards: Vec<ShardFile> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".safetensors"))
        .map(|name| ShardFile {
            path: dir.join(&name),
            name,
        })
        .collect();
    shards.sort_by(|a, b| a.name.cmp(&b.name));
    let mut o = OocOptions::with_budget(u64::MAX / 4);
    o.remote = Some(RemoteWeights {
        shards,
        source: fake,
        parallel: 3,
    });
    o.route_trace = Some(dir.join("routes.jsonl"));
    arch::load_budgeted(dir, &o).unwrap()
}

fn fake(dir: &Path) -> Fake {
    Fake {
        dir: dir.into(),
        local: Mutex::default(),
        asked: Mutex::default(),
        fail: false,
        wrong_path: None,
    }
}

fn greedy(m: &dyn Model) -> Result<Vec<u32>> {
    let opts = GenerateOptions {
        max_new_tokens: 5,
        prefill_chunk: 3,
        ..Default::default()
    };
    let mut s = m.new_state();
    Ok(generate(m, &mut s, &[3, 1, 4, 1, 5], &opts, |_| Flow::Continue)?.output_ids)
}

#[test]
fn only_routed_expert_ranges_are_asked_for_once_and_results_are_exact() {
    let dir = model_dir();
    let want = greedy(arch::load(dir.path()).unwrap().as_ref()).unwrap();
    let f = Arc::new(fake(dir.path()));
    let (m, rt) = load(dir.path(), f.clone());
    assert!(f.asked.lock().unwrap().is_empty(), "loading asks for nothing");
    assert_eq!(greedy(m.as_ref()).unwrap(), want);
    let asked = f.asked.lock().unwrap().clone();
    let unique: BTreeSet<_> = asked.iter().map(|(f, r)| (f.clone(), r.start, r.end)).collect();
    assert_eq!(
        unique.len(),
        asked.len(),
        "each range is asked for once: {asked:?}"
    );
    let routed = deltafin_engine::cache::routes::RouteCounts::read(&dir.path().join("routes.jsonl")).unwrap();
    assert_eq!(rt.stats().experts.remote_experts, routed.counts.len() as u64);
    assert!(routed.counts.len() < 64, "a strict subset is routed");
    // Every asked range lies inside one routed expert's tensors.
    let index = deltafin_engine::weights::WeightIndex::open(dir.path()).unwrap();
    for (file, r) in &asked {
        let owner: Vec<&str> = index
            .names()
            .filter(|n| {
                let i = index.info(n).unwrap();
                index.shard_name(i.shard) == file && i.offset < r.end && r.start < i.offset + i.len
            })
            .collect();
        assert!(
            !owner.is_empty() && owner.iter().all(|n| n.contains(".mlp.experts.")),
            "{file} {r:?}: {owner:?}"
        );
        let keys: BTreeSet<(u32, u32)> = owner
            .iter()
            .map(|n| {
                let l = n
                    .split("layers.")
                    .nth(1)
                    .unwrap()
                    .split('.')
                    .next()
                    .unwrap()
                    .parse()
                    .unwrap();
                let e = n
                    .split("experts.")
                    .nth(1)
                    .unwrap()
                    .split('.')
                    .next()
                    .unwrap()
                    .parse()
                    .unwrap();
                (l, e)
            })
            .collect();
        assert_eq!(keys.len(), 1, "one expert per range: {owner:?}");
        let key = keys.into_iter().next().unwrap();
        assert!(
            routed.counts.keys().any(|k| (k.layer, k.expert) == key),
            "{key:?} was not routed"
        );
    }
    // Again: all local, nothing asked.
    assert_eq!(greedy(m.as_ref()).unwrap(), want);
    assert_eq!(f.asked.lock().unwrap().len(), asked.len());
}

#[test]
fn a_failing_source_is_a_remote_error_and_a_wrong_file_is_refused() {
    let dir = model_dir();
    let (m, _rt) = load(
        dir.path(),
        Arc::new(Fake {
            fail: true,
            ..fake(dir.path())
        }),
    );
    let e = greedy(m.as_ref()).unwrap_err();
    assert_eq!(e.kind(), "remote");
    assert!(
        e.to_string().contains(".safetensors: bytes ") && e.to_string().contains("HTTP 503"),
        "{e}"
    );

    let copy = dir.path().join("elsewhere.bin");
    std::fs::write(&copy, b"x").unwrap();
    let (m, _rt) = load(
        dir.path(),
        Arc::new(Fake {
            wrong_path: Some(copy),
            ..fake(dir.path())
        }),
    );
    let e = greedy(m.as_ref()).unwrap_err();
    assert_eq!(e.kind(), "remote");
    assert!(e.to_string().contains("not the file being read"), "{e}");
}

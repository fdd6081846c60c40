//! Malformed copies of a fixture for the bad-input tests: its config edited, or one tensor
//! dropped or reshaped in its shard (the bytes kept).

use std::path::Path;

use deltafin_engine::weights::{TensorSpec, WeightIndex, write_safetensors};
use serde_json::Value;

/// A copy of fixture `name` in a temporary directory.
pub fn copy_fixture(name: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(super::fixture(name)).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, dir.path().join(path.file_name().unwrap())).unwrap();
    }
    dir
}

/// A copy of fixture `name` with its `config.json` edited.
pub fn with_config(name: &str, edit: impl FnOnce(&mut Value)) -> tempfile::TempDir {
    let dir = copy_fixture(name);
    let path = dir.path().join("config.json");
    let mut config: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    edit(&mut config);
    std::fs::write(&path, config.to_string()).unwrap();
    dir
}

/// A copy of fixture `name` with tensor `target` dropped (`shape` `None`) or given another shape
/// of the same byte size.
pub fn with_tensor(name: &str, target: &str, shape: Option<&[usize]>) -> tempfile::TempDir {
    let dir = copy_fixture(name);
    alter_tensor(dir.path(), target, shape);
    dir
}

/// Rewrite the shard of checkpoint `dir` that holds `target` (see [`with_tensor`]); a dropped
/// tensor also leaves the shard index.
pub fn alter_tensor(dir: &Path, target: &str, shape: Option<&[usize]>) {
    let index = WeightIndex::open(dir).unwrap();
    let shard = index.shard_path(index.info(target).unwrap()).to_path_buf();
    let mut names: Vec<String> = index
        .names()
        .filter(|n| index.shard_path(index.info(n).unwrap()) == shard)
        .filter(|n| shape.is_some() || n != &target)
        .map(String::from)
        .collect();
    names.sort();
    let specs: Vec<TensorSpec> = names
        .iter()
        .map(|n| {
            let i = index.info(n).unwrap();
            match (n == target, shape) {
                (true, Some(s)) => TensorSpec::new(n, i.dtype, s),
                _ => TensorSpec::new(n, i.dtype, &i.shape),
            }
        })
        .collect();
    let blobs: Vec<Vec<u8>> = names
        .iter()
        .map(|n| index.blob(index.info(n).unwrap()).to_vec())
        .collect();
    drop(index);
    write_safetensors(&shard, &specs, &[], |i, out| out.write_all(&blobs[i])).unwrap();
    let path = dir.join("model.safetensors.index.json");
    if shape.is_none() && path.exists() {
        let mut v: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        v["weight_map"].as_object_mut().unwrap().remove(target);
        std::fs::write(path, v.to_string()).unwrap();
    }
}

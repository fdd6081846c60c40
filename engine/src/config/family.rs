//! Which family parses a `config.json`: one table of [`Family`] rows (kept by `arch::registry`,
//! whose rows build the architecture), matched on the text config's `model_type` and how it is
//! nested. The supported-type list in errors and the README's table derive from the same rows.
//!
//! [`Spec::from_value_with`] reads what every family shares — the optional `text_config` wrapper and
//! its `language_model.` tensor prefix, and the quantisation config (declared in the text config
//! by some releases and at the top by others) — into a [`Checkpoint`], then hands the fields to
//! the matching row's parser.

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::{Fields, Quantization};
use crate::error::{Error, Result};

/// What the loaders need of a checkpoint beyond its architecture: tensor prefix and quantisation.
#[derive(Debug, Clone)]
pub struct Checkpoint {
    /// Prefix of every tensor name (`""`, or `"language_model."` for nested configs).
    pub tensor_prefix: String,
    /// Inserted after the `model.` of the text model's names (`""`, or `"language_model."` for
    /// Qwen3.5's nested `model.language_model.layers…`); see [`NestedNames`].
    pub model_infix: String,
    /// How weights are quantised.
    pub quant: Quantization,
    /// The outer `model_type` as written in the file.
    pub model_type: String,
    /// Path of the parsed file (for error messages).
    pub path: PathBuf,
}

/// A parsed `config.json`: the checkpoint and the architecture `A` its family's parser built.
#[derive(Debug, Clone)]
pub struct Spec<A> {
    pub arch: A,
    pub checkpoint: Checkpoint,
}

impl<A> std::ops::Deref for Spec<A> {
    type Target = Checkpoint;

    fn deref(&self) -> &Checkpoint {
        &self.checkpoint
    }
}

/// Where a family's text config may sit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Nesting {
    /// At the top of `config.json` only.
    Flat,
    /// At the top, or under `text_config` (tensors prefixed `language_model.`) of one of these
    /// outer `model_type`s.
    FlatOrNestedIn(&'static [&'static str]),
    /// Under `text_config` of one of these outer `model_type`s only.
    NestedIn(&'static [&'static str]),
}

impl Nesting {
    fn accepts(self, outer: &str, nested: bool) -> bool {
        match (self, nested) {
            (Nesting::Flat | Nesting::FlatOrNestedIn(_), false) => true,
            (Nesting::FlatOrNestedIn(o) | Nesting::NestedIn(o), true) => o.contains(&outer),
            (Nesting::Flat, true) | (Nesting::NestedIn(_), false) => false,
        }
    }
}

/// How a nested text config's tensors are named.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NestedNames {
    /// Every name prefixed (Kimi-K2.5: `language_model.model.layers…`).
    Prefix(&'static str),
    /// The text model's `model.` names gain an infix (Qwen3.5: `model.language_model.layers…`);
    /// the others (`lm_head.weight`) are as they are.
    ModelInfix(&'static str),
}

/// The fields a family's parser reads: the top of the file and the text config (the same map
/// when the config is flat).
#[derive(Debug, Clone, Copy)]
pub struct FamilyInput<'a> {
    pub(crate) top: Fields<'a>,
    pub(crate) text: Fields<'a>,
}

/// One row of the family table.
#[derive(Debug)]
pub struct Family<A> {
    /// The text config's `model_type`s this row parses.
    pub model_types: &'static [&'static str],
    pub nesting: Nesting,
    /// How tensors are named when the text config is nested.
    pub nested_names: NestedNames,
    /// Published checkpoints it runs and their formats (the README table).
    pub runs: &'static str,
    pub parse: fn(FamilyInput<'_>) -> Result<A>,
}

/// A typed text config that knows where it sits in `config.json`: the family table's rows
/// are built from it, and tests load a checkpoint straight into it ([`Spec::load_typed`]).
pub trait TextConfig: Sized {
    /// The text config's `model_type`s.
    const MODEL_TYPES: &'static [&'static str];
    /// Where the text config may sit.
    const NESTING: Nesting;
    /// How tensors are named when the text config is nested.
    const NESTED_NAMES: NestedNames = NestedNames::Prefix("language_model.");
    /// Validate the fields into the typed config.
    fn parse(input: FamilyInput<'_>) -> Result<Self>;
}

impl<C: TextConfig> Spec<C> {
    /// Read `dir/config.json` as a `C` (an error if its type is not one of `C`'s).
    pub fn load_typed(dir: &Path) -> Result<Spec<C>> {
        Self::load_with(dir, &[Self::row()])
    }

    /// [`Spec::load_typed`] for an already-parsed value.
    pub fn from_value_typed(value: &Value, path: &Path) -> Result<Spec<C>> {
        Self::from_value_with(value, path, &[Self::row()])
    }

    fn row() -> Family<C> {
        Family {
            model_types: C::MODEL_TYPES,
            nesting: C::NESTING,
            nested_names: C::NESTED_NAMES,
            runs: "",
            parse: C::parse,
        }
    }
}

/// The supported types of `families`, as errors list them (`kimi_k25 (text_config kimi_k2)`).
pub fn supported<A>(families: &[Family<A>]) -> String {
    let mut out: Vec<String> = Vec::new();
    for f in families {
        let types = f.model_types.join("/");
        match f.nesting {
            Nesting::Flat => out.extend(f.model_types.iter().map(|t| t.to_string())),
            Nesting::FlatOrNestedIn(outer) => {
                out.extend(f.model_types.iter().map(|t| t.to_string()));
                let extra: Vec<&str> = outer
                    .iter()
                    .copied()
                    .filter(|o| !f.model_types.contains(o))
                    .collect();
                out.extend(extra.iter().map(|o| format!("{o} (text_config {types})")));
            }
            Nesting::NestedIn(outer) => {
                out.extend(outer.iter().map(|o| format!("{o} (text_config {types})")))
            }
        }
    }
    out.join(", ")
}

impl<A> Spec<A> {
    /// Read and validate `dir/config.json` with the first row of `families` that takes it.
    pub fn load_with(dir: &Path, families: &[Family<A>]) -> Result<Spec<A>> {
        let path = dir.join("config.json");
        let bytes = std::fs::read(&path).map_err(|e| Error::io(&path, e))?;
        let value: Value = serde_json::from_slice(&bytes).map_err(|source| Error::Json {
            path: path.clone(),
            source,
        })?;
        Self::from_value_with(&value, &path, families)
    }

    /// Validate an already-parsed `config.json` value.
    pub fn from_value_with(value: &Value, path: &Path, families: &[Family<A>]) -> Result<Spec<A>> {
        let outer = value
            .as_object()
            .ok_or_else(|| Error::config(path, "<root>", "expected a JSON object"))?;
        let top = Fields {
            map: outer,
            path,
            scope: "",
        };
        let model_type = top
            .opt_str("model_type")?
            .ok_or_else(|| top.err("model_type", "missing"))?
            .to_string();
        let (text, scope) = match top.get("text_config") {
            Some(Value::Object(text)) => (text, "text_config."),
            Some(_) => return Err(top.err("text_config", "expected an object")),
            None => (outer, ""),
        };
        let text = Fields {
            map: text,
            path,
            scope,
        };
        let inner_type = text.opt_str("model_type")?.unwrap_or(&model_type).to_string();
        let nested = !scope.is_empty();
        let Some(family) = families
            .iter()
            .find(|f| f.model_types.contains(&inner_type.as_str()) && f.nesting.accepts(&model_type, nested))
        else {
            return Err(Error::UnknownModelType {
                path: path.to_path_buf(),
                model_type: if nested {
                    format!("{model_type}/{inner_type}")
                } else {
                    model_type
                },
                supported: supported(families),
            });
        };
        let quant = match text
            .get("quantization_config")
            .or_else(|| top.get("quantization_config"))
        {
            Some(q) => Quantization::parse(q, path)?,
            None => Quantization::None,
        };
        Ok(Spec {
            arch: (family.parse)(FamilyInput { top, text })?,
            checkpoint: Checkpoint {
                tensor_prefix: match (nested, family.nested_names) {
                    (true, NestedNames::Prefix(p)) => p.to_string(),
                    _ => String::new(),
                },
                model_infix: match (nested, family.nested_names) {
                    (true, NestedNames::ModelInfix(i)) => i.to_string(),
                    _ => String::new(),
                },
                quant,
                model_type,
                path: path.to_path_buf(),
            },
        })
    }
}

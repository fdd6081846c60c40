//! Typed model configs parsed from Hugging Face `config.json`.

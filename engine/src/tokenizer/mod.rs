//! Tokenizers and chat templates.
//!
//! [`Tokenizer::from_dir`] loads a model directory's tokenizer:
//! * `tiktoken.model` (+ `tokenizer_config.json`): Kimi's tiktoken-rank BPE with its
//!   pre-tokenizer pattern, 400k/25k input cuts and 256 specials after the base ranks;
//! * otherwise `tokenizer.json` (+ `tokenizer_config.json`): byte-level BPE through the
//!   `tokenizers` crate (DeepSeek-V3, Qwen3).
//!
//! Invariants:
//! * [`Tokenizer::encode`] never produces special tokens from text (for tokenizer.json this is
//!   transformers' `split_special_tokens=True`); [`Tokenizer::encode_with_special`] does, and is
//!   for trusted text only.
//! * [`Tokenizer::encode_chat`] renders the chat template (transformers' Jinja semantics) and never
//!   turns a control token inside user-supplied strings into its id (see [`chat`]); without
//!   control tokens in the input its ids are those of the whole rendered string.
//! * [`Tokenizer::encode_prompt`] is transformers' `tokenizer(text)["input_ids"]` for a raw
//!   prompt: a BOS (or EOS) only where that tokenizer adds one — tokenizer.json's post-processor;
//!   Kimi's tiktoken tokenizer adds none.
//! * A tokenizer that defines K3's XTML markers (`<|open|>`, `<|close|>`, `<|sep|>`,
//!   `<|end_of_msg|>`) renders chats with K3's native encoder ([`xtml`]), not a Jinja template.
//! * Decoding is byte-exact ([`Tokenizer::decode_bytes`]); [`Tokenizer::decode`] is lossy UTF-8.
//! * No input panics; malformed files are [`Error::Tokenizer`] naming the file.
//!
//! ```no_run
//! use std::path::Path;
//! use deltafin_engine::tokenizer::{ChatMessage, ChatOptions, IncrementalDecoder, Tokenizer};
//!
//! let tok = Tokenizer::from_dir(Path::new("/models/kimi-k2"))?;
//! let opts = ChatOptions { add_generation_prompt: true, ..Default::default() };
//! let prompt = tok.encode_chat(&[ChatMessage::new("user", "Hello!")], &opts)?;
//! let mut stream = IncrementalDecoder::new(&tok);
//! for id in prompt {
//!     if let Some(text) = stream.push(id) {
//!         print!("{text}");
//!     }
//! }
//! # Ok::<(), deltafin_engine::Error>(())
//! ```

mod bpe;
mod bytes;
mod chat;
mod config;
mod dsml;
mod dsml_v4;
pub use dsml::DsmlVersion;
mod hf;
mod pretok;
mod pyjson;
mod specials;
mod stream;
mod template;
mod tiktoken;
mod tool_history;
mod xtml;

use std::path::Path;

pub use chat::{ChatMessage, ChatOptions};
pub use stream::IncrementalDecoder;
pub use template::ChatTemplate;
pub use tool_history::{arguments_as_objects, normalize_k2_tool_ids};

use chat::{ControlTokens, Piece};
use config::TokenizerConfig;
use hf::HfBackend;
use specials::LiteralSet;
use tiktoken::TiktokenBpe;

use crate::error::{Error, Result};

/// File names looked up by [`Tokenizer::from_dir`].
const TIKTOKEN_FILE: &str = "tiktoken.model";
const TOKENIZER_JSON: &str = "tokenizer.json";
const CONFIG_FILE: &str = "tokenizer_config.json";
const TEMPLATE_FILE: &str = "chat_template.jinja";

/// One per loaded tokenizer, so the variants' size difference does not matter.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)]
enum Backend {
    Tiktoken(TiktokenBpe),
    Hf(HfBackend),
}

/// A model's tokenizer, special tokens and chat template. Immutable and `Send + Sync`.
pub struct Tokenizer {
    backend: Backend,
    bos_id: Option<u32>,
    eos_id: Option<u32>,
    /// `bos_token`, `eos_token`, … from tokenizer_config.json (chat-template variables).
    special_attributes: Vec<(String, String)>,
    template: Option<ChatTemplate>,
    control: ControlTokens,
    /// Ids of `"\n"` (encoded with specials), for pieces in the middle of a chat.
    newline_ids: Vec<u32>,
    /// Whether chats use K3's XTML encoder (all of [`xtml::MARKERS`] are special tokens).
    xtml: bool,
    /// Which DeepSeek DSML encoder renders chats ([`dsml`], [`dsml_v4`]: a `deepseek_v32` or
    /// `deepseek_v4` checkpoint that ships no chat template, as DeepSeek publishes them).
    dsml: Option<DsmlVersion>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("backend", &self.backend)
            .field("vocab_size", &self.vocab_size())
            .field("bos_id", &self.bos_id)
            .field("eos_id", &self.eos_id)
            .field("chat_template", &self.template.is_some())
            .finish()
    }
}

impl AsRef<Tokenizer> for Tokenizer {
    fn as_ref(&self) -> &Tokenizer {
        self
    }
}

impl Tokenizer {
    /// Load the tokenizer of a model directory (see the module docs for the files used).
    pub fn from_dir(dir: &Path) -> Result<Tokenizer> {
        let config_path = dir.join(CONFIG_FILE);
        let config = if config_path.is_file() {
            Some(TokenizerConfig::load(&config_path)?)
        } else {
            None
        };
        let tiktoken_path = dir.join(TIKTOKEN_FILE);
        let json_path = dir.join(TOKENIZER_JSON);
        let backend = if tiktoken_path.is_file() {
            Backend::Tiktoken(TiktokenBpe::load(&tiktoken_path, config.as_ref())?)
        } else if json_path.is_file() {
            Backend::Hf(HfBackend::load(&json_path)?)
        } else {
            let what = if dir.is_dir() {
                "no tokenizer found"
            } else {
                "not a directory"
            };
            return Err(Error::Tokenizer {
                path: dir.to_path_buf(),
                reason: format!("{what}: expected {TIKTOKEN_FILE} (with {CONFIG_FILE}) or {TOKENIZER_JSON}"),
            });
        };
        let template = load_template(dir, config.as_ref())?;
        let dsml = match template {
            Some(_) => None,
            None => native_dsml(dir)?,
        };
        Self::assemble(backend, config.as_ref(), template, dsml)
    }

    fn assemble(
        backend: Backend,
        config: Option<&TokenizerConfig>,
        template: Option<ChatTemplate>,
        dsml: Option<DsmlVersion>,
    ) -> Result<Self> {
        let mut tokenizer = Tokenizer {
            backend,
            bos_id: None,
            eos_id: None,
            special_attributes: config.map(|c| c.special_attributes.clone()).unwrap_or_default(),
            template,
            control: ControlTokens::new(LiteralSet::empty()),
            newline_ids: Vec::new(),
            xtml: false,
            dsml,
        };
        if let Some(config) = config {
            tokenizer.bos_id = tokenizer.attribute_id(config, "bos_token")?;
            tokenizer.eos_id = tokenizer.attribute_id(config, "eos_token")?;
        }
        tokenizer.control = tokenizer.control_tokens(config)?;
        tokenizer.newline_ids = tokenizer.encode_with_special("\n");
        tokenizer.xtml = xtml::MARKERS.iter().all(|m| {
            tokenizer
                .token_to_id(m)
                .is_some_and(|id| tokenizer.is_special(id))
        });
        Ok(tokenizer)
    }

    /// The id of a special-token attribute (`None` if unset; an error if not in the vocabulary).
    fn attribute_id(&self, config: &TokenizerConfig, attr: &str) -> Result<Option<u32>> {
        let Some(token) = config.attribute(attr) else {
            return Ok(None);
        };
        self.token_to_id(token).map(Some).ok_or_else(|| Error::Tokenizer {
            path: config.path.clone(),
            reason: format!("`{attr}` `{token}` is not a token of this tokenizer"),
        })
    }

    /// Control tokens: every special; for tokenizer.json also the added tokens listed in
    /// `chat_control_tokens`, or else those the chat template's text contains (transformers'
    /// rule, with the template source standing in for its literal strings).
    fn control_tokens(&self, config: Option<&TokenizerConfig>) -> Result<ControlTokens> {
        let items: Vec<(&str, u32)> = match &self.backend {
            Backend::Tiktoken(t) => t
                .specials()
                .strings()
                .filter_map(|s| t.specials().get(s).map(|id| (s, id)))
                .collect(),
            Backend::Hf(h) => {
                let listed = config.and_then(|c| c.chat_control_tokens.as_ref());
                let source = match &self.template {
                    Some(t) => t.source(),
                    None if self.dsml == Some(DsmlVersion::V32) => dsml::MARKERS,
                    None if self.dsml == Some(DsmlVersion::V4) => dsml_v4::MARKERS,
                    None => "",
                };
                h.added_tokens()
                    .iter()
                    .filter(|(content, _, special)| {
                        *special
                            || match listed {
                                Some(list) => list.iter().any(|l| l == content),
                                None => {
                                    source.contains(content.as_str())
                                        && !content.chars().all(pretok::py_isspace)
                                }
                            }
                    })
                    .map(|(content, id, _)| (content.as_str(), *id))
                    .collect()
            }
        };
        let items = items
            .into_iter()
            .filter(|(s, _)| !s.contains([chat::START, chat::END]));
        let set = LiteralSet::new(items).map_err(|reason| Error::Tokenizer {
            path: self.source_name().into(),
            reason,
        })?;
        Ok(ControlTokens::new(set))
    }

    fn source_name(&self) -> &'static str {
        match self.backend {
            Backend::Tiktoken(_) => TIKTOKEN_FILE,
            Backend::Hf(_) => TOKENIZER_JSON,
        }
    }

    /// Encode plain text: special-token strings are encoded as ordinary text. Never adds BOS/EOS.
    ///
    /// For tokenizer.json, other added tokens are still recognised (transformers'
    /// `split_special_tokens=True`). The `tokenizers` crate's encode is fallible in principle;
    /// the load-time checks exclude its known failure causes, and a failure would give no ids.
    pub fn encode(&self, text: &str) -> Vec<u32> {
        match &self.backend {
            Backend::Tiktoken(t) => t.encode_plain(text),
            Backend::Hf(h) => h.encode_plain(text).unwrap_or_default(),
        }
    }

    /// Encode trusted text: special-token strings become their ids. Never adds BOS/EOS.
    pub fn encode_with_special(&self, text: &str) -> Vec<u32> {
        match &self.backend {
            Backend::Tiktoken(t) => t.encode_special(text),
            Backend::Hf(h) => h.encode_special(text).unwrap_or_default(),
        }
    }

    /// Encode a raw text prompt exactly as transformers' `tokenizer(text)["input_ids"]`: special
    /// and added tokens are recognised, then the model's own tokenizer adds what it adds —
    /// tokenizer.json's post-processor (DeepSeek-V3: `<｜begin▁of▁sentence｜>`); Kimi's
    /// `TikTokenTokenizer` (tiktoken.model) adds nothing.
    pub fn encode_prompt(&self, text: &str) -> Vec<u32> {
        match &self.backend {
            Backend::Tiktoken(t) => t.encode_special(text),
            Backend::Hf(h) => h.encode_prompt(text).unwrap_or_default(),
        }
    }

    /// Encode with no added token recognised at all (for user-supplied control tokens).
    fn encode_no_added(&self, text: &str) -> Vec<u32> {
        match &self.backend {
            Backend::Tiktoken(t) => t.encode_plain(text),
            Backend::Hf(h) => h.encode_no_added(text).unwrap_or_default(),
        }
    }

    /// Decode to text: lossy UTF-8 (U+FFFD), specials as their text; unknown ids are skipped.
    pub fn decode(&self, ids: &[u32]) -> String {
        String::from_utf8_lossy(&self.decode_bytes(ids)).into_owned()
    }

    /// Decode to the exact bytes; unknown ids are skipped.
    pub fn decode_bytes(&self, ids: &[u32]) -> Vec<u8> {
        let mut out = Vec::with_capacity(ids.len() * 4);
        for &id in ids {
            if let Some(b) = self.token_bytes(id) {
                out.extend_from_slice(b);
            }
        }
        out
    }

    /// The bytes of one token.
    pub(crate) fn token_bytes(&self, id: u32) -> Option<&[u8]> {
        match &self.backend {
            Backend::Tiktoken(t) => t.token_bytes(id),
            Backend::Hf(h) => h.token_bytes(id),
        }
    }

    /// The id of a vocabulary string (byte-level alphabet, or a special's text).
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        match &self.backend {
            Backend::Tiktoken(t) => t.token_to_id(token),
            Backend::Hf(h) => h.token_to_id(token),
        }
    }

    /// The vocabulary string of an id (byte-level alphabet, or a special's text).
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        match &self.backend {
            Backend::Tiktoken(t) => t.id_to_token(id),
            Backend::Hf(h) => h.id_to_token(id),
        }
    }

    /// `bos_token` of tokenizer_config.json.
    pub fn bos_id(&self) -> Option<u32> {
        self.bos_id
    }

    /// `eos_token` of tokenizer_config.json.
    pub fn eos_id(&self) -> Option<u32> {
        self.eos_id
    }

    /// Whether `id` is a special token (tiktoken: the 256 after the ranks; tokenizer.json: added
    /// tokens flagged `special`).
    pub fn is_special(&self, id: u32) -> bool {
        match &self.backend {
            Backend::Tiktoken(t) => t.is_special(id),
            Backend::Hf(h) => h.is_special(id),
        }
    }

    /// One past the largest token id.
    pub fn vocab_size(&self) -> usize {
        match &self.backend {
            Backend::Tiktoken(t) => t.vocab_size(),
            Backend::Hf(h) => h.vocab_size(),
        }
    }

    /// The chat template (`chat_template.jinja`, else tokenizer_config.json `chat_template`).
    pub fn chat_template(&self) -> Option<&ChatTemplate> {
        self.template.as_ref()
    }

    /// Whether chats are rendered by K3's native XTML encoder (see the module docs).
    pub fn is_xtml(&self) -> bool {
        self.xtml
    }

    /// Whether chats are rendered by DeepSeek-V3.2's native DSML encoder ([`dsml`]).
    pub fn is_dsml(&self) -> bool {
        self.dsml.is_some()
    }

    /// The DSML encoder that renders chats, if one does.
    pub fn dsml_version(&self) -> Option<DsmlVersion> {
        self.dsml
    }

    /// Render the chat template as transformers' `apply_chat_template(tokenize=False)` does
    /// (XTML tokenizers: the text of K3's encoder segments).
    pub fn render_chat(&self, messages: &[ChatMessage], opts: &ChatOptions) -> Result<String> {
        if self.xtml {
            return Ok(self
                .xtml_segments(messages, opts)?
                .into_iter()
                .map(|s| s.text)
                .collect());
        }
        self.render(messages, opts, None)
    }

    /// Render the chat template and encode it; control tokens in user-supplied strings are text.
    /// XTML tokenizers encode K3's segments one at a time, only markers as special tokens.
    pub fn encode_chat(&self, messages: &[ChatMessage], opts: &ChatOptions) -> Result<Vec<u32>> {
        if self.xtml {
            let mut ids = Vec::new();
            for segment in self.xtml_segments(messages, opts)? {
                ids.extend(if segment.special {
                    self.encode_with_special(&segment.text)
                } else {
                    self.encode(&segment.text)
                });
            }
            return Ok(ids);
        }
        let rendered = self.render(messages, opts, Some(&self.control))?;
        self.encode_marked(&rendered)
    }

    fn xtml_segments(&self, messages: &[ChatMessage], opts: &ChatOptions) -> Result<Vec<xtml::Segment>> {
        chat::check_chat_inputs(messages, opts)?;
        xtml::render(messages, opts, opts.tools.as_deref())
    }

    fn render(
        &self,
        messages: &[ChatMessage],
        opts: &ChatOptions,
        control: Option<&ControlTokens>,
    ) -> Result<String> {
        if let Some(version) = self.dsml {
            chat::check_chat_inputs(messages, opts)?;
            let render = match version {
                DsmlVersion::V32 => dsml::render,
                DsmlVersion::V4 => dsml_v4::render,
            };
            return match control {
                Some(c) => render(
                    &chat::marked_messages(messages, c),
                    &chat::marked_options(opts, c),
                ),
                None => render(messages, opts),
            };
        }
        let template = self
            .template
            .as_ref()
            .ok_or_else(|| Error::Template("the tokenizer has no chat template".into()))?;
        chat::check_chat_inputs(messages, opts)?;
        let sort_tools = matches!(self.backend, Backend::Tiktoken(_));
        let vars = chat::template_vars(messages, opts, &self.special_attributes, sort_tools, control)?;
        template.render_vars(vars, template::unix_now())
    }

    /// Encode a rendered chat whose user-supplied control tokens are marked.
    fn encode_marked(&self, rendered: &str) -> Result<Vec<u32>> {
        let mut ids = Vec::new();
        for (i, piece) in chat::split_marked(rendered, &self.control)
            .into_iter()
            .enumerate()
        {
            match piece {
                Piece::Text(text) if i == 0 => ids.extend(self.encode_with_special(text)),
                Piece::Text(text) if !text.is_empty() => {
                    ids.extend(chat::encode_mid_piece(text, &self.newline_ids, |s| {
                        self.encode_with_special(s)
                    }));
                }
                Piece::Marked(token) => {
                    let piece_ids =
                        chat::encode_mid_piece(token, &self.newline_ids, |s| self.encode_no_added(s));
                    if self.control.id(token).is_some_and(|id| piece_ids.contains(&id)) {
                        return Err(Error::Template(format!(
                            "cannot encode the control token `{token}` in user text as text: plain encoding yields the token itself"
                        )));
                    }
                    ids.extend(piece_ids);
                }
                Piece::Text(_) | Piece::Break => {}
            }
        }
        Ok(ids)
    }
}

/// The DSML encoder of the family `dir`'s `config.json` names, for a checkpoint that ships no
/// template.
fn native_dsml(dir: &Path) -> Result<Option<DsmlVersion>> {
    let path = dir.join("config.json");
    if !path.is_file() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
    let config: serde_json::Value = serde_json::from_str(&text).map_err(|e| Error::Tokenizer {
        path: path.clone(),
        reason: format!("config.json is not JSON: {e}"),
    })?;
    Ok(config["model_type"].as_str().and_then(DsmlVersion::of_model_type))
}

/// `chat_template.jinja` if present, else tokenizer_config.json's `chat_template`.
fn load_template(dir: &Path, config: Option<&TokenizerConfig>) -> Result<Option<ChatTemplate>> {
    let jinja_path = dir.join(TEMPLATE_FILE);
    let (source, path) = if jinja_path.is_file() {
        (
            std::fs::read_to_string(&jinja_path).map_err(|e| Error::io(&jinja_path, e))?,
            jinja_path,
        )
    } else if let Some(source) = config.and_then(|c| c.chat_template.clone()) {
        (source, dir.join(CONFIG_FILE))
    } else {
        return Ok(None);
    };
    ChatTemplate::new(source).map(Some).map_err(|e| Error::Tokenizer {
        path,
        reason: format!("chat template does not compile: {e}"),
    })
}

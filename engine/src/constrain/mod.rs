//! Token-level constrained decoding: a grammar (Lark, with JSON-schema rules) compiled by
//! [`llguidance`] into a per-step mask over the model's vocabulary.
//!
//! Why llguidance: it is pure Rust (no C++ build, unlike xgrammar-rs), MIT, handles JSON Schema
//! and context-free grammars in one engine (outlines-core is regex/DFA only, no recursion), names
//! special tokens by id (`<[163595]>`) so native tool-call markers can be forced while plain text
//! can never forge them, and computes masks lazily over a token trie (tens of microseconds per
//! step at 160k ids).
//!
//! This module owns the vocabulary view ([`Vocabulary`]: every token's bytes, specials marked
//! with toktrie's `0xFF` prefix, padded ids beyond the tokenizer left empty so they are never
//! allowed) and the [`Grammar`] → [`TokenConstraint`] adapter the decoder applies at every
//! sampled row (plain decoding, prefill's first token, and each verified draft row alike).

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{self, TokEnv, TokRxInfo, TokTrie, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};

use crate::error::{Error, Result};
use crate::generate::{ConstraintFactory, TokenConstraint};
use crate::tokenizer::Tokenizer;

/// toktrie's view of a [`Tokenizer`].
struct TokenizerView {
    tokenizer: Arc<Tokenizer>,
    trie: TokTrie,
}

impl TokenizerEnv for TokenizerView {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    /// llguidance tokenizes the bytes a grammar forces, which may begin or end inside a UTF-8
    /// character (after a token that held only its first bytes): valid text goes through the
    /// tokenizer, stray bytes through the trie. A lossy conversion would turn them into U+FFFD
    /// and force the wrong tokens, so no 3-byte character could be finished byte by byte.
    fn tokenize_bytes(&self, s: &[u8]) -> Vec<toktrie::TokenId> {
        self.trie
            .tokenize_with_greedy_fallback(s, |text| self.tokenizer.encode(text))
    }
}

/// The token bytes toktrie needs for `vocab` ids (`vocab` may exceed the tokenizer's size when
/// the model pads its embedding; those ids get no bytes and are never allowed). Special tokens,
/// and the `structural` ids (markers a tokenizer lists as ordinary added tokens, such as
/// DeepSeek-V3's tool-call tokens), are marked so that no text rule can ever produce them: a
/// grammar names them by id.
pub fn token_env(tokenizer: Arc<Tokenizer>, vocab: usize, structural: &[u32]) -> Result<TokEnv> {
    let eos = tokenizer.eos_id().ok_or_else(|| {
        Error::Constraint("the tokenizer has no end-of-sequence token to end a constrained output".into())
    })?;
    let words: Vec<Vec<u8>> = (0..vocab as u32)
        .map(|id| {
            let bytes = tokenizer.decode_bytes(&[id]);
            if tokenizer.is_special(id) || structural.contains(&id) {
                let name = tokenizer.id_to_token(id).unwrap_or_default();
                let mut marked = Vec::with_capacity(name.len() + 1);
                marked.push(TokTrie::SPECIAL_TOKEN_MARKER);
                marked.extend_from_slice(name.as_bytes());
                marked
            } else {
                bytes
            }
        })
        .collect();
    let mut info = TokRxInfo::new(vocab as u32, eos);
    info.tok_bos = tokenizer.bos_id();
    let trie = TokTrie::from(&info, &words);
    Ok(Arc::new(TokenizerView { tokenizer, trie }))
}

/// `schema` with llguidance's JSON options set to compact output (`,` and `:` separators, no
/// free whitespace) unless the schema sets its own `x-guidance` options. Free whitespace between
/// JSON tokens lets a model pad its answer indefinitely (a weak or untrained model loops on
/// whitespace until `max_tokens` cuts the JSON off); compact JSON is still exactly the schema's
/// language and is what a strict structured output looks like.
pub fn compact_json(schema: &serde_json::Value) -> serde_json::Value {
    let mut schema = schema.clone();
    if let Some(o) = schema.as_object_mut()
        && !o.contains_key("x-guidance")
    {
        o.insert(
            "x-guidance".into(),
            serde_json::json!({"whitespace_flexible": false, "item_separator": ",", "key_separator": ":"}),
        );
    }
    schema
}

/// The vocabulary of one model, ready to compile grammars against (build once per model).
pub struct Vocabulary {
    factory: Arc<ParserFactory>,
}

impl std::fmt::Debug for Vocabulary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Vocabulary")
            .field("vocab_size", &self.factory.tok_env().tok_trie().vocab_size())
            .finish()
    }
}

impl Vocabulary {
    /// Index the tokenizer's `vocab` ids ([`token_env`]: `structural` ids count as specials).
    pub fn new(tokenizer: Arc<Tokenizer>, vocab: usize, structural: &[u32]) -> Result<Vocabulary> {
        let env = token_env(tokenizer, vocab, structural)?;
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| Error::Constraint(e.to_string()))?;
        factory.quiet();
        Ok(Vocabulary {
            factory: Arc::new(factory),
        })
    }

    /// The toktrie environment (token bytes and tokenization).
    pub fn env(&self) -> &TokEnv {
        self.factory.tok_env()
    }

    /// Compile a Lark grammar (llguidance dialect: `%json {…}` rules, `<[ID]>` special tokens).
    /// Fails with [`Error::Constraint`] naming the problem; the grammar is checked by building a
    /// parser once, so a returned grammar always starts.
    pub fn lark(&self, source: &str) -> Result<Arc<Grammar>> {
        self.compile(TopLevelGrammar::from_lark(source.to_string()))
    }

    /// Compile a JSON schema (the whole output is one JSON value matching it, written
    /// compactly: see [`compact_json`]).
    pub fn json_schema(&self, schema: serde_json::Value) -> Result<Arc<Grammar>> {
        self.compile(TopLevelGrammar::from_json_schema(compact_json(&schema)))
    }

    fn compile(&self, grammar: TopLevelGrammar) -> Result<Arc<Grammar>> {
        let g = Grammar {
            factory: self.factory.clone(),
            grammar,
            budget: None,
            stops: Vec::new(),
        };
        g.matcher()?;
        Ok(Arc::new(g))
    }
}

/// A compiled grammar; [`ConstraintFactory::start`] gives each sequence its own matcher.
pub struct Grammar {
    factory: Arc<ParserFactory>,
    grammar: TopLevelGrammar,
    budget: Option<ReasoningBudget>,
    /// Tokens that end generation (see [`Grammar::with_stop_ids`]).
    stops: Vec<u32>,
}

/// A bound on the reasoning that opens a constrained output: once `tokens` tokens are out and
/// `close` has not been, `close` is the only token allowed (when the grammar allows it), so
/// the constrained part always gets the rest of the token limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReasoningBudget {
    /// The token that ends the reasoning (`</think>`; K3's `<|close|>`).
    pub close: u32,
    /// How many tokens the reasoning may take.
    pub tokens: usize,
}

impl ReasoningBudget {
    /// Half of a `max_new_tokens` limit for the reasoning, ended by `close`.
    pub fn half_of(max_new_tokens: usize, close: u32) -> ReasoningBudget {
        ReasoningBudget {
            close,
            tokens: max_new_tokens / 2,
        }
    }
}

impl std::fmt::Debug for Grammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Grammar")
    }
}

impl Grammar {
    fn matcher(&self) -> Result<Matcher> {
        let parser = self
            .factory
            .create_parser(self.grammar.clone())
            .map_err(|e| Error::Constraint(e.to_string()))?;
        let matcher = Matcher::new(Ok(parser));
        match matcher.get_error() {
            Some(e) => Err(Error::Constraint(e)),
            None => Ok(matcher),
        }
    }

    /// The same grammar with its opening reasoning bounded by `budget`.
    pub fn with_reasoning_budget(&self, budget: ReasoningBudget) -> Arc<Grammar> {
        Arc::new(Grammar {
            factory: self.factory.clone(),
            grammar: self.grammar.clone(),
            budget: Some(budget),
            stops: self.stops.clone(),
        })
    }

    /// The same grammar for a generation that ends at any of `stops` (the model's end-of-turn
    /// and end-of-text ids): one of them is allowed only where it completes the grammar. A
    /// grammar whose free text admits any token would otherwise let the model end the output
    /// in the middle (GLM's `<|user|>` inside reasoning before a forced call), and the answer
    /// would come back cut short.
    pub fn with_stop_ids(&self, stops: &[u32]) -> Arc<Grammar> {
        Arc::new(Grammar {
            factory: self.factory.clone(),
            grammar: self.grammar.clone(),
            budget: self.budget,
            stops: stops.to_vec(),
        })
    }

    /// Whether `tokens`, consumed in order from the start, are all allowed (for tests and checks).
    pub fn accepts_prefix(&self, tokens: &[u32]) -> Result<bool> {
        let mut m = self.matcher()?;
        for &t in tokens {
            let mask = m.compute_mask().map_err(|e| Error::Constraint(e.to_string()))?;
            if !mask.is_allowed(t) || m.consume_token(t).is_err() {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

impl ConstraintFactory for Grammar {
    fn start(&self) -> Result<Box<dyn TokenConstraint>> {
        Ok(Box::new(GrammarConstraint {
            matcher: self.matcher()?,
            eos: self.factory.tok_env().tok_trie().eos_token(),
            budget: self.budget,
            consumed: 0,
            stops: self.stops.clone(),
        }))
    }
}

/// One sequence's position in a [`Grammar`].
struct GrammarConstraint {
    matcher: Matcher,
    /// The trie's end-of-sequence id (allowed by the mask when the grammar may end; checked
    /// by the full mask only).
    eos: u32,
    /// The reasoning bound, until its close is consumed (then `None`).
    budget: Option<ReasoningBudget>,
    /// Tokens consumed so far.
    consumed: usize,
    /// Tokens that end generation: allowed only where they complete the grammar.
    stops: Vec<u32>,
}

impl GrammarConstraint {
    /// Whether consuming `stop` (which the mask allows) leaves the grammar complete; the
    /// matcher is rolled back either way.
    fn completes(&mut self, stop: u32) -> Result<bool> {
        let err = |e: &dyn std::fmt::Display| Error::Constraint(e.to_string());
        self.matcher.consume_token(stop).map_err(|e| err(&e))?;
        let done = self.matcher.is_stopped() || self.matcher.is_accepting().map_err(|e| err(&e))?;
        self.matcher.rollback(1).map_err(|e| err(&e))?;
        Ok(done)
    }

    /// The close token when the reasoning budget is spent and the close is still due.
    fn forced_close(&self) -> Option<u32> {
        self.budget.filter(|b| self.consumed >= b.tokens).map(|b| b.close)
    }
}

impl std::fmt::Debug for GrammarConstraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrammarConstraint")
            .field("stopped", &self.matcher.is_stopped())
            .finish()
    }
}

impl TokenConstraint for GrammarConstraint {
    fn mask(&mut self, logits: &mut [f32]) -> Result<()> {
        let mut mask = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| Error::Constraint(e.to_string()))?;
        if let Some(close) = self.forced_close()
            && mask.is_allowed(close)
        {
            mask.set_all(false);
            mask.allow_token(close);
        }
        if !self.matcher.is_stopped() {
            for i in 0..self.stops.len() {
                let stop = self.stops[i];
                if stop != self.eos
                    && (stop as usize) < mask.len()
                    && mask.is_allowed(stop)
                    && !self.completes(stop)?
                {
                    mask.disallow_token(stop);
                }
            }
        }
        // The mask covers the model's vocabulary (the trie was built for it); any row entry past
        // it is forbidden too.
        let n = logits.len();
        let allowed = mask.num_set();
        mask.iter_unset_entries(|id| {
            if id < n {
                logits[id] = f32::NEG_INFINITY;
            }
        });
        if mask.len() < n {
            logits[mask.len()..].fill(f32::NEG_INFINITY);
        }
        if allowed == 0 {
            return Err(Error::Constraint("the grammar allows no next token".into()));
        }
        Ok(())
    }

    fn allows(&mut self, token: u32) -> Result<Option<bool>> {
        if self.matcher.is_stopped() || token == self.eos {
            return Ok(None);
        }
        if self.forced_close().is_some_and(|close| close != token) || self.stops.contains(&token) {
            // Only the close may come, if the grammar allows it here; a stop only where it
            // completes the grammar: the mask decides.
            return Ok(None);
        }
        let valid = self
            .matcher
            .validate_tokens(&[token])
            .map_err(|e| Error::Constraint(e.to_string()))?;
        Ok(Some(valid == 1))
    }

    fn accept(&mut self, token: u32) -> Result<()> {
        if self.matcher.is_stopped() {
            // The grammar is complete: only the end token may follow, and it ends the output.
            return Ok(());
        }
        self.consumed += 1;
        if self.budget.is_some_and(|b| b.close == token) {
            self.budget = None;
        }
        self.matcher
            .consume_token(token)
            .map_err(|e| Error::Constraint(format!("token {token} rejected: {e}")))
    }
}

#[cfg(test)]
mod tests;

//! UTF-8-safe streaming detokenization.
//!
//! Byte-level tokens can end inside a multi-byte character. [`IncrementalDecoder`] buffers the
//! bytes of an incomplete character and emits text only up to the last complete one. Invalid
//! sequences become U+FFFD exactly as in [`String::from_utf8_lossy`], so the concatenation of
//! everything `push` and `flush` return equals `Tokenizer::decode` of all ids.

use std::sync::Arc;

use super::Tokenizer;

/// A streaming decoder over a tokenizer (`&Tokenizer`, `Arc<Tokenizer>`, …).
#[derive(Debug)]
pub struct IncrementalDecoder<T: AsRef<Tokenizer> = Arc<Tokenizer>> {
    tokenizer: T,
    pending: Vec<u8>,
}

impl<T: AsRef<Tokenizer>> IncrementalDecoder<T> {
    /// A decoder with nothing pending.
    pub fn new(tokenizer: T) -> Self {
        IncrementalDecoder {
            tokenizer,
            pending: Vec::new(),
        }
    }

    /// Add one token; returns the text that became complete, if any.
    pub fn push(&mut self, id: u32) -> Option<String> {
        if let Some(bytes) = self.tokenizer.as_ref().token_bytes(id) {
            self.pending.extend_from_slice(bytes);
        }
        self.take_complete()
    }

    /// Emit whatever is pending (an incomplete character becomes U+FFFD) and reset.
    pub fn flush(&mut self) -> Option<String> {
        if self.pending.is_empty() {
            return None;
        }
        let text = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        Some(text)
    }

    /// Bytes held back because they may start a character that is not complete yet.
    pub fn pending_bytes(&self) -> &[u8] {
        &self.pending
    }

    fn take_complete(&mut self) -> Option<String> {
        let mut out = String::new();
        let mut consumed = 0;
        loop {
            match std::str::from_utf8(&self.pending[consumed..]) {
                Ok(s) => {
                    out.push_str(s);
                    consumed = self.pending.len();
                    break;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    out.push_str(
                        std::str::from_utf8(&self.pending[consumed..consumed + valid]).unwrap_or_default(),
                    );
                    consumed += valid;
                    match e.error_len() {
                        // Invalid bytes that no continuation can fix.
                        Some(n) => {
                            out.push('\u{FFFD}');
                            consumed += n;
                        }
                        // An incomplete character at the end: keep it for the next token.
                        None => break,
                    }
                }
            }
        }
        self.pending.drain(..consumed);
        (!out.is_empty()).then_some(out)
    }
}

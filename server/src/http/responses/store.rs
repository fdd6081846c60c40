//! Finished responses kept for `previous_response_id`: a bounded in-memory LRU (entries and
//! bytes) from response id to the whole conversation of that turn, its output included, with
//! the instructions left out (OpenAI does not carry `instructions` over). A follow-up's prompt
//! is that conversation plus the new items, a strict extension of the previous prompt, so the
//! engine's state reuse skips the shared prefix by itself. Nothing survives a restart.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use deltafin_engine::tokenizer::ChatMessage;

/// Default bound on stored responses.
pub const DEFAULT_ENTRIES: usize = 64;
/// Default bound on the stored conversations' text, in bytes.
pub const DEFAULT_BYTES: usize = 64 << 20;

#[derive(Debug)]
struct Entry {
    messages: Arc<Vec<ChatMessage>>,
    bytes: usize,
    used: u64,
}

#[derive(Debug, Default)]
struct Inner {
    map: HashMap<String, Entry>,
    tick: u64,
    bytes: usize,
}

/// The store (shared by every request of one server).
#[derive(Debug)]
pub struct ResponseStore {
    inner: Mutex<Inner>,
    max_entries: usize,
    max_bytes: usize,
}

impl Default for ResponseStore {
    fn default() -> Self {
        ResponseStore::new(DEFAULT_ENTRIES, DEFAULT_BYTES)
    }
}

/// The approximate memory one conversation holds.
fn size(messages: &[ChatMessage]) -> usize {
    messages
        .iter()
        .map(|m| {
            let calls = m
                .tool_calls
                .iter()
                .flatten()
                .map(|c| c.to_string().len())
                .sum::<usize>();
            let opt = |s: &Option<String>| s.as_ref().map_or(0, String::len);
            64 + m.role.len()
                + m.content.len()
                + calls
                + opt(&m.reasoning_content)
                + opt(&m.tool_call_id)
                + opt(&m.name)
        })
        .sum()
}

impl ResponseStore {
    pub fn new(max_entries: usize, max_bytes: usize) -> Self {
        ResponseStore {
            inner: Mutex::new(Inner::default()),
            max_entries,
            max_bytes,
        }
    }

    fn with<R>(&self, f: impl FnOnce(&mut Inner) -> R) -> R {
        let mut guard = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut guard)
    }

    /// The conversation of response `id` (now the most recently used), if still held.
    pub fn get(&self, id: &str) -> Option<Arc<Vec<ChatMessage>>> {
        self.with(|s| {
            s.tick += 1;
            let tick = s.tick;
            s.map.get_mut(id).map(|e| {
                e.used = tick;
                e.messages.clone()
            })
        })
    }

    /// Keep `messages` as response `id`, evicting the least recently used beyond the bounds
    /// (a conversation larger than the whole byte bound is not kept).
    pub fn put(&self, id: String, messages: Vec<ChatMessage>) {
        let bytes = size(&messages);
        if bytes > self.max_bytes || self.max_entries == 0 {
            return;
        }
        self.with(|s| {
            s.tick += 1;
            let entry = Entry {
                messages: Arc::new(messages),
                bytes,
                used: s.tick,
            };
            s.bytes += bytes;
            if let Some(old) = s.map.insert(id, entry) {
                s.bytes -= old.bytes;
            }
            while s.map.len() > self.max_entries || s.bytes > self.max_bytes {
                let Some(oldest) = s.map.iter().min_by_key(|(_, e)| e.used).map(|(k, _)| k.clone()) else {
                    break;
                };
                if let Some(e) = s.map.remove(&oldest) {
                    s.bytes -= e.bytes;
                }
            }
        });
    }

    /// Responses held.
    pub fn len(&self) -> usize {
        self.with(|s| s.map.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conv(text: &str) -> Vec<ChatMessage> {
        vec![ChatMessage::new("user", text)]
    }

    #[test]
    fn the_least_recently_used_goes_first_when_entries_run_out() {
        let s = ResponseStore::new(2, 1 << 20);
        s.put("a".into(), conv("a"));
        s.put("b".into(), conv("b"));
        assert!(s.get("a").is_some());
        s.put("c".into(), conv("c"));
        assert_eq!(s.len(), 2);
        assert!(s.get("b").is_none(), "b was least recently used");
        assert_eq!(s.get("a").unwrap()[0].content, "a");
        assert!(s.get("c").is_some());
    }

    #[test]
    fn the_byte_bound_evicts_and_oversized_conversations_are_not_kept() {
        let one = size(&conv(&"x".repeat(100)));
        let s = ResponseStore::new(64, one * 2);
        s.put("a".into(), conv(&"x".repeat(100)));
        s.put("b".into(), conv(&"x".repeat(100)));
        s.put("c".into(), conv(&"x".repeat(100)));
        assert_eq!(s.len(), 2);
        assert!(s.get("a").is_none());
        s.put("huge".into(), conv(&"x".repeat(one * 3)));
        assert!(s.get("huge").is_none());
        assert_eq!(s.len(), 2);
        // Replacing an id does not double-count its bytes.
        s.put("b".into(), conv(&"x".repeat(100)));
        assert_eq!(s.len(), 2);
        assert!(s.get("c").is_some() && s.get("b").is_some());
    }
}

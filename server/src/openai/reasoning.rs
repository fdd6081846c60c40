//! The reasoning split (pure): which output tokens are thinking, which are the answer, and which
//! are control tokens to hide. Kimi and DeepSeek chat formats wrap thinking in the special
//! tokens `<think>` … `</think>`; when the rendered prompt already ends with the opening marker
//! the output starts inside the thinking.
//!
//! Markers are recognised only as special token ids, never as text the model spelled out, so a
//! literal "<think>" in an answer stays in the answer.

/// Where a piece of output text goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Channel {
    /// `reasoning_content`.
    Reasoning,
    /// `content` (`text` for completions).
    Content,
}

/// The token ids that open and close thinking.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThinkMarkers {
    pub open: u32,
    pub close: u32,
}

/// What to do with one output token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// Decode it into this channel.
    Text(Channel),
    /// A marker or another special token: not shown.
    Hidden,
}

/// The split state machine for one response.
#[derive(Debug, Clone)]
pub struct ReasoningSplit {
    markers: Option<ThinkMarkers>,
    channel: Channel,
}

impl ReasoningSplit {
    /// A splitter; `markers: None` sends everything to `Content`. `prompt_tail` is the last
    /// prompt id: a prompt ending in the open marker starts inside the thinking.
    pub fn new(markers: Option<ThinkMarkers>, prompt_tail: Option<u32>) -> Self {
        let thinking = matches!((markers, prompt_tail), (Some(m), Some(t)) if m.open == t);
        ReasoningSplit {
            markers,
            channel: if thinking {
                Channel::Reasoning
            } else {
                Channel::Content
            },
        }
    }

    /// The current channel.
    pub fn channel(&self) -> Channel {
        self.channel
    }

    /// Route token `id`; `special` says whether it is a special (control) token.
    pub fn route(&mut self, id: u32, special: bool) -> Route {
        if let Some(m) = self.markers {
            if id == m.open {
                self.channel = Channel::Reasoning;
                return Route::Hidden;
            }
            if id == m.close {
                self.channel = Channel::Content;
                return Route::Hidden;
            }
        }
        if special {
            Route::Hidden
        } else {
            Route::Text(self.channel)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const M: ThinkMarkers = ThinkMarkers {
        open: 100,
        close: 101,
    };

    fn routes(split: &mut ReasoningSplit, ids: &[(u32, bool)]) -> Vec<Route> {
        ids.iter()
            .map(|&(id, special)| split.route(id, special))
            .collect()
    }

    #[test]
    fn thinking_then_answer() {
        let mut s = ReasoningSplit::new(Some(M), Some(7));
        let r = routes(
            &mut s,
            &[
                (1, false),
                (100, true),
                (2, false),
                (101, true),
                (3, false),
                (5, true),
            ],
        );
        use Channel::*;
        use Route::*;
        assert_eq!(
            r,
            vec![
                Text(Content),
                Hidden,
                Text(Reasoning),
                Hidden,
                Text(Content),
                Hidden
            ]
        );
    }

    #[test]
    fn a_prompt_ending_in_the_open_marker_starts_in_reasoning() {
        let mut s = ReasoningSplit::new(Some(M), Some(100));
        assert_eq!(s.channel(), Channel::Reasoning);
        assert_eq!(s.route(9, false), Route::Text(Channel::Reasoning));
        assert_eq!(s.route(101, true), Route::Hidden);
        assert_eq!(s.route(9, false), Route::Text(Channel::Content));
    }

    #[test]
    fn without_markers_everything_is_content_and_specials_hide() {
        let mut s = ReasoningSplit::new(None, Some(100));
        assert_eq!(s.route(100, true), Route::Hidden);
        assert_eq!(s.route(4, false), Route::Text(Channel::Content));
    }
}

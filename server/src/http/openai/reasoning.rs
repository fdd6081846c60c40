//! The reasoning split (pure): which output tokens are thinking, which are the answer, and which
//! are control tokens to hide. Two chat formats separate thinking:
//!
//! * **Think tags** (Kimi K2 thinking, DeepSeek-R1): the special tokens `<think>` … `</think>`.
//! * **XTML** (Kimi K3): elements `<|open|>NAME<|sep|>` … `<|close|>NAME<|sep|>`, where the
//!   special `<|open|>`/`<|close|>`/`<|sep|>` wrap a plain-text name; `think` holds the
//!   reasoning and `response` the answer. Every tag (any name) is hidden, never partially shown.
//! * **Harmony** (gpt-oss): messages `<|channel|>NAME<|message|>BODY` (a later one opened by
//!   `<|start|>ROLE`); the `analysis` channel is reasoning, `final` and `commentary` are the
//!   answer. Headers are hidden; the output starts in the header of the assistant message the
//!   generation prompt opened.
//!
//! A rendered prompt that already opened the thinking (the generation prompt of thinking
//! templates) starts the output inside it. Markers are recognised only by token ids: text the
//! model spells out ("<think>") stays text. Element and channel *names* between the markers
//! are plain text, compared by what they spell, not by their ids: a model may spell `analysis`
//! in other tokens than the tokenizer's own encoding (a grammar admits every spelling), and the
//! tool-call parser reads harmony headers by their text too.
//!
//! K3 sometimes omits `<|close|>think<|sep|>` (agent-api.md §2, "Known K3 bugs"): opening
//! `response` or `tools`, or closing `response`, also ends the thinking. A tool-call section
//! (parsed before this split) ends it too, through [`ReasoningSplit::leave_reasoning`].

/// The `<think>` / `</think>` token ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThinkMarkers {
    pub open: u32,
    pub close: u32,
    /// The id of `"\n"`, which may follow `<think>` at the end of a generation prompt
    /// (Qwen3.5's and MiniMax-M2's `<think>\n`).
    pub newline: Option<u32>,
}

/// XTML control tokens and the ids of the element names that switch channels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XtmlMarkers {
    pub open: u32,
    pub close: u32,
    pub sep: u32,
    /// Ids of the plain text `think`.
    pub think: Vec<u32>,
    /// Ids of the plain text `response`.
    pub response: Vec<u32>,
    /// Ids of the plain text `tools`.
    pub tools: Vec<u32>,
}

/// Harmony's control tokens and the ids of the channel name `analysis`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HarmonyMarkers {
    pub start: u32,
    pub channel: u32,
    pub message: u32,
    /// Ids of the plain text `analysis`.
    pub analysis: Vec<u32>,
}

/// How a chat format marks its thinking.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Markers {
    Think(ThinkMarkers),
    Xtml(XtmlMarkers),
    Harmony(HarmonyMarkers),
}

/// Where a piece of output text goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Channel {
    /// `reasoning_content`.
    Reasoning,
    /// `content` (`text` for completions).
    Content,
}

/// What to do with one output token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// Decode it into this channel.
    Text(Channel),
    /// A marker, part of a tag, or another special token: not shown.
    Hidden,
}

/// Longest XTML tag name (in tokens) held before the tag is given up as malformed.
const MAX_TAG_TOKENS: usize = 64;

/// The split state machine for one response.
#[derive(Debug, Clone)]
pub struct ReasoningSplit {
    markers: Option<Markers>,
    channel: Channel,
    /// Inside an XTML tag: whether it opens an element, and the name's ids so far.
    tag: Option<(bool, Vec<u32>)>,
    /// Inside a harmony header: the channel name's ids so far.
    header: Option<Vec<u32>>,
}

/// Whether `prompt` ends inside an opened thinking element (`<think>`, possibly followed by a
/// newline, or XTML's `<|open|>think<|sep|>`), so the output starts with reasoning.
pub fn opens_thinking(markers: Option<&Markers>, prompt: &[u32]) -> bool {
    match markers {
        Some(Markers::Think(m)) => match prompt {
            [.., last] if *last == m.open => true,
            [.., open, last] => *open == m.open && Some(*last) == m.newline,
            _ => false,
        },
        Some(Markers::Xtml(x)) => {
            let mut opened = vec![x.open];
            opened.extend(&x.think);
            opened.push(x.sep);
            prompt.ends_with(&opened)
        }
        Some(Markers::Harmony(_)) | None => false,
    }
}

impl ReasoningSplit {
    /// A splitter; `markers: None` sends all text to `Content`. `prompt` is the rendered
    /// prompt: one ending in an opened thinking element starts inside the thinking.
    pub fn new(markers: Option<Markers>, prompt: &[u32]) -> Self {
        let channel = if opens_thinking(markers.as_ref(), prompt) {
            Channel::Reasoning
        } else {
            Channel::Content
        };
        let header = matches!(markers, Some(Markers::Harmony(_))).then(Vec::new);
        ReasoningSplit {
            markers,
            channel,
            tag: None,
            header,
        }
    }

    /// The current channel.
    pub fn channel(&self) -> Channel {
        self.channel
    }

    /// The output left the thinking without its close marker (a tool-call section began).
    pub fn leave_reasoning(&mut self) {
        self.channel = Channel::Content;
    }

    /// Route token `id`; `special` says whether it is a special (control) token; `spell` gives
    /// the text of ids (the tokenizer's decode), for comparing names.
    pub fn route(&mut self, id: u32, special: bool, spell: &dyn Fn(&[u32]) -> String) -> Route {
        let same = |a: &[u32], b: &[u32]| a == b || spell(a) == spell(b);
        match &self.markers {
            Some(Markers::Think(m)) if id == m.open => self.channel = Channel::Reasoning,
            Some(Markers::Think(m)) if id == m.close => self.channel = Channel::Content,
            Some(Markers::Xtml(x)) => {
                if let Some((opening, name)) = &mut self.tag {
                    if id == x.sep {
                        let leaves = same(name, &x.response) || (*opening && same(name, &x.tools));
                        self.channel = match (*opening, same(name, &x.think)) {
                            (true, true) => Channel::Reasoning,
                            (false, true) => Channel::Content,
                            _ if leaves => Channel::Content,
                            _ => self.channel,
                        };
                        self.tag = None;
                    } else if name.len() < MAX_TAG_TOKENS {
                        name.push(id);
                    } else {
                        self.tag = None;
                    }
                    return Route::Hidden;
                }
                if id == x.open || id == x.close {
                    self.tag = Some((id == x.open, Vec::new()));
                    return Route::Hidden;
                }
                if special {
                    return Route::Hidden;
                }
                return Route::Text(self.channel);
            }
            Some(Markers::Harmony(h)) => {
                if id == h.start || id == h.channel {
                    self.header = Some(Vec::new());
                } else if id == h.message {
                    // The header's first word is the channel (a recipient or content type may follow).
                    let analysis = self.header.take().is_some_and(|name| {
                        name == h.analysis
                            || spell(&name).split_whitespace().next() == Some(&*spell(&h.analysis))
                    });
                    self.channel = if analysis {
                        Channel::Reasoning
                    } else {
                        Channel::Content
                    };
                } else if let Some(name) = &mut self.header {
                    if !special && name.len() < MAX_TAG_TOKENS {
                        name.push(id);
                    }
                } else if !special {
                    return Route::Text(self.channel);
                }
            }
            _ if special => {}
            _ => return Route::Text(self.channel),
        }
        Route::Hidden
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const M: ThinkMarkers = ThinkMarkers {
        open: 100,
        close: 101,
        newline: Some(9),
    };

    /// <|start|>=1 <|channel|>=2 <|message|>=3 (special); "analysis" = [7, 8].
    fn harmony() -> Markers {
        Markers::Harmony(HarmonyMarkers {
            start: 1,
            channel: 2,
            message: 3,
            analysis: vec![7, 8],
        })
    }

    fn xtml() -> Markers {
        Markers::Xtml(XtmlMarkers {
            open: 200,
            close: 201,
            sep: 202,
            think: vec![1, 2],
            response: vec![3, 4],
            tools: vec![5],
        })
    }

    /// The test vocabulary's text: "think" = [1, 2], "response" = [3, 4], "tools" = [5],
    /// "analysis" = [7, 8], and the same names in other pieces: "t"+"hink" = [11, 12],
    /// "a"+"nalysis" = [13, 14]; anything else spells itself as `<id>`.
    fn spell(ids: &[u32]) -> String {
        ids.iter()
            .map(|&id| match id {
                1 => "th".to_string(),
                2 => "ink".into(),
                3 => "resp".into(),
                4 => "onse".into(),
                5 => "tools".into(),
                7 => "anal".into(),
                8 => "ysis".into(),
                11 => "t".into(),
                12 => "hink".into(),
                13 => "a".into(),
                14 => "nalysis".into(),
                _ => format!("<{id}>"),
            })
            .collect()
    }

    fn route(split: &mut ReasoningSplit, id: u32, special: bool) -> Route {
        split.route(id, special, &spell)
    }

    fn routes(split: &mut ReasoningSplit, ids: &[(u32, bool)]) -> Vec<Route> {
        ids.iter()
            .map(|&(id, special)| route(split, id, special))
            .collect()
    }

    use Channel::*;
    use Route::*;

    #[test]
    fn thinking_then_answer() {
        let mut s = ReasoningSplit::new(Some(Markers::Think(M)), &[7]);
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
        let mut s = ReasoningSplit::new(Some(Markers::Think(M)), &[5, 100]);
        assert_eq!(s.channel(), Reasoning);
        assert_eq!(route(&mut s, 9, false), Text(Reasoning));
        assert_eq!(route(&mut s, 101, true), Hidden);
        assert_eq!(route(&mut s, 9, false), Text(Content));
        // `<think>\n` (Qwen3.5, MiniMax-M2) opens it too; other text after the open does not.
        assert!(opens_thinking(Some(&Markers::Think(M)), &[5, 100, 9]));
        assert!(!opens_thinking(Some(&Markers::Think(M)), &[5, 100, 7]));
        assert!(!opens_thinking(Some(&Markers::Think(M)), &[100, 101, 9]));
        assert!(!opens_thinking(Some(&Markers::Think(M)), &[9]));
    }

    #[test]
    fn harmony_channels_split_and_headers_hide() {
        // <|start|>=1 <|channel|>=2 <|message|>=3 <|end|>=4 (special); "analysis" = [7, 8].
        let h = harmony();
        let mut s = ReasoningSplit::new(Some(h), &[1, 9]);
        assert!(!opens_thinking(s.markers.as_ref(), &[1, 9]));
        let ids = [
            (2, true),
            (7, false),
            (8, false),
            (3, true),
            (20, false),
            (4, true), // analysis
            (1, true),
            (9, false),
            (2, true),
            (30, false),
            (3, true),
            (21, false), // final
        ];
        assert_eq!(
            routes(&mut s, &ids),
            [
                Hidden,
                Hidden,
                Hidden,
                Hidden,
                Text(Reasoning),
                Hidden,
                Hidden,
                Hidden,
                Hidden,
                Hidden,
                Hidden,
                Text(Content),
            ]
        );
    }

    /// A grammar admits every spelling of a channel or element name, and a model under one may
    /// take another than the tokenizer's own: the name is what it spells.
    #[test]
    fn names_spelled_in_other_tokens_still_switch_channels() {
        let h = harmony();
        let mut s = ReasoningSplit::new(Some(h), &[1, 9]);
        let ids = [(2, true), (13, false), (14, false), (3, true), (20, false)];
        assert_eq!(routes(&mut s, &ids)[4], Text(Reasoning), "<|channel|>a+nalysis");
        // Prompt ends with <|open|>response<|sep|>; then <|open|>t+hink<|sep|> opens thinking.
        let mut s = ReasoningSplit::new(Some(xtml()), &[200, 3, 4, 202]);
        let ids = [(200, true), (11, false), (12, false), (202, true), (50, false)];
        assert_eq!(routes(&mut s, &ids)[4], Text(Reasoning));
        let ids = [(201, true), (11, false), (12, false), (202, true), (51, false)];
        assert_eq!(routes(&mut s, &ids)[4], Text(Content));
    }

    #[test]
    fn without_markers_everything_is_content_and_specials_hide() {
        let mut s = ReasoningSplit::new(None, &[100]);
        assert_eq!(route(&mut s, 100, true), Hidden);
        assert_eq!(route(&mut s, 4, false), Text(Content));
    }

    #[test]
    fn xtml_elements_switch_channels_and_tags_are_hidden() {
        // Prompt ends with <|open|>think<|sep|>.
        let mut s = ReasoningSplit::new(Some(xtml()), &[9, 200, 1, 2, 202]);
        assert_eq!(s.channel(), Reasoning);
        let ids = [
            (50, false), // thinking
            (201, true),
            (1, false),
            (2, false),
            (202, true), // </think>
            (200, true),
            (3, false),
            (4, false),
            (202, true), // <response>
            (60, false), // answer
            (201, true),
            (3, false),
            (4, false),
            (202, true), // </response>
            (200, true),
            (9, false),
            (202, true), // an unknown element: hidden, no switch
            (61, false),
        ];
        let r = routes(&mut s, &ids);
        let shown: Vec<(u32, Route)> = ids
            .iter()
            .map(|p| p.0)
            .zip(r)
            .filter(|(_, r)| *r != Hidden)
            .collect();
        assert_eq!(
            shown,
            vec![(50, Text(Reasoning)), (60, Text(Content)), (61, Text(Content))]
        );
        // A prompt that did not open the thinking starts in the answer.
        assert_eq!(
            ReasoningSplit::new(Some(xtml()), &[200, 3, 4, 202]).channel(),
            Content
        );
    }

    #[test]
    fn a_runaway_tag_is_dropped_without_exposing_it() {
        let mut s = ReasoningSplit::new(Some(xtml()), &[]);
        assert_eq!(route(&mut s, 200, true), Hidden);
        for _ in 0..MAX_TAG_TOKENS {
            assert_eq!(route(&mut s, 7, false), Hidden);
        }
        assert_eq!(route(&mut s, 7, false), Hidden, "the tag is given up");
        assert_eq!(route(&mut s, 7, false), Text(Content));
    }

    #[test]
    fn k3_response_or_tools_without_a_think_close_ends_the_thinking() {
        let prompt = [200, 1, 2, 202];
        // <|open|>response<|sep|> while thinking.
        let mut s = ReasoningSplit::new(Some(xtml()), &prompt);
        routes(
            &mut s,
            &[(50, false), (200, true), (3, false), (4, false), (202, true)],
        );
        assert_eq!(s.channel(), Content);
        // <|close|>response<|sep|> while thinking.
        let mut s = ReasoningSplit::new(Some(xtml()), &prompt);
        routes(&mut s, &[(201, true), (3, false), (4, false), (202, true)]);
        assert_eq!(s.channel(), Content);
        // <|open|>tools<|sep|> while thinking.
        let mut s = ReasoningSplit::new(Some(xtml()), &prompt);
        routes(&mut s, &[(200, true), (5, false), (202, true)]);
        assert_eq!(s.channel(), Content);
        // A closing tools tag or another element does not.
        let mut s = ReasoningSplit::new(Some(xtml()), &prompt);
        routes(
            &mut s,
            &[
                (201, true),
                (5, false),
                (202, true),
                (200, true),
                (9, false),
                (202, true),
            ],
        );
        assert_eq!(s.channel(), Reasoning);
        s.leave_reasoning();
        assert_eq!(s.channel(), Content);
    }
}

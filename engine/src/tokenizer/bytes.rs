//! GPT-2's reversible byte <-> printable-character map, the alphabet in which byte-level BPE
//! vocabularies (tokenizer.json, and Kimi's `get_vocab()`) spell token strings.

use std::sync::OnceLock;

/// The two directions of the map: `to_char[b]` and `to_byte(c)`.
#[derive(Debug)]
pub(crate) struct ByteMap {
    to_char: [char; 256],
    /// Indexed by code point; the alphabet lies entirely below U+0144.
    to_byte: [Option<u8>; ALPHABET_END],
}

/// One past the largest code point of the alphabet (U+0100 + 68 remapped bytes).
const ALPHABET_END: usize = 256 + 68;

impl ByteMap {
    /// The process-wide map (built once; it is a pure function of the byte values).
    pub(crate) fn get() -> &'static ByteMap {
        static MAP: OnceLock<ByteMap> = OnceLock::new();
        MAP.get_or_init(ByteMap::build)
    }

    fn build() -> ByteMap {
        let mut to_char = ['\0'; 256];
        let mut to_byte = [None; ALPHABET_END];
        let mut next = 256u32;
        for b in 0..=255u8 {
            let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
            let c = if printable {
                char::from(b)
            } else {
                let c = char::from_u32(next).unwrap_or('\u{FFFD}');
                next += 1;
                c
            };
            to_char[usize::from(b)] = c;
            if let Some(slot) = to_byte.get_mut(c as usize) {
                *slot = Some(b);
            }
        }
        ByteMap { to_char, to_byte }
    }

    /// The character that spells byte `b`.
    pub(crate) fn char_of(&self, b: u8) -> char {
        self.to_char[usize::from(b)]
    }

    /// The byte spelled by `c`, if `c` belongs to the alphabet.
    pub(crate) fn byte_of(&self, c: char) -> Option<u8> {
        self.to_byte.get(c as usize).copied().flatten()
    }

    /// Spell `bytes` in the alphabet.
    pub(crate) fn encode(&self, bytes: &[u8]) -> String {
        bytes.iter().map(|&b| self.char_of(b)).collect()
    }

    /// Bytes spelled by `s`, or `None` if some character is outside the alphabet.
    pub(crate) fn decode(&self, s: &str) -> Option<Vec<u8>> {
        s.chars().map(|c| self.byte_of(c)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::ByteMap;

    #[test]
    fn round_trips_every_byte() {
        let map = ByteMap::get();
        for b in 0..=255u8 {
            assert_eq!(map.byte_of(map.char_of(b)), Some(b));
        }
        assert_eq!(map.char_of(b' '), 'Ġ');
        assert_eq!(map.char_of(b'\n'), 'Ċ');
        assert_eq!(map.byte_of('A'), Some(b'A'));
        assert_eq!(map.byte_of('\u{144}'), None);
        assert_eq!(map.byte_of(' '), None);
    }
}

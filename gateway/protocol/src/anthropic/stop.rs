//! `stop_sequences`, applied by the gateway: the Codex backend rejects `stop`, so the text is
//! cut where a sequence first appears, as Anthropic does (the sequence itself is not shown).
//!
//! # Key Components
//! - [`StopMatcher`]: fed text pieces as they stream; it releases text that can no longer be
//!   the start of a stop sequence and holds back the rest (at most the longest sequence minus
//!   one byte), so a sequence split across deltas is still found.

/// Incremental stop-sequence matcher over one stream of text.
#[derive(Debug, Clone, Default)]
pub(crate) struct StopMatcher {
    sequences: Vec<String>,
    held: String,
    matched: Option<String>,
}

// === impl StopMatcher ===

impl StopMatcher {
    /// A matcher for `sequences` (empty ones are ignored).
    pub(crate) fn new(sequences: &[String]) -> Self {
        Self {
            sequences: sequences
                .iter()
                .filter(|s| !s.is_empty())
                .cloned()
                .collect(),
            held: String::new(),
            matched: None,
        }
    }

    /// Whether there is anything to match.
    pub(crate) fn is_active(&self) -> bool {
        !self.sequences.is_empty()
    }

    /// The sequence that matched, once one did.
    pub(crate) fn matched(&self) -> Option<&str> {
        self.matched.as_deref()
    }

    /// Feeds `text`; returns what may be shown now. After a match everything is dropped.
    pub(crate) fn push(&mut self, text: &str) -> String {
        if self.matched.is_some() {
            return String::new();
        }
        self.held.push_str(text);
        // The earliest occurrence of any sequence ends the text.
        let first = self
            .sequences
            .iter()
            .filter_map(|s| self.held.find(s.as_str()).map(|at| (at, s)))
            .min_by_key(|(at, s)| (*at, std::cmp::Reverse(s.len())));
        if let Some((at, s)) = first {
            self.matched = Some(s.clone());
            let mut shown = std::mem::take(&mut self.held);
            shown.truncate(at);
            return shown;
        }
        // Hold back the longest suffix that is a prefix of some sequence.
        let mut keep = 0;
        for s in &self.sequences {
            let max = s.len().saturating_sub(1).min(self.held.len());
            for n in (keep + 1..=max).rev() {
                let start = self.held.len() - n;
                if self.held.is_char_boundary(start) && s.starts_with(&self.held[start..]) {
                    keep = n;
                    break;
                }
            }
        }
        let cut = self.held.len() - keep;
        let rest = self.held.split_off(cut);
        std::mem::replace(&mut self.held, rest)
    }

    /// The end of the text: whatever was held back is shown.
    pub(crate) fn flush(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(seqs: &[&str], pieces: &[&str]) -> (String, Option<String>) {
        let seqs: Vec<String> = seqs.iter().map(|s| (*s).to_owned()).collect();
        let mut m = StopMatcher::new(&seqs);
        let mut out = String::new();
        for p in pieces {
            out.push_str(&m.push(p));
        }
        if m.matched().is_none() {
            out.push_str(&m.flush());
        }
        (out, m.matched().map(str::to_owned))
    }

    #[test]
    fn cuts_before_the_sequence_even_across_pieces() {
        assert_eq!(
            run(&["STOP"], &["hello ST", "OP world"]),
            ("hello ".into(), Some("STOP".into()))
        );
        assert_eq!(
            run(&["STOP"], &["hello S", "T", "ray"]),
            ("hello STray".into(), None)
        );
        assert_eq!(
            run(&["\n\nHuman:", "END"], &["a\n", "\nHu", "man: x END"]),
            ("a".into(), Some("\n\nHuman:".into()))
        );
        assert_eq!(
            run(&["é!"], &["caf", "é", "!"]),
            ("caf".into(), Some("é!".into()))
        );
        assert_eq!(run(&[], &["a", "b"]), ("ab".into(), None));
    }

    #[test]
    fn releases_text_that_cannot_start_a_sequence() {
        let mut m = StopMatcher::new(&["abc".to_owned()]);
        assert_eq!(m.push("xxab"), "xx");
        assert_eq!(m.push("d"), "abd");
        assert_eq!(m.push("a"), "");
        assert_eq!(m.flush(), "a");
    }
}

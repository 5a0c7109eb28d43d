//! Reasoning effort as the Codex backend takes it (`reasoning.effort`), for every client
//! dialect that asks for one.
//!
//! # Key Components
//! - [`clamp_effort`]: a requested effort -> the nearest level the model supports.

/// Reasoning effort levels from lowest to highest, for clamping.
const EFFORT_ORDER: [&str; 7] = ["none", "minimal", "low", "medium", "high", "xhigh", "max"];

/// Clamps `effort` to the nearest supported level at or below it (or the lowest above it).
pub(crate) fn clamp_effort<'e>(effort: &'e str, levels: &'e [String]) -> &'e str {
    if levels.is_empty() || levels.iter().any(|l| l == effort) {
        return effort;
    }
    let rank = |s: &str| EFFORT_ORDER.iter().position(|x| *x == s);
    let Some(want) = rank(effort) else {
        return effort;
    };
    let ranked = levels
        .iter()
        .filter_map(|l| rank(l).map(|r| (r, l.as_str())));
    ranked
        .clone()
        .filter(|(r, _)| *r <= want)
        .max_by_key(|(r, _)| *r)
        .or_else(|| ranked.min_by_key(|(r, _)| *r))
        .map_or(effort, |(_, l)| l)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clamps_efforts() {
        let levels = vec!["low".to_owned(), "medium".to_owned(), "high".to_owned()];
        assert_eq!(clamp_effort("high", &levels), "high");
        assert_eq!(clamp_effort("xhigh", &levels), "high");
        assert_eq!(clamp_effort("minimal", &levels), "low");
        assert_eq!(clamp_effort("bogus", &levels), "bogus");
        assert_eq!(clamp_effort("xhigh", &[]), "xhigh");
    }
}

//! A header `regex` condition, compiled once at configure time and run on every matching request.
//!
//! Invariant: a `Pattern` matches the **whole** value (the source is anchored as one group, so an
//! alternation cannot match a part of it), and matching takes time linear in the value's length
//! (`regex-lite` has no backtracking, backreferences or look-around): a client cannot make a
//! header check slow. A pattern longer than [`MAX_PATTERN_LEN`] or whose compiled form is larger
//! than the size limit is refused.

/// Longest `regex` pattern.
pub const MAX_PATTERN_LEN: usize = 1024;

/// A regular expression that must match a whole header value, run by `regex-lite`.
#[derive(Debug, Clone)]
pub struct Pattern {
    /// As configured (without the anchors added to it).
    pub source: String,
    regex: regex_lite::Regex,
}

/// Two patterns are the same when they were configured the same.
impl PartialEq for Pattern {
    fn eq(&self, other: &Self) -> bool {
        self.source == other.source
    }
}

impl Eq for Pattern {}

impl Pattern {
    /// `source`, anchored and compiled; the error is a reason for the configuration's message.
    pub fn new(source: &str) -> Result<Pattern, String> {
        if source.len() > MAX_PATTERN_LEN {
            return Err(format!("must be at most {MAX_PATTERN_LEN} bytes"));
        }
        let regex = regex_lite::RegexBuilder::new(&format!("^(?:{source})$"))
            .nest_limit(32)
            .size_limit(256 * 1024)
            .build()
            .map_err(|e| {
                let text = e.to_string();
                let line = text.lines().last().unwrap_or_default().trim().to_owned();
                format!("is not a valid regular expression: {line}")
            })?;
        Ok(Pattern {
            source: source.to_owned(),
            regex,
        })
    }

    /// Whether the whole of `value` matches (bytes that are not UTF-8 read as U+FFFD).
    pub fn is_match(&self, value: &[u8]) -> bool {
        self.regex.is_match(&String::from_utf8_lossy(value))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anchored_as_a_whole() {
        let p = Pattern::new("v[0-9]+").unwrap();
        assert!(p.is_match(b"v12"));
        assert!(!p.is_match(b"xv12") && !p.is_match(b"v12x"));
        let p = Pattern::new("a|b").unwrap();
        assert!(p.is_match(b"a") && p.is_match(b"b"));
        assert!(!p.is_match(b"ab") && !p.is_match(b"xb"));
        // Bytes that are not UTF-8 read as U+FFFD: one character, not a digit.
        assert!(!Pattern::new("v[0-9]").unwrap().is_match(&[b'v', 0xff]));
        assert!(Pattern::new("v.").unwrap().is_match(&[b'v', 0xff]));
    }

    #[test]
    fn matching_is_linear_on_a_classic_blow_up() {
        // (a+)+$ against "aaa…b" takes exponential time in a backtracking engine.
        let p = Pattern::new("(a+)+").unwrap();
        let value = format!("{}b", "a".repeat(50_000));
        let start = std::time::Instant::now();
        assert!(!p.is_match(value.as_bytes()));
        assert!(p.is_match("a".repeat(50_000).as_bytes()));
        // Not a timing assertion on a busy machine: this only fails if matching is exponential.
        assert!(start.elapsed() < std::time::Duration::from_secs(30));
    }

    #[test]
    fn refused_patterns() {
        assert_eq!(
            Pattern::new(&"a".repeat(1025)).unwrap_err(),
            "must be at most 1024 bytes"
        );
        // Backreferences and look-around (what makes backtracking engines blow up) do not exist,
        // and too many repetitions compile to more than the size limit.
        for pat in [r"(a)\1", "(?=a)a", "(?<=a)b", "((a{100}){100}){100}", "(x"] {
            let e = Pattern::new(pat).unwrap_err();
            assert!(
                e.starts_with("is not a valid regular expression: "),
                "{pat}: {e}"
            );
        }
    }
}

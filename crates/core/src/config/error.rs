//! The configuration's one error, and how it quotes what a user wrote.
//!
//! Invariant: a `ConfigError` displays as one line, `<field>: <reason>`, where `<field>` is a path
//! such as `rules[1].rate` (or `configuration` for the whole document). User text in it is
//! escaped and cut to 64 characters, so a log line stays one line of bounded length; a secret
//! (`basic_auth`, `password`) is never quoted.

/// A configuration error: `field` is a path such as `rules[1].rate`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub field: String,
    pub reason: String,
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.reason)
    }
}

impl std::error::Error for ConfigError {}

/// The field name of the whole document.
pub const DOCUMENT: &str = "configuration";

pub fn err(field: impl Into<String>, reason: impl Into<String>) -> ConfigError {
    ConfigError {
        field: field.into(),
        reason: reason.into(),
    }
}

/// Longest user text an error quotes, in characters.
const MAX_QUOTED_CHARS: usize = 64;

/// A user-supplied string for an error message: quoted, escaped (the log stays one line), and cut
/// to 64 characters.
pub fn quoted(s: &str) -> String {
    let mut chars = s.chars();
    let head: String = chars.by_ref().take(MAX_QUOTED_CHARS).collect();
    if chars.next().is_some() {
        format!("{head:?}…")
    } else {
        format!("{head:?}")
    }
}

/// A field name the user wrote, safe to put in a field path (escaped, cut to 64 characters).
pub fn field_name(s: &str) -> String {
    let mut chars = s.chars();
    let head: String = chars.by_ref().take(MAX_QUOTED_CHARS).collect();
    let escaped: String = head.escape_debug().collect();
    if chars.next().is_some() {
        format!("{escaped}…")
    } else {
        escaped
    }
}

/// `parent.name`, or `name` at the top level.
pub fn join(parent: &str, name: &str) -> String {
    if parent.is_empty() {
        name.to_owned()
    } else {
        format!("{parent}.{name}")
    }
}

/// `parent[i]`.
pub fn index(parent: &str, i: usize) -> String {
    format!("{parent}[{i}]")
}

//! Path normalisation for `path_prefix` matching and the `path` key source.
//!
//! Invariant: a request never escapes a path rule by how it spells its path, nor reaches a path's
//! override by a spelling only some servers call that path. A `path_prefix` rule applies when the
//! prefix starts **any** reading a server could give the path; an override applies only when
//! **every** reading is the path as sent (`agreed`). The readings: the bytes as sent,
//! or the RFC 3986 normal form with `%2F`/`%5C` read as data or as separators and `;params` kept
//! or cut (four normal forms), each also with the escapes servers decode before routing decoded
//! ([`decoded`]). A path no reading can make sense of (an invalid `%` escape, a `..` above the
//! root) is *irregular*, and an irregular path matches every path rule.
//!
//! The normal form: the path before `?`/`#`, with a leading `/` added if missing; unreserved
//! characters (`A-Z a-z 0-9 - . _ ~`) percent-decoded, every other escape upper-cased
//! (`%2f` → `%2F`) and a `%` that starts no escape written `%25`; repeated slashes merged; `.` and `..` segments resolved as RFC 3986 §5.2.4
//! says, a `..` at the root staying at the root. Case is kept.

use std::borrow::Cow;

/// How a server may read the two things servers disagree on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reading {
    /// `%2F`, `%5C` and `\` separate segments (Envoy's `UNESCAPE_AND_FORWARD`, Go's `net/http`,
    /// Windows servers), instead of being data inside a segment.
    pub escaped_slashes: bool,
    /// `;params` are cut from each segment (Java servlet containers read `/a;x=1/b` as `/a/b` and
    /// `/..;/` as `/../`).
    pub strip_params: bool,
}

impl Reading {
    /// Escapes stay data, `;` stays part of the segment (what Envoy's `normalize_path` does with
    /// `path_with_escaped_slashes_action: KEEP_UNCHANGED`).
    pub const STRICT: Reading = Reading {
        escaped_slashes: false,
        strip_params: false,
    };
    /// Everything that could separate or hide a segment does: the reading that merges most.
    pub const LOOSE: Reading = Reading {
        escaped_slashes: true,
        strip_params: true,
    };
    /// The four normal-form readings.
    pub const ALL: [Reading; 4] = [
        Reading::STRICT,
        Reading {
            escaped_slashes: true,
            strip_params: false,
        },
        Reading {
            escaped_slashes: false,
            strip_params: true,
        },
        Reading::LOOSE,
    ];
}

/// A path in normal form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Normal {
    pub path: Vec<u8>,
    /// An invalid percent escape, or a `..` above the root: servers disagree on what it means.
    pub irregular: bool,
}

/// `:path` up to the first `?` or `#`.
pub fn path_only(full: &[u8]) -> &[u8] {
    let end = full
        .iter()
        .position(|&b| b == b'?' || b == b'#')
        .unwrap_or(full.len());
    full.get(..end).unwrap_or(full)
}

fn hex_value(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// The byte a `%XX` escape at `s[i]` encodes; None if there is none there (no `%`, or not two
/// hex digits after it).
pub(crate) fn escape_at(s: &[u8], i: usize) -> Option<u8> {
    if s.get(i) != Some(&b'%') {
        return None;
    }
    let hi = s.get(i + 1).copied().and_then(hex_value)?;
    let lo = s.get(i + 2).copied().and_then(hex_value)?;
    Some(hi << 4 | lo)
}

fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

fn upper_hex(nibble: u8) -> u8 {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    HEX.get(usize::from(nibble & 0x0f)).copied().unwrap_or(b'0')
}

/// True when the normal form of `path` (a path without query) is `path` itself under every
/// reading: it starts with `/`, has no `%`, `\`, `;`, no empty segment but a trailing one, and no
/// `.`/`..` segment. Most real paths are; they skip the work.
fn is_plain(path: &[u8]) -> bool {
    if path.first() != Some(&b'/') {
        return false;
    }
    if path.iter().any(|b| matches!(b, b'%' | b'\\' | b';')) {
        return false;
    }
    let mut segments = path.split(|&b| b == b'/').skip(1).peekable();
    while let Some(seg) = segments.next() {
        let last = segments.peek().is_none();
        if (seg.is_empty() && !last) || seg == b"." || seg == b".." {
            return false;
        }
    }
    true
}

/// The normal form of `path` (the part of `:path` before `?`/`#`) under `reading`.
pub fn normalize(path: &[u8], reading: Reading) -> Normal {
    if is_plain(path) {
        return Normal {
            path: path.to_vec(),
            irregular: false,
        };
    }
    let mut irregular = false;
    // 1. Decode unreserved escapes, upper-case the others; separators become b'/'.
    let mut text = Vec::with_capacity(path.len() + 1);
    let leading_separator = matches!(path.first(), Some(b'/'))
        || (reading.escaped_slashes && matches!(path.first(), Some(b'\\')));
    if !leading_separator {
        text.push(b'/');
    }
    let mut i = 0;
    while let Some(&b) = path.get(i) {
        if b == b'%' {
            if let Some(v) = escape_at(path, i) {
                if is_unreserved(v) {
                    text.push(v);
                } else if reading.escaped_slashes && (v == b'/' || v == b'\\') {
                    text.push(b'/');
                } else {
                    text.extend_from_slice(&[b'%', upper_hex(v >> 4), upper_hex(v)]);
                }
                i += 3;
                continue;
            }
            // A `%` that starts no escape is a literal percent sign: written `%25`, so that the
            // normal form is one (decoding it again changes nothing).
            irregular = true;
            text.extend_from_slice(b"%25");
            i += 1;
            continue;
        }
        text.push(if reading.escaped_slashes && b == b'\\' {
            b'/'
        } else {
            b
        });
        i += 1;
    }
    // 2. Segments: cut params, merge empty ones, resolve dot segments.
    let mut stack: Vec<&[u8]> = Vec::new();
    let mut trailing_slash = false;
    for seg in text.split(|&b| b == b'/').skip(1) {
        let seg = if reading.strip_params {
            let end = seg.iter().position(|&b| b == b';').unwrap_or(seg.len());
            seg.get(..end).unwrap_or(seg)
        } else {
            seg
        };
        match seg {
            b"" | b"." => trailing_slash = true,
            b".." => {
                if stack.pop().is_none() {
                    irregular = true;
                }
                trailing_slash = true;
            }
            _ => {
                stack.push(seg);
                trailing_slash = false;
            }
        }
    }
    let mut out = Vec::with_capacity(text.len());
    for seg in &stack {
        out.push(b'/');
        out.extend_from_slice(seg);
    }
    if trailing_slash || out.is_empty() {
        out.push(b'/');
    }
    Normal {
        path: out,
        irregular,
    }
}

/// `path` (in normal form) with every escape decoded that servers decode before they route, all
/// but `%2F` and `%5C` (separators to some readings, which read them so) and `%25` (decoding it
/// would make a new escape): Kestrel, Go, Django or Spring route `/odata/%24batch` as
/// `/odata/$batch` and `/caf%C3%A9` as `/café`. Borrowed when there is nothing to decode.
fn decoded(path: &[u8]) -> Cow<'_, [u8]> {
    if !path.contains(&b'%') {
        return Cow::Borrowed(path);
    }
    let mut out = Vec::with_capacity(path.len());
    let mut i = 0;
    while let Some(&b) = path.get(i) {
        match escape_at(path, i).filter(|v| !matches!(v, b'/' | b'\\' | b'%')) {
            Some(v) => {
                out.push(v);
                i += 3;
            }
            None => {
                out.push(b);
                i += 1;
            }
        }
    }
    Cow::Owned(out)
}

/// Whether `prefix` starts `s` (ASCII case-insensitively if `ignore_case`).
fn starts_with(s: &[u8], prefix: &[u8], ignore_case: bool) -> bool {
    match s.get(..prefix.len()) {
        Some(head) if ignore_case => head.eq_ignore_ascii_case(prefix),
        Some(head) => head == prefix,
        None => false,
    }
}

/// Whether a path rule with `prefix` (itself in normal form) applies to `full_path` (`:path`
/// with any query): the prefix starts the path as sent or one of its normal forms, each also
/// [`decoded`] (with the prefix decoded too), or the path is irregular.
pub fn prefix_matches(full_path: &[u8], prefix: &[u8], ignore_case: bool) -> bool {
    let raw = path_only(full_path);
    if starts_with(raw, prefix, ignore_case) {
        return true;
    }
    let decoded_prefix = decoded(prefix);
    Reading::ALL.iter().any(|&r| {
        let n = normalize(raw, r);
        n.irregular
            || starts_with(&n.path, prefix, ignore_case)
            || starts_with(&decoded(&n.path), &decoded_prefix, ignore_case)
    })
}

/// The value of the `path` key source: the loosest normal form, [`decoded`], so every spelling a
/// server could read as one path shares that path's bucket.
pub fn key_value(full_path: &[u8]) -> Vec<u8> {
    let loose = normalize(path_only(full_path), Reading::LOOSE).path;
    match decoded(&loose) {
        Cow::Borrowed(_) => loose,
        Cow::Owned(d) => d,
    }
}

/// The value of the attribute `request.path` as a key: [`key_value`] of the path, then its query
/// (from `?`) as sent.
pub fn key_value_with_query(full_path: &[u8]) -> Vec<u8> {
    let mut value = key_value(full_path);
    value.extend_from_slice(
        full_path
            .get(path_only(full_path).len()..)
            .unwrap_or_default(),
    );
    value
}

/// The path of `full_path` (`:path` with any query) when every reading agrees on it: the bytes as
/// sent are their own normal form under each reading, regular, and hold no escape that some
/// servers decode (`/odata/%24batch` is `/odata/$batch` only to those). An override on a path applies
/// only then: `/x/..;/health` is `/health` only to a server that cuts `;params`, so it does not
/// get `/health`'s override (the reverse of `prefix_matches`, where any reading is enough).
pub fn agreed(full_path: &[u8]) -> Option<&[u8]> {
    let raw = path_only(full_path);
    if is_plain(raw) {
        return Some(raw);
    }
    let agree = Reading::ALL.iter().all(|&r| {
        let n = normalize(raw, r);
        !n.irregular && n.path == raw
    });
    (agree && *decoded(raw) == *raw).then_some(raw)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strict(p: &str) -> (String, bool) {
        let n = normalize(p.as_bytes(), Reading::STRICT);
        (String::from_utf8(n.path).unwrap(), n.irregular)
    }

    fn loose(p: &str) -> (String, bool) {
        let n = normalize(p.as_bytes(), Reading::LOOSE);
        (String::from_utf8(n.path).unwrap(), n.irregular)
    }

    #[test]
    fn normal_form_table() {
        // (sent, strict reading, loose reading, irregular)
        let table: &[(&str, &str, &str, bool)] = &[
            ("/api/x", "/api/x", "/api/x", false),
            ("/", "/", "/", false),
            ("", "/", "/", false),
            ("/api/", "/api/", "/api/", false),
            // Repeated slashes merge, a trailing one stays.
            ("//api/x", "/api/x", "/api/x", false),
            ("/api//x", "/api/x", "/api/x", false),
            ("/api/x//", "/api/x/", "/api/x/", false),
            ("///", "/", "/", false),
            // Dot segments (RFC 3986 §5.2.4).
            ("/./api/x", "/api/x", "/api/x", false),
            ("/x/../api/x", "/api/x", "/api/x", false),
            ("/a/b/..", "/a/", "/a/", false),
            ("/a/b/.", "/a/b/", "/a/b/", false),
            ("/a/./b/../../c", "/c", "/c", false),
            ("/a/.../b", "/a/.../b", "/a/.../b", false),
            ("/a/..b/.c", "/a/..b/.c", "/a/..b/.c", false),
            // Unreserved escapes decode (any hex case); others are upper-cased.
            ("/%61pi/x", "/api/x", "/api/x", false),
            ("/%41%5a%30%2D%2e%5F%7e", "/AZ0-._~", "/AZ0-._~", false),
            ("/a%20b", "/a%20b", "/a%20b", false),
            ("/a%3a", "/a%3A", "/a%3A", false),
            ("/a%2fb", "/a%2Fb", "/a/b", false),
            ("/%7Euser", "/~user", "/~user", false),
            // Encoded dots are dots.
            ("/api/%2e%2E/x", "/x", "/x", false),
            ("/%2E/api", "/api", "/api", false),
            // Encoded slashes: data (strict) or separators (loose).
            ("/api%2Fx", "/api%2Fx", "/api/x", false),
            ("/x%2F..%2Fapi/y", "/x%2F..%2Fapi/y", "/api/y", false),
            ("/api%5Cx", "/api%5Cx", "/api/x", false),
            ("/api\\x", "/api\\x", "/api/x", false),
            ("\\api\\x", "/\\api\\x", "/api/x", false),
            // Path parameters: part of the segment (strict) or cut (loose).
            ("/api;v=1/x", "/api;v=1/x", "/api/x", false),
            ("/x/..;/api/x", "/x/..;/api/x", "/api/x", false),
            ("/a/;x/b", "/a/;x/b", "/a/b", false),
            ("/a%3Bb", "/a%3Bb", "/a%3Bb", false),
            // Case is kept.
            ("/API/x", "/API/x", "/API/x", false),
            // No leading slash: read as if it had one.
            ("api/x", "/api/x", "/api/x", false),
            ("*", "/*", "/*", false),
            // Irregular: `..` above the root (clamped), a `%` that starts no escape (as `%25`).
            ("/../api/x", "/api/x", "/api/x", true),
            ("/a/../../api", "/api", "/api", true),
            ("/..", "/", "/", true),
            ("/api/%zz", "/api/%25zz", "/api/%25zz", true),
            ("/api/%4", "/api/%254", "/api/%254", true),
            ("/api/100%", "/api/100%25", "/api/100%25", true),
            ("/api/%%41", "/api/%25A", "/api/%25A", true),
            ("/api/%g0/x", "/api/%25g0/x", "/api/%25g0/x", true),
            // Found by the fuzzer: decoding must not make a new escape ("%%3333" is not "%333").
            ("/%%3333", "/%25333", "/%25333", true),
        ];
        for &(sent, want_strict, want_loose, irregular) in table {
            assert_eq!(
                strict(sent),
                (want_strict.to_owned(), irregular),
                "strict reading of {sent:?}"
            );
            assert_eq!(
                loose(sent),
                (want_loose.to_owned(), irregular),
                "loose reading of {sent:?}"
            );
        }
    }

    #[test]
    fn parameter_dot_dot_above_root_is_irregular_only_when_cut() {
        assert_eq!(strict("/..;/x"), ("/..;/x".to_owned(), false));
        assert_eq!(loose("/..;/x"), ("/x".to_owned(), true));
    }

    #[test]
    fn normal_form_is_a_fixed_point() {
        for p in [
            "//a/./b/../c%2f%61;x/..;/%7e",
            "/x/../../y%zz",
            "\\a\\..\\b",
            "/%2E%2E/%2e/a",
            "/%%3333",
            "/%%2e%2e/..",
        ] {
            for r in Reading::ALL {
                let once = normalize(p.as_bytes(), r);
                let twice = normalize(&once.path, r);
                assert_eq!(once.path, twice.path, "{p:?} {r:?}");
            }
        }
    }

    #[test]
    fn plain_paths_take_the_short_cut() {
        for p in ["/", "/api/x", "/api/x/", "/a-b_c.d~e/f.json", "/a..b"] {
            assert!(is_plain(p.as_bytes()), "{p}");
        }
        for p in [
            "", "a", "//", "/a//b", "/./a", "/a/..", "/a%20", "/a;b", "/a\\b",
        ] {
            assert!(!is_plain(p.as_bytes()), "{p}");
        }
    }

    #[test]
    fn prefix_matching_sees_every_reading() {
        let api = |p: &str| prefix_matches(p.as_bytes(), b"/api/", false);
        // The spellings from the hardening issue, and more.
        for p in [
            "/api/x",
            "//api/x",
            "/./api/x",
            "/%61pi/x",
            "/x/../api/x",
            "/api/x?q=1",
            "/api%2Fx",
            "/x%2F..%2Fapi/x",
            "/x\\..\\api\\x",
            "/api;jsessionid=1/x",
            "/x/..;/api/x",
            "/api/%2e%2e/api/x",
            // Read as data, `/api/x%2F..%2F..` stays under /api/; read as slashes it leaves.
            "/api/x%2F..%2F..%2Fy",
            // A server that does not normalise routes the bytes as sent.
            "/api/../x",
            // Irregular paths match every path rule.
            "/../other",
            "/other/%zz",
        ] {
            assert!(api(p), "{p} must match /api/");
        }
        for p in [
            "/",
            "/api",
            "/apix/",
            "/other/api/",
            "/x?next=/api/",
            "/x#/api/",
            "/API/x",
            "/a/../x",
            "/api%2F../x",
            "/ap%69x/",
        ] {
            assert!(!api(p), "{p} must not match /api/");
        }
        // Case-insensitive rules.
        assert!(prefix_matches(b"/API/x", b"/api/", true));
        assert!(prefix_matches(b"//Api/./x", b"/api/", true));
        assert!(!prefix_matches(b"/APIx", b"/api/", true));
        // The prefix is a byte prefix: "/api" matches "/apix".
        assert!(prefix_matches(b"/apix", b"/api", false));
    }

    #[test]
    fn only_a_path_every_reading_agrees_on_is_agreed() {
        for p in ["/health", "/health?x=1", "/api/x/", "/a..b", "/"] {
            assert_eq!(agreed(p.as_bytes()), Some(path_only(p.as_bytes())), "{p}");
        }
        for p in [
            // The override attack: only a reading that cuts `;params` resolves `..;`.
            "/api/search/..;/..;/health",
            "/x/..;/health",
            "/health;x=1",
            "/x%2F..%2Fhealth",
            "/x\\..\\health",
            // Spellings every normal form agrees on, but a server that routes the bytes as sent
            // does not.
            "//health",
            "/./health",
            "/x/../health",
            "/%68ealth",
            "/a%2fb",
            // Escapes that servers decode before they route, and Envoy's route match does not.
            "/a%20b",
            "/odata/%24batch",
            "/caf%C3%A9",
            // Irregular.
            "/../health",
            "/health%zz",
            "health",
            "",
        ] {
            assert_eq!(agreed(p.as_bytes()), None, "{p}");
        }
    }

    #[test]
    fn key_value_merges_spellings() {
        let want = b"/api/x".to_vec();
        for p in [
            "/api/x",
            "//api/x",
            "/./api/x",
            "/%61pi/x",
            "/x/../api/x",
            "/api%2Fx",
            "/api;v=2/x?q=1",
            "/api\\x",
        ] {
            assert_eq!(key_value(p.as_bytes()), want, "{p}");
        }
        assert_ne!(key_value(b"/API/x"), want);
        assert_ne!(key_value(b"/api/x/"), want);
        // Escapes servers decode before routing: one bucket per path they route to.
        let batch = key_value(b"/odata/$batch");
        for p in [
            "/odata/%24batch",
            "/odata/%24ba%74ch",
            "/odata;v=1/%24batch",
        ] {
            assert_eq!(key_value(p.as_bytes()), batch, "{p}");
        }
        assert_eq!(key_value("/caf%C3%A9".as_bytes()), "/café".as_bytes());
        // Never a separator or a new escape.
        assert_eq!(key_value(b"/a%2Fb%5Cc%2525"), b"/a/b/c%2525".to_vec());
        assert_eq!(key_value(b"/a%25%32%46"), b"/a%252F".to_vec());
    }

    /// A prefix with a character servers decode from an escape (`$`, `:`, `@`, UTF-8) holds for
    /// every spelling of it, either way round.
    #[test]
    fn prefix_matching_decodes_what_servers_decode() {
        for (path, prefix, ignore_case) in [
            ("/odata/%24batch", "/odata/$batch", false),
            ("/odata/$batch", "/odata/%24batch", false),
            ("/odata/%24BATCH", "/odata/$batch", true),
            ("/users/me%40example.com", "/users/me@", false),
            ("/caf%C3%A9/menu", "/café/", false),
            ("/v1/items%3Aimport", "/v1/items:import", false),
        ] {
            assert!(
                prefix_matches(path.as_bytes(), prefix.as_bytes(), ignore_case),
                "{path} must match {prefix}"
            );
        }
        assert!(!prefix_matches(
            b"/odata/%24batchx",
            b"/odata/$batchy",
            false
        ));
    }
}

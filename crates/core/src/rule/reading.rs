//! One request, one reading: the values of the key sources that servers parse differently (a
//! header, a query parameter, a cookie).
//!
//! Invariant: such a source has a value only when its name appears **once** in the request, as
//! any server might spell or split it, and every reading that finds it gives the same value. A
//! name that appears more than once, or whose value depends on the reading, is [`Read::Ambiguous`]:
//! never a value, so a client cannot get a fresh bucket by adding a copy of the name that its
//! application ignores (`session=R1; session=VALID` is read as `VALID` by Django, `?key=R1&key=VALID`
//! by PHP, a second `x-api-key` line is ignored by Go).
//!
//! "Appears", as servers fold names:
//! - a header: a line whose name is the name, ASCII case-insensitively, with `_` for `-` (CGI,
//!   WSGI and PHP read `x_api_key` as `HTTP_X_API_KEY`, the same variable as `x-api-key`);
//! - a query parameter: a pair split at `&`, or at `&` and `;` (Rack 2, older Python), whose
//!   form-decoded name folds to the name;
//! - a cookie: a pair of any `cookie` line split at `;`, or at `;` and `,` (Rack 2, RFC 2965), whose
//!   name folds to the name.
//!
//! A query or cookie name folds by: percent-decoding (a query name always is; PHP and Rack 2
//! decode cookie names too), cutting at a NUL and trimming whitespace, `.` and ` ` as `_` (PHP),
//! and ASCII lower-casing (ASP.NET Core); an array entry of the name (`key[]`, `key[0]`: PHP,
//! Rack) is the name too, and so is a name with a `[` no `]` closes that PHP reads as the name
//! (`api[key` is PHP's `api_key`). A name that only some servers fold to the name, alone, is read: the servers
//! that see it see that value, the others see no such name (and the rule would not apply if it
//! were skipped).

use std::borrow::Cow;

use super::path;

/// What a key source reads from a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Read<'a> {
    /// The request has no such value: the rule does not apply.
    Missing,
    /// The one value every reading gives.
    Value(Cow<'a, [u8]>),
    /// Readings disagree: the name appears more than once, or its value depends on the reading.
    Ambiguous,
}

/// The lines of one request header, in the order received. A header Envoy folds itself
/// (`user-agent`, `x-forwarded-for`: its "inline" headers) arrives as one line, joined with `,`;
/// so does every line of a view that cannot tell lines apart.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Lines<'a> {
    #[default]
    None,
    One(Cow<'a, [u8]>),
    /// Two or more.
    Many(Vec<Cow<'a, [u8]>>),
}

impl<'a> Lines<'a> {
    /// Adds a line after the others.
    pub fn push(&mut self, line: Cow<'a, [u8]>) {
        *self = match std::mem::take(self) {
            Lines::None => Lines::One(line),
            Lines::One(first) => Lines::Many(vec![first, line]),
            Lines::Many(mut all) => {
                all.push(line);
                Lines::Many(all)
            }
        };
    }

    /// Each line, in order.
    pub fn iter(&self) -> impl Iterator<Item = &[u8]> {
        let lines: &[Cow<'a, [u8]>] = match self {
            Lines::None => &[],
            Lines::One(line) => std::slice::from_ref(line),
            Lines::Many(all) => all,
        };
        lines.iter().map(|l| &**l)
    }
}

/// Whether a header line named `sent` is header `name` (lower-case) to some server: ASCII
/// case-insensitively, `_` and `-` alike.
pub fn is_header_name(sent: &[u8], name: &str) -> bool {
    let fold = |b: u8| {
        if b == b'_' {
            b'-'
        } else {
            b.to_ascii_lowercase()
        }
    };
    sent.len() == name.len()
        && sent
            .iter()
            .zip(name.as_bytes())
            .all(|(&a, &b)| fold(a) == fold(b))
}

/// The value of a header source, from its lines (see [`is_header_name`]): one line is its value,
/// several are ambiguous.
pub fn header(lines: Lines<'_>) -> Read<'_> {
    match lines {
        Lines::None => Read::Missing,
        Lines::One(value) => Read::Value(value),
        Lines::Many(_) => Read::Ambiguous,
    }
}

/// The value of a header key source: as [`header`] reads it, and without what the most lenient
/// server strips from its ends ([`trim_lenient`]: gunicorn up to 21 decodes a header as Latin-1
/// and strips it as Python's `str.strip()` does), so `K\xa0` is `K`'s bucket, not one of its own.
pub fn header_key(lines: Lines<'_>) -> Read<'_> {
    match header(lines) {
        Read::Value(Cow::Borrowed(value)) => Read::Value(Cow::Borrowed(trim_lenient(value))),
        Read::Value(Cow::Owned(value)) => Read::Value(Cow::Owned(trim_lenient(&value).to_vec())),
        other => other,
    }
}

/// A header's value as [`header_key`] reads it, for a configured value (an override's).
pub(crate) fn header_key_value(value: &[u8]) -> &[u8] {
    trim_lenient(value)
}

/// The query string of `:path`: after the first `?` (if it comes before any `#`), up to `#`.
fn query_of(full: &[u8]) -> Option<&[u8]> {
    let start = full.iter().position(|&b| b == b'?' || b == b'#')?;
    if full.get(start) != Some(&b'?') {
        return None;
    }
    let rest = full.get(start + 1..)?;
    let end = rest.iter().position(|&b| b == b'#').unwrap_or(rest.len());
    rest.get(..end)
}

/// Form-decoding of one query component: `+` is a space, `%XX` is a byte, an invalid escape is
/// kept literally.
pub(crate) fn percent_decode(s: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while let Some(&b) = s.get(i) {
        match b {
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b'%' => match path::escape_at(s, i) {
                Some(v) => {
                    out.push(v);
                    i += 3;
                }
                None => {
                    out.push(b'%');
                    i += 1;
                }
            },
            _ => {
                out.push(b);
                i += 1;
            }
        }
    }
    out
}

/// Whether Python's `str.strip()` removes byte `b` from a header that WSGI and ASGI servers
/// decode as Latin-1 (Django's and Starlette's cookie parsers strip each name and value so):
/// ASCII whitespace, `\x0b`, `\x1c`–`\x1f`, and NEL and NO-BREAK SPACE (`\x85`, `\xa0`).
fn is_stripped(b: u8) -> bool {
    b.is_ascii_whitespace() || matches!(b, 0x0b | 0x1c..=0x1f | 0x85 | 0xa0)
}

/// `s` without the bytes the most lenient server strips from both ends ([`is_stripped`]).
fn trim_lenient(s: &[u8]) -> &[u8] {
    let start = s.iter().position(|&b| !is_stripped(b)).unwrap_or(s.len());
    let end = s
        .iter()
        .rposition(|&b| !is_stripped(b))
        .map_or(start, |e| e + 1);
    s.get(start..end).unwrap_or_default()
}

/// A query or cookie name (already decoded) as the most lenient server reads it: up to its first
/// NUL (PHP reads a name as a C string), trimmed ([`trim_lenient`]), `.` and ` ` before any `[`
/// as `_` (PHP), ASCII lower-case (ASP.NET Core).
fn fold_name(decoded: &[u8]) -> Vec<u8> {
    let c_string = decoded.split(|&b| b == 0).next().unwrap_or_default();
    let name = trim_lenient(c_string);
    let mut in_base = true;
    name.iter()
        .map(|&b| {
            in_base &= b != b'[';
            match b {
                b'.' | b' ' if in_base => b'_',
                b => b.to_ascii_lowercase(),
            }
        })
        .collect()
}

/// Whether a name that folds to `name` is the source's name `want` (folded) to some server:
/// itself, or an array entry of it (`key[]`, `key[0]` for `key`: PHP, Rack).
fn is_name(name: &[u8], want: &[u8]) -> bool {
    match name.strip_prefix(want) {
        Some(rest) => rest.is_empty() || rest.first() == Some(&b'['),
        None => false,
    }
}

/// PHP's readings of a name (folded) with a `[` that no `]` closes (`api[key`): no array entry
/// but a plain name, that `[` read as `_` (`api_key`); PHP 8 also reads every ` `, `.` and `[`
/// after it as `_`, PHP 7 keeps them. None for any other name (and for one that starts with `[`,
/// which PHP drops).
fn php_unclosed(folded: &[u8]) -> Option<[Vec<u8>; 2]> {
    let open = folded.iter().position(|&b| b == b'[')?;
    let (base, after) = (folded.get(..open)?, folded.get(open + 1..)?);
    if base.is_empty() || after.contains(&b']') {
        return None;
    }
    let mut php7 = Vec::with_capacity(folded.len());
    php7.extend_from_slice(base);
    php7.push(b'_');
    let mut php8 = php7.clone();
    php7.extend_from_slice(after);
    php8.extend(after.iter().map(|&b| match b {
        b' ' | b'.' | b'[' => b'_',
        b => b,
    }));
    Some([php7, php8])
}

/// Whether a query or cookie name as sent (already decoded) is the source's name `want` (folded)
/// to some server: folded ([`fold_name`]) it is the name or an array entry of it ([`is_name`]),
/// or PHP reads it as the name ([`php_unclosed`]).
fn names(decoded: &[u8], want: &[u8]) -> bool {
    let folded = fold_name(decoded);
    is_name(&folded, want)
        || php_unclosed(&folded).is_some_and(|readings| readings.iter().any(|r| *r == *want))
}

/// What the readings of one name found: its values (at most two kept: a second means they
/// disagree), and whether they are ambiguous already (a reading found the name twice, or a value
/// no reading can pin down).
#[derive(Default)]
struct Found {
    values: Vec<Vec<u8>>,
    ambiguous: bool,
}

impl Found {
    /// One reading's matches for the name.
    fn reading(&mut self, matches: impl Iterator<Item = Option<Vec<u8>>>) {
        let mut seen = 0usize;
        for value in matches {
            seen += 1;
            match value {
                Some(v) if self.values.contains(&v) => {}
                Some(v) => self.values.push(v),
                // A value no reading can pin down (see `cookie_value`).
                None => self.ambiguous = true,
            }
            if seen > 1 {
                self.ambiguous = true;
            }
            if self.ambiguous || self.values.len() > 1 {
                return;
            }
        }
    }

    fn read(mut self) -> Read<'static> {
        match (self.ambiguous, self.values.len()) {
            (false, 0) => Read::Missing,
            (false, 1) => self
                .values
                .pop()
                .map_or(Read::Ambiguous, |v| Read::Value(Cow::Owned(v))),
            _ => Read::Ambiguous,
        }
    }
}

/// `pair` split at its first `=` (a pair without one is a name with an empty value).
fn name_value(pair: &[u8]) -> (&[u8], &[u8]) {
    match pair.iter().position(|&b| b == b'=') {
        Some(eq) => (
            pair.get(..eq).unwrap_or_default(),
            pair.get(eq + 1..).unwrap_or_default(),
        ),
        None => (pair, &[]),
    }
}

/// The ways servers split a query into pairs: at `&`, or at `&` and `;` (Rack 2, older Python).
const QUERY_SEPARATORS: [&[u8]; 2] = [b"&", b"&;"];

/// The values (form-decoded) of the pairs of `query`, split at `separators`, whose name folds to
/// `want` (folded).
fn query_pairs<'q>(
    query: &'q [u8],
    separators: &'q [u8],
    want: &'q [u8],
) -> impl Iterator<Item = Vec<u8>> + 'q {
    query
        .split(|b| separators.contains(b))
        .filter(|pair| !pair.is_empty())
        .map(name_value)
        .filter(move |(n, _)| names(&percent_decode(n), want))
        .map(|(_, v)| percent_decode(v))
}

/// The value of query parameter `name` in `:path` `full_path` (form-decoded; `?name` alone is an
/// empty value).
pub fn query(full_path: &[u8], name: &str) -> Read<'static> {
    let Some(query) = query_of(full_path) else {
        return Read::Missing;
    };
    let want = fold_name(name.as_bytes());
    let mut found = Found::default();
    for separators in QUERY_SEPARATORS {
        found.reading(query_pairs(query, separators, &want).map(Some));
    }
    found.read()
}

/// Every value some reading of `:path` `full_path` gives query parameter `name` (form-decoded),
/// a value once per reading that finds it: where any of them matters, not only one agreed on.
pub fn query_values<'q>(full_path: &'q [u8], name: &str) -> impl Iterator<Item = Vec<u8>> + 'q {
    let want = fold_name(name.as_bytes());
    let query = query_of(full_path).unwrap_or_default();
    QUERY_SEPARATORS
        .into_iter()
        .flat_map(move |separators| query_pairs(query, separators, &want).collect::<Vec<_>>())
}

/// A cookie value as servers read it: surrounding whitespace (as the most lenient server reads
/// it, [`trim_lenient`]) and one pair of double quotes removed (Go, Python, Express), then
/// percent-decoded (PHP, Rack, Express), so that the spellings of one value share its bucket.
/// None for a quoted value with a backslash: Python reads `\` escapes in it, other servers keep
/// them or drop the cookie.
pub(crate) fn cookie_value(raw: &[u8]) -> Option<Vec<u8>> {
    let value = trim_lenient(raw);
    let value = match value {
        [b'"', inner @ .., b'"'] => {
            if inner.contains(&b'\\') {
                return None;
            }
            inner
        }
        _ => value,
    };
    Some(percent_decode(value))
}

/// The value of cookie `name` in the request's `cookie` lines (see [`cookie_value`]).
pub fn cookie(lines: &Lines<'_>, name: &str) -> Read<'static> {
    let want = fold_name(name.as_bytes());
    let mut found = Found::default();
    for separators in [&b";"[..], b";,"] {
        let matches = lines
            .iter()
            .flat_map(|line| line.split(|b| separators.contains(b)))
            .filter(|pair| !pair.trim_ascii().is_empty())
            .map(name_value)
            .filter(|(n, _)| names(&percent_decode(n), &want))
            .map(|(_, v)| cookie_value(v));
        found.reading(matches);
    }
    found.read()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(r: Read<'_>) -> Option<String> {
        match r {
            Read::Value(v) => Some(String::from_utf8(v.into_owned()).unwrap()),
            Read::Missing => None,
            Read::Ambiguous => Some("<ambiguous>".into()),
        }
    }

    fn q(name: &str, path: &str) -> Option<String> {
        value(query(path.as_bytes(), name))
    }

    fn c(name: &str, lines: &[&str]) -> Option<String> {
        let mut l = Lines::None;
        for line in lines {
            l.push(Cow::Borrowed(line.as_bytes()));
        }
        value(cookie(&l, name))
    }

    const AMBIGUOUS: Option<&str> = Some("<ambiguous>");

    #[test]
    fn query_values_decode() {
        assert_eq!(q("user", "/?user=%61lice").as_deref(), Some("alice"));
        assert_eq!(q("user", "/?%75ser=alice").as_deref(), Some("alice"));
        assert_eq!(q("p", "/?p=a%2Fb").as_deref(), Some("a/b"));
        assert_eq!(q("p", "/?p=a+b").as_deref(), Some("a b"));
        assert_eq!(q("p", "/?p=a%2Bb").as_deref(), Some("a+b"));
        assert_eq!(q("a b", "/?a+b=1").as_deref(), Some("1"));
        assert_eq!(q("p", "/?p=%zz").as_deref(), Some("%zz"));
        assert_eq!(q("a", "/?a").as_deref(), Some(""));
        assert_eq!(q("a", "/?a=1=2").as_deref(), Some("1=2"));
        assert_eq!(q("a", "/?&&a=1&").as_deref(), Some("1"));
        assert_eq!(q("a", "/?a=1#x").as_deref(), Some("1"));
        assert_eq!(q("a", "/?b=1#&a=2"), None);
        assert_eq!(q("a", "/#?a=1"), None);
        assert_eq!(q("a", "/?ab=1&ba=2"), None);
        assert_eq!(q("a", "/a"), None);
    }

    /// Every way a query name can appear twice, as some server reads it.
    #[test]
    fn a_query_name_that_appears_twice_is_ambiguous() {
        for path in [
            "/?key=R1&key=VALID",     // PHP and Rack read the last, Go and Java the first
            "/?key=VALID&key=VALID",  // the same value twice: some servers join them
            "/?key=R1;key=VALID",     // `;` separates for Rack 2 and older Python
            "/?key=R1&%6Bey=VALID",   // a percent-encoded name
            "/?key=R1&KEY=VALID",     // ASP.NET Core ignores case
            "/?key=R1&key[]=VALID",   // PHP's and Rack's arrays
            "/?key[]=R1&key[]=VALID", //
            "/?key=R1&key[a]=VALID",  //
            "/?key=R1&+key=VALID",    // PHP drops leading spaces
            "/?key&key=VALID",        // a name alone is an empty value
            "/?key=VALID;junk",       // `VALID;junk` or `VALID`, by the separator
            "/?a=1&key=R1&b=2&key=VALID", //
            "/?key=R1&key%00junk=VALID", // PHP's name ends at a NUL
        ] {
            assert_eq!(q("key", path).as_deref(), AMBIGUOUS, "{path}");
        }
        assert_eq!(
            q("api_key", "/?api_key=R1&api.key=VALID").as_deref(),
            AMBIGUOUS
        );
        assert_eq!(
            q("api_key", "/?api_key=R1&api+key=VALID").as_deref(),
            AMBIGUOUS
        );
        // Once, however it is spelled: its value.
        for path in [
            "/?key=VALID",
            "/?%6Bey=VALID",
            "/?KEY=VALID",
            "/?key[]=VALID",
            "/?x=1;key=VALID", // only the readings that split at `;` see it
            "/?key=V%41LID",
            "/?a=1&key=VALID&b=2",
            "/?key%00=VALID",
            "/?key%00junk=VALID",
        ] {
            assert_eq!(q("key", path).as_deref(), Some("VALID"), "{path}");
        }
        assert_eq!(q("key", "/?key=a%3Bb").as_deref(), Some("a;b"));
        assert_eq!(q("api_key", "/?api.key=V").as_deref(), Some("V"));
        // A name with brackets: other entries of the same array are other names.
        let filter = |p: &str| q("filter[user]", p);
        assert_eq!(
            filter("/?filter[user]=a&filter[org]=b").as_deref(),
            Some("a")
        );
        assert_eq!(
            filter("/?filter[user]=a&filter[user]=b").as_deref(),
            AMBIGUOUS
        );
        assert_eq!(
            filter("/?filter[user]=a&Filter[User][]=b").as_deref(),
            AMBIGUOUS
        );
        assert_eq!(filter("/?filter=a"), None);
    }

    /// PHP reads a `[` that no `]` closes as `_` (`api[key` is `api_key`, and since PHP 8 every
    /// ` `, `.` and `[` after it too): `?api[key=VALID` is `$_GET['api_key']`. Read as another
    /// name, a client's key spelled so would not apply the rule at all, and a junk `api_key`
    /// next to it would mint a fresh bucket per junk value while PHP sees `VALID`.
    #[test]
    fn php_reads_an_unclosed_bracket_in_a_name_as_an_underscore() {
        assert_eq!(q("api_key", "/?api[key=VALID").as_deref(), Some("VALID"));
        assert_eq!(q("a_b_c", "/?a[b.c=VALID").as_deref(), Some("VALID"));
        assert_eq!(q("a_b.c", "/?a[b.c=VALID").as_deref(), Some("VALID"));
        for path in [
            "/?api_key=R1&api[key=VALID",
            "/?api[key=VALID&api_key=R1",
            "/?api_key=R1&API[Key=VALID",
            "/?api_key=R1&api%5Bkey=VALID",
        ] {
            assert_eq!(q("api_key", path).as_deref(), AMBIGUOUS, "{path}");
        }
        assert_eq!(c("api_key", &["api[key=VALID"]).as_deref(), Some("VALID"));
        assert_eq!(
            c("api_key", &["api_key=R1; api[key=VALID"]).as_deref(),
            AMBIGUOUS
        );
        // A closed bracket is an array entry of the name before it, as before.
        assert_eq!(q("api_key", "/?api[key]=VALID"), None);
        assert_eq!(q("api", "/?api[key]=VALID").as_deref(), Some("VALID"));
        assert_eq!(q("api_key", "/?api[ ]=VALID"), None);
        // A name that starts with `[` is no variable to PHP.
        assert_eq!(q("_key", "/?[key=VALID"), None);
    }

    /// A header key's value is read as the most lenient server reads it: gunicorn up to 21
    /// decodes a header as Latin-1 and strips it as `str.strip()` does, so to an application it
    /// serves, `K\xa0`, `K\x85` and `K \x1f` are `K`: never a bucket of their own.
    #[test]
    fn a_header_key_is_read_without_what_the_most_lenient_server_strips() {
        let key = |value: &[u8]| match header_key(Lines::One(Cow::Borrowed(value))) {
            Read::Value(v) => v.into_owned(),
            _ => panic!("one line is a value"),
        };
        for sent in [
            &b"K"[..],
            b"K\xa0",
            b"\xa0K",
            b"K\x85",
            b"K \x1f\xa0",
            b"\x0bK\x0c",
        ] {
            assert_eq!(key(sent), b"K", "{sent:?}");
        }
        assert_eq!(key(b"K\xa0L"), b"K\xa0L", "inside the value it stays");
        let owned = header_key(Lines::One(Cow::Owned(b"K\xa0".to_vec())));
        assert!(matches!(owned, Read::Value(v) if *v == *b"K"));
        assert!(matches!(header_key(Lines::None), Read::Missing));
        let two = Lines::Many(vec![Cow::Borrowed(&b"K"[..]), Cow::Borrowed(&b"K"[..])]);
        assert!(matches!(header_key(two), Read::Ambiguous));
    }

    #[test]
    fn cookie_values() {
        assert_eq!(c("sid", &["sid=abc"]).as_deref(), Some("abc"));
        assert_eq!(c("sid", &["a=1; sid=abc; b=2"]).as_deref(), Some("abc"));
        assert_eq!(c("sid", &["a=1;sid=abc"]).as_deref(), Some("abc"));
        assert_eq!(c("sid", &["a=1", "sid=abc"]).as_deref(), Some("abc"));
        assert_eq!(c("sid", &["sid= abc "]).as_deref(), Some("abc"));
        assert_eq!(c("sid", &["sid="]).as_deref(), Some(""));
        assert_eq!(c("sid", &["sid"]).as_deref(), Some(""));
        assert_eq!(c("sid", &["sid=a=b"]).as_deref(), Some("a=b"));
        assert_eq!(c("sid", &["sidx=1; xsid=2"]), None);
        assert_eq!(c("sid", &[]), None);
        // The spellings of one value are one value.
        for spelled in [
            "sid=VALID",
            "sid=\"VALID\"",
            "sid=%56ALID",
            "sid=\"%56ALID\"",
        ] {
            assert_eq!(c("sid", &[spelled]).as_deref(), Some("VALID"), "{spelled}");
        }
        assert_eq!(c("sid", &["sid=s%3Aabc.sig"]).as_deref(), Some("s:abc.sig"));
        assert_eq!(c("sid", &["sid=a+b"]).as_deref(), Some("a b"));
        // A `,` that only some readings split at: read by those, another cookie for the others.
        assert_eq!(c("sid", &["a=1,sid=abc"]).as_deref(), Some("abc"));
    }

    /// Django and Starlette strip a cookie's name and value as Python strips a Latin-1 string:
    /// NEL, NO-BREAK SPACE and `\x1c`–`\x1f` too. A client cannot mint buckets, or hide the
    /// cookie, with them.
    #[test]
    fn cookie_names_and_values_are_stripped_as_python_strips_them() {
        let read = |line: &[u8]| {
            let mut l = Lines::None;
            l.push(Cow::Borrowed(line));
            value(cookie(&l, "sid"))
        };
        for line in [
            &b"sid=VALID\xa0"[..],
            b"sid=VALID\xa0\xa0",
            b"sid=\x85VALID\x1f",
            b"\xa0sid=VALID",
            b"a=1; \x85sid\xa0=VALID",
            b"sid=\xa0\"VALID\"\x0b",
        ] {
            assert_eq!(read(line).as_deref(), Some("VALID"), "{line:?}");
        }
        // Only at the ends.
        let mut inner = Lines::None;
        inner.push(Cow::Borrowed(&b"sid=VA\xa0LID"[..]));
        assert!(
            matches!(cookie(&inner, "sid"), Read::Value(v) if *v == b"VA\xa0LID"[..]),
            "a stripped byte inside a value stays"
        );
    }

    /// Every way a cookie name can appear twice, as some server reads it.
    #[test]
    fn a_cookie_name_that_appears_twice_is_ambiguous() {
        for lines in [
            &["session=R1; session=VALID"][..], // Django and Starlette read the last
            &["session=VALID; session=VALID"],
            &["session=R1", "session=VALID"], // on two lines
            &["a=1; session=R1", "b=2; session=VALID"],
            &["session=R1,session=VALID"],  // `,` separates for Rack 2
            &["session=R1; Session=VALID"], // ASP.NET Core ignores case
            &["session=R1; %73ession=VALID"], // PHP and Rack 2 decode names
            &["session=R1; session[x]=VALID"], // PHP's arrays
            &["session=R1; session%00x=VALID"], // PHP's name ends at a NUL
            &["session=R1;  session =VALID"],
            &["session; session=VALID"],
            &["session=VALID,junk"], // `VALID,junk` or `VALID`, by the separator
            &["session=\"V\\ALID\""], // Python reads `\` escapes
        ] {
            assert_eq!(c("session", lines).as_deref(), AMBIGUOUS, "{lines:?}");
        }
        assert_eq!(c("a_b", &["a_b=1; a.b=2"]).as_deref(), AMBIGUOUS);
    }

    #[test]
    fn header_names_and_lines() {
        assert!(is_header_name(b"x-api-key", "x-api-key"));
        assert!(is_header_name(b"X-Api-Key", "x-api-key"));
        assert!(is_header_name(b"x_api_key", "x-api-key"));
        assert!(!is_header_name(b"x-api-keys", "x-api-key"));
        assert!(!is_header_name(b"x.api-key", "x-api-key"));
        let one = |v: &'static str| Lines::One(Cow::Borrowed(v.as_bytes()));
        assert_eq!(header(Lines::None), Read::Missing);
        assert_eq!(header(one("a")), Read::Value(Cow::Borrowed(&b"a"[..])));
        assert_eq!(header(one("a,b")), Read::Value(Cow::Borrowed(&b"a,b"[..])));
        let mut two = one("a");
        two.push(Cow::Borrowed(b"a"));
        assert_eq!(two.iter().collect::<Vec<_>>(), [&b"a"[..], b"a"]);
        assert_eq!(header(two), Read::Ambiguous);
    }
}

//! Rule matching and bucket-key extraction over a `RequestView` (no host calls here).
//!
//! Invariant: the bucket key is `<key_prefix>:{<rule>:<digest>}` where the digest is a SHA-256 of the
//! rule's key sources (their canonical spelling) and key values, each length-prefixed, so no user
//! text reaches Redis or a URL, two different value tuples never share a key, and changing a rule's
//! key sources starts fresh buckets. A request cannot escape a rule by how it spells its path
//! (see `path`) or its address (see `ip`), nor get a fresh bucket by repeating a key source's name
//! (see `reading`): an ambiguous source keys the request into one bucket per rule (and per the
//! other sources' values), marked in the digest so that no value can name it. Overrides change a
//! bucket's limits, never its key, and apply only where every reading agrees on the key: never to
//! an ambiguous source, nor to a path that some reading spells otherwise.

pub mod hash;
pub mod host;
pub mod ip;
pub mod path;
pub mod pattern;
pub mod reading;
pub mod value;

pub use reading::{Lines, Read};

use std::borrow::Cow;

use sha2::{Digest, Sha256};

use crate::bucket::Limits;
use crate::config::{HeaderValueMatch, KeySource, Match, Override, Rule};

/// What rule matching needs from a request. Names are lower-case; pseudo-headers `:path`, `:method`,
/// `:authority` are asked for through `header` too.
pub trait RequestView {
    /// The value of request header `name`: when the request has several lines of it, all of them
    /// joined with `,` in the order received (what Envoy's `request.headers` attribute gives, and
    /// how Envoy itself folds the headers it combines). None when the request has no such line; an
    /// empty line is an empty value. Borrowed when the view holds the value as it is (one line),
    /// so a rule that only looks at a header does not copy it.
    fn header(&self, name: &str) -> Option<Cow<'_, [u8]>>;
    /// Every line of the request headers that some server reads as header `name`, in the order
    /// received: names compared ASCII case-insensitively, `_` and `-` alike
    /// ([`reading::is_header_name`]). The default, for a view that cannot tell lines apart, is
    /// [`RequestView::header`] as one line.
    fn header_lines(&self, name: &str) -> Lines<'_> {
        self.header(name).map_or(Lines::None, Lines::One)
    }
    /// downstream peer IP without port (Envoy's source.address)
    fn client_ip(&self) -> Option<Vec<u8>>;
    /// An Envoy attribute by path segments (`["connection", "uri_san_peer_certificate"]`), as the
    /// host serialises it; `["metadata"]` is the whole dynamic metadata (a serialised
    /// `envoy.config.core.v3.Metadata`). None when the host has no such value.
    fn property(&self, _path: &[&str]) -> Option<Vec<u8>> {
        None
    }
}

/// Bytes of the digest that go into the key (hex-encoded: twice as many characters).
const DIGEST_BYTES: usize = 16;

/// Whether the request satisfies every condition of `m` (an empty `Match` matches everything).
pub fn matches(m: &Match, req: &dyn RequestView) -> bool {
    if let Some(prefix) = &m.path_prefix {
        match req.header(":path") {
            Some(full) if path::prefix_matches(&full, prefix.as_bytes(), m.path_ignore_case) => {}
            _ => return false,
        }
    }
    if !m.methods.is_empty() {
        match req.header(":method") {
            Some(method) if m.methods.iter().any(|x| x.as_bytes() == &*method) => {}
            _ => return false,
        }
    }
    if !m.hosts.is_empty() {
        match req.header(":authority") {
            Some(authority) if m.hosts.iter().any(|h| host_matches(h, &authority)) => {}
            _ => return false,
        }
    }
    m.headers
        .iter()
        .all(|h| header_condition(&h.name, &h.value, req))
}

/// Whether header condition `value` holds for header `name`: for all the header's lines joined
/// with `,`, or for one of the lines some server reads as that header ([`RequestView::header_lines`]:
/// an application that reads one line sees that one), so a request cannot step out of a rule by
/// repeating a header or respelling its name. `absent` holds when no line has the name itself.
fn header_condition(name: &str, value: &HeaderValueMatch, req: &dyn RequestView) -> bool {
    let holds = |got: &[u8]| match value {
        HeaderValueMatch::Absent | HeaderValueMatch::Present => true,
        HeaderValueMatch::Exact(want) => want.as_bytes() == got,
        HeaderValueMatch::Prefix(want) => got.starts_with(want.as_bytes()),
        HeaderValueMatch::Regex(p) => p.is_match(got),
    };
    match (value, req.header(name)) {
        (HeaderValueMatch::Absent, got) => got.is_none(),
        (_, Some(joined)) if holds(&joined) => true,
        (_, _) => req.header_lines(name).iter().any(holds),
    }
}

/// `:authority` without its port (and userinfo), lower-cased, without a trailing dot, an IP
/// literal in canonical form: `API.Example.com.:8443` → `api.example.com`, `[0:0::1]:80` → `[::1]`.
fn host_of(authority: &[u8]) -> Vec<u8> {
    let after_user = match authority.iter().rposition(|&b| b == b'@') {
        Some(at) => authority.get(at + 1..).unwrap_or_default(),
        None => authority,
    };
    let host = if after_user.first() == Some(&b'[') {
        let end = after_user
            .iter()
            .position(|&b| b == b']')
            .map_or(after_user.len(), |e| e + 1);
        after_user.get(..end).unwrap_or(after_user)
    } else {
        match after_user.iter().rposition(|&b| b == b':') {
            Some(colon) => after_user.get(..colon).unwrap_or(after_user),
            None => after_user,
        }
    };
    let mut host = host.strip_suffix(b".").unwrap_or(host).to_vec();
    host.make_ascii_lowercase();
    host::canonical(host)
}

/// Whether `pattern` (from `match.hosts`) matches the request's `:authority`.
fn host_matches(pattern: &str, authority: &[u8]) -> bool {
    let host = host_of(authority);
    match pattern.strip_prefix('*') {
        // `*.example.com`: at least one character before `.example.com`.
        Some(suffix) => host.len() > suffix.len() && host.ends_with(suffix.as_bytes()),
        None => host == pattern.as_bytes(),
    }
}

/// A key source's reading of `req`, borrowed from the request where it is taken as sent (a
/// header, the method, a literal): the local path then copies no key value.
fn key_value<'a>(source: &'a KeySource, req: &'a dyn RequestView) -> Read<'a> {
    match source {
        KeySource::Header(name) => reading::header(req.header_lines(name)),
        KeySource::Method => req.header(":method").map_or(Read::Missing, Read::Value),
        KeySource::Literal(text) => Read::Value(Cow::Borrowed(text.as_bytes())),
        derived => derived_value(derived, req),
    }
}

/// The reading of a key source that is derived from what the request sent (normalised, parsed or
/// looked up); the others [`key_value`] borrows. Out of line: a header-keyed rule's path never
/// runs it.
#[inline(never)]
fn derived_value<'a>(source: &'a KeySource, req: &'a dyn RequestView) -> Read<'a> {
    let owned = |v: Option<Vec<u8>>| v.map_or(Read::Missing, |v| Read::Value(Cow::Owned(v)));
    match source {
        KeySource::Header(_) | KeySource::Method | KeySource::Literal(_) => key_value(source, req),
        KeySource::Query(name) => match req.header(":path") {
            Some(full) => reading::query(&full, name),
            None => Read::Missing,
        },
        KeySource::ClientIp {
            v4_prefix,
            v6_prefix,
        } => owned(
            req.client_ip()
                .map(|ip| ip::key_value(&ip, *v4_prefix, *v6_prefix)),
        ),
        KeySource::Path => owned(req.header(":path").map(|p| path::key_value(&p))),
        KeySource::Authority => owned(req.header(":authority").map(|a| a.to_ascii_lowercase())),
        KeySource::Cookie(name) => reading::cookie(&req.header_lines("cookie"), name),
        // Envoy's `request.headers` attribute joins a header's lines with `,`: read as the header
        // source reads it, so a repeated line is ambiguous here too.
        KeySource::Property { path, .. } => match request_header(path) {
            Some(name) => reading::header(req.header_lines(&name)),
            None => {
                let segments: Vec<&str> = path.iter().map(String::as_str).collect();
                owned(
                    req.property(&segments)
                        .map(|raw| value::attribute_text(path, raw)),
                )
            }
        },
        KeySource::Metadata { namespace, fields } => owned(
            req.property(&["metadata"])
                .and_then(|metadata| value::metadata_value(&metadata, namespace, fields))
                .as_ref()
                .and_then(value::key_text),
        ),
    }
}

/// The header an attribute path `request.headers.<name>` names (lower-cased), if it is one.
fn request_header(path: &[String]) -> Option<String> {
    match path {
        [request, headers, name] if request == "request" && headers == "headers" => {
            Some(name.to_ascii_lowercase())
        }
        _ => None,
    }
}

/// One key source's part of a bucket's identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part<'a> {
    /// The value every reading agrees on.
    Value(&'a [u8]),
    /// The source is ambiguous ([`Read::Ambiguous`]): a marker no value can equal.
    Ambiguous,
}

impl Read<'_> {
    /// This reading as a part of the bucket's identity; None when missing.
    pub fn part(&self) -> Option<Part<'_>> {
        match self {
            Read::Missing => None,
            Read::Value(v) => Some(Part::Value(v)),
            Read::Ambiguous => Some(Part::Ambiguous),
        }
    }
}

/// The rule's key sources' readings in order (each a value or ambiguous), or None if any source
/// is missing (then the rule does not apply).
pub fn key_values<'a>(sources: &'a [KeySource], req: &'a dyn RequestView) -> Option<Vec<Read<'a>>> {
    sources
        .iter()
        .map(|s| match key_value(s, req) {
            Read::Missing => None,
            read => Some(read),
        })
        .collect()
}

/// `<prefix>:{<rule>:<digest>}`, digest = lowercase hex of the first 16 bytes of SHA-256 over, for
/// each key source in order, (u32 big-endian length ++ the source's canonical spelling ++ u32
/// big-endian length ++ its value). `values` has one value per source.
///
/// A value longer than `u32::MAX` bytes (impossible for a request header) has its length saturated.
/// Out of line: a hot key's requests find their key in the [`KeyCache`], and this code (SHA-256
/// and the key's formatting) would sit in the middle of theirs.
#[inline(never)]
pub fn bucket_key<V: AsRef<[u8]>>(
    prefix: &str,
    rule: &str,
    sources: &[KeySource],
    values: &[V],
) -> String {
    let parts = values.iter().map(|v| Part::Value(v.as_ref()));
    key_of_input(prefix, rule, &digest_input(sources, parts))
}

/// [`bucket_key`] for parts that may be ambiguous: an ambiguous part is digested as the length
/// `u32::MAX` followed by no bytes, which no value gives (a value that long would be followed by
/// its 4 GiB), so it is one bucket per rule and per the other parts' values.
#[inline(never)]
pub fn bucket_key_of(
    prefix: &str,
    rule: &str,
    sources: &[KeySource],
    parts: &[Part<'_>],
) -> String {
    key_of_input(prefix, rule, &digest_input(sources, parts.iter().copied()))
}

/// What the digest is taken over (see [`bucket_key`] and [`bucket_key_of`]).
fn digest_input<'a>(sources: &[KeySource], parts: impl Iterator<Item = Part<'a>>) -> Vec<u8> {
    fn field(input: &mut Vec<u8>, bytes: &[u8]) {
        let len = u32::try_from(bytes.len()).unwrap_or(u32::MAX);
        input.extend_from_slice(&len.to_be_bytes());
        input.extend_from_slice(bytes);
    }
    let mut input = Vec::with_capacity(sources.len() * 64);
    for (source, part) in sources.iter().zip(parts) {
        field(&mut input, source.to_string().as_bytes());
        match part {
            Part::Value(value) => field(&mut input, value),
            Part::Ambiguous => input.extend_from_slice(&u32::MAX.to_be_bytes()),
        }
    }
    input
}

fn key_of_input(prefix: &str, rule: &str, input: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let digest = Sha256::digest(input);
    let mut key = String::with_capacity(prefix.len() + rule.len() + 4 + DIGEST_BYTES * 2);
    key.push_str(prefix);
    key.push_str(":{");
    key.push_str(rule);
    key.push(':');
    for &b in digest.iter().take(DIGEST_BYTES) {
        for nibble in [b >> 4, b & 0x0f] {
            if let Some(&c) = HEX.get(usize::from(nibble)) {
                key.push(char::from(c));
            }
        }
    }
    key.push('}');
    key
}

/// The bucket keys of recently seen key values, per worker and rule: a hot key's requests skip
/// SHA-256 and its formatting, which in wasm cost more than the rest of the local path.
///
/// Invariant: a cached key is exactly what [`bucket_key`] gives for the rule's prefix, name and
/// sources and the same values. It is looked up by rule index and values only, so one cache
/// serves one configuration (the engine's, rebuilt with it). It is a set-associative array of
/// [`KeyCache::MAX`] entries of values at most [`KeyCache::MAX_VALUES_LEN`] bytes long: a flood of
/// new keys, however long their values, holds at most about 0.5 MiB per worker, and a lookup
/// compares at most [`KeyCache::WAYS`] entries whatever the values (crafted values that share a
/// set only evict each other: a miss, what a new key costs anyway). The set is picked by a fast
/// hash under a seed random per worker ([`hash`]).
#[derive(Debug)]
pub struct KeyCache {
    /// `MAX / WAYS` sets of `WAYS` entries, most recently used first (empty until first used).
    entries: Vec<Option<Cached>>,
    seed: u64,
    /// Key Strings given back ([`KeyCache::recycle`]): a hit is copied into one of these rather
    /// than into a new allocation.
    spare: Vec<String>,
}

#[derive(Debug)]
struct Cached {
    rule: usize,
    values: Vec<Vec<u8>>,
    key: String,
}

impl Default for KeyCache {
    fn default() -> KeyCache {
        KeyCache {
            entries: Vec::new(),
            seed: hash::random_seed(),
            spare: Vec::new(),
        }
    }
}

impl KeyCache {
    pub const MAX: usize = 1024;
    /// Entries per set.
    pub const WAYS: usize = 4;
    /// Values longer than this together are digested each time, never cached.
    pub const MAX_VALUES_LEN: usize = 256;
    /// Most key Strings kept for reuse.
    const MAX_SPARE: usize = 8;

    /// Takes back a key this cache gave out, once its request is done with it, to reuse its
    /// allocation for a later hit.
    pub fn recycle(&mut self, key: String) {
        if self.spare.len() < Self::MAX_SPARE {
            self.spare.push(key);
        }
    }

    /// [`bucket_key`] of rule `idx` (`prefix`, `rule` its name, `sources` its key), from the cache
    /// when the same values were seen lately.
    pub fn bucket_key<V: AsRef<[u8]>>(
        &mut self,
        idx: usize,
        (prefix, rule, sources): (&str, &str, &[KeySource]),
        values: &[V],
    ) -> String {
        if values.iter().map(|v| v.as_ref().len()).sum::<usize>() > Self::MAX_VALUES_LEN {
            return bucket_key(prefix, rule, sources, values);
        }
        if self.entries.is_empty() {
            self.entries.resize_with(Self::MAX, || None);
        }
        let set = self.set_of(idx, values);
        let Some(set) = self.entries.get_mut(set..set + Self::WAYS) else {
            return bucket_key(prefix, rule, sources, values);
        };
        let hit = set.iter().position(|e| {
            e.as_ref().is_some_and(|e| {
                e.rule == idx
                    && e.values
                        .iter()
                        .map(Vec::as_slice)
                        .eq(values.iter().map(AsRef::as_ref))
            })
        });
        // Hit or miss, the entry ends up first: a miss takes the least recently used one's place.
        let used = hit.unwrap_or(Self::WAYS - 1);
        if let Some(recent) = set.get_mut(..=used) {
            recent.rotate_right(1);
        }
        let Some(first) = set.first_mut() else {
            return bucket_key(prefix, rule, sources, values);
        };
        match first {
            Some(e) if hit.is_some() => {
                let mut key = self.spare.pop().unwrap_or_default();
                key.clear();
                key.push_str(&e.key);
                key
            }
            _ => Self::fill(first, idx, (prefix, rule, sources), values),
        }
    }

    /// A miss: `slot` caches rule `idx`'s key for `values` from now on, in place of what it held.
    /// Out of line, as [`bucket_key`].
    #[inline(never)]
    fn fill<V: AsRef<[u8]>>(
        slot: &mut Option<Cached>,
        idx: usize,
        (prefix, rule, sources): (&str, &str, &[KeySource]),
        values: &[V],
    ) -> String {
        let key = bucket_key(prefix, rule, sources, values);
        *slot = Some(Cached {
            rule: idx,
            values: values.iter().map(|v| v.as_ref().to_vec()).collect(),
            key: key.clone(),
        });
        key
    }

    /// The first entry of the set for rule `idx`'s `values`.
    fn set_of<V: AsRef<[u8]>>(&self, idx: usize, values: &[V]) -> usize {
        use std::hash::Hasher;
        let mut h = hash::FastHasher::new(self.seed);
        h.write_usize(idx);
        for v in values {
            let v = v.as_ref();
            h.write_usize(v.len());
            h.write(v);
        }
        let sets = Self::MAX / Self::WAYS;
        (h.finish() % sets as u64) as usize * Self::WAYS
    }
}

/// A rule that applies to a request: its bucket and the limits that hold for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    /// `<prefix>:{<rule>:<digest>}`: the same whatever override applies.
    pub key: String,
    /// The rule's limits, or its override's for this key.
    pub limits: Limits,
    /// An override says this key is not limited: admit without a backend call (still count it).
    /// `limits` are then the rule's, for headers.
    pub unlimited: bool,
    /// A key source was ambiguous ([`Read::Ambiguous`]): `key` is the rule's bucket for ambiguous
    /// requests, under the rule's own limits.
    pub ambiguous: bool,
}

/// The override of `rule`, which has overrides, for key `values` of `req`, if there is one and
/// every reading of the request agrees on its key: when a source reads the path (`path`, or the
/// attributes `request.path` and `request.url_path`), only if the path as sent is that path under
/// every reading ([`path::agreed`]), as a path match holds under any. Out of line: few rules have
/// overrides, and [`applies`] calls it only for those.
#[inline(never)]
fn override_of<'r>(
    rule: &'r Rule,
    values: &[&[u8]],
    req: &dyn RequestView,
) -> Option<&'r Override> {
    if rule.key.iter().any(reads_the_path) {
        let full = req.header(":path")?;
        path::agreed(&full)?;
    }
    let values: Vec<Vec<u8>> = values.iter().map(|v| v.to_vec()).collect();
    rule.overrides.get(&values)
}

/// Whether `source`'s value is the request's path, in some spelling.
fn reads_the_path(source: &KeySource) -> bool {
    match source {
        KeySource::Path => true,
        KeySource::Property { path, .. } => {
            matches!(path.as_slice(), [r, p] if r == "request" && (p == "path" || p == "url_path"))
        }
        _ => false,
    }
}

/// The bucket key and effective limits if the rule's match holds and all key sources are present.
/// `idx` is the rule's index in its configuration (for `keys`).
pub fn applies(
    prefix: &str,
    (idx, rule): (usize, &Rule),
    req: &dyn RequestView,
    keys: &mut KeyCache,
) -> Option<Applied> {
    if !matches(&rule.matcher, req) {
        return None;
    }
    // One source (the usual rule) needs no Vec of values.
    let (one, single, many, refs);
    let values: &[&[u8]] = match rule.key.as_slice() {
        [source] => {
            one = match key_value(source, req) {
                Read::Value(v) => v,
                Read::Missing => return None,
                Read::Ambiguous => return Some(ambiguous(prefix, rule, &[Part::Ambiguous])),
            };
            single = [&*one];
            &single[..]
        }
        sources => {
            many = sources
                .iter()
                .map(|s| match key_value(s, req) {
                    Read::Value(v) => Some(Some(v)),
                    Read::Missing => None,
                    Read::Ambiguous => Some(None),
                })
                .collect::<Option<Vec<_>>>()?;
            if many.iter().any(Option::is_none) {
                let parts: Vec<Part<'_>> = many
                    .iter()
                    .map(|v| v.as_deref().map_or(Part::Ambiguous, Part::Value))
                    .collect();
                return Some(ambiguous(prefix, rule, &parts));
            }
            refs = many.iter().flatten().map(|v| &**v).collect::<Vec<_>>();
            &refs
        }
    };
    let overridden = if rule.overrides.is_empty() {
        None
    } else {
        override_of(rule, values, req)
    };
    let (limits, unlimited) = match overridden {
        None => (rule.limits, false),
        Some(Override::Limits(l)) => (*l, false),
        Some(Override::Unlimited) => (rule.limits, true),
    };
    Some(Applied {
        key: keys.bucket_key(idx, (prefix, &rule.name, &rule.key), values),
        limits: limits.limits(),
        unlimited,
        ambiguous: false,
    })
}

/// A request one of whose key sources is ambiguous (`parts`, none missing): the rule's bucket for
/// ambiguous requests, under the rule's limits (no override), its key digested each time (the
/// key cache holds values only). Out of line and cold: only a client that repeats a key source's
/// name comes here.
#[cold]
#[inline(never)]
fn ambiguous(prefix: &str, rule: &Rule, parts: &[Part<'_>]) -> Applied {
    Applied {
        key: bucket_key_of(prefix, &rule.name, &rule.key, parts),
        limits: rule.limits.limits(),
        unlimited: false,
        ambiguous: true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bucket::Limits;
    use crate::config::{HeaderMatch, Mode, Override, Quota};
    use std::collections::HashMap;

    #[derive(Default)]
    struct Req {
        headers: HashMap<String, Vec<u8>>,
        /// Header lines as sent (name as sent, value), for `header_lines`; `headers` holds each
        /// name's lines joined with `,`.
        lines: Vec<(String, Vec<u8>)>,
        ip: Option<Vec<u8>>,
        /// Attributes by dot-joined path.
        props: HashMap<String, Vec<u8>>,
    }

    impl Req {
        fn new(method: &str, path: &str) -> Self {
            Req::default().with(":method", method).with(":path", path)
        }
        fn with(mut self, name: &str, value: impl AsRef<[u8]>) -> Self {
            self.headers
                .insert(name.to_owned(), value.as_ref().to_vec());
            self.lines.retain(|(n, _)| n != name);
            self.lines.push((name.to_owned(), value.as_ref().to_vec()));
            self
        }
        /// Adds a header line (another line of a header already there is joined with `,` for
        /// `header`, as Envoy's attribute joins them).
        fn line(mut self, name: &str, value: impl AsRef<[u8]>) -> Self {
            let key = name.to_ascii_lowercase();
            let joined = match self.headers.remove(&key) {
                Some(mut v) => {
                    v.push(b',');
                    v.extend_from_slice(value.as_ref());
                    v
                }
                None => value.as_ref().to_vec(),
            };
            self.headers.insert(key, joined);
            self.lines.push((name.to_owned(), value.as_ref().to_vec()));
            self
        }
        fn ip(mut self, ip: &str) -> Self {
            self.ip = Some(ip.as_bytes().to_vec());
            self
        }
    }

    impl RequestView for Req {
        fn header(&self, name: &str) -> Option<Cow<'_, [u8]>> {
            self.headers.get(name).map(|v| Cow::Borrowed(v.as_slice()))
        }
        fn header_lines(&self, name: &str) -> Lines<'_> {
            let mut lines = Lines::None;
            for (n, v) in &self.lines {
                if reading::is_header_name(n.as_bytes(), name) {
                    lines.push(Cow::Borrowed(v));
                }
            }
            lines
        }
        fn client_ip(&self) -> Option<Vec<u8>> {
            self.ip.clone()
        }
        fn property(&self, path: &[&str]) -> Option<Vec<u8>> {
            self.props.get(&path.join(".")).cloned()
        }
    }

    impl Req {
        fn prop(mut self, path: &str, value: impl AsRef<[u8]>) -> Self {
            self.props.insert(path.to_owned(), value.as_ref().to_vec());
            self
        }
    }

    /// The bucket key `applies` gives, if the rule applies.
    fn key_of(prefix: &str, rule: &Rule, req: &Req) -> Option<String> {
        applies(prefix, (0, rule), req, &mut KeyCache::default()).map(|a| a.key)
    }

    /// The value of `source`, None when missing (panics when ambiguous).
    fn one(source: KeySource, req: &Req) -> Option<Vec<u8>> {
        match key_values(&[source], req)?.remove(0) {
            Read::Value(v) => Some(v.into_owned()),
            other => panic!("{other:?}"),
        }
    }

    fn read(source: KeySource, req: &Req) -> Read<'static> {
        match key_value(&source, req) {
            Read::Value(v) => Read::Value(Cow::Owned(v.into_owned())),
            Read::Missing => Read::Missing,
            Read::Ambiguous => Read::Ambiguous,
        }
    }

    fn query(name: &str, path: &str) -> Option<Vec<u8>> {
        one(KeySource::Query(name.into()), &Req::new("GET", path))
    }

    fn rule(matcher: Match, key: Vec<KeySource>) -> Rule {
        Rule {
            name: "per-user".into(),
            matcher,
            key,
            limits: Quota::try_from(Limits {
                burst: 10,
                rate: 10,
                period_ms: 1000,
            })
            .unwrap(),
            cost: 1,
            cost_header: None,
            mode: Mode::Exact,
            max_wait_ms: 0,
            lease_max: 10,
            lease_horizon_ms: 200,
            shadow: false,
            fallback: None,
            usage: None,
            overrides: Default::default(),
        }
    }

    /// `prefix:{rule:` + 32 lowercase hex + `}`.
    fn assert_safe_key(key: &str, prefix: &str, rule: &str) {
        let head = format!("{prefix}:{{{rule}:");
        assert!(key.starts_with(&head), "{key}");
        assert!(key.ends_with('}'), "{key}");
        let digest = &key[head.len()..key.len() - 1];
        assert_eq!(digest.len(), 32, "{key}");
        assert!(
            digest
                .bytes()
                .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')),
            "{key}"
        );
    }

    // ---- matching ----

    #[test]
    fn empty_match_matches_everything() {
        assert!(matches(&Match::default(), &Req::default()));
    }

    #[test]
    fn path_prefix() {
        let m = Match {
            path_prefix: Some("/api/".into()),
            ..Match::default()
        };
        assert!(matches(&m, &Req::new("GET", "/api/users")));
        assert!(matches(&m, &Req::new("GET", "/api/")));
        assert!(!matches(&m, &Req::new("GET", "/api")));
        assert!(!matches(&m, &Req::new("GET", "/other/api/")));
        // Only the path counts, not the query or fragment.
        assert!(!matches(&m, &Req::new("GET", "/x?next=/api/")));
        assert!(!matches(&m, &Req::new("GET", "/x#/api/")));
        assert!(matches(&m, &Req::new("GET", "/api/?q=1")));
        // Byte prefix: case-sensitive.
        assert!(!matches(&m, &Req::new("GET", "/API/users")));
        // No :path, no match.
        assert!(!matches(&m, &Req::default()));
    }

    #[test]
    fn methods() {
        let m = Match {
            methods: vec!["GET".into(), "POST".into()],
            ..Match::default()
        };
        assert!(matches(&m, &Req::new("GET", "/")));
        assert!(matches(&m, &Req::new("POST", "/")));
        assert!(!matches(&m, &Req::new("PUT", "/")));
        assert!(!matches(&m, &Req::new("get", "/")));
        assert!(!matches(&m, &Req::default().with(":path", "/")));
        // Empty list = any method.
        assert!(matches(&Match::default(), &Req::new("DELETE", "/")));
    }

    #[test]
    fn header_exact() {
        let m = Match {
            headers: vec![HeaderMatch {
                name: "x-tier".into(),
                value: HeaderValueMatch::Exact("free".into()),
            }],
            ..Match::default()
        };
        assert!(matches(&m, &Req::new("GET", "/").with("x-tier", "free")));
        assert!(!matches(&m, &Req::new("GET", "/").with("x-tier", "Free")));
        assert!(!matches(&m, &Req::new("GET", "/").with("x-tier", "free ")));
        assert!(!matches(&m, &Req::new("GET", "/").with("x-tier", "")));
        assert!(!matches(&m, &Req::new("GET", "/")));
    }

    #[test]
    fn header_present() {
        let m = Match {
            headers: vec![HeaderMatch {
                name: "authorization".into(),
                value: HeaderValueMatch::Present,
            }],
            ..Match::default()
        };
        assert!(matches(
            &m,
            &Req::new("GET", "/").with("authorization", "x")
        ));
        assert!(matches(&m, &Req::new("GET", "/").with("authorization", "")));
        assert!(!matches(&m, &Req::new("GET", "/")));
    }

    #[test]
    fn all_conditions_must_hold() {
        let m = Match {
            path_prefix: Some("/api/".into()),
            path_ignore_case: false,
            hosts: vec![],
            methods: vec!["GET".into()],
            headers: vec![
                HeaderMatch {
                    name: "x-a".into(),
                    value: HeaderValueMatch::Present,
                },
                HeaderMatch {
                    name: "x-b".into(),
                    value: HeaderValueMatch::Exact("1".into()),
                },
            ],
        };
        let ok = Req::new("GET", "/api/x").with("x-a", "").with("x-b", "1");
        assert!(matches(&m, &ok));
        assert!(!matches(&m, &Req::new("GET", "/api/x").with("x-a", "")));
        assert!(!matches(
            &m,
            &Req::new("POST", "/api/x").with("x-a", "").with("x-b", "1")
        ));
        assert!(!matches(
            &m,
            &Req::new("GET", "/x").with("x-a", "").with("x-b", "1")
        ));
    }

    // ---- key sources ----

    #[test]
    fn each_key_source() {
        let req = Req::new("PATCH", "/a/b?x=1#frag")
            .with(":authority", "Api.Example.COM:8443")
            .with("x-user-id", "Alice")
            .ip("10.0.0.7");
        assert_eq!(
            one(KeySource::Header("x-user-id".into()), &req),
            Some(b"Alice".to_vec())
        );
        assert_eq!(one(KeySource::Query("x".into()), &req), Some(b"1".to_vec()));
        assert_eq!(one(KeySource::CLIENT_IP, &req), Some(b"10.0.0.7".to_vec()));
        assert_eq!(one(KeySource::Path, &req), Some(b"/a/b".to_vec()));
        assert_eq!(one(KeySource::Method, &req), Some(b"PATCH".to_vec()));
        assert_eq!(
            one(KeySource::Authority, &req),
            Some(b"api.example.com:8443".to_vec())
        );
        assert_eq!(
            one(KeySource::Literal("all".into()), &req),
            Some(b"all".to_vec())
        );
        assert_eq!(
            key_values(
                &[KeySource::Method, KeySource::Header("x-user-id".into())],
                &req
            ),
            Some(vec![
                Read::Value(Cow::Borrowed(&b"PATCH"[..])),
                Read::Value(Cow::Borrowed(&b"Alice"[..]))
            ])
        );
        assert_eq!(key_values(&[], &req), Some(vec![]));
    }

    #[test]
    fn missing_source_gives_none() {
        let req = Req::new("GET", "/a?x=1");
        assert_eq!(one(KeySource::Header("x-user-id".into()), &req), None);
        assert_eq!(one(KeySource::Query("y".into()), &req), None);
        assert_eq!(one(KeySource::CLIENT_IP, &req), None);
        assert_eq!(one(KeySource::Authority, &req), None);
        assert_eq!(one(KeySource::Path, &Req::default()), None);
        assert_eq!(one(KeySource::Method, &Req::default()), None);
        assert_eq!(one(KeySource::Query("x".into()), &Req::default()), None);
        // One missing source among present ones: the whole tuple is missing.
        assert_eq!(
            key_values(
                &[KeySource::Path, KeySource::Header("x-user-id".into())],
                &req
            ),
            None
        );
    }

    #[test]
    fn empty_header_value_is_present() {
        let req = Req::new("GET", "/").with("x-user-id", "");
        assert_eq!(
            one(KeySource::Header("x-user-id".into()), &req),
            Some(vec![])
        );
    }

    // ---- query decoding ----

    #[test]
    fn query_percent_decoding() {
        assert_eq!(query("user", "/?user=%61lice"), Some(b"alice".to_vec()));
        assert_eq!(query("user", "/?%75ser=alice"), Some(b"alice".to_vec()));
        assert_eq!(query("p", "/?p=a%2Fb"), Some(b"a/b".to_vec()));
        assert_eq!(query("p", "/?p=a%2fb"), Some(b"a/b".to_vec()));
        assert_eq!(query("p", "/?p=a+b"), Some(b"a b".to_vec()));
        assert_eq!(query("p", "/?p=a%2Bb"), Some(b"a+b".to_vec()));
        assert_eq!(query("a b", "/?a+b=1"), Some(b"1".to_vec()));
        assert_eq!(query("p", "/?p=%00%FF"), Some(vec![0, 0xff]));
        // `%61` and `a` are the same user.
        let k = |p: &str| {
            let r = rule(Match::default(), vec![KeySource::Query("u".into())]);
            key_of("tg", &r, &Req::new("GET", p))
        };
        assert_eq!(k("/?u=a"), k("/?u=%61"));
        assert_eq!(k("/?u=a%20b"), k("/?u=a+b"));
        assert_ne!(k("/?u=a"), k("/?u=b"));
    }

    #[test]
    fn query_bad_escapes_kept_literally() {
        assert_eq!(query("p", "/?p=%"), Some(b"%".to_vec()));
        assert_eq!(query("p", "/?p=%4"), Some(b"%4".to_vec()));
        assert_eq!(query("p", "/?p=%zz"), Some(b"%zz".to_vec()));
        assert_eq!(query("p", "/?p=%4g1"), Some(b"%4g1".to_vec()));
        assert_eq!(query("p", "/?p=100%"), Some(b"100%".to_vec()));
        assert_eq!(query("p", "/?p=%%41"), Some(b"%A".to_vec()));
    }

    #[test]
    fn query_structure() {
        // A name that appears twice is ambiguous, however it is spelled (more in `reading`).
        let q = |p: &str| read(KeySource::Query("a".into()), &Req::new("GET", p));
        assert_eq!(q("/?a=1&a=2"), Read::Ambiguous);
        assert_eq!(q("/?a=1&%61=2"), Read::Ambiguous);
        assert_eq!(q("/?%61=2&a=1"), Read::Ambiguous);
        assert_eq!(q("/?a=1;a=2"), Read::Ambiguous);
        assert_eq!(q("/?a=1&A=2"), Read::Ambiguous);
        // A name alone has an empty value; so does `a=`.
        assert_eq!(query("a", "/?a"), Some(vec![]));
        assert_eq!(query("a", "/?a="), Some(vec![]));
        assert_eq!(query("a", "/?b=1&a&c=2"), Some(vec![]));
        // Only the first '=' splits.
        assert_eq!(query("a", "/?a=1=2"), Some(b"1=2".to_vec()));
        // Empty pairs are skipped.
        assert_eq!(query("a", "/?&&a=1&"), Some(b"1".to_vec()));
        // The fragment is not part of the query.
        assert_eq!(query("a", "/?a=1#x"), Some(b"1".to_vec()));
        assert_eq!(query("a", "/?b=1#&a=2"), None);
        assert_eq!(query("a", "/#?a=1"), None);
        // A second '?' is part of the query.
        assert_eq!(query("a", "/?b=?&a=?1"), Some(b"?1".to_vec()));
        // Names match after decoding, as the most lenient server folds them.
        assert_eq!(query("a", "/?A=1"), Some(b"1".to_vec()));
        assert_eq!(query("a", "/?a[]=1"), Some(b"1".to_vec()));
        assert_eq!(query("a", "/?ab=1"), None);
        assert_eq!(query("a", "/a"), None);
        assert_eq!(query("a", "/?"), None);
    }

    // ---- keys ----

    fn hdr(name: &str) -> KeySource {
        KeySource::Header(name.into())
    }

    #[test]
    fn known_digest_vectors() {
        // Computed independently (Python hashlib): sha256(be32(16) "header:x-user-id" be32(5)
        // "alice").hexdigest()[:32].
        assert_eq!(
            bucket_key(
                "tollgate",
                "per-user",
                &[hdr("x-user-id")],
                &[b"alice".to_vec()]
            ),
            "tollgate:{per-user:1ff5268a9b87e2b51262db40cbb6e203}"
        );
        // No sources: SHA-256 of the empty string.
        assert_eq!(
            bucket_key::<&[u8]>("tollgate", "all", &[], &[]),
            "tollgate:{all:e3b0c44298fc1c149afbf4c8996fb924}"
        );
        assert_eq!(
            bucket_key(
                "tg",
                "r",
                &[KeySource::Query("u".into()), KeySource::Method],
                &[b"alice".to_vec(), b"GET".to_vec()]
            ),
            "tg:{r:9b0e09c30ea49b9245d57227f92d75bc}"
        );
    }

    #[test]
    fn distinct_tuples_give_distinct_keys() {
        let ab = [hdr("a"), hdr("b")];
        let ab_c = bucket_key("tg", "r", &ab, &[b"ab".to_vec(), b"c".to_vec()]);
        let a_bc = bucket_key("tg", "r", &ab, &[b"a".to_vec(), b"bc".to_vec()]);
        let abc = bucket_key("tg", "r", &[hdr("a")], &[b"abc".to_vec()]);
        assert_eq!(ab_c, "tg:{r:69963a5f864f080ac1f77e30ea4c8de3}");
        assert_eq!(a_bc, "tg:{r:d3e0f5e3d3c0ea94d01719c28cc1b4dc}");
        assert_ne!(ab_c, a_bc);
        assert_ne!(ab_c, abc);
        assert_ne!(a_bc, abc);
        // An empty value is a value.
        assert_ne!(
            bucket_key::<&[u8]>("tg", "r", &[], &[]),
            bucket_key("tg", "r", &[hdr("a")], &[Vec::new()])
        );
        // The rule name separates buckets too.
        assert_ne!(
            bucket_key("tg", "r1", &[hdr("a")], &[b"a".to_vec()]),
            bucket_key("tg", "r2", &[hdr("a")], &[b"a".to_vec()])
        );
    }

    #[test]
    fn changing_a_source_starts_fresh_buckets() {
        let v = [b"alice".to_vec()];
        let header = bucket_key("tg", "r", &[hdr("x-user-id")], &v);
        let query = bucket_key("tg", "r", &[KeySource::Query("x-user-id".into())], &v);
        assert_eq!(query, "tg:{r:edb0ebb3ea7077b9aabd4f21cb174575}");
        assert_ne!(header, query);
        assert_ne!(header, bucket_key("tg", "r", &[hdr("x-user")], &v));
        assert_ne!(
            header,
            bucket_key("tg", "r", &[KeySource::Literal("x".into())], &v)
        );
        // Another IPv6 prefix is another source (and its values differ anyway).
        let v6 = [b"::/64".to_vec()];
        assert_ne!(
            bucket_key("tg", "r", &[KeySource::CLIENT_IP], &v6),
            bucket_key(
                "tg",
                "r",
                &[KeySource::ClientIp {
                    v4_prefix: 32,
                    v6_prefix: 56
                }],
                &v6
            )
        );
        // Spelling a default explicitly is the same source.
        assert_eq!(
            KeySource::ClientIp {
                v4_prefix: 32,
                v6_prefix: 64
            }
            .to_string(),
            "client_ip"
        );
    }

    #[test]
    fn hostile_values_never_reach_the_key() {
        let r = rule(
            Match::default(),
            vec![KeySource::Header("x-user-id".into())],
        );
        let hostile: Vec<Vec<u8>> = vec![
            b"/".to_vec(),
            b"a/b/../../FLUSHALL".to_vec(),
            b"+".to_vec(),
            b"?x=1".to_vec(),
            b"%".to_vec(),
            b"%2F".to_vec(),
            b"user.json".to_vec(),
            b"..".to_vec(),
            b"a\0b".to_vec(),
            b"a\r\nSET x 1\r\n".to_vec(),
            b"{tag}".to_vec(),
            b"}:{".to_vec(),
            vec![0xff, 0xfe, 0x80],
            vec![b'x'; 64 * 1024],
            Vec::new(),
        ];
        let mut keys = Vec::new();
        for v in &hostile {
            let req = Req::new("GET", "/").with("x-user-id", v);
            let key = key_of("tollgate", &r, &req).unwrap();
            assert_safe_key(&key, "tollgate", "per-user");
            keys.push(key);
        }
        let mut unique = keys.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), keys.len(), "hostile values collided");

        // Through a query parameter and the path too.
        let rq = rule(
            Match::default(),
            vec![KeySource::Query("u".into()), KeySource::Path],
        );
        let req = Req::new("GET", "/../x.json?u=%00%0D%0A%2F..%3F%25");
        assert_safe_key(
            &key_of("tollgate", &rq, &req).unwrap(),
            "tollgate",
            "per-user",
        );
    }

    #[test]
    fn applies_needs_match_and_all_sources() {
        let r = rule(
            Match {
                path_prefix: Some("/api/".into()),
                ..Match::default()
            },
            vec![KeySource::Header("x-user-id".into()), KeySource::CLIENT_IP],
        );
        let full = Req::new("GET", "/api/x")
            .with("x-user-id", "alice")
            .ip("10.0.0.1");
        assert_eq!(
            key_of("tg", &r, &full),
            Some(bucket_key(
                "tg",
                "per-user",
                &r.key,
                &[b"alice".to_vec(), b"10.0.0.1".to_vec()]
            ))
        );
        // Match fails.
        let other_path = Req::new("GET", "/x")
            .with("x-user-id", "alice")
            .ip("10.0.0.1");
        assert_eq!(key_of("tg", &r, &other_path), None);
        // A source is missing.
        let no_ip = Req::new("GET", "/api/x").with("x-user-id", "alice");
        assert_eq!(key_of("tg", &r, &no_ip), None);
        // Empty key: one bucket for the rule.
        let global = rule(Match::default(), vec![]);
        assert_eq!(
            key_of("tg", &global, &Req::default()),
            Some("tg:{per-user:e3b0c44298fc1c149afbf4c8996fb924}".to_owned())
        );
    }

    #[test]
    fn path_rules_see_through_spellings() {
        let r = rule(
            Match {
                path_prefix: Some("/api/".into()),
                ..Match::default()
            },
            vec![KeySource::Path],
        );
        let want = key_of("tg", &r, &Req::new("GET", "/api/x"));
        assert!(want.is_some());
        // The hardening issue's spellings: all match, all share /api/x's bucket.
        for p in [
            "//api/x",
            "/./api/x",
            "/%61pi/x",
            "/x/../api/x",
            "/api%2Fx",
            "/api;a=1/x",
        ] {
            assert_eq!(key_of("tg", &r, &Req::new("GET", p)), want, "{p}");
        }
        // Irregular paths match every path rule (keyed by their clamped form).
        assert!(key_of("tg", &r, &Req::new("GET", "/../other")).is_some());
        assert!(key_of("tg", &r, &Req::new("GET", "/other/%zz")).is_some());
        assert_eq!(key_of("tg", &r, &Req::new("GET", "/other")), None);
        // Case-sensitive unless asked.
        assert_eq!(key_of("tg", &r, &Req::new("GET", "/API/x")), None);
        let ci = rule(
            Match {
                path_prefix: Some("/api/".into()),
                path_ignore_case: true,
                ..Match::default()
            },
            vec![],
        );
        assert!(key_of("tg", &ci, &Req::new("GET", "/API/x")).is_some());
        assert!(key_of("tg", &ci, &Req::new("GET", "//Api/x")).is_some());
        assert_eq!(key_of("tg", &ci, &Req::new("GET", "/APIX")), None);
    }

    #[test]
    fn client_ip_keys_by_address_or_network() {
        let v6_56 = KeySource::ClientIp {
            v4_prefix: 32,
            v6_prefix: 56,
        };
        let ip = |a: &str, s: &KeySource| one(s.clone(), &Req::default().ip(a));
        let d = &KeySource::CLIENT_IP;
        assert_eq!(ip("10.0.0.7", d), Some(b"10.0.0.7".to_vec()));
        assert_eq!(ip("::ffff:10.0.0.7", d), Some(b"10.0.0.7".to_vec()));
        assert_eq!(
            ip("2001:db8:0:1::7", d),
            Some(b"2001:db8:0:1::/64".to_vec())
        );
        assert_eq!(
            ip("2001:db8:0:1::7", &v6_56),
            Some(b"2001:db8::/56".to_vec())
        );
        assert_eq!(ip("::1", d), Some(b"::/64".to_vec()));
        // Two addresses of one /64 share a bucket.
        let r = rule(Match::default(), vec![KeySource::CLIENT_IP]);
        assert_eq!(
            key_of("tg", &r, &Req::default().ip("2001:db8:0:1::1")),
            key_of("tg", &r, &Req::default().ip("2001:db8:0:1:ffff::2"))
        );
        assert_ne!(
            key_of("tg", &r, &Req::default().ip("2001:db8:0:1::1")),
            key_of("tg", &r, &Req::default().ip("2001:db8:0:2::1"))
        );
    }

    fn header_rule(name: &str, value: HeaderValueMatch) -> Match {
        Match {
            headers: vec![HeaderMatch {
                name: name.into(),
                value,
            }],
            ..Match::default()
        }
    }

    #[test]
    fn header_prefix_absent_regex() {
        let prefix = header_rule("authorization", HeaderValueMatch::Prefix("Bearer ".into()));
        let get = |h: &[(&str, &str)]| {
            h.iter()
                .fold(Req::new("GET", "/"), |r, (n, v)| r.with(n, v))
        };
        assert!(matches(&prefix, &get(&[("authorization", "Bearer abc")])));
        assert!(matches(&prefix, &get(&[("authorization", "Bearer ")])));
        assert!(!matches(&prefix, &get(&[("authorization", "bearer abc")])));
        assert!(!matches(&prefix, &get(&[])));
        let absent = header_rule("x-internal", HeaderValueMatch::Absent);
        assert!(matches(&absent, &get(&[])));
        assert!(!matches(&absent, &get(&[("x-internal", "")])));
        assert!(!matches(&absent, &get(&[("x-internal", "1")])));
        let re = header_rule(
            "x-tier",
            HeaderValueMatch::Regex(
                crate::rule::pattern::Pattern::new("free|trial-[0-9]+").unwrap(),
            ),
        );
        assert!(matches(&re, &get(&[("x-tier", "free")])));
        assert!(matches(&re, &get(&[("x-tier", "trial-12")])));
        assert!(!matches(&re, &get(&[("x-tier", "trial-")])));
        assert!(!matches(&re, &get(&[("x-tier", "freedom")])));
        assert!(!matches(&re, &get(&[])));
        // Repeated lines arrive joined: "free,free" is not "free".
        assert!(!matches(&re, &get(&[("x-tier", "free,free")])));
    }

    #[test]
    fn hosts_match_without_port_case_and_wildcard() {
        let m = Match {
            hosts: vec![
                "api.example.com".into(),
                "*.tenant.example.com".into(),
                "[::1]".into(),
                "10.0.0.2".into(),
            ],
            ..Match::default()
        };
        let host = |a: &str| matches(&m, &Req::new("GET", "/").with(":authority", a));
        for yes in [
            "api.example.com",
            "API.Example.COM",
            "api.example.com:8443",
            "api.example.com.",
            "api.example.com.:80",
            "user@api.example.com:1",
            "a.tenant.example.com",
            "x.y.tenant.example.com:443",
            "[::1]:8080",
            "[::1]",
            // Every spelling of the literal, as the configured one was canonicalised too.
            "[0:0::1]:8080",
            "[::0001]",
            "[0:0:0:0:0:0:0:1]:80",
            "[::1%25eth0]:80",
            "10.0.0.2:80",
            "[::FFFF:10.0.0.2]:80",
        ] {
            assert!(host(yes), "{yes}");
        }
        for no in [
            "tenant.example.com",
            ".tenant.example.com",
            "api.example.com.evil",
            "evilapi.example.com",
            "example.com",
            "api.example.co",
            "[::2]:80",
            "[::1:0]",
            "[::ffff:10.0.0.3]",
            "",
        ] {
            assert!(!host(no), "{no}");
        }
        assert!(!matches(&m, &Req::new("GET", "/")), "no :authority");
        assert!(matches(&Match::default(), &Req::new("GET", "/")));
    }

    #[test]
    fn cookies() {
        let c = |lines: &[&str], name: &str| {
            let mut req = Req::new("GET", "/");
            for line in lines {
                req = req.line("cookie", line);
            }
            read(KeySource::Cookie(name.into()), &req)
        };
        let v = |s: &'static str| Read::Value(Cow::Borrowed(s.as_bytes()));
        assert_eq!(c(&["sid=abc"], "sid"), v("abc"));
        assert_eq!(c(&["a=1; sid=abc; b=2"], "sid"), v("abc"));
        // Several cookie lines.
        assert_eq!(c(&["a=1", "sid=abc"], "sid"), v("abc"));
        assert_eq!(c(&["sid=1", "sid=2"], "sid"), Read::Ambiguous);
        assert_eq!(c(&["sid=1; sid=2"], "sid"), Read::Ambiguous);
        assert_eq!(c(&["sid=1; SID=2"], "sid"), Read::Ambiguous);
        // Values as servers decode them: unquoted, percent-decoded.
        assert_eq!(c(&["sid=\"q v\""], "sid"), v("q v"));
        assert_eq!(c(&["sid=a%20b"], "sid"), v("a b"));
        assert_eq!(c(&["sid="], "sid"), v(""));
        assert_eq!(c(&["sid=a=b"], "sid"), v("a=b"));
        assert_eq!(c(&["sidx=1; xsid=2"], "sid"), Read::Missing);
        assert_eq!(c(&[], "sid"), Read::Missing);
    }

    fn property(path: &str) -> KeySource {
        let (spelled, resolved) = match path {
            "source.principal" => (path, "connection.uri_san_peer_certificate"),
            p => (p, p),
        };
        KeySource::Property {
            spelled: spelled.into(),
            path: resolved.split('.').map(str::to_owned).collect(),
        }
    }

    #[test]
    fn property_sources() {
        let req = Req::new("GET", "/")
            .prop(
                "connection.uri_san_peer_certificate",
                "spiffe://td/ns/a/sa/alice",
            )
            .prop("source.port", 40000i64.to_le_bytes())
            .prop("connection.mtls", [1])
            .prop("connection.requested_server_name", "");
        let v = |p: &str| one(property(p), &req).map(|v| String::from_utf8(v).unwrap());
        assert_eq!(
            v("source.principal").as_deref(),
            Some("spiffe://td/ns/a/sa/alice")
        );
        assert_eq!(
            v("connection.uri_san_peer_certificate").as_deref(),
            Some("spiffe://td/ns/a/sa/alice")
        );
        assert_eq!(v("source.port").as_deref(), Some("40000"));
        assert_eq!(v("connection.mtls").as_deref(), Some("true"));
        // An empty value is a value; a missing one is not.
        assert_eq!(v("connection.requested_server_name").as_deref(), Some(""));
        assert_eq!(v("connection.dns_san_peer_certificate"), None);
        // The alias and the attribute it names are different sources (different buckets).
        assert_ne!(
            property("source.principal").to_string(),
            property("connection.uri_san_peer_certificate").to_string()
        );
    }

    #[test]
    fn metadata_sources() {
        // `sub: "alice"` and `uid: 42` in namespace `jwt`, field `p` (a struct), serialised as
        // Envoy's Metadata (filter_metadata entry -> Struct -> Value.struct_value -> fields).
        fn field(n: u8, b: &[u8]) -> Vec<u8> {
            let mut out = vec![n << 3 | 2, u8::try_from(b.len()).unwrap()];
            out.extend_from_slice(b);
            out
        }
        fn entry(k: &str, v: &[u8]) -> Vec<u8> {
            [field(1, k.as_bytes()), field(2, v)].concat()
        }
        let sub = field(3, b"alice");
        let mut uid = vec![2 << 3 | 1];
        uid.extend_from_slice(&42f64.to_bits().to_le_bytes());
        let payload = [field(1, &entry("sub", &sub)), field(1, &entry("uid", &uid))].concat();
        let ns = field(1, &entry("p", &field(5, &payload)));
        let md = field(1, &entry("jwt", &ns));
        let req = Req::new("GET", "/").prop("metadata", md);
        let src = |f: &str| KeySource::Metadata {
            namespace: "jwt".into(),
            fields: f.split('.').map(str::to_owned).collect(),
        };
        assert_eq!(one(src("p.sub"), &req), Some(b"alice".to_vec()));
        assert_eq!(one(src("p.uid"), &req), Some(b"42".to_vec()));
        assert_eq!(one(src("p.gone"), &req), None);
        assert_eq!(one(src("p.sub"), &Req::new("GET", "/")), None);
        // The rule does not apply without the claim.
        let r = rule(Match::default(), vec![src("p.sub")]);
        assert!(applies("tg", (0, &r), &req, &mut KeyCache::default()).is_some());
        assert_eq!(
            applies(
                "tg",
                (0, &r),
                &Req::new("GET", "/").prop("metadata", ""),
                &mut KeyCache::default()
            ),
            None
        );
    }

    #[test]
    fn the_ambiguous_marker_has_known_digests() {
        // Computed independently (Python hashlib): sha256(be32(16) "header:x-api-key"
        // be32(0xffffffff)).hexdigest()[:32].
        assert_eq!(
            bucket_key_of("tg", "r", &[hdr("x-api-key")], &[Part::Ambiguous]),
            "tg:{r:a71304c0f8c5d973c510877a10c04dac}"
        );
        assert_eq!(
            bucket_key_of(
                "tg",
                "r",
                &[hdr("x-tenant"), KeySource::Cookie("session".into())],
                &[Part::Value(b"acme"), Part::Ambiguous]
            ),
            "tg:{r:2aed9ccc0e1ef000c9c5b16d9c3bef11}"
        );
        // All values: what `bucket_key` gives.
        assert_eq!(
            bucket_key_of("tg", "r", &[hdr("x")], &[Part::Value(b"a")]),
            bucket_key("tg", "r", &[hdr("x")], &[b"a".to_vec()])
        );
    }

    /// The attack: after `VALID` spent its burst, copies of the key source's name with junk values
    /// must not each get a bucket. Every source reads a repeated name as ambiguous: one bucket per
    /// rule, never a value's, never an override's.
    #[test]
    fn a_repeated_key_source_is_one_ambiguous_bucket_per_rule() {
        type Twice = fn(&str, &str) -> Req;
        let cases: [(KeySource, Twice); 4] = [
            (KeySource::Cookie("session".into()), |a, b| {
                Req::new("GET", "/").line("cookie", format!("session={a}; session={b}"))
            }),
            (KeySource::Query("key".into()), |a, b| {
                Req::new("GET", &format!("/?key={a}&key={b}"))
            }),
            (hdr("x-api-key"), |a, b| {
                Req::new("GET", "/")
                    .line("x-api-key", a)
                    .line("x-api-key", b)
            }),
            (property("request.headers.x-api-key"), |a, b| {
                Req::new("GET", "/")
                    .line("x-api-key", a)
                    .line("X_Api_Key", b)
            }),
        ];
        for (source, twice) in cases {
            let mut r = rule(Match::default(), vec![source.clone()]);
            r.overrides
                .insert(vec![b"internal".to_vec()], Override::Unlimited);
            let apply = |req: &Req| applies("tg", (3, &r), req, &mut KeyCache::default()).unwrap();
            let shared = apply(&twice("R1", "VALID"));
            assert!(shared.ambiguous, "{source}");
            assert_eq!(
                shared.key,
                bucket_key_of("tg", &r.name, &r.key, &[Part::Ambiguous])
            );
            assert_eq!(
                (shared.limits, shared.unlimited),
                (r.limits.limits(), false)
            );
            for (a, b) in [
                ("R2", "VALID"),
                ("VALID", "R3"),
                ("VALID", "VALID"),
                ("internal", "internal"),
            ] {
                assert_eq!(apply(&twice(a, b)), shared, "{source} {a} {b}");
            }
            // No value names the ambiguous bucket, whatever its bytes.
            for value in [&b""[..], b"VALID", &u32::MAX.to_be_bytes()] {
                assert_ne!(shared.key, bucket_key("tg", &r.name, &r.key, &[value]));
            }
            // Another rule's ambiguous bucket is another bucket.
            let mut other = r.clone();
            other.name = "other".into();
            assert_ne!(
                applies(
                    "tg",
                    (4, &other),
                    &twice("R1", "VALID"),
                    &mut KeyCache::default()
                )
                .unwrap()
                .key,
                shared.key
            );
        }
    }

    #[test]
    fn an_ambiguous_source_keeps_the_other_sources_values() {
        let r = rule(
            Match::default(),
            vec![hdr("x-tenant"), KeySource::Cookie("session".into())],
        );
        let req = |tenant: &str, cookie: &str| {
            Req::new("GET", "/")
                .with("x-tenant", tenant)
                .line("cookie", cookie)
        };
        let a = applies(
            "tg",
            (0, &r),
            &req("acme", "session=1; session=2"),
            &mut KeyCache::default(),
        )
        .unwrap();
        assert!(a.ambiguous);
        assert_eq!(a.key, "tg:{per-user:2aed9ccc0e1ef000c9c5b16d9c3bef11}");
        assert_eq!(
            a.key,
            bucket_key_of(
                "tg",
                "per-user",
                &r.key,
                &[Part::Value(b"acme"), Part::Ambiguous]
            )
        );
        let b = applies(
            "tg",
            (0, &r),
            &req("other", "session=1; session=2"),
            &mut KeyCache::default(),
        )
        .unwrap();
        assert_ne!(a.key, b.key, "one ambiguous bucket per tenant");
        // A missing source still means the rule does not apply.
        let no_tenant = Req::new("GET", "/").line("cookie", "session=1; session=2");
        assert_eq!(
            applies("tg", (0, &r), &no_tenant, &mut KeyCache::default()),
            None
        );
        // Once: the value, not ambiguous.
        let one = applies(
            "tg",
            (0, &r),
            &req("acme", "session=1"),
            &mut KeyCache::default(),
        )
        .unwrap();
        assert!(!one.ambiguous);
        assert_eq!(
            one.key,
            bucket_key("tg", "per-user", &r.key, &[b"acme".to_vec(), b"1".to_vec()])
        );
    }

    #[test]
    fn a_header_key_reads_one_line_by_any_spelling_of_its_name() {
        let r = rule(Match::default(), vec![hdr("x-api-key")]);
        let key = |req: &Req| applies("tg", (0, &r), req, &mut KeyCache::default()).unwrap();
        let plain = key(&Req::new("GET", "/").line("x-api-key", "VALID"));
        assert!(!plain.ambiguous);
        // CGI, WSGI and PHP read `x_api_key` as `x-api-key`.
        assert_eq!(key(&Req::new("GET", "/").line("X_API_KEY", "VALID")), plain);
        // One line with a comma is one value, as every server reads one line.
        assert!(!key(&Req::new("GET", "/").line("x-api-key", "R1,VALID")).ambiguous);
        assert!(
            key(&Req::new("GET", "/")
                .line("x-api-key", "VALID")
                .line("x_api_key", "R1"))
            .ambiguous
        );
    }

    /// The override attack: `/health` unlimited on a `path`-keyed rule is reached only by a path
    /// every reading calls `/health`; other spellings stay in `/health`'s bucket under the rule's
    /// limits.
    #[test]
    fn a_path_override_applies_only_where_every_reading_agrees() {
        let mut r = rule(Match::default(), vec![KeySource::Path]);
        r.overrides
            .insert(vec![b"/health".to_vec()], Override::Unlimited);
        let apply = |p: &str| {
            applies("tg", (0, &r), &Req::new("GET", p), &mut KeyCache::default()).unwrap()
        };
        let health = apply("/health");
        assert!(health.unlimited);
        assert!(apply("/health?probe=1").unlimited);
        for p in [
            "/api/search/..;/..;/health",
            "/x/..;/health",
            "/health;v=1",
            "//health",
            "/x/../health",
            "/%68ealth",
            "/x%2F..%2Fhealth",
            "/../health",
        ] {
            let a = apply(p);
            assert!(!a.unlimited, "{p}");
            assert_eq!(a.limits, r.limits, "{p}");
            assert_eq!(
                a.key, health.key,
                "{p}: /health's bucket, under the rule's limits"
            );
        }
        // With other sources too, and for limit overrides as for `unlimited`.
        let mut two = rule(Match::default(), vec![KeySource::Method, KeySource::Path]);
        let wide = Limits {
            burst: 99,
            rate: 99,
            period_ms: 1000,
        };
        two.overrides.insert(
            vec![b"GET".to_vec(), b"/health".to_vec()],
            Override::Limits(Quota::try_from(wide).unwrap()),
        );
        let limits = |p: &str| {
            applies(
                "tg",
                (0, &two),
                &Req::new("GET", p),
                &mut KeyCache::default(),
            )
            .unwrap()
            .limits
        };
        assert_eq!(limits("/health"), wide);
        assert_eq!(limits("/x/..;/health"), two.limits);
        // An attribute that is the path as sent: its override too only where readings agree.
        let mut raw = rule(Match::default(), vec![property("request.url_path")]);
        raw.overrides
            .insert(vec![b"/a;v=1/x".to_vec()], Override::Unlimited);
        raw.overrides
            .insert(vec![b"/health".to_vec()], Override::Unlimited);
        let unlimited = |p: &str| {
            let req = Req::new("GET", p).prop("request.url_path", p);
            applies("tg", (0, &raw), &req, &mut KeyCache::default())
                .unwrap()
                .unlimited
        };
        assert!(unlimited("/health"));
        assert!(
            !unlimited("/a;v=1/x"),
            "a server that cuts ;params reads /a/x"
        );
    }

    #[test]
    fn a_header_condition_holds_for_any_line_of_a_repeated_header() {
        let m = header_rule("x-tier", HeaderValueMatch::Exact("free".into()));
        let req = |lines: &[&str]| {
            lines
                .iter()
                .fold(Req::new("GET", "/"), |r, l| r.line("x-tier", l))
        };
        assert!(matches(&m, &req(&["free"])));
        // An application that reads the first (or the last) line sees "free".
        assert!(matches(&m, &req(&["free", "paid"])));
        assert!(matches(&m, &req(&["paid", "free"])));
        assert!(!matches(&m, &req(&["paid", "gold"])));
        let joined = header_rule("x-tier", HeaderValueMatch::Exact("paid,gold".into()));
        assert!(matches(&joined, &req(&["paid", "gold"])));
        let present = header_rule("x-tier", HeaderValueMatch::Present);
        assert!(matches(&present, &Req::new("GET", "/").line("x_tier", "1")));
        let absent = header_rule("x-tier", HeaderValueMatch::Absent);
        assert!(!matches(&absent, &req(&["a", "b"])));
        assert!(matches(&absent, &Req::new("GET", "/")));
    }

    #[test]
    fn overrides_change_limits_not_keys() {
        let mut r = rule(Match::default(), vec![KeySource::Header("x-tenant".into())]);
        let acme = Limits {
            burst: 2000,
            rate: 1000,
            period_ms: 1000,
        };
        r.overrides.insert(
            vec![b"acme".to_vec()],
            Override::Limits(Quota::try_from(acme).unwrap()),
        );
        r.overrides
            .insert(vec![b"internal".to_vec()], Override::Unlimited);
        let tenant = |t: &str| {
            applies(
                "tg",
                (0, &r),
                &Req::new("GET", "/").with("x-tenant", t),
                &mut KeyCache::default(),
            )
            .unwrap()
        };
        let plain = rule(Match::default(), vec![KeySource::Header("x-tenant".into())]);
        let plain_key =
            |t: &str| key_of("tg", &plain, &Req::new("GET", "/").with("x-tenant", t)).unwrap();

        let a = tenant("acme");
        assert_eq!(a.limits, acme);
        assert!(!a.unlimited);
        assert_eq!(a.key, plain_key("acme"), "an override keeps the bucket");
        let i = tenant("internal");
        assert!(i.unlimited);
        assert_eq!(i.limits, r.limits);
        assert_eq!(i.key, plain_key("internal"));
        let d = tenant("other");
        assert_eq!((d.limits, d.unlimited), (r.limits.limits(), false));
        // Matched on the value as requests give it: "ACME" is another tenant.
        assert_eq!(tenant("ACME").limits, r.limits);
    }

    #[test]
    fn authority_is_case_insensitive() {
        let r = rule(Match::default(), vec![KeySource::Authority]);
        let a = applies(
            "tg",
            (0, &r),
            &Req::default().with(":authority", "API.example.com"),
            &mut KeyCache::default(),
        );
        let b = applies(
            "tg",
            (0, &r),
            &Req::default().with(":authority", "api.EXAMPLE.com"),
            &mut KeyCache::default(),
        );
        assert!(a.is_some());
        assert_eq!(a, b);
    }

    #[test]
    fn the_key_cache_gives_exactly_the_bucket_key() {
        let mut cache = KeyCache::default();
        let sources = [hdr("x-user-id"), KeySource::Query("k".into())];
        let other = [hdr("x-tenant")];
        let v = |a: &str, b: &str| vec![a.as_bytes().to_vec(), b.as_bytes().to_vec()];
        for (idx, rule, sources, values) in [
            (0, "r", &sources[..], v("alice", "1")),
            (0, "r", &sources[..], v("alice", "1")),
            (1, "r2", &sources[..], v("alice", "1")),
            (0, "r", &sources[..], v("alic", "e1")),
            (2, "t", &other[..], vec![b"alice1".to_vec()]),
            (0, "r", &sources[..], v("alice", "1")),
        ] {
            assert_eq!(
                cache.bucket_key(idx, ("tg", rule, sources), &values),
                bucket_key("tg", rule, sources, &values)
            );
        }
    }

    /// Values crafted into one set only evict each other; the set keeps its most recently used.
    #[test]
    fn a_key_cache_set_keeps_its_recently_used_entries() {
        let mut cache = KeyCache::default();
        let sources = [hdr("x-user-id")];
        let value = |i: usize| vec![i.to_string().into_bytes()];
        let hot = value(0);
        let set = cache.set_of(0, &hot);
        let same_set: Vec<_> = (1..)
            .map(value)
            .filter(|v| cache.set_of(0, v) == set)
            .take(3 * KeyCache::WAYS)
            .collect();
        let cached = |c: &KeyCache, v: &[Vec<u8>]| {
            c.entries[set..set + KeyCache::WAYS]
                .iter()
                .flatten()
                .any(|e| e.values == v)
        };
        for v in &same_set {
            for values in [&hot, v] {
                assert_eq!(
                    cache.bucket_key(0, ("tg", "r", &sources), values),
                    bucket_key("tg", "r", &sources, values)
                );
            }
            assert!(cached(&cache, &hot) && cached(&cache, v));
        }
        assert!(
            !cached(&cache, &same_set[0]),
            "the least recently used went"
        );
        assert_eq!(cache.entries.iter().flatten().count(), KeyCache::WAYS);
    }

    #[test]
    fn a_recycled_key_string_carries_the_next_hit() {
        let mut cache = KeyCache::default();
        let sources = [hdr("x-user-id")];
        let (a, b) = ([b"alice".to_vec()], [b"bob".to_vec()]);
        let key_a = cache.bucket_key(0, ("tg", "r", &sources), &a);
        cache.bucket_key(0, ("tg", "r", &sources), &b);
        cache.recycle(key_a);
        let key_b = cache.bucket_key(0, ("tg", "r", &sources), &b);
        assert_eq!(key_b, bucket_key("tg", "r", &sources, &b));
        assert!(cache.spare.is_empty(), "the hit took the recycled String");
        for _ in 0..2 * KeyCache::MAX_SPARE {
            cache.recycle(String::new());
        }
        assert_eq!(cache.spare.len(), KeyCache::MAX_SPARE);
    }

    #[test]
    fn the_key_cache_is_bounded() {
        let mut cache = KeyCache::default();
        let sources = [hdr("x-user-id")];
        for i in 0..KeyCache::MAX * 3 + 1 {
            let values = [i.to_string().into_bytes()];
            let long = [vec![b'x'; KeyCache::MAX_VALUES_LEN + 1 + i % 7]];
            assert_eq!(
                cache.bucket_key(0, ("tg", "r", &sources), &long),
                bucket_key("tg", "r", &sources, &long)
            );
            assert_eq!(
                cache.bucket_key(0, ("tg", "r", &sources), &values),
                bucket_key("tg", "r", &sources, &values)
            );
            assert_eq!(cache.entries.len(), KeyCache::MAX);
            assert!(cache.entries.iter().flatten().all(|e| e
                .values
                .iter()
                .map(Vec::len)
                .sum::<usize>()
                <= KeyCache::MAX_VALUES_LEN));
        }
    }
}

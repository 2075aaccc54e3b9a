//! Values of Envoy attributes and dynamic metadata as key values: one stable text per value.
//!
//! Invariant: a value that is not a string gets one encoding that depends only on the value (not
//! on how Envoy serialises it): integers and integral numbers as decimal (`42`, not `42.0`), other
//! numbers in Rust's shortest round-trip form (`0.5`), booleans as `true`/`false`, lists and
//! structs as compact JSON with keys sorted; a string is its bytes. A null, or anything that
//! cannot be read, is a missing value (the rule does not apply).
//!
//! Dynamic metadata comes from Envoy's `metadata` attribute: the serialised
//! `envoy.config.core.v3.Metadata` protobuf, whose `filter_metadata` maps a namespace to a
//! `google.protobuf.Struct`. Reading that message keeps each field's type (the per-field
//! attribute path would give a number as 8 raw bytes, indistinguishable from an 8-byte string).

use std::collections::BTreeMap;

/// A `google.protobuf.Value`.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Null,
    Number(f64),
    String(Vec<u8>),
    Bool(bool),
    Struct(BTreeMap<Vec<u8>, Value>),
    List(Vec<Value>),
}

/// Deepest nesting of structs and lists read (deeper values are treated as unreadable).
const MAX_DEPTH: usize = 32;

/// One protobuf field: its number and its payload.
enum Field<'a> {
    Varint(u64),
    Fixed64(u64),
    Bytes(&'a [u8]),
    Fixed32,
}

/// A reader over a protobuf message's fields.
struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn varint(&mut self) -> Option<u64> {
        let mut value: u64 = 0;
        for shift in (0..64).step_by(7) {
            let (&b, rest) = self.buf.split_first()?;
            self.buf = rest;
            value |= u64::from(b & 0x7f).checked_shl(shift)?;
            if b & 0x80 == 0 {
                return Some(value);
            }
        }
        None
    }

    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if n > self.buf.len() {
            return None;
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Some(head)
    }

    /// The next field, None at the end; Err(()) on malformed input.
    fn field(&mut self) -> Result<Option<(u64, Field<'a>)>, ()> {
        if self.buf.is_empty() {
            return Ok(None);
        }
        let tag = self.varint().ok_or(())?;
        let number = tag >> 3;
        let field = match tag & 7 {
            0 => Field::Varint(self.varint().ok_or(())?),
            1 => {
                let b = self.take(8).ok_or(())?;
                let mut le = [0u8; 8];
                le.copy_from_slice(b);
                Field::Fixed64(u64::from_le_bytes(le))
            }
            2 => {
                let len = usize::try_from(self.varint().ok_or(())?).map_err(|_| ())?;
                Field::Bytes(self.take(len).ok_or(())?)
            }
            5 => {
                self.take(4).ok_or(())?;
                Field::Fixed32
            }
            _ => return Err(()),
        };
        Ok(Some((number, field)))
    }
}

/// Each entry of a `map<string, M>` field `number` of `msg` as (key, message bytes), in order.
fn map_entries(msg: &[u8], number: u64) -> Option<Vec<(&[u8], &[u8])>> {
    let mut out = Vec::new();
    let mut r = Reader { buf: msg };
    while let Some((n, f)) = r.field().ok()? {
        if let (true, Field::Bytes(entry)) = (n == number, f) {
            let (mut key, mut value): (&[u8], &[u8]) = (&[], &[]);
            let mut e = Reader { buf: entry };
            while let Some((en, ef)) = e.field().ok()? {
                match (en, ef) {
                    (1, Field::Bytes(k)) => key = k,
                    (2, Field::Bytes(v)) => value = v,
                    _ => {}
                }
            }
            out.push((key, value));
        }
    }
    Some(out)
}

/// A `google.protobuf.Struct` message.
fn read_struct(msg: &[u8], depth: usize) -> Option<BTreeMap<Vec<u8>, Value>> {
    let mut out = BTreeMap::new();
    // Later entries with the same key win, as protobuf maps do.
    for (key, value) in map_entries(msg, 1)? {
        out.insert(key.to_vec(), read_value(value, depth + 1)?);
    }
    Some(out)
}

/// A `google.protobuf.Value` message (an empty one is null).
fn read_value(msg: &[u8], depth: usize) -> Option<Value> {
    if depth > MAX_DEPTH {
        return None;
    }
    let mut value = Value::Null;
    let mut r = Reader { buf: msg };
    while let Some((n, f)) = r.field().ok()? {
        value = match (n, f) {
            (1, Field::Varint(_)) => Value::Null,
            (2, Field::Fixed64(bits)) => Value::Number(f64::from_bits(bits)),
            (3, Field::Bytes(s)) => Value::String(s.to_vec()),
            (4, Field::Varint(b)) => Value::Bool(b != 0),
            (5, Field::Bytes(s)) => Value::Struct(read_struct(s, depth)?),
            (6, Field::Bytes(l)) => {
                let mut items = Vec::new();
                let mut lr = Reader { buf: l };
                while let Some((ln, lf)) = lr.field().ok()? {
                    if let (1, Field::Bytes(item)) = (ln, lf) {
                        items.push(read_value(item, depth + 1)?);
                    }
                }
                Value::List(items)
            }
            _ => continue,
        };
    }
    Some(value)
}

/// The message of the last entry of map field `number` of `msg` whose key is `key` (protobuf maps
/// keep the last entry for a key). Only the entries' keys are read: their values are skipped.
fn map_entry<'a>(msg: &'a [u8], number: u64, key: &[u8]) -> Option<&'a [u8]> {
    let mut found = None;
    let mut r = Reader { buf: msg };
    while let Some((n, f)) = r.field().ok()? {
        if let (true, Field::Bytes(entry)) = (n == number, f) {
            let (mut k, mut value): (&[u8], &[u8]) = (&[], &[]);
            let mut e = Reader { buf: entry };
            while let Some((en, ef)) = e.field().ok()? {
                match (en, ef) {
                    (1, Field::Bytes(b)) => k = b,
                    (2, Field::Bytes(v)) => value = v,
                    _ => {}
                }
            }
            if k == key {
                found = Some(value);
            }
        }
    }
    found
}

/// Where a walk down a metadata path stands: a `Struct` message (the namespace, or a value's
/// struct), a `ListValue` message, or a `Value` message.
#[derive(Clone, Copy)]
enum Step<'a> {
    Struct(&'a [u8]),
    List(&'a [u8]),
    Value(&'a [u8]),
}

/// The struct or list a `Value` message holds (None for a scalar, or a malformed message), read
/// as [`read_value`] reads it: the last kind given wins. Nothing inside it is parsed.
fn container(value: &[u8]) -> Option<Step<'_>> {
    let mut kind = None;
    let mut r = Reader { buf: value };
    while let Some((n, f)) = r.field().ok()? {
        kind = match (n, f) {
            (5, Field::Bytes(s)) => Some(Step::Struct(s)),
            (6, Field::Bytes(l)) => Some(Step::List(l)),
            (1 | 4, Field::Varint(_)) | (2, Field::Fixed64(_)) | (3, Field::Bytes(_)) => None,
            _ => continue,
        };
    }
    kind
}

/// The `Value` message of item `i` of a `ListValue` message.
fn list_item(list: &[u8], i: usize) -> Option<&[u8]> {
    let mut seen = 0usize;
    let mut r = Reader { buf: list };
    while let Some((n, f)) = r.field().ok()? {
        if let (1, Field::Bytes(item)) = (n, f) {
            if seen == i {
                return Some(item);
            }
            seen += 1;
        }
    }
    None
}

/// The value at `fields` inside namespace `namespace` of a serialised `Metadata` message; a field
/// of all digits indexes a list. None if any step is missing or malformed, or the value itself
/// nests deeper than `MAX_DEPTH`.
///
/// Only the configured path is read: at each step the entries' keys are compared and every other
/// value is skipped unread, so nothing elsewhere in the namespace (a value nested too deep, or
/// malformed) can hide the key.
pub fn metadata_value(metadata: &[u8], namespace: &str, fields: &[String]) -> Option<Value> {
    let mut at = Step::Struct(map_entry(metadata, 1, namespace.as_bytes())?);
    for field in fields {
        let inside = match at {
            Step::Value(v) => container(v)?,
            other => other,
        };
        let value = match inside {
            Step::Struct(s) => map_entry(s, 1, field.as_bytes())?,
            Step::List(l) if field.bytes().all(|b| b.is_ascii_digit()) => {
                list_item(l, field.parse().ok()?)?
            }
            _ => return None,
        };
        at = Step::Value(value);
    }
    match at {
        Step::Struct(s) => Some(Value::Struct(read_struct(s, 0)?)),
        Step::Value(v) => read_value(v, fields.len()),
        Step::List(_) => None,
    }
}

/// `n` as key text: integral values below 2^53 in magnitude as integers, others in Rust's
/// shortest round-trip decimal form (`NaN`, `inf`, `-inf` for the non-finite).
fn number_text(n: f64) -> String {
    const EXACT: f64 = 9_007_199_254_740_992.0; // 2^53
    if n.fract() == 0.0 && n.abs() < EXACT {
        // Exact: an integral f64 below 2^53 converts to i64 without loss.
        #[allow(clippy::cast_possible_truncation)]
        let i = n as i64;
        return i.to_string();
    }
    n.to_string()
}

fn json_into(v: &Value, out: &mut Vec<u8>) {
    match v {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(b) => out.extend_from_slice(if *b { b"true" } else { b"false" }),
        Value::Number(n) => out.extend_from_slice(number_text(*n).as_bytes()),
        Value::String(s) => json_string(s, out),
        Value::List(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                json_into(item, out);
            }
            out.push(b']');
        }
        Value::Struct(m) => {
            out.push(b'{');
            for (i, (k, item)) in m.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                json_string(k, out);
                out.push(b':');
                json_into(item, out);
            }
            out.push(b'}');
        }
    }
}

/// A JSON string literal of `s` (invalid UTF-8 replaced by U+FFFD).
fn json_string(s: &[u8], out: &mut Vec<u8>) {
    let text = String::from_utf8_lossy(s);
    let quoted = serde_json::Value::String(text.into_owned()).to_string();
    out.extend_from_slice(quoted.as_bytes());
}

/// The key value of `v` (see the module invariant); None for null.
pub fn key_text(v: &Value) -> Option<Vec<u8>> {
    match v {
        Value::Null => None,
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(number_text(*n).into_bytes()),
        Value::Bool(b) => Some(if *b {
            b"true".to_vec()
        } else {
            b"false".to_vec()
        }),
        Value::Struct(_) | Value::List(_) => {
            let mut out = Vec::new();
            json_into(v, &mut out);
            Some(out)
        }
    }
}

/// How Envoy serialises an attribute of a known non-string type (Envoy's attribute table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AttrType {
    /// `int`, `uint`, and timestamps/durations (nanoseconds): 8 bytes, little-endian.
    Int,
    Uint,
    Bool,
}

fn attr_type(path: &[String]) -> Option<AttrType> {
    let joined = path.join(".");
    let t = match joined.as_str() {
        "source.port"
        | "destination.port"
        | "upstream.port"
        | "request.headers_bytes"
        | "request.size"
        | "request.total_size"
        | "request.time"
        | "request.duration"
        | "response.code"
        | "response.flags"
        | "response.grpc_status"
        | "response.size"
        | "response.total_size"
        | "response.headers_bytes"
        | "response.backend_latency"
        | "xds.listener_direction"
        | "upstream.cx_pool_ready_duration" => AttrType::Int,
        "connection.id" | "upstream.num_endpoints" | "upstream.request_attempt_count" => {
            AttrType::Uint
        }
        "connection.mtls" => AttrType::Bool,
        _ => return None,
    };
    Some(t)
}

/// The key value of attribute `path` from the bytes Envoy gave: integers as decimal, booleans as
/// `true`/`false` (for the attributes Envoy documents with those types), anything else (strings)
/// as the bytes themselves.
pub fn attribute_text(path: &[String], raw: Vec<u8>) -> Vec<u8> {
    let eight = |raw: &[u8]| -> Option<[u8; 8]> { raw.try_into().ok() };
    match attr_type(path) {
        Some(AttrType::Int) => match eight(&raw) {
            Some(b) => i64::from_le_bytes(b).to_string().into_bytes(),
            None => raw,
        },
        Some(AttrType::Uint) => match eight(&raw) {
            Some(b) => u64::from_le_bytes(b).to_string().into_bytes(),
            None => raw,
        },
        Some(AttrType::Bool) => match raw.as_slice() {
            [0] => b"false".to_vec(),
            [1] => b"true".to_vec(),
            _ => raw,
        },
        None => raw,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // A tiny protobuf writer for the tests.
    fn varint(mut v: u64, out: &mut Vec<u8>) {
        loop {
            let b = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                out.push(b);
                return;
            }
            out.push(b | 0x80);
        }
    }
    fn bytes_field(n: u64, b: &[u8], out: &mut Vec<u8>) {
        varint(n << 3 | 2, out);
        varint(b.len() as u64, out);
        out.extend_from_slice(b);
    }
    fn entry(k: &[u8], v: &[u8]) -> Vec<u8> {
        let mut e = Vec::new();
        bytes_field(1, k, &mut e);
        bytes_field(2, v, &mut e);
        e
    }
    fn pb_struct(fields: &[(&str, Vec<u8>)]) -> Vec<u8> {
        let mut out = Vec::new();
        for (k, v) in fields {
            bytes_field(1, &entry(k.as_bytes(), v), &mut out);
        }
        out
    }
    fn num(n: f64) -> Vec<u8> {
        let mut out = vec![2 << 3 | 1];
        out.extend_from_slice(&n.to_bits().to_le_bytes());
        out
    }
    fn string(s: &str) -> Vec<u8> {
        let mut out = Vec::new();
        bytes_field(3, s.as_bytes(), &mut out);
        out
    }
    fn boolean(b: bool) -> Vec<u8> {
        vec![4 << 3, u8::from(b)]
    }
    fn null() -> Vec<u8> {
        vec![1 << 3, 0]
    }
    fn structv(fields: &[(&str, Vec<u8>)]) -> Vec<u8> {
        let mut out = Vec::new();
        bytes_field(5, &pb_struct(fields), &mut out);
        out
    }
    fn list(items: &[Vec<u8>]) -> Vec<u8> {
        let mut l = Vec::new();
        for i in items {
            bytes_field(1, i, &mut l);
        }
        let mut out = Vec::new();
        bytes_field(6, &l, &mut out);
        out
    }
    fn metadata(ns: &[(&str, Vec<u8>)]) -> Vec<u8> {
        let mut out = Vec::new();
        for (name, s) in ns {
            bytes_field(1, &entry(name.as_bytes(), s), &mut out);
        }
        out
    }

    fn jwt_metadata() -> Vec<u8> {
        let payload = structv(&[
            ("sub", string("alice")),
            ("uid", num(42.0)),
            ("neg", num(-3.0)),
            ("ratio", num(0.5)),
            ("big", num(12_345_678_901_234_567_890.0)),
            ("admin", boolean(true)),
            ("nothing", null()),
            ("empty", string("")),
            ("groups", list(&[string("b"), string("a"), num(1.0)])),
            (
                "org",
                structv(&[("name", string("acme")), ("id", num(7.0))]),
            ),
            ("quote", string("a\"b")),
        ]);
        metadata(&[
            ("other", pb_struct(&[("sub", string("mallory"))])),
            (
                "envoy.filters.http.jwt_authn",
                pb_struct(&[("jwt_payload", payload)]),
            ),
        ])
    }

    fn get(path: &str) -> Option<String> {
        let fields: Vec<String> = path.split('.').map(str::to_owned).collect();
        metadata_value(&jwt_metadata(), "envoy.filters.http.jwt_authn", &fields)
            .as_ref()
            .and_then(key_text)
            .map(|v| String::from_utf8(v).unwrap())
    }

    #[test]
    fn metadata_values_have_one_encoding() {
        assert_eq!(get("jwt_payload.sub").as_deref(), Some("alice"));
        assert_eq!(get("jwt_payload.uid").as_deref(), Some("42"));
        assert_eq!(get("jwt_payload.neg").as_deref(), Some("-3"));
        assert_eq!(get("jwt_payload.ratio").as_deref(), Some("0.5"));
        assert_eq!(
            get("jwt_payload.big").as_deref(),
            Some("12345678901234567000")
        );
        assert_eq!(get("jwt_payload.admin").as_deref(), Some("true"));
        assert_eq!(get("jwt_payload.empty").as_deref(), Some(""));
        assert_eq!(get("jwt_payload.groups").as_deref(), Some(r#"["b","a",1]"#));
        assert_eq!(get("jwt_payload.groups.1").as_deref(), Some("a"));
        assert_eq!(
            get("jwt_payload.org").as_deref(),
            Some(r#"{"id":7,"name":"acme"}"#)
        );
        assert_eq!(get("jwt_payload.org.name").as_deref(), Some("acme"));
        assert_eq!(get("jwt_payload.quote").as_deref(), Some("a\"b"));
        assert_eq!(
            get("jwt_payload").unwrap(),
            r#"{"admin":true,"big":12345678901234567000,"empty":"","groups":["b","a",1],"neg":-3,"nothing":null,"org":{"id":7,"name":"acme"},"quote":"a\"b","ratio":0.5,"sub":"alice","uid":42}"#
        );
    }

    #[test]
    fn missing_and_null_values() {
        assert_eq!(get("jwt_payload.nothing"), None);
        assert_eq!(get("jwt_payload.missing"), None);
        assert_eq!(get("jwt_payload.sub.x"), None);
        assert_eq!(get("jwt_payload.groups.3"), None);
        assert_eq!(get("jwt_payload.groups.x"), None);
        assert_eq!(get("nope"), None);
        assert_eq!(
            metadata_value(&jwt_metadata(), "missing.ns", &["sub".into()]),
            None
        );
        assert_eq!(metadata_value(&[], "ns", &["a".into()]), None);
    }

    #[test]
    fn malformed_metadata_is_missing() {
        let good = jwt_metadata();
        for cut in 1..good.len() {
            // Never a panic; a truncated message reads as missing or as a shorter message.
            let _ = metadata_value(
                &good[..cut],
                "envoy.filters.http.jwt_authn",
                &["jwt_payload".into()],
            );
        }
        assert_eq!(metadata_value(&[0xff; 12], "a", &[]), None);
        assert_eq!(metadata_value(&[0x0b], "a", &[]), None); // wire type 3 (groups)
                                                             // Nesting deeper than MAX_DEPTH is unreadable.
        let mut v = string("deep");
        for _ in 0..40 {
            v = structv(&[("a", v)]);
        }
        let md = metadata(&[("ns", pb_struct(&[("a", v)]))]);
        assert_eq!(metadata_value(&md, "ns", &["a".into()]), None);
    }

    #[test]
    fn only_the_configured_path_is_read() {
        // A value nested past MAX_DEPTH, and a malformed one, beside the key: neither hides it.
        let mut deep = string("deep");
        for _ in 0..40 {
            deep = list(&[deep]);
        }
        let mut broken = Vec::new();
        bytes_field(5, &[0xff; 6], &mut broken);
        let payload = structv(&[
            ("junk", deep.clone()),
            ("sub", string("alice")),
            ("bad", broken.clone()),
        ]);
        let md = metadata(&[(
            "ns",
            pb_struct(&[("deep", deep), ("p", payload), ("bad", broken)]),
        )]);
        let at = |path: &str| {
            let fields: Vec<String> = path.split('.').map(str::to_owned).collect();
            metadata_value(&md, "ns", &fields)
        };
        assert_eq!(at("p.sub"), Some(Value::String(b"alice".to_vec())));
        // What lies on the path is still read in full, and still bounded.
        assert_eq!(at("p.junk"), None);
        assert_eq!(at("p.bad"), None);
        assert_eq!(at("p"), None);
        // Lists on the path are indexed without reading their other items.
        let md = metadata(&[(
            "ns",
            pb_struct(&[(
                "l",
                list(&[structv(&[("x", list(&[]))]), string("zero"), string("one")]),
            )]),
        )]);
        let fields = |p: &str| -> Vec<String> { p.split('.').map(str::to_owned).collect() };
        assert_eq!(
            metadata_value(&md, "ns", &fields("l.2")),
            Some(Value::String(b"one".to_vec()))
        );
        assert_eq!(metadata_value(&md, "ns", &fields("l.3")), None);
        assert_eq!(metadata_value(&md, "ns", &fields("l.1.x")), None);
    }

    #[test]
    fn later_map_entries_win() {
        let md = metadata(&[
            ("ns", pb_struct(&[("a", string("1")), ("a", string("2"))])),
            ("ns", pb_struct(&[("b", string("3"))])),
        ]);
        assert_eq!(metadata_value(&md, "ns", &["a".into()]), None);
        assert_eq!(
            metadata_value(&md, "ns", &["b".into()]),
            Some(Value::String(b"3".to_vec()))
        );
    }

    #[test]
    fn numbers() {
        assert_eq!(number_text(0.0), "0");
        assert_eq!(number_text(-0.0), "0");
        assert_eq!(number_text(9_007_199_254_740_991.0), "9007199254740991");
        assert_eq!(number_text(9_007_199_254_740_992.0), "9007199254740992");
        assert_eq!(number_text(1e300).len(), 301);
        assert_eq!(number_text(1.25), "1.25");
        assert_eq!(number_text(f64::NAN), "NaN");
        assert_eq!(number_text(f64::INFINITY), "inf");
    }

    #[test]
    fn attribute_encodings() {
        let p = |s: &str| -> Vec<String> { s.split('.').map(str::to_owned).collect() };
        let t = |path: &str, raw: &[u8]| {
            String::from_utf8(attribute_text(&p(path), raw.to_vec())).unwrap()
        };
        assert_eq!(t("source.port", &40000i64.to_le_bytes()), "40000");
        assert_eq!(
            t("connection.id", &u64::MAX.to_le_bytes()),
            "18446744073709551615"
        );
        assert_eq!(t("connection.mtls", &[1]), "true");
        assert_eq!(t("connection.mtls", &[0]), "false");
        assert_eq!(t("source.address", b"10.0.0.1:5"), "10.0.0.1:5");
        assert_eq!(
            t("connection.uri_san_peer_certificate", b"spiffe://a/b"),
            "spiffe://a/b"
        );
        // A length that does not fit the type is kept as it is.
        assert_eq!(t("source.port", b"123"), "123");
        assert_eq!(t("connection.mtls", b"yes"), "yes");
    }
}

//! Dynamic metadata as Envoy hands it to a Wasm filter: a serialised
//! `envoy.config.core.v3.Metadata` (`filter_metadata`: namespace -> `google.protobuf.Struct`),
//! written from JSON so a request description can say `envoy.filters.http.jwt_authn={"payload":…}`.
//!
//! Invariant: the encoding is the protobuf wire format the host gives (`rule::value` decodes it),
//! so the core reads these values exactly as it reads Envoy's: a number is a double, a list a
//! `ListValue`, an object a `Struct`.

use serde_json::Value;

/// The serialised `Metadata` holding each namespace's JSON object.
pub fn encode(namespaces: &[(String, serde_json::Map<String, Value>)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, fields) in namespaces {
        let mut entry = Vec::new();
        bytes_field(1, name.as_bytes(), &mut entry);
        bytes_field(2, &structure(fields), &mut entry);
        bytes_field(1, &entry, &mut out);
    }
    out
}

/// A `google.protobuf.Struct`: field 1, map<string, Value>.
fn structure(fields: &serde_json::Map<String, Value>) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, v) in fields {
        let mut entry = Vec::new();
        bytes_field(1, name.as_bytes(), &mut entry);
        bytes_field(2, &value(v), &mut entry);
        bytes_field(1, &entry, &mut out);
    }
    out
}

/// A `google.protobuf.Value`: null 1, number 2 (double), string 3, bool 4, struct 5, list 6.
fn value(v: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    match v {
        Value::Null => out.extend_from_slice(&[1 << 3, 0]),
        Value::Number(n) => {
            out.push((2 << 3) | 1);
            out.extend_from_slice(&n.as_f64().unwrap_or(0.0).to_le_bytes());
        }
        Value::String(s) => bytes_field(3, s.as_bytes(), &mut out),
        Value::Bool(b) => out.extend_from_slice(&[4 << 3, u8::from(*b)]),
        Value::Object(fields) => bytes_field(5, &structure(fields), &mut out),
        Value::Array(items) => {
            let mut list = Vec::new();
            for item in items {
                bytes_field(1, &value(item), &mut list);
            }
            bytes_field(6, &list, &mut out);
        }
    }
    out
}

/// A length-delimited field.
fn bytes_field(number: u64, bytes: &[u8], out: &mut Vec<u8>) {
    varint((number << 3) | 2, out);
    varint(bytes.len() as u64, out);
    out.extend_from_slice(bytes);
}

fn varint(mut n: u64, out: &mut Vec<u8>) {
    while n >= 0x80 {
        out.push((n as u8 & 0x7f) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_core::rule::value::{key_text, metadata_value};

    /// The core's own decoder reads back what was written, in its key-text form.
    #[test]
    fn the_core_reads_what_is_encoded() {
        let payload = serde_json::json!({
            "payload": {"sub": "alice", "uid": 42, "groups": ["a", "b"], "org": {"id": 7},
                        "admin": true, "long": "x".repeat(300)}
        });
        let Value::Object(fields) = payload else {
            unreachable!()
        };
        let md = encode(&[("envoy.filters.http.jwt_authn".to_string(), fields)]);
        let get = |path: &str| {
            let fields: Vec<String> = path.split('.').map(str::to_owned).collect();
            metadata_value(&md, "envoy.filters.http.jwt_authn", &fields)
                .as_ref()
                .and_then(key_text)
                .map(|v| String::from_utf8(v).unwrap())
        };
        assert_eq!(get("payload.sub").as_deref(), Some("alice"));
        assert_eq!(get("payload.uid").as_deref(), Some("42"));
        assert_eq!(get("payload.groups.1").as_deref(), Some("b"));
        assert_eq!(get("payload.org").as_deref(), Some(r#"{"id":7}"#));
        assert_eq!(get("payload.admin").as_deref(), Some("true"));
        assert_eq!(get("payload.long").map(|s| s.len()), Some(300));
        assert_eq!(get("payload.nope"), None);
    }
}

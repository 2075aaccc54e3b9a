//! One bucket, named the way an operator knows it: a rule and the values of its key sources.
//!
//! Invariant: the values go through the core's own readings (a request carrying them is built and
//! read by `rule::key_values`), so `client_ip` is masked to its network, a path normalised, a
//! host lower-cased, a JWT claim read as the filter reads it; the bucket key is the core's
//! `bucket_key` of them and the limits are the rule's, or its override's for these values.

use std::borrow::Cow;
use std::fmt;

use tollgate_core::bucket::Limits;
use tollgate_core::config::{Config, KeySource, Override, Rule};
use tollgate_core::rule::{as_matched, bucket_key, ip, key_values, parts_of_key, Read, DIGEST_HEX};

use crate::metadata;
use crate::request::Described;

/// A bucket of a configured rule.
#[derive(Debug, Clone)]
pub struct Target<'c> {
    pub rule: &'c Rule,
    /// `<prefix>:{<rule>:<digest>}`, as Redis stores it.
    pub key: String,
    /// The key values as the filter reads them, one per source.
    pub values: Vec<Vec<u8>>,
    pub limits: Limits,
    /// An override says this key is never checked against Redis.
    pub unlimited: bool,
}

/// Why no bucket is named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TargetError {
    UnknownRule {
        rule: String,
        known: Vec<String>,
    },
    WrongCount {
        rule: String,
        sources: Vec<String>,
        got: usize,
    },
    Unreadable {
        source: String,
        value: String,
    },
    /// `--bucket` names no bucket of this configuration.
    NotABucket {
        key: String,
        prefix: String,
    },
}

impl fmt::Display for TargetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TargetError::UnknownRule { rule, known } => write!(
                f,
                "unknown rule {rule:?}: the configuration has {}",
                known.join(", ")
            ),
            TargetError::WrongCount { rule, sources, got } => write!(
                f,
                "rule {rule:?} needs {} key value{} (--key), one for each of: {}; got {got}",
                sources.len(),
                if sources.len() == 1 { "" } else { "s" },
                sources.join(", ")
            ),
            TargetError::Unreadable { source, value } => write!(
                f,
                "the value {value:?} is not one the filter can read for key source {source} \
                 (a client_ip source takes an address, or its network at the source's prefix)"
            ),
            TargetError::NotABucket { key, prefix } => write!(
                f,
                "{key:?} is no bucket of this configuration: a bucket key reads \
                 {prefix}:{{<rule>:<32 hex digits>}}, with the name of one of its rules"
            ),
        }
    }
}

/// The sources an operator gives a value for: all but `literal:` (fixed by the configuration).
fn asked(rule: &Rule) -> impl Iterator<Item = &KeySource> {
    rule.key
        .iter()
        .filter(|s| !matches!(s, KeySource::Literal(_)))
}

/// The bucket of rule `name` for `values` (one per key source that is not a literal, in order).
pub fn target<'c>(
    config: &'c Config,
    name: &str,
    values: &[String],
) -> Result<Target<'c>, TargetError> {
    let rule = config
        .rules
        .iter()
        .find(|r| r.name == name)
        .ok_or_else(|| TargetError::UnknownRule {
            rule: name.to_string(),
            known: config.rules.iter().map(|r| r.name.clone()).collect(),
        })?;
    let sources: Vec<&KeySource> = asked(rule).collect();
    if sources.len() != values.len() {
        return Err(TargetError::WrongCount {
            rule: name.to_string(),
            sources: sources.iter().map(|s| s.to_string()).collect(),
            got: values.len(),
        });
    }
    let mut read = Vec::with_capacity(rule.key.len());
    for (source, value) in sources.iter().zip(values) {
        // A client address or its network (`198.51.100.0/24`), as an override names it: a typo
        // is refused rather than read as a socket path.
        if let KeySource::ClientIp {
            v4_prefix,
            v6_prefix,
        } = source
        {
            let read_as = match value.parse::<std::net::IpAddr>() {
                Ok(_) => Some(ip::key_value(value.as_bytes(), *v4_prefix, *v6_prefix)),
                Err(_) => ip::canonical(value, *v4_prefix, *v6_prefix),
            };
            match read_as {
                Some(v) => {
                    read.push(v);
                    continue;
                }
                None => {
                    return Err(TargetError::Unreadable {
                        source: source.to_string(),
                        value: value.clone(),
                    })
                }
            }
        }
        let req = carrying(source, value);
        let v = match key_values(std::slice::from_ref(*source), &req).as_deref() {
            Some([Read::Value(v)]) => {
                as_matched(rule.matcher.path_ignore_case, source, Cow::Borrowed(v)).into_owned()
            }
            _ => {
                return Err(TargetError::Unreadable {
                    source: source.to_string(),
                    value: value.clone(),
                })
            }
        };
        read.push(v);
    }
    // Literals in their places.
    let mut given = read.into_iter();
    let values: Vec<Vec<u8>> = rule
        .key
        .iter()
        .map(|s| match s {
            KeySource::Literal(text) => text.as_bytes().to_vec(),
            _ => given.next().unwrap_or_default(),
        })
        .collect();
    let (limits, unlimited) = match rule.overrides.get(&values) {
        Some(Override::Limits(q)) => (q.limits(), false),
        Some(Override::Unlimited) => (rule.limits.limits(), true),
        None => (rule.limits.limits(), false),
    };
    Ok(Target {
        rule,
        key: bucket_key(&config.key_prefix, &rule.name, &rule.key, &values),
        values,
        limits,
        unlimited,
    })
}

/// The bucket whose key `key` is (as `explain` prints it): the bucket of an override's values
/// under its limits, else a rule's bucket under the rule's own limits, its key values unknown.
pub fn by_key<'c>(config: &'c Config, key: &str) -> Result<Target<'c>, TargetError> {
    let not_one = || TargetError::NotABucket {
        key: key.to_string(),
        prefix: config.key_prefix.clone(),
    };
    let (name, digest) = parts_of_key(&config.key_prefix, key).ok_or_else(not_one)?;
    let is_digest = digest.len() == DIGEST_HEX
        && digest
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    let rule = config
        .rules
        .iter()
        .find(|r| r.name == name)
        .filter(|_| is_digest)
        .ok_or_else(not_one)?;
    // An override's values are known: its bucket is the one their key names.
    let overridden = rule.overrides.iter().find(|(values, _)| {
        bucket_key(&config.key_prefix, &rule.name, &rule.key, values.as_slice()) == key
    });
    let (values, limits, unlimited) = match overridden {
        Some((values, Override::Limits(q))) => (values.clone(), q.limits(), false),
        Some((values, Override::Unlimited)) => (values.clone(), rule.limits.limits(), true),
        None => (Vec::new(), rule.limits.limits(), false),
    };
    Ok(Target {
        rule,
        key: key.to_string(),
        values,
        limits,
        unlimited,
    })
}

/// A request that carries `value` where `source` reads it.
fn carrying(source: &KeySource, value: &str) -> Described {
    let mut req = Described::default();
    match source {
        KeySource::Header(name) => req.line(name, value.as_bytes()),
        KeySource::Query(name) => req.line(
            ":path",
            format!("/?{}={}", encode(name), encode(value)).as_bytes(),
        ),
        // Encoded, as a query value is: the value named is the one the filter reads (decoded).
        KeySource::Cookie(name) => {
            req.line("cookie", format!("{name}={}", encode(value)).as_bytes())
        }
        KeySource::ClientIp { .. } => req.client_ip(value),
        KeySource::Path => req.line(":path", value.as_bytes()),
        KeySource::Method => req.line(":method", value.as_bytes()),
        KeySource::Authority => req.line(":authority", value.as_bytes()),
        KeySource::Literal(_) => {}
        // `request.path` and `request.url_path` are read from the path, as the filter reads them.
        KeySource::Property { .. } if tollgate_core::rule::reads_the_path(source).is_some() => {
            req.line(":path", value.as_bytes())
        }
        // So are `request.method` and the other `request.headers.<name>`: from the request line
        // and header lines, not from Envoy's attribute.
        KeySource::Property { .. } if tollgate_core::rule::reads_the_method(source) => {
            req.line(":method", value.as_bytes())
        }
        KeySource::Property { path, .. } => match tollgate_core::rule::request_header(path) {
            Some(name) => req.line(&name, value.as_bytes()),
            None => req.property(&path.join("."), value),
        },
        KeySource::Metadata { namespace, fields } => {
            // The value as a string at the field's path: its key text is the value itself, as it
            // is for a number or a boolean the filter reads (`42`, `true`).
            let mut node = serde_json::Value::String(value.to_string());
            for field in fields.iter().rev() {
                let mut m = serde_json::Map::new();
                m.insert(field.clone(), node);
                node = serde_json::Value::Object(m);
            }
            if let serde_json::Value::Object(m) = node {
                req.metadata(metadata::encode(&[(namespace.clone(), m)]));
            }
        }
    }
    req
}

/// Percent-encodes every byte but the unreserved ones.
fn encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use tollgate_core::rule::{applies, KeyCache};

    use super::*;

    #[test]
    fn a_path_is_the_filters_bucket_however_it_is_spelled() {
        let config = Config::parse(
            br#"{"rules":[{"name":"ci","rate":5,"key":["path","property:request.path"],
                "match":{"path_prefix":"/api/","path_ignore_case":true},
                "overrides":[{"key":["/api/health","/api/health"],"unlimited":true}]}]}"#,
            tollgate_core::config::Artifact::Envoy,
        )
        .unwrap();
        let key = |p: &str| target(&config, "ci", &[p.to_string(), p.to_string()]).unwrap();
        let mut filter = Described::default();
        filter.line(":path", b"/api/x");
        let rule = config.rules.first().unwrap();
        let applied = applies("tg", (0, rule), &filter, &mut KeyCache::default()).unwrap();
        for p in ["/api/x", "/API/x", "/api//X"] {
            assert_eq!(
                key(p).key,
                applied
                    .key
                    .replacen("tg:", &format!("{}:", config.key_prefix), 1),
                "{p}"
            );
        }
        assert!(key("/API/Health").unlimited);
    }

    /// The filter's bucket of `req` for the one rule of `config`.
    fn filters_key(config: &Config, req: &Described) -> String {
        let rule = config.rules.first().unwrap();
        let applied = applies("tg", (0, rule), req, &mut KeyCache::default()).unwrap();
        applied
            .key
            .replacen("tg:", &format!("{}:", config.key_prefix), 1)
    }

    /// `--bucket` names the bucket `explain` printed, the ambiguous one too; nothing else.
    #[test]
    fn a_bucket_key_names_its_rules_bucket() {
        let config = Config::parse(
            br#"{"key_prefix":"tg","rules":[{"name":"r","rate":5,"burst":7,"key":["header:x-user"]}]}"#,
            tollgate_core::config::Artifact::Envoy,
        )
        .unwrap();
        let mut twice = Described::default();
        twice.line(":path", b"/");
        twice.line("x-user", b"a");
        twice.line("x-user", b"b");
        let ambiguous = filters_key(&config, &twice);
        let t = by_key(&config, &ambiguous).unwrap();
        assert_eq!(
            (t.rule.name.as_str(), t.key.as_str()),
            ("r", ambiguous.as_str())
        );
        assert_eq!(t.limits.burst, 7);
        let alice = target(&config, "r", &["alice".to_string()]).unwrap().key;
        // An override's bucket, under its limits.
        let gold = Config::parse(
            br#"{"key_prefix":"tg","rules":[{"name":"r","rate":5,"burst":7,"key":["header:x-user"],
                "overrides":[{"key":["gold"],"rate":50,"burst":1000}]}]}"#,
            tollgate_core::config::Artifact::Envoy,
        )
        .unwrap();
        let gold_key = target(&gold, "r", &["gold".to_string()]).unwrap();
        let named = by_key(&gold, &gold_key.key).unwrap();
        assert_eq!(
            (named.limits.burst, named.values),
            (1000, vec![b"gold".to_vec()])
        );
        assert_eq!(by_key(&gold, &alice).unwrap().limits.burst, 7);
        assert_eq!(by_key(&config, &alice).unwrap().key, alice);
        for wrong in [
            alice.replacen("tg:", "tollgate:", 1),
            alice.replacen("{r:", "{s:", 1),
            alice.replacen('}', "0}", 1),
            alice.to_uppercase().replacen("TG:{R:", "tg:{r:", 1),
            "tg:{r}".to_string(),
        ] {
            assert!(
                matches!(by_key(&config, &wrong), Err(TargetError::NotABucket { .. })),
                "{wrong}"
            );
        }
    }

    /// A value is named as `explain` prints it (the value the filter reads: a cookie's or a query
    /// parameter's decoded), and names the bucket the filter keys that request on.
    #[test]
    fn a_value_names_the_filters_bucket_whatever_the_source() {
        let cases: [(&str, &str, &[u8], &str); 5] = [
            ("cookie:sid", "cookie", b"sid=AbC%2Bd%2F%3D%3D", "AbC+d/=="),
            ("cookie:sid", "cookie", b"sid=\"a b\"", "a b"),
            (
                "query:email",
                ":path",
                b"/?email=alice%40example.com",
                "alice@example.com",
            ),
            (
                "property:request.headers.x-api-key",
                "x-api-key",
                b"k1",
                "k1",
            ),
            ("property:request.method", ":method", b"POST", "POST"),
        ];
        for (source, name, sent, value) in cases {
            let config = Config::parse(
                format!(r#"{{"rules":[{{"name":"r","rate":5,"key":["{source}"]}}]}}"#).as_bytes(),
                tollgate_core::config::Artifact::Envoy,
            )
            .unwrap();
            let mut req = Described::default();
            for (pseudo, v) in [(":path", "/"), (":method", "GET")] {
                if pseudo != name {
                    req.line(pseudo, v.as_bytes());
                }
            }
            req.line(name, sent);
            let named = target(&config, "r", &[value.to_string()]);
            assert_eq!(
                named.map(|t| t.key),
                Ok(filters_key(&config, &req)),
                "{source} = {value:?}"
            );
        }
    }
}

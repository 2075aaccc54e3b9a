//! An Envoy bootstrap as `check` reads it: the configuration of tollgate's Wasm filter, the
//! static clusters' names, and every `http_filters` list that holds tollgate, with the
//! `jwt_authn` filters in it (before tollgate or after, and the metadata fields their providers
//! write).
//!
//! Invariant: a filter is known by the type of its `typed_config` (what follows the type URL's
//! last `/`), given directly or wrapped in a TypedStruct (`udpa.type.v1` or `xds.type.v3`, the
//! message under `value`), as Envoy knows it; never by its name, which Envoy leaves free. A
//! field is found under either name Envoy accepts for it, the proto's (`http_filters`) or its
//! JSON name (`httpFilters`). The document is only read: any shape gives an answer or a message,
//! never a panic.

use serde_json::Value;

use crate::load::LoadError;

/// What `check` needs of a bootstrap besides the configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bootstrap {
    /// The static clusters, by name.
    pub clusters: Vec<String>,
    /// Each `http_filters` list that holds tollgate's Wasm filter.
    pub chains: Vec<Chain>,
}

/// An `http_filters` list that holds tollgate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chain {
    /// The name of the listener it is in, if it is in a named one.
    pub listener: Option<String>,
    /// Tollgate's filter is wrapped in an `ExtensionWithMatcher`: its matcher may skip it for
    /// some requests.
    pub matched: bool,
    /// Its `jwt_authn` filters, in order.
    pub jwt_authn: Vec<JwtAuthn>,
}

/// A `jwt_authn` filter of a chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JwtAuthn {
    /// It runs before tollgate's (first) Wasm filter, so its metadata is there for tollgate.
    pub before: bool,
    /// The fields of namespace `envoy.filters.http.jwt_authn` its providers write
    /// (`payload_in_metadata`, `header_in_metadata`, `failed_status_in_metadata`), sorted.
    pub fields: Vec<String>,
}

/// The type of Envoy's Wasm HTTP filter.
const WASM: &str = "envoy.extensions.filters.http.wasm.v3.Wasm";
/// The type of Envoy's JWT authentication filter.
const JWT_AUTHN: &str = "envoy.extensions.filters.http.jwt_authn.v3.JwtAuthentication";
/// The wrapper that gives an HTTP filter a matcher (which may skip it for some requests):
/// `extension_config` holds the filter as an `http_filters` entry does (`name`, `typed_config`).
const EXTENSION_WITH_MATCHER: &str = "envoy.extensions.common.matching.v3.ExtensionWithMatcher";
/// The wrappers that carry a message as JSON: `type_url` names it, `value` holds it.
const TYPED_STRUCTS: [&str; 2] = ["udpa.type.v1.TypedStruct", "xds.type.v3.TypedStruct"];
/// The fields of a `jwt_authn` provider that name where in its metadata namespace it writes.
const METADATA_FIELDS: [&str; 3] = [
    "payload_in_metadata",
    "header_in_metadata",
    "failed_status_in_metadata",
];

/// The configuration of tollgate's Wasm filter in `doc` (a bootstrap: it has `static_resources`)
/// and what else `check` reads of it.
pub fn read(doc: &Value) -> Result<(Vec<u8>, Bootstrap), LoadError> {
    let (json, ours) = configuration(doc)?;
    let clusters = field(doc, "static_resources")
        .and_then(|r| r.get("clusters"))
        .and_then(Value::as_array)
        .map(|clusters| {
            clusters
                .iter()
                .filter_map(|c| c.get("name")?.as_str())
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    let mut chains = Vec::new();
    find_chains(doc, None, &ours, &mut chains);
    Ok((json, Bootstrap { clusters, chains }))
}

/// The type name and the message of an `Any` in its JSON form (`@type` and the message's fields),
/// a TypedStruct unwrapped.
fn typed(any: &Value) -> Option<(&str, &Value)> {
    let name = type_name(any.get("@type")?.as_str()?);
    if TYPED_STRUCTS.contains(&name) {
        let inner = type_name(field(any, "type_url")?.as_str()?);
        return Some((inner, any.get("value")?));
    }
    Some((name, any))
}

/// What follows a type URL's last `/` (`type.googleapis.com/a.B` -> `a.B`), as Envoy reads it.
fn type_name(url: &str) -> &str {
    url.rsplit_once('/').map_or(url, |(_, name)| name)
}

/// Field `name` (the proto's name, snake_case) of message `v`, under that name or its JSON name
/// (lowerCamelCase: `static_resources` is also `staticResources`), both of which Envoy reads.
pub fn field<'v>(v: &'v Value, name: &str) -> Option<&'v Value> {
    v.get(name).or_else(|| {
        if name.contains('_') {
            v.get(json_name(name).as_str())
        } else {
            None
        }
    })
}

/// The JSON name of proto field `name`: each `_` dropped and the letter after it upper-cased.
fn json_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut upper = false;
    for c in name.chars() {
        match c {
            '_' => upper = true,
            c if upper => {
                out.push(c.to_ascii_uppercase());
                upper = false;
            }
            c => out.push(c),
        }
    }
    out
}

/// The string the `configuration` of tollgate's Wasm filter holds (of those whose `root_id` is
/// `tollgate`, if the bootstrap has several Wasm filters, or a Wasm filter delivered by ECDS
/// besides one static filter; it must be the same wherever the filter is, one per listener say),
/// and the `config` of each of tollgate's Wasm filters.
fn configuration(doc: &Value) -> Result<(Vec<u8>, Vec<&Value>), LoadError> {
    let mut filters = Vec::new();
    wasm_filters(doc, &mut filters);
    // A filter that comes by ECDS is not in the bootstrap: the one static Wasm filter may be
    // another plugin's.
    let discovered = discovers_wasm(doc);
    let ours: Vec<&Value> = match filters.as_slice() {
        [_] if !discovered => filters.clone(),
        _ => filters
            .iter()
            .copied()
            .filter(|c| field(c, "root_id").and_then(Value::as_str) == Some("tollgate"))
            .collect(),
    };
    let mut configurations: Vec<Option<&str>> = ours
        .iter()
        .map(|c| c.get("configuration")?.get("value")?.as_str())
        .collect();
    configurations.sort_unstable();
    configurations.dedup();
    if filters.is_empty() && discovered {
        return Err(LoadError::NotAConfiguration(
            "the Envoy bootstrap's Wasm filter comes by ECDS (an http_filters entry's \
             config_discovery), so the bootstrap does not hold its configuration: give the \
             filter's configuration as JSON"
                .to_string(),
        ));
    }
    if filters.is_empty() {
        return Err(LoadError::NotAConfiguration(format!(
            "the Envoy bootstrap has no Wasm HTTP filter (a typed_config of type {WASM}, or a \
             TypedStruct whose type_url names it): give the filter's configuration as JSON"
        )));
    }
    let unsure = |why: String| {
        let by_ecds = if discovered {
            " and a Wasm filter delivered by ECDS (config_discovery)"
        } else {
            ""
        };
        LoadError::NotAConfiguration(format!(
            "an Envoy bootstrap with {} static Wasm filter{}{by_ecds}, {why}: give the filter's \
             configuration as JSON",
            filters.len(),
            if filters.len() == 1 { "" } else { "s" },
        ))
    };
    match configurations.as_slice() {
        [Some(value)] => Ok((value.as_bytes().to_vec(), ours)),
        [None] => Err(LoadError::NotAConfiguration(
            "the Envoy bootstrap's Wasm filter has no configuration.value string".to_string(),
        )),
        [] => Err(unsure("none with root_id \"tollgate\"".to_string())),
        several => Err(unsure(format!(
            "{} different configurations among those with root_id \"tollgate\"",
            several.len()
        ))),
    }
}

/// Whether an `http_filters` entry under `v` gets a Wasm filter by ECDS: its `config_discovery`
/// lists the Wasm filter's type among its `type_urls`.
fn discovers_wasm(v: &Value) -> bool {
    match v {
        Value::Object(map) => {
            let wasm_url = |u: &Value| u.as_str().map(type_name) == Some(WASM);
            let here = field(v, "config_discovery")
                .and_then(|d| field(d, "type_urls"))
                .and_then(Value::as_array)
                .is_some_and(|urls| urls.iter().any(wasm_url));
            here || map.values().any(discovers_wasm)
        }
        Value::Array(items) => items.iter().any(discovers_wasm),
        _ => false,
    }
}

/// Every Wasm HTTP filter's `config` (its plugin configuration) under `v`.
fn wasm_filters<'v>(v: &'v Value, out: &mut Vec<&'v Value>) {
    match v {
        Value::Object(map) => {
            if let Some((WASM, wasm)) = typed(v) {
                if let Some(config) = wasm.get("config") {
                    out.push(config);
                }
                return;
            }
            map.values().for_each(|v| wasm_filters(v, out));
        }
        Value::Array(items) => items.iter().for_each(|v| wasm_filters(v, out)),
        _ => {}
    }
}

/// Each `http_filters` list under `v` that holds one of `ours` (tollgate's Wasm filters' configs),
/// with the name of the listener it is in.
fn find_chains(v: &Value, listener: Option<&str>, ours: &[&Value], out: &mut Vec<Chain>) {
    match v {
        Value::Object(map) => {
            if let Some(Value::Array(filters)) = field(v, "http_filters") {
                if let Some(chain) = chain(filters, listener, ours) {
                    out.push(chain);
                }
            }
            for (key, v) in map {
                match (key.as_str(), v) {
                    ("listeners", Value::Array(listeners)) => {
                        for l in listeners {
                            let name = l.get("name").and_then(Value::as_str);
                            find_chains(l, name.or(listener), ours, out);
                        }
                    }
                    _ => find_chains(v, listener, ours, out),
                }
            }
        }
        Value::Array(items) => items
            .iter()
            .for_each(|v| find_chains(v, listener, ours, out)),
        _ => {}
    }
}

/// `filters` (an `http_filters` list) as a chain, if it holds one of `ours`.
fn chain(filters: &[Value], listener: Option<&str>, ours: &[&Value]) -> Option<Chain> {
    let is_ours = |f: &Value| match message(f) {
        Some((WASM, wasm)) => wasm
            .get("config")
            .is_some_and(|c| ours.iter().any(|o| std::ptr::eq(*o, c))),
        _ => false,
    };
    let tollgate = filters.iter().position(is_ours)?;
    let jwt_authn = filters
        .iter()
        .enumerate()
        .filter_map(|(at, f)| match message(f) {
            Some((JWT_AUTHN, jwt)) => Some(JwtAuthn {
                before: at < tollgate,
                fields: written(jwt),
            }),
            _ => None,
        })
        .collect();
    let matched = filters
        .get(tollgate)
        .and_then(|f| typed(field(f, "typed_config")?))
        .is_some_and(|(name, _)| name == EXTENSION_WITH_MATCHER);
    Some(Chain {
        listener: listener.map(str::to_string),
        matched,
        jwt_authn,
    })
}

/// The type name and message of an `http_filters` entry's `typed_config`; of the filter it
/// wraps, for an `ExtensionWithMatcher`.
fn message(filter: &Value) -> Option<(&str, &Value)> {
    match typed(field(filter, "typed_config")?)? {
        (EXTENSION_WITH_MATCHER, wrapper) => message(field(wrapper, "extension_config")?),
        other => Some(other),
    }
}

/// The metadata fields the providers of a `jwt_authn` configuration write, sorted, once each.
fn written(jwt: &Value) -> Vec<String> {
    let mut fields: Vec<String> = jwt
        .get("providers")
        .and_then(Value::as_object)
        .into_iter()
        .flat_map(|providers| providers.values())
        .flat_map(|p| METADATA_FIELDS.iter().filter_map(|f| field(p, f)?.as_str()))
        .filter(|f| !f.is_empty())
        .map(str::to_string)
        .collect();
    fields.sort_unstable();
    fields.dedup();
    fields
}

#[cfg(test)]
mod tests {
    use super::*;

    fn yaml(text: &str) -> Value {
        serde_saphyr::from_str(text).unwrap()
    }

    #[test]
    fn typed_unwraps_both_typed_structs_and_reads_the_name_after_the_last_slash() {
        for wrapper in TYPED_STRUCTS {
            let any = yaml(&format!(
                "{{'@type': type.googleapis.com/{wrapper}, type_url: x/{WASM}, value: {{a: 1}}}}"
            ));
            assert_eq!(typed(&any), Some((WASM, &yaml("{a: 1}"))));
        }
        let direct = yaml(&format!("{{'@type': example.com/a/{WASM}, config: {{}}}}"));
        assert_eq!(typed(&direct).map(|t| t.0), Some(WASM));
        for no in [
            "{config: {}}",
            "{'@type': 1}",
            "{'@type': udpa.type.v1.TypedStruct, value: {}}",
            "{'@type': udpa.type.v1.TypedStruct, type_url: x}",
            "[]",
        ] {
            assert_eq!(typed(&yaml(no)), None, "{no}");
        }
    }

    #[test]
    fn written_reads_every_providers_metadata_fields_and_nothing_else() {
        let jwt = yaml(
            "providers:
  a: {payload_in_metadata: payload, header_in_metadata: header}
  b: {payload_in_metadata: payload, failed_status_in_metadata: ''}
  c: {issuer: x}
  d: 7",
        );
        assert_eq!(written(&jwt), ["header", "payload"]);
        for none in [
            "{}",
            "providers: []",
            "providers: {a: {payload_in_metadata: 1}}",
        ] {
            assert!(written(&yaml(none)).is_empty(), "{none}");
        }
    }

    #[test]
    fn chains_hold_tollgate_name_their_listener_and_place_jwt_authn_around_it() {
        let doc = yaml(&format!(
            "static_resources:
  listeners:
  - name: a
    filter_chains:
    - filters:
      - typed_config:
          http_filters:
          - typed_config: {{'@type': x/{WASM}, config: {{root_id: other}}}}
          - typed_config: {{'@type': x/{JWT_AUTHN}, providers: {{p: {{payload_in_metadata: payload}}}}}}
          - typed_config: {{'@type': x/{WASM}, config: {{root_id: tollgate, configuration: {{value: c}}}}}}
          - typed_config:
              '@type': xds.type.v3.TypedStruct
              type_url: {JWT_AUTHN}
              value: {{providers: {{q: {{header_in_metadata: header}}}}}}
  - filter_chains:
    - filters:
      - typed_config:
          http_filters:
          - typed_config:
              '@type': udpa.type.v1.TypedStruct
              type_url: {WASM}
              value: {{config: {{root_id: tollgate, configuration: {{value: c}}}}}}
  - name: no-tollgate
    http_filters:
    - typed_config: {{'@type': x/{WASM}, config: {{root_id: other}}}}
"
        ));
        let (json, bootstrap) = read(&doc).unwrap();
        assert_eq!(json, b"c");
        assert_eq!(
            bootstrap.chains,
            [
                Chain {
                    listener: Some("a".to_string()),
                    matched: false,
                    jwt_authn: vec![
                        JwtAuthn {
                            before: true,
                            fields: vec!["payload".to_string()]
                        },
                        JwtAuthn {
                            before: false,
                            fields: vec!["header".to_string()]
                        },
                    ],
                },
                Chain {
                    listener: None,
                    matched: false,
                    jwt_authn: vec![]
                },
            ]
        );
    }
}

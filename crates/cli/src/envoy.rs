//! An Envoy bootstrap as `check` reads it: the configuration of tollgate's Wasm filter and the
//! static clusters' names.
//!
//! Invariant: a filter is known by the type of its `typed_config` (what follows the type URL's
//! last `/`), given directly or wrapped in a TypedStruct (`udpa.type.v1` or `xds.type.v3`, the
//! message under `value`), as Envoy knows it; never by its name, which Envoy leaves free. The
//! document is only read: any shape gives an answer or a message, never a panic.

use serde_json::Value;

use crate::load::LoadError;

/// What `check` needs of a bootstrap besides the configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bootstrap {
    /// The static clusters, by name.
    pub clusters: Vec<String>,
}

/// The type of Envoy's Wasm HTTP filter.
const WASM: &str = "envoy.extensions.filters.http.wasm.v3.Wasm";
/// The wrappers that carry a message as JSON: `type_url` names it, `value` holds it.
const TYPED_STRUCTS: [&str; 2] = ["udpa.type.v1.TypedStruct", "xds.type.v3.TypedStruct"];

/// The configuration of tollgate's Wasm filter in `doc` (a bootstrap: it has `static_resources`)
/// and what else `check` reads of it.
pub fn read(doc: &Value) -> Result<(Vec<u8>, Bootstrap), LoadError> {
    let json = configuration(doc)?;
    let clusters = doc
        .get("static_resources")
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
    Ok((json, Bootstrap { clusters }))
}

/// The type name and the message of an `Any` in its JSON form (`@type` and the message's fields),
/// a TypedStruct unwrapped.
fn typed(any: &Value) -> Option<(&str, &Value)> {
    let name = type_name(any.get("@type")?.as_str()?);
    if TYPED_STRUCTS.contains(&name) {
        let inner = type_name(any.get("type_url")?.as_str()?);
        return Some((inner, any.get("value")?));
    }
    Some((name, any))
}

/// What follows a type URL's last `/` (`type.googleapis.com/a.B` -> `a.B`), as Envoy reads it.
fn type_name(url: &str) -> &str {
    url.rsplit_once('/').map_or(url, |(_, name)| name)
}

/// The string the `configuration` of tollgate's Wasm filter holds (of those whose `root_id` is
/// `tollgate`, if the bootstrap has several Wasm filters; it must be the same wherever the filter
/// is, one per listener say).
fn configuration(doc: &Value) -> Result<Vec<u8>, LoadError> {
    let mut filters = Vec::new();
    wasm_filters(doc, &mut filters);
    let ours: Vec<&Value> = match filters.as_slice() {
        [_] => filters.clone(),
        _ => filters
            .iter()
            .copied()
            .filter(|c| c.get("root_id").and_then(Value::as_str) == Some("tollgate"))
            .collect(),
    };
    let mut configurations: Vec<Option<&str>> = ours
        .iter()
        .map(|c| c.get("configuration")?.get("value")?.as_str())
        .collect();
    configurations.sort_unstable();
    configurations.dedup();
    if filters.is_empty() {
        return Err(LoadError::NotAConfiguration(format!(
            "the Envoy bootstrap has no Wasm HTTP filter (a typed_config of type {WASM}, or a \
             TypedStruct whose type_url names it): give the filter's configuration as JSON"
        )));
    }
    let unsure = |why: String| {
        LoadError::NotAConfiguration(format!(
            "an Envoy bootstrap with {} Wasm filters, {why}: give the filter's configuration as \
             JSON",
            filters.len()
        ))
    };
    match configurations.as_slice() {
        [Some(value)] => Ok(value.as_bytes().to_vec()),
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
}

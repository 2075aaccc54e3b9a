//! A configuration file as the proxy would get it: JSON (the filter's `configuration`), or the
//! tollgate configuration inside a manifest (an Istio WasmPlugin's or TrafficExtension's
//! `pluginConfig`, a Higress WasmPlugin's `defaultConfig`) or inside an Envoy bootstrap (its Wasm
//! filter's `configuration`).
//!
//! Invariant: the configuration is parsed by `Config::parse`, the filter's own code, for the
//! artifact that would load it (a Higress manifest: tollgate-higress.wasm), so every message is
//! the filter's; nothing here validates anything itself.

use std::fmt;
use std::path::Path;

use tollgate_core::config::{Artifact, Config, ConfigError};

/// Where the configuration came from in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    Json,
    IstioWasmPlugin,
    IstioTrafficExtension,
    HigressWasmPlugin,
    EnvoyBootstrap,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Origin::Json => "JSON configuration",
            Origin::IstioWasmPlugin => "Istio WasmPlugin, spec.pluginConfig",
            Origin::IstioTrafficExtension => "Istio TrafficExtension, spec.wasm.pluginConfig",
            Origin::HigressWasmPlugin => "Higress WasmPlugin, spec.defaultConfig",
            Origin::EnvoyBootstrap => "Envoy bootstrap, the Wasm filter's configuration",
        })
    }
}

/// A configuration the filter accepted.
pub struct Loaded {
    pub config: Config,
    pub artifact: Artifact,
    pub origin: Origin,
    /// An Envoy bootstrap's static clusters, by name (None: not a bootstrap).
    pub static_clusters: Option<Vec<String>>,
}

/// Why a file gives no configuration.
#[derive(Debug)]
pub enum LoadError {
    /// The file cannot be read.
    Read(String),
    /// Not JSON, and not a manifest that holds a tollgate configuration.
    NotAConfiguration(String),
    /// The filter refuses it: its own message.
    Refused(ConfigError),
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadError::Read(e) => write!(f, "cannot read the configuration: {e}"),
            LoadError::NotAConfiguration(e) => write!(f, "not a tollgate configuration: {e}"),
            // What the filter logs when on_configure refuses it.
            LoadError::Refused(e) => write!(f, "bad configuration: {e}"),
        }
    }
}

/// The configuration in `path`; `artifact` overrides the one the file implies.
pub fn load(path: &Path, artifact: Option<Artifact>) -> Result<Loaded, LoadError> {
    let bytes =
        std::fs::read(path).map_err(|e| LoadError::Read(format!("{}: {e}", path.display())))?;
    let (json, origin, static_clusters) = extract(&bytes)?;
    let artifact = artifact.unwrap_or(match origin {
        Origin::HigressWasmPlugin => Artifact::Higress,
        _ => Artifact::Envoy,
    });
    let config = Config::parse(&json, artifact).map_err(LoadError::Refused)?;
    Ok(Loaded {
        config,
        artifact,
        origin,
        static_clusters,
    })
}

/// What a file holds: the configuration's JSON bytes, where it was, and an Envoy bootstrap's
/// static clusters (None: not a bootstrap).
type Extracted = (Vec<u8>, Origin, Option<Vec<String>>);

/// The configuration's JSON bytes in `bytes`, and where it was. A file whose first non-blank
/// character is `{` is JSON and goes to the filter as it is (its messages about bad JSON are the
/// filter's); anything else is read as a YAML manifest.
pub fn extract(bytes: &[u8]) -> Result<Extracted, LoadError> {
    let first = bytes.iter().find(|b| !b.is_ascii_whitespace());
    if first == Some(&b'{') {
        // An Envoy bootstrap in JSON; anything else goes to the filter as it is.
        if let Ok(doc) = serde_json::from_slice::<serde_json::Value>(bytes) {
            if doc.get("static_resources").is_some() {
                return bootstrap(&doc);
            }
        }
        return Ok((bytes.to_vec(), Origin::Json, None));
    }
    let text = std::str::from_utf8(bytes)
        .map_err(|e| LoadError::NotAConfiguration(format!("not UTF-8: {e}")))?;
    let doc: serde_json::Value = serde_saphyr::from_str(text).map_err(|e| {
        LoadError::NotAConfiguration(format!("neither JSON nor a YAML manifest: {e}"))
    })?;
    if doc.get("static_resources").is_some() {
        return bootstrap(&doc);
    }
    let kind = doc.get("kind").and_then(|k| k.as_str()).unwrap_or_default();
    let api = doc
        .get("apiVersion")
        .and_then(|k| k.as_str())
        .unwrap_or_default();
    let spec = doc.get("spec");
    let (config, origin) = match (kind, api.split('/').next().unwrap_or_default()) {
        ("WasmPlugin", "extensions.istio.io") => (
            spec.and_then(|s| s.get("pluginConfig")),
            Origin::IstioWasmPlugin,
        ),
        ("TrafficExtension", "extensions.istio.io") => (
            spec.and_then(|s| s.get("wasm"))
                .and_then(|w| w.get("pluginConfig")),
            Origin::IstioTrafficExtension,
        ),
        ("WasmPlugin", "extensions.higress.io") => (
            spec.and_then(|s| s.get("defaultConfig")),
            Origin::HigressWasmPlugin,
        ),
        _ => {
            return Err(LoadError::NotAConfiguration(format!(
                "a YAML document of kind {kind:?} ({api:?}): expected an Istio WasmPlugin or \
                 TrafficExtension (extensions.istio.io), a Higress WasmPlugin \
                 (extensions.higress.io) or an Envoy bootstrap (static_resources)"
            )))
        }
    };
    let Some(config) = config else {
        let field = match origin {
            Origin::IstioTrafficExtension => "spec.wasm.pluginConfig",
            Origin::HigressWasmPlugin => "spec.defaultConfig",
            _ => "spec.pluginConfig",
        };
        return Err(LoadError::NotAConfiguration(format!(
            "the {kind} has no {field}"
        )));
    };
    let json = serde_json::to_vec(config)
        .map_err(|e| LoadError::NotAConfiguration(format!("cannot re-encode as JSON: {e}")))?;
    Ok((json, origin, None))
}

/// An Envoy bootstrap's tollgate configuration and its static clusters' names.
fn bootstrap(doc: &serde_json::Value) -> Result<Extracted, LoadError> {
    let json = bootstrap_configuration(doc)?;
    let clusters = doc
        .get("static_resources")
        .and_then(|r| r.get("clusters"))
        .and_then(|c| c.as_array())
        .map(|clusters| {
            clusters
                .iter()
                .filter_map(|c| c.get("name")?.as_str())
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    Ok((json, Origin::EnvoyBootstrap, Some(clusters)))
}

/// The `@type` of Envoy's Wasm HTTP filter.
const WASM_FILTER: &str = "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm";

/// The configuration of the Wasm HTTP filter of an Envoy bootstrap (of those whose `root_id` is
/// `tollgate`, if it has several): the string its `configuration` holds, which must be the same
/// wherever the filter is (one per listener, say).
fn bootstrap_configuration(doc: &serde_json::Value) -> Result<Vec<u8>, LoadError> {
    let mut filters = Vec::new();
    wasm_filters(doc, &mut filters);
    let ours: Vec<&serde_json::Value> = match filters.as_slice() {
        [_] => filters.clone(),
        _ => filters
            .iter()
            .copied()
            .filter(|c| c.get("root_id").and_then(|r| r.as_str()) == Some("tollgate"))
            .collect(),
    };
    let mut configurations: Vec<Option<&str>> = ours
        .iter()
        .map(|c| c.get("configuration")?.get("value")?.as_str())
        .collect();
    configurations.sort_unstable();
    configurations.dedup();
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

/// Every Wasm HTTP filter's `config` under `v`.
fn wasm_filters<'v>(v: &'v serde_json::Value, out: &mut Vec<&'v serde_json::Value>) {
    match v {
        serde_json::Value::Object(map) => {
            if map.get("@type").and_then(|t| t.as_str()) == Some(WASM_FILTER) {
                if let Some(config) = map.get("config") {
                    out.push(config);
                }
                return;
            }
            map.values().for_each(|v| wasm_filters(v, out));
        }
        serde_json::Value::Array(items) => items.iter().for_each(|v| wasm_filters(v, out)),
        _ => {}
    }
}

//! A configuration file as the proxy would get it: JSON (the filter's `configuration`), or the
//! tollgate configuration inside a manifest (an Istio WasmPlugin's or TrafficExtension's
//! `pluginConfig`, a Higress WasmPlugin's `defaultConfig`) or inside an Envoy bootstrap (its Wasm
//! filter's `configuration`, read by `envoy`).
//!
//! Invariant: the configuration is parsed by `Config::parse`, the filter's own code, for the
//! artifact that would load it (a Higress manifest: tollgate-higress.wasm), so every message is
//! the filter's; nothing here validates anything itself.

use std::fmt;
use std::path::Path;

use tollgate_core::config::{Artifact, Config, ConfigError};

use crate::envoy::Bootstrap;

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
    /// What `check` reads of an Envoy bootstrap around the filter (None: not a bootstrap).
    pub bootstrap: Option<Bootstrap>,
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
    let (json, origin, bootstrap) = extract(&bytes)?;
    let artifact = artifact.unwrap_or(match origin {
        Origin::HigressWasmPlugin => Artifact::Higress,
        _ => Artifact::Envoy,
    });
    let config = Config::parse(&json, artifact).map_err(LoadError::Refused)?;
    Ok(Loaded {
        config,
        artifact,
        origin,
        bootstrap,
    })
}

/// What a file holds: the configuration's JSON bytes, where it was, and what `check` reads of an
/// Envoy bootstrap (None: not a bootstrap).
type Extracted = (Vec<u8>, Origin, Option<Bootstrap>);

/// The configuration's JSON bytes in `bytes`, and where it was. A file whose first non-blank
/// character is `{` is JSON and goes to the filter as it is (its messages about bad JSON are the
/// filter's); anything else is read as a YAML manifest.
pub fn extract(bytes: &[u8]) -> Result<Extracted, LoadError> {
    let first = bytes.iter().find(|b| !b.is_ascii_whitespace());
    if first == Some(&b'{') {
        // An Envoy bootstrap in JSON; anything else goes to the filter as it is.
        if let Ok(doc) = serde_json::from_slice::<serde_json::Value>(bytes) {
            if crate::envoy::field(&doc, "static_resources").is_some() {
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
    if crate::envoy::field(&doc, "static_resources").is_some() {
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

/// An Envoy bootstrap's tollgate configuration, and what else `check` reads of it.
fn bootstrap(doc: &serde_json::Value) -> Result<Extracted, LoadError> {
    let (json, bootstrap) = crate::envoy::read(doc)?;
    Ok((json, Origin::EnvoyBootstrap, Some(bootstrap)))
}

//! The artifact a configuration is for, and what a configuration written for another looks like.
//!
//! Invariant: a configuration is read only by the artifact it can run on. Before anything else is
//! read, the other artifact's `backend` fields are refused with a message that names the artifact
//! to use, and Higress' per-route `matchRules` (`_rules_`) with one that says how to select
//! requests instead; so the compile step never sees a field its artifact cannot reach.

use serde_json::Value;

use super::error::{err, join, ConfigError};

/// Which artifact the configuration is for: it decides how script calls travel, and the other
/// artifact's `backend` fields are refused with a message that names the artifact to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Artifact {
    /// tollgate.wasm, for stock Envoy and Istio: HTTP callouts to Webdis.
    #[default]
    Envoy,
    /// tollgate-higress.wasm: Higress' Redis callouts, straight to Redis.
    Higress,
}

/// How script calls travel to Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// HTTP callouts to a Webdis front (`backend.authority`, `backend.basic_auth`).
    Webdis,
    /// RESP through Higress' Redis callouts (`backend.username`, `password`, `database`).
    Resp,
}

impl Artifact {
    /// How this artifact's script calls travel.
    pub fn protocol(self) -> Protocol {
        match self {
            Artifact::Envoy => Protocol::Webdis,
            Artifact::Higress => Protocol::Resp,
        }
    }
}

/// `backend` fields only Higress' Redis callouts use.
const RESP_ONLY: &[&str] = &[
    "service_name",
    "service_port",
    "username",
    "password",
    "database",
];
/// `backend` fields only the HTTP callouts to Webdis use.
const WEBDIS_ONLY: &[&str] = &["authority", "basic_auth"];

/// Higress turns a WasmPlugin's `matchRules` into this field of the configuration.
const HIGRESS_MATCH_RULES: &str = "_rules_";

/// Refuses what in `document` is for another artifact or host shape.
pub fn refuse_foreign(document: &Value, artifact: Artifact) -> Result<(), ConfigError> {
    if document.get(HIGRESS_MATCH_RULES).is_some() {
        return Err(err(
            HIGRESS_MATCH_RULES,
            "per-route matchRules are not supported: give the plugin config as defaultConfig and \
             select requests with each rule's match",
        ));
    }
    let (foreign, reason) = match artifact {
        Artifact::Envoy => (
            RESP_ONLY,
            "only in the Higress build (tollgate-higress.wasm, Redis callouts); this build \
             reaches Redis through Webdis",
        ),
        Artifact::Higress => (
            WEBDIS_ONLY,
            "only in tollgate.wasm (the HTTP build, Webdis); this Higress build calls Redis \
             directly",
        ),
    };
    let backend = document.get("backend").and_then(Value::as_object);
    match backend.and_then(|b| foreign.iter().find(|name| b.contains_key(**name))) {
        Some(name) => Err(err(join("backend", name), reason)),
        None => Ok(()),
    }
}

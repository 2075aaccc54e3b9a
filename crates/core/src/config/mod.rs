//! Plugin configuration: JSON bytes -> validated, typed `Config`.
//!
//! Invariant: a `Config` that exists is valid — every rule has positive limits that fit the Lua
//! script's exact integer range, names are unique and safe to put in a Redis key, a header name or a
//! metric name. Any other input is a `ConfigError` naming the field and the reason, in one line.
//!
//! Two steps. `document` is the JSON as written, derived by serde: unknown fields are refused at
//! every level, fixed defaults filled in, each integer within its bounds (`Int`), read by `de`
//! so that errors name their path in the reference's words. `compile` turns it into the validated
//! types of `model` for one artifact (`artifact` has refused what is for the other):
//! cross-field rules, the normal forms of `match` (`matcher`) and the key-source grammar and overrides (`keys`), and
//! `tiers` (which sources may pick limits). Every bound is
//! defined once (`bounds`, and the script's own in `bucket`); limits are `Quota`s.

mod artifact;
mod bounds;
mod compile;
mod de;
mod document;
mod error;
mod int;
mod keys;
mod matcher;
mod model;
mod outcome;
mod quota;
#[cfg(test)]
mod tests;
mod tiers;

pub use artifact::{Artifact, Protocol};
pub use bounds::*;
pub use document::schema;
pub use error::ConfigError;
pub use int::Int;
pub use model::*;
pub use outcome::StatusSet;
pub use quota::{CapacityError, NotAQuota, PeriodMs, Quota, Tokens};

use error::{err, DOCUMENT};

impl TryFrom<&[u8]> for Config {
    type Error = ConfigError;

    /// The configuration for tollgate.wasm (stock Envoy and Istio).
    fn try_from(bytes: &[u8]) -> Result<Self, Self::Error> {
        Config::parse(bytes, Artifact::Envoy)
    }
}

impl Config {
    /// The configuration `bytes` for `artifact`, validated.
    pub fn parse(bytes: &[u8], artifact: Artifact) -> Result<Config, ConfigError> {
        let text = std::str::from_utf8(bytes).map_err(|e| {
            err(
                DOCUMENT,
                format!("not valid UTF-8 (at byte {})", e.valid_up_to()),
            )
        })?;
        if text.trim().is_empty() {
            return Err(err(DOCUMENT, "empty"));
        }
        let value: serde_json::Value =
            serde_json::from_str(text).map_err(|e| err(DOCUMENT, format!("invalid JSON: {e}")))?;
        if !value.is_object() {
            return Err(err(DOCUMENT, "must be a JSON object"));
        }
        artifact::refuse_foreign(&value, artifact)?;
        compile::compile(de::read(&value)?, artifact)
    }
}

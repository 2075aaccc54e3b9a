//! What `check` says about an Envoy bootstrap around the filter: a backend cluster it lacks, a
//! matcher that may skip the filter, and a rule keyed on what `jwt_authn` verified when no
//! `jwt_authn` before tollgate writes the field the key reads (no `jwt_authn` in tollgate's
//! `http_filters`, one only after tollgate, or none whose providers write it).
//!
//! Invariant: these are warnings, one line each that says what to change; none refuses the
//! configuration (the filter loads it all the same, and Envoy may get the rest by xDS).

use tollgate_core::config::{Config, KeySource};

use crate::envoy::{Bootstrap, Chain};

/// The dynamic metadata namespace `jwt_authn` writes (Envoy's jwt_authn filter names it itself,
/// whatever the filter is called in `http_filters`).
const JWT_NAMESPACE: &str = "envoy.filters.http.jwt_authn";

/// The warnings about `bootstrap` for `config`, in the order of its rules.
pub fn warnings(config: &Config, bootstrap: &Bootstrap) -> Vec<String> {
    let mut out = Vec::new();
    let cluster = &config.backend.cluster;
    if !bootstrap.clusters.contains(cluster) {
        let theirs = match bootstrap.clusters.as_slice() {
            [] => "it has none".to_string(),
            names => format!("its clusters: {}", names.join(", ")),
        };
        out.push(format!(
            "warning: the bootstrap has no static cluster \"{cluster}\" (backend.cluster; \
             {theirs}): unless CDS adds it, every check fails into the failure mode"
        ));
    }
    for chain in bootstrap.chains.iter().filter(|c| c.matched) {
        let line = format!(
            "warning: tollgate's Wasm filter in {} is wrapped in an ExtensionWithMatcher: the \
             requests its matcher skips the filter for reach the upstream with no limit",
            place(chain)
        );
        if !out.contains(&line) {
            out.push(line);
        }
    }
    for rule in &config.rules {
        let keys = rule.key.iter().map(|k| (k, Use::Key));
        let tiers = rule.tiers.iter().map(|t| (&t.from, Use::Tiers));
        for (source, used) in keys.chain(tiers) {
            let KeySource::Metadata { namespace, fields } = source else {
                continue;
            };
            let Some(field) = fields.first().filter(|_| namespace == JWT_NAMESPACE) else {
                continue;
            };
            for chain in &bootstrap.chains {
                let Some(change) = change(chain, field) else {
                    continue;
                };
                let line = format!(
                    "warning: rule \"{}\" {} {source}, but {change} (until then {})",
                    rule.name,
                    used.verb(),
                    used.consequence()
                );
                // Unnamed listeners with the same fault say it once.
                if !out.contains(&line) {
                    out.push(line);
                }
            }
        }
    }
    out
}

/// How a rule uses a key source.
#[derive(Clone, Copy)]
enum Use {
    Key,
    Tiers,
}

impl Use {
    fn verb(self) -> &'static str {
        match self {
            Use::Key => "keys on",
            Use::Tiers => "takes its tiers from",
        }
    }

    /// What a request gets while the source has no value.
    fn consequence(self) -> &'static str {
        match self {
            Use::Key => "the rule never applies",
            Use::Tiers => "every key gets the rule's own limits",
        }
    }
}

/// What is wrong with `chain` for a key that reads `field` (the first field after the namespace)
/// and what to change, or None if a `jwt_authn` before tollgate writes it.
fn change(chain: &Chain, field: &str) -> Option<String> {
    let place = place(chain);
    let before: Vec<_> = chain.jwt_authn.iter().filter(|j| j.before).collect();
    if chain.jwt_authn.is_empty() {
        return Some(format!(
            "{place} have no jwt_authn filter: add {JWT_NAMESPACE} before tollgate's Wasm \
             filter, with payload_in_metadata: {field} on its providers"
        ));
    }
    if before.is_empty() {
        return Some(format!(
            "jwt_authn comes after tollgate in {place}: move it before tollgate's Wasm filter"
        ));
    }
    if before.iter().any(|j| j.fields.iter().any(|f| f == field)) {
        return None;
    }
    let mut written: Vec<&str> = before
        .iter()
        .flat_map(|j| j.fields.iter().map(String::as_str))
        .collect();
    written.sort_unstable();
    written.dedup();
    let written = match written.as_slice() {
        [] => "none writes its payload to metadata".to_string(),
        fields => format!("they write {}", fields.join(", ")),
    };
    Some(format!(
        "no jwt_authn provider before tollgate in {place} writes \"{field}\" ({written}): set \
         payload_in_metadata: {field} on the provider that verifies these tokens"
    ))
}

/// Where `chain` is, in a warning.
fn place(chain: &Chain) -> String {
    match &chain.listener {
        Some(name) => format!("the http_filters of listener \"{name}\""),
        None => "the http_filters holding tollgate".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envoy::JwtAuthn;

    fn jwt(before: bool, fields: &[&str]) -> JwtAuthn {
        JwtAuthn {
            before,
            fields: fields.iter().map(|f| f.to_string()).collect(),
        }
    }

    fn chain(listener: Option<&str>, jwt_authn: Vec<JwtAuthn>) -> Chain {
        Chain {
            listener: listener.map(str::to_string),
            matched: false,
            jwt_authn,
        }
    }

    #[test]
    fn a_jwt_authn_before_tollgate_that_writes_the_field_is_enough() {
        let fine = [
            vec![jwt(true, &["payload"])],
            vec![jwt(true, &["header", "payload"]), jwt(false, &[])],
            vec![jwt(true, &[]), jwt(true, &["payload"])],
        ];
        for jwt_authn in fine {
            assert_eq!(
                change(&chain(None, jwt_authn.clone()), "payload"),
                None,
                "{jwt_authn:?}"
            );
        }
        // The field after tollgate only, or another field before it.
        let after = change(&chain(None, vec![jwt(false, &["payload"])]), "payload").unwrap();
        assert!(
            after.starts_with(
                "jwt_authn comes after tollgate in the http_filters holding tollgate:"
            ),
            "{after}"
        );
        let other = change(
            &chain(
                None,
                vec![
                    jwt(true, &["b", "a"]),
                    jwt(true, &["a"]),
                    jwt(false, &["payload"]),
                ],
            ),
            "payload",
        )
        .unwrap();
        assert!(
            other
                .contains("writes \"payload\" (they write a, b): set payload_in_metadata: payload"),
            "{other}"
        );
    }

    #[test]
    fn only_jwt_authn_metadata_is_looked_at_and_each_line_is_said_once() {
        let config = Config::parse(
            br#"{"rules": [
              {"name": "jwt", "key": ["metadata:envoy.filters.http.jwt_authn:payload.sub"], "rate": 1, "burst": 1},
              {"name": "other", "key": ["metadata:example:payload.sub", "client_ip"], "rate": 1, "burst": 1}]}"#,
            tollgate_core::config::Artifact::Envoy,
        )
        .unwrap();
        // The same list on two unnamed listeners, and a named one.
        let bootstrap = Bootstrap {
            clusters: vec![],
            chains: vec![
                chain(None, vec![]),
                chain(None, vec![]),
                chain(Some("b"), vec![]),
            ],
        };
        let out = warnings(&config, &bootstrap);
        assert_eq!(out.len(), 3, "{out:#?}");
        assert!(
            out[0].contains("(backend.cluster; it has none)"),
            "{}",
            out[0]
        );
        assert!(out[1].starts_with("warning: rule \"jwt\" keys on metadata:envoy.filters.http.jwt_authn:payload.sub, but the http_filters holding tollgate have no jwt_authn filter"), "{}", out[1]);
        assert!(out[2].contains("listener \"b\""), "{}", out[2]);
    }
}

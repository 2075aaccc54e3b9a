//! `tollgate explain`: what the filter does with one request, rule by rule.
//!
//! Invariant: every verdict here is the core's: whether a rule applies, its bucket key and limits
//! come from `rule::applies`, the key values from `rule::key_values`, the cost from
//! `engine::cost_of`; the reasons a rule does not apply are found by asking the core's `matches`
//! one condition at a time, so a reason is never given that the filter would not act on.

use tollgate_core::config::{Config, Match, Mode};
use tollgate_core::engine::{cost_of, CostError};
use tollgate_core::rule::{
    applies, as_matched, key_values, matches, KeyCache, LimitsBy, Read, RequestView,
};

use crate::describe;

/// The explanation, one line a row.
pub fn explain(config: &Config, req: &dyn RequestView) -> Vec<String> {
    let mut out = Vec::new();
    let mut keys = KeyCache::default();
    let mut applying = 0;
    for (idx, rule) in config.rules.iter().enumerate() {
        let Some(applied) = applies(&config.key_prefix, (idx, rule), req, &mut keys) else {
            out.push(format!(
                "{}: does not apply: {}",
                rule.name,
                why_not(rule, req)
            ));
            continue;
        };
        applying += 1;
        out.push(format!(
            "{}: applies{}",
            rule.name,
            if rule.shadow {
                " (shadow: a denial is only counted, never answered)"
            } else {
                ""
            }
        ));
        let readings = key_values(&rule.key, req).unwrap_or_default();
        for (source, read) in rule.key.iter().zip(&readings) {
            let shown = match read {
                Read::Value(v) => {
                    let v = as_matched(
                        rule.matcher.path_ignore_case,
                        source,
                        std::borrow::Cow::Borrowed(v),
                    );
                    match std::str::from_utf8(&v) {
                        Ok(text) => format!("{text:?}"),
                        // A command line carries only UTF-8: the text shown would name another
                        // bucket as a --key value.
                        Err(_) => format!(
                            "{:?} (not UTF-8: no --key value names it; use the bucket key)",
                            String::from_utf8_lossy(&v)
                        ),
                    }
                }
                Read::Missing => "(missing)".to_string(),
                Read::Ambiguous => {
                    "AMBIGUOUS (sent more than once, or read differently by different servers)"
                        .to_string()
                }
            };
            out.push(format!("  key {source} = {shown}"));
        }
        if applied.ambiguous {
            out.push(
                "  bucket (the rule's one bucket for ambiguous requests): ".to_string()
                    + &applied.key,
            );
        } else {
            out.push(format!("  bucket: {}", applied.key));
        }
        let whose = match applied.by {
            LimitsBy::Rule => "the rule's",
            LimitsBy::Override => "an override's",
            LimitsBy::Tier => "its tier's",
            LimitsBy::AmbiguousTier => "the rule's: the tier source is AMBIGUOUS",
        };
        if applied.unlimited {
            let by = if applied.by == LimitsBy::Tier {
                "its tier"
            } else {
                "an override"
            };
            out.push(format!(
                "  limits: unlimited by {by}: admitted without a call to Redis (still counted)"
            ));
            continue;
        }
        out.push(format!(
            "  limits: {} ({whose})",
            describe::limits(&applied.limits)
        ));
        match cost_of(rule, &applied.limits, req) {
            Ok(cost) => out.push(format!(
                "  cost: {cost} token{}{}",
                if cost == 1 { "" } else { "s" },
                match (&rule.cost_header, rule.cost_header.as_deref().and_then(|h| req.header(h))) {
                    (Some(h), Some(_)) => format!(" (from header {h}, never below the rule's cost {})", rule.cost),
                    (Some(h), None) => format!(" (no {h} header: the rule's cost)"),
                    _ => String::new(),
                }
            )),
            Err(CostError::Invalid) => out.push(
                "  cost: the cost header is not a positive integer: the request is answered 400".to_string(),
            ),
            Err(CostError::OverBurst { burst, .. }) => out.push(format!(
                "  cost: above the burst ({burst}): it can never be admitted, the request is answered 400"
            )),
        }
        let mode = match rule.mode {
            Mode::Exact if describe::held_ms(rule) > 0 => format!(
                "exact: one call to Redis; waits up to {} for tokens",
                describe::duration(rule.max_wait_ms)
            ),
            Mode::Exact => {
                "exact: one call to Redis per request (shared by concurrent requests of the key)"
                    .to_string()
            }
            Mode::Lease => {
                "lease: spends tokens the proxy leased; calls Redis when it has none".to_string()
            }
        };
        out.push(format!("  mode: {mode}"));
    }
    out.push(match applying {
        0 => "no rule applies: the request is not limited".to_string(),
        1 => "1 rule applies".to_string(),
        n => format!("{n} rules apply: the request is denied if any enforced one denies it"),
    });
    out
}

/// Why `rule` does not apply to `req`: the first condition of its match that fails, or the key
/// source it lacks.
fn why_not(rule: &tollgate_core::config::Rule, req: &dyn RequestView) -> String {
    let m = &rule.matcher;
    let shown = |name: &str| {
        req.header(name).map_or("none".to_string(), |v| {
            format!("{:?}", String::from_utf8_lossy(&v))
        })
    };
    if m.path_prefix.is_some() {
        let only = Match {
            path_prefix: m.path_prefix.clone(),
            path_ignore_case: m.path_ignore_case,
            ..Match::default()
        };
        if !matches(&only, req) {
            return format!(
                "path {} is not under {}",
                shown(":path"),
                m.path_prefix.as_deref().unwrap_or_default()
            );
        }
    }
    if !m.methods.is_empty() {
        let only = Match {
            methods: m.methods.clone(),
            ..Match::default()
        };
        if !matches(&only, req) {
            return format!(
                "method {} is not one of {}",
                shown(":method"),
                m.methods.join(", ")
            );
        }
    }
    if !m.hosts.is_empty() {
        let only = Match {
            hosts: m.hosts.clone(),
            ..Match::default()
        };
        if !matches(&only, req) {
            return format!(
                "host {} is not one of {}",
                shown(":authority"),
                m.hosts.join(", ")
            );
        }
    }
    for h in &m.headers {
        let only = Match {
            headers: vec![h.clone()],
            ..Match::default()
        };
        if !matches(&only, req) {
            return format!(
                "header {} {} does not hold (it is {})",
                h.name,
                describe::header_condition(&h.value),
                shown(&h.name)
            );
        }
    }
    for source in &rule.key {
        if key_values(std::slice::from_ref(source), req).is_none() {
            return format!("the request has no value for key source {source}");
        }
    }
    "its match does not hold".to_string()
}

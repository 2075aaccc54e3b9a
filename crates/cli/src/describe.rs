//! Human phrases for what a configuration says: limits, durations, key sources, a rule's `match`,
//! and `tollgate check`'s one-screen summary.
//!
//! Invariant: every phrase is derived from the validated `Config` (never from the file's text), so
//! the summary says what the filter will do, in the filter's normal forms.

use tollgate_core::bucket::Limits;
use tollgate_core::config::{
    Config, FailureMode, HeaderValueMatch, KeySource, Match, Mode, Override, Protocol, Rule, Tiers,
    UsageSource, WorstCase,
};

/// `100 per minute, burst 100`.
pub fn limits(l: &Limits) -> String {
    format!("{} per {}, burst {}", l.rate, period(l.period_ms), l.burst)
}

/// A refill period: `second`, `minute`, `10 seconds`, `250 ms`.
pub fn period(ms: u64) -> String {
    const UNITS: [(u64, &str); 4] = [
        (86_400_000, "day"),
        (3_600_000, "hour"),
        (60_000, "minute"),
        (1000, "second"),
    ];
    for (unit, name) in UNITS {
        if ms == unit {
            return name.to_string();
        }
        if ms.is_multiple_of(unit) {
            return format!("{} {name}s", ms / unit);
        }
    }
    format!("{ms} ms")
}

/// A duration for a reader: `250 ms`, `1.5 s`, `2 min 5 s`, `3 h 20 min`.
pub fn duration(ms: u64) -> String {
    if ms < 1000 {
        format!("{ms} ms")
    } else if ms < 60_000 {
        let tenths = ms.div_ceil(100);
        if tenths.is_multiple_of(10) {
            format!("{} s", tenths / 10)
        } else {
            format!("{}.{} s", tenths / 10, tenths % 10)
        }
    } else if ms < 3_600_000 {
        let s = ms.div_ceil(1000);
        format!("{} min {} s", s / 60, s % 60)
    } else {
        let min = ms.div_ceil(60_000);
        format!("{} h {} min", min / 60, min % 60)
    }
}

/// What a key source reads, in words, with its canonical spelling where the words leave it out.
pub fn source(s: &KeySource) -> String {
    match s {
        KeySource::Header(name) => format!("header {name}"),
        KeySource::Query(name) => format!("query parameter {name}"),
        KeySource::Cookie(name) => format!("cookie {name}"),
        KeySource::ClientIp { .. } => format!("client address ({s})"),
        KeySource::Path => "path".to_string(),
        KeySource::Method => "method".to_string(),
        KeySource::Authority => "host (authority)".to_string(),
        KeySource::Literal(text) => format!("the fixed value {text:?} (one bucket for all)"),
        KeySource::Metadata { namespace, fields }
            if namespace == "envoy.filters.http.jwt_authn" =>
        {
            let claim = fields.get(1..).unwrap_or_default().join(".");
            if claim.is_empty() {
                format!("the whole verified JWT payload ({s})")
            } else {
                format!("JWT {claim} ({s})")
            }
        }
        KeySource::Metadata { .. } => format!("dynamic metadata ({s})"),
        KeySource::Property { spelled, .. } => format!("Envoy attribute {spelled}"),
    }
}

/// How long the filter holds a request of `rule` for tokens about to refill: its `max_wait_ms`,
/// but never for a shadow rule, which refuses nothing (the filter sends its calls with no wait).
pub fn held_ms(rule: &Rule) -> u64 {
    if rule.shadow {
        0
    } else {
        rule.max_wait_ms
    }
}

/// Where a rule applies: `/api/ on api.example.com`, `every request`.
pub fn scope(m: &Match) -> String {
    let mut parts = Vec::new();
    match &m.path_prefix {
        Some(p) if m.path_ignore_case => parts.push(format!("paths under {p} (any case)")),
        Some(p) => parts.push(format!("paths under {p}")),
        None => {}
    }
    if !m.methods.is_empty() {
        parts.push(format!("methods {}", m.methods.join(", ")));
    }
    if !m.hosts.is_empty() {
        parts.push(format!("on {}", m.hosts.join(", ")));
    }
    for h in &m.headers {
        parts.push(format!(
            "when header {} {}",
            h.name,
            header_condition(&h.value)
        ));
    }
    if parts.is_empty() {
        "every request".to_string()
    } else {
        parts.join(" ")
    }
}

/// A header condition in words: `is "v"`, `is present`.
pub fn header_condition(v: &HeaderValueMatch) -> String {
    match v {
        HeaderValueMatch::Exact(s) => format!("is {s:?}"),
        HeaderValueMatch::Present => "is present".to_string(),
        HeaderValueMatch::Prefix(s) => format!("starts with {s:?}"),
        HeaderValueMatch::Absent => "is absent".to_string(),
        HeaderValueMatch::Regex(p) => format!("matches /{}/", p.source),
    }
}

/// `tollgate check`'s summary: the backend in one line, then one line per rule (and a line of
/// details when the rule has more than its limits, key and scope).
pub fn summary(config: &Config) -> Vec<String> {
    let b = &config.backend;
    let transport = match b.protocol {
        Protocol::Webdis => format!("Webdis through Envoy cluster {:?}", b.cluster),
        Protocol::Resp => format!("Redis through Higress cluster {:?}", b.cluster),
    };
    let failure = match config.failure_mode {
        FailureMode::Open => "open (admit)",
        FailureMode::Closed => "closed (deny)",
        FailureMode::Local => "local (each rule's fallback bucket in the proxy)",
    };
    let mut out = vec![
        format!("backend: {transport}, timeout {} ms", b.timeout_ms),
        format!(
            "bucket keys: {}:{{<rule>:<digest>}}; when Redis cannot answer: {failure}; a denial answers {}",
            config.key_prefix, config.deny.status
        ),
        format!(
            "{} rule{} (every rule that applies to a request charges its own bucket):",
            config.rules.len(),
            if config.rules.len() == 1 { "" } else { "s" }
        ),
    ];
    for rule in &config.rules {
        out.push(format!("  {}", rule_line(rule)));
        let details = rule_details(rule);
        if !details.is_empty() {
            out.push(format!("      {}", details.join("; ")));
        }
    }
    out
}

/// `per-user: 100 per minute, burst 100, key: JWT sub, exact mode, applies to /api/ on api.example.com`.
pub fn rule_line(rule: &Rule) -> String {
    let mut keys: Vec<String> = rule.key.iter().map(source).collect();
    if keys.is_empty() {
        keys.push("none (one bucket for all)".to_string());
    }
    let mode = match rule.mode {
        Mode::Exact => "exact mode",
        Mode::Lease => "lease mode",
    };
    format!(
        "{}: {}, key: {}, {mode}{}, applies to {}",
        rule.name,
        limits(&rule.limits.limits()),
        keys.join(" + "),
        if rule.shadow {
            ", SHADOW (denials only counted)"
        } else {
            ""
        },
        scope(&rule.matcher)
    )
}

fn rule_details(rule: &Rule) -> Vec<String> {
    let mut d = Vec::new();
    if rule.cost != 1 {
        d.push(format!("cost {}", rule.cost));
    }
    if let Some(h) = &rule.cost_header {
        d.push(format!("cost raised by header {h}"));
    }
    if held_ms(rule) > 0 {
        d.push(format!(
            "waits up to {} for tokens",
            duration(rule.max_wait_ms)
        ));
    } else if rule.max_wait_ms > 0 {
        d.push(format!(
            "would wait up to {} for tokens once enforced (a shadow rule holds no request)",
            duration(rule.max_wait_ms)
        ));
    }
    if rule.mode == Mode::Lease {
        d.push(format!(
            "leases up to {} tokens per proxy, about {} of its demand",
            rule.lease_max,
            duration(rule.lease_horizon_ms)
        ));
    }
    if let Some(f) = &rule.fallback {
        d.push(format!("fallback {}", limits(&f.limits())));
    }
    if let Some(u) = &rule.usage {
        let from = match &u.source {
            UsageSource::Header(h) => Some(format!("response header {h}")),
            UsageSource::BodyField(f) => Some(format!("response body field {}", f.join("."))),
            UsageSource::Status(statuses) => {
                d.push(format!(
                    "keeps its cost only for answers {statuses}; other answers refund it"
                ));
                None
            }
        };
        let worst = match u.unreadable {
            WorstCase::Recent => "the largest recent usage".to_string(),
            WorstCase::Fixed(n) => format!("{n}"),
            WorstCase::Upfront => "the up-front cost".to_string(),
        };
        if let Some(from) = from {
            d.push(format!(
                "charged the usage from {from} (unreadable: {worst})"
            ));
        }
    }
    if let Some(p) = &rule.penalty {
        let steps: Vec<String> = p.durations_ms().iter().map(|&ms| duration(ms)).collect();
        d.push(format!(
            "after a denial refuses the key for {} (repeat offences within {})",
            steps.join(", then "),
            duration(p.window_ms())
        ));
    }
    let (mut unlimited, mut other) = (0, 0);
    for o in rule.overrides.values() {
        match o {
            Override::Unlimited => unlimited += 1,
            Override::Limits(_) => other += 1,
        }
    }
    if other + unlimited > 0 {
        d.push(format!(
            "{} override{} ({other} with own limits, {unlimited} unlimited)",
            other + unlimited,
            if other + unlimited == 1 { "" } else { "s" }
        ));
    }
    if let Some(t) = &rule.tiers {
        d.push(tiers(t));
    }
    d
}

/// `tiers by JWT claim plan: "free" 100 per minute, burst 20, "pro" unlimited (other values: the
/// rule's limits)`.
fn tiers(t: &Tiers) -> String {
    let each: Vec<String> = t
        .limits
        .iter()
        .map(|(name, given)| {
            let given = match given {
                Override::Unlimited => "unlimited".to_string(),
                Override::Limits(q) => limits(&q.limits()),
            };
            format!("{:?} {given}", String::from_utf8_lossy(name))
        })
        .collect();
    format!(
        "tiers by {}: {} (other values: the rule's limits)",
        source(&t.from),
        each.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn periods_and_durations_read_naturally() {
        assert_eq!(period(1000), "second");
        assert_eq!(period(60_000), "minute");
        assert_eq!(period(10_000), "10 seconds");
        assert_eq!(period(7_200_000), "2 hours");
        assert_eq!(period(250), "250 ms");
        assert_eq!(duration(250), "250 ms");
        assert_eq!(duration(1500), "1.5 s");
        assert_eq!(duration(2000), "2 s");
        assert_eq!(duration(125_000), "2 min 5 s");
        assert_eq!(duration(12_000_000), "3 h 20 min");
    }
}

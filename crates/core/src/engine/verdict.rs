//! What a request's checks decide together: each rule's outcome, and the verdict that combines
//! them (admit, with the headers of the most restrictive rule; or a local answer).
//!
//! Invariant: a request is admitted only if every enforced (non-shadow) rule that matched admits
//! it: any enforced denial answers with the configured `deny` reply (and the longest wait), a
//! `closed` failure mode with 503.

use super::decision::Refusal;
use super::rules::RuleRef;
use crate::backend::Reply;
use crate::bucket::Limits;
use crate::config::{Config, HeaderStyle};
use crate::headers::{self, Report};

/// gRPC status codes used in local replies.
pub const GRPC_RESOURCE_EXHAUSTED: u32 = 8;
pub const GRPC_UNAVAILABLE: u32 = 14;
/// The HTTP status of the answer when the backend failed and the failure mode refuses.
pub const BACKEND_UNAVAILABLE_STATUS: u32 = 503;
/// The `retry-after` (seconds) of that answer.
const BACKEND_UNAVAILABLE_RETRY_S: &str = "1";

/// How one rule decided (or failed to).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// `epoch`: the bucket's spill epoch after the take and the take's mark, when the call asked
    /// for them (what a refund of the take carries; None: a refund of it gives back nothing).
    Allowed {
        remaining: u64,
        reset_ms: u64,
        epoch: Option<crate::bucket::Stamp>,
    },
    Denied {
        retry_ms: u64,
    },
    /// Admitted on tokens reserved from the future: hold the request `delay_ms` first.
    Reserved {
        delay_ms: u64,
        reset_ms: u64,
        epoch: Option<crate::bucket::Stamp>,
    },
    /// The backend failed and the failure mode admits / refuses.
    FailOpen,
    FailClosed,
}

impl Outcome {
    /// An admission on leased tokens (held first, when they are still refilling).
    pub fn leased(s: crate::shared::lease::Spent) -> Outcome {
        if s.delay_ms > 0 {
            return Outcome::Reserved {
                delay_ms: s.delay_ms,
                reset_ms: s.reset_ms,
                epoch: None,
            };
        }
        Outcome::Allowed {
            remaining: s.remaining,
            reset_ms: s.reset_ms,
            epoch: None,
        }
    }

    /// What a script reply means for a check (a denial's retry is never negative: -1 only comes
    /// for a cost above the burst, which the engine refuses before calling).
    pub fn of_reply(r: &Reply) -> Outcome {
        match r {
            r if r.allowed && r.retry_after_ms > 0 => Outcome::Reserved {
                delay_ms: u64::try_from(r.retry_after_ms).unwrap_or(0),
                reset_ms: r.reset_after_ms,
                epoch: r.epoch,
            },
            r if r.allowed => Outcome::Allowed {
                remaining: r.remaining,
                reset_ms: r.reset_after_ms,
                epoch: r.epoch,
            },
            r => Outcome::Denied {
                retry_ms: u64::try_from(r.retry_after_ms).unwrap_or(r.reset_after_ms),
            },
        }
    }

    /// The spill epoch and mark of an admission by a call that asked for them.
    pub fn epoch(&self) -> Option<crate::bucket::Stamp> {
        match self {
            Outcome::Allowed { epoch, .. } | Outcome::Reserved { epoch, .. } => *epoch,
            _ => None,
        }
    }

    /// Whether this outcome refuses the request (if its rule is enforced).
    pub fn refuses(&self) -> bool {
        matches!(self, Outcome::Denied { .. } | Outcome::FailClosed)
    }
}

/// Where an outcome came from (for metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// This proxy's lease or deny cache, no call.
    Local,
    /// The global bucket in Redis.
    Backend,
    /// The failure mode (open/closed) or the per-proxy fallback bucket (local).
    Failure,
}

/// A local answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalReply {
    pub status: u32,
    pub headers: Vec<(String, String)>,
    pub body: String,
    /// For a gRPC request: the grpc-status to answer with (None: Envoy derives it).
    pub grpc_status: Option<u32>,
    /// The response code details (Envoy's `%RESPONSE_CODE_DETAILS%`): why, and which rule
    /// ([`Refusal::details`]).
    pub details: String,
}

/// What happens to the request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Let it through (after holding it `shown.delay_ms`, for a reservation), and say so on the
    /// response.
    Allow(Shown),
    Respond(LocalReply),
}

/// What an admitted request's response headers say (written only when the response comes, see
/// [`Plugin::write_headers`](super::Plugin::write_headers)).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Shown {
    /// The most restrictive enforced rule that admitted it with numbers to tell.
    pub admit: Option<Admit>,
    /// How long it was held for a reservation.
    pub delay_ms: u64,
}

impl Shown {
    /// What the response's headers say under the rule of the same name in `rules` (none of its
    /// numbers if that rule is gone).
    pub fn rebind(self, rules: &super::rules::Rules) -> Shown {
        let admit = self.admit.and_then(|a| {
            let rule = rules.named(&a.rule.name)?.clone();
            Some(Admit { rule, ..a })
        });
        Shown { admit, ..self }
    }

    /// Whether the response gets any header in `style`.
    pub fn any(&self, style: HeaderStyle) -> bool {
        self.delay_ms > 0 || (self.admit.is_some() && style != HeaderStyle::None)
    }
}

/// One enforced rule's admission, for the response headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admit {
    pub rule: RuleRef,
    /// The key's effective limits.
    pub limits: Limits,
    pub remaining: u64,
    pub reset_ms: u64,
}

impl Admit {
    /// What the response's rate-limit headers say of it.
    pub fn report(&self) -> Report<'_> {
        Report {
            rule: &self.rule.name,
            limits: self.limits,
            remaining: self.remaining,
            reset_ms: self.reset_ms,
        }
    }
}

/// The verdict of a request, folded from its checks' outcomes as they come (nothing collected:
/// this runs on every request): denied if any enforced rule denies (with the headers of the
/// longest wait); 503 if a `closed` failure mode refused; otherwise admitted with the headers of
/// the most restrictive rule. It borrows the checks' rules; the verdict keeps the one its
/// response's headers name.
#[derive(Debug, Default)]
pub struct Fold<'a> {
    /// The enforced denial with the longest wait (the last of equal ones).
    worst: Option<Report<'a>>,
    /// The most restrictive enforced admission, and its rule.
    admit: Option<(&'a RuleRef, Report<'a>)>,
    /// A `closed` failure mode refused: the first rule it refused for.
    closed: Option<&'a str>,
    /// The longest hold for a reservation.
    delay_ms: u64,
}

impl<'a> Fold<'a> {
    /// One check's outcome: of `rule`, under the key's effective `limits`.
    pub fn add(&mut self, rule: &'a RuleRef, outcome: Outcome, limits: Limits) {
        if rule.shadow {
            return;
        }
        let report = |remaining, reset_ms| Report {
            rule: &rule.name,
            limits,
            remaining,
            reset_ms,
        };
        let (remaining, reset_ms) = match outcome {
            Outcome::Denied { retry_ms } => {
                if self.worst.as_ref().is_none_or(|w| retry_ms >= w.reset_ms) {
                    self.worst = Some(report(0, retry_ms));
                }
                return;
            }
            Outcome::Reserved {
                delay_ms, reset_ms, ..
            } => {
                self.delay_ms = self.delay_ms.max(delay_ms);
                (0, reset_ms)
            }
            Outcome::Allowed {
                remaining,
                reset_ms,
                ..
            } => (remaining, reset_ms),
            Outcome::FailClosed => {
                self.closed = self.closed.or(Some(&rule.name));
                return;
            }
            Outcome::FailOpen => return,
        };
        let r = report(remaining, reset_ms);
        if self
            .admit
            .as_ref()
            .is_none_or(|(_, a)| headers::more_restrictive(&r, a))
        {
            self.admit = Some((rule, r));
        }
    }

    /// Whether an enforced rule refused: the verdict is a local answer, whatever the other
    /// checks say.
    pub fn refuses(&self) -> bool {
        self.worst.is_some() || self.closed.is_some()
    }

    /// The verdict (`grpc` adapts a local answer to a gRPC client).
    pub fn verdict(self, cfg: &Config, grpc: bool) -> Verdict {
        if let Some(worst) = self.worst {
            return denial(cfg, &worst, grpc);
        }
        if let Some(rule) = self.closed {
            return backend_unavailable(rule, grpc);
        }
        Verdict::Allow(Shown {
            admit: self.admit.map(|(rule, r)| Admit {
                rule: rule.clone(),
                limits: r.limits,
                remaining: r.remaining,
                reset_ms: r.reset_ms,
            }),
            delay_ms: self.delay_ms,
        })
    }
}

/// The verdict of the outcomes `(rule, outcome, effective limits)` of a request (see [`Fold`]).
pub fn verdict<'a>(
    cfg: &Config,
    outcomes: impl Iterator<Item = (&'a RuleRef, Outcome, Limits)>,
    grpc: bool,
) -> Verdict {
    let mut fold = Fold::default();
    for (rule, outcome, limits) in outcomes {
        fold.add(rule, outcome, limits);
    }
    fold.verdict(cfg, grpc)
}

/// The local reply to a request an enforced rule refused (`worst`: the longest wait). Cold, as
/// the other local replies: most requests are admitted, and this code would otherwise sit in the
/// middle of theirs.
#[cold]
fn denial(cfg: &Config, worst: &Report, grpc: bool) -> Verdict {
    let mut hdrs = vec![(
        "retry-after".to_string(),
        headers::retry_after_secs(worst.reset_ms).to_string(),
    )];
    hdrs.extend(headers::rate_limit_headers(cfg.response_headers, worst));
    Verdict::Respond(LocalReply {
        status: cfg.deny.status,
        headers: hdrs,
        body: cfg.deny.body.clone(),
        grpc_status: (grpc && cfg.deny.grpc_resource_exhausted).then_some(GRPC_RESOURCE_EXHAUSTED),
        details: Refusal::RateLimited.details(worst.rule),
    })
}

/// The local reply when the backend failed and the failure mode refuses (for `rule`).
#[cold]
fn backend_unavailable(rule: &str, grpc: bool) -> Verdict {
    Verdict::Respond(LocalReply {
        status: BACKEND_UNAVAILABLE_STATUS,
        headers: vec![(
            "retry-after".to_string(),
            BACKEND_UNAVAILABLE_RETRY_S.to_string(),
        )],
        body: "rate limit backend unavailable\n".to_string(),
        grpc_status: grpc.then_some(GRPC_UNAVAILABLE),
        details: Refusal::BackendUnavailable.details(rule),
    })
}

/// Whether `content-type` names a gRPC request.
pub fn is_grpc(content_type: Option<&[u8]>) -> bool {
    content_type.is_some_and(|ct| ct.starts_with(b"application/grpc"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::rules::{RuleId, Rules};

    fn rules() -> (Config, Rules) {
        let json = br#"{"rules":[
            {"name":"a","key":["header:x"],"rate":10},
            {"name":"b","key":["header:x"],"rate":10},
            {"name":"shadow","key":["header:x"],"rate":10,"shadow":true}]}"#;
        let cfg = Config::try_from(&json[..]).unwrap();
        let rules = Rules::new(&cfg.rules);
        (cfg, rules)
    }

    fn allowed(remaining: u64) -> Outcome {
        Outcome::Allowed {
            remaining,
            reset_ms: 100,
            epoch: None,
        }
    }

    #[test]
    fn the_fold_names_the_most_restrictive_admission_and_ignores_shadow_rules() {
        let (cfg, rules) = rules();
        let [a, b, shadow] = [0, 1, 2].map(|i| rules.get(RuleId::new(i)).unwrap());
        let limits = a.limits.limits();
        let mut fold = Fold::default();
        fold.add(a, allowed(5), limits);
        fold.add(shadow, Outcome::Denied { retry_ms: 900 }, limits);
        assert!(!fold.refuses(), "a shadow rule never refuses");
        fold.add(b, allowed(2), limits);
        let Verdict::Allow(shown) = fold.verdict(&cfg, false) else {
            panic!("admitted");
        };
        let admit = shown.admit.unwrap();
        assert_eq!((admit.rule.name.as_str(), admit.remaining), ("b", 2));
    }

    #[test]
    fn the_fold_refuses_with_the_longest_wait_the_last_of_equal_ones() {
        let (cfg, rules) = rules();
        let [a, b] = [0, 1].map(|i| rules.get(RuleId::new(i)).unwrap());
        let limits = a.limits.limits();
        let mut fold = Fold::default();
        fold.add(a, Outcome::Denied { retry_ms: 2000 }, limits);
        fold.add(b, Outcome::Denied { retry_ms: 2000 }, limits);
        assert!(fold.refuses());
        let Verdict::Respond(reply) = fold.verdict(&cfg, false) else {
            panic!("refused");
        };
        let policy = reply
            .headers
            .iter()
            .find(|(k, _)| k == "ratelimit-policy")
            .map(|(_, v)| v.as_str());
        assert_eq!(reply.status, cfg.deny.status);
        assert!(policy.is_some_and(|p| p.starts_with("\"b\"")), "{policy:?}");
        assert_eq!(
            reply.details, "tollgate_rate_limited{b}",
            "the rule its headers name"
        );
    }

    #[test]
    fn a_closed_failure_mode_answers_503_unless_a_rule_denies() {
        let (cfg, rules) = rules();
        let a = rules.get(RuleId::new(0)).unwrap();
        let limits = a.limits.limits();
        let mut fold = Fold::default();
        fold.add(a, Outcome::FailClosed, limits);
        assert!(fold.refuses());
        let Verdict::Respond(reply) = fold.verdict(&cfg, true) else {
            panic!("refused");
        };
        assert_eq!(reply.status, BACKEND_UNAVAILABLE_STATUS);
        assert_eq!(reply.grpc_status, Some(GRPC_UNAVAILABLE));
        assert_eq!(reply.details, "tollgate_backend_unavailable{a}");
    }
}

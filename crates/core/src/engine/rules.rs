//! The configuration's rules as the engine holds them: each with its id (its place in the
//! configuration) and what is derived from it once per configure.
//!
//! Invariant: a [`RuleRef`] can only be had from the [`Rules`] of the engine's configuration, so
//! whatever holds one (a check, a lease wait, a call, a pending flush) has its rule: no lookup by
//! index that could miss, no fallback invented for a rule that "is not there". Only ids that come
//! from outside the engine (another worker's message, a rule name handed over from the previous
//! configuration) are looked up, and may find nothing.

use std::cmp::Ordering;
use std::ops::Deref;
use std::rc::Rc;

use crate::config::Rule;
use crate::headers;

/// A rule's place in its configuration (what metrics and the key cache know it by).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RuleId(usize);

impl RuleId {
    /// The rule at `index` in its configuration's `rules`.
    pub const fn new(index: usize) -> RuleId {
        RuleId(index)
    }

    pub const fn index(self) -> usize {
        self.0
    }
}

/// One rule of the engine's configuration (cheap to clone: a shared handle).
#[derive(Clone)]
pub struct RuleRef(Rc<Entry>);

struct Entry {
    id: RuleId,
    rule: Rule,
    /// The rule's `RateLimit-Policy` value under its own limits (constant per configuration).
    policy: String,
}

impl RuleRef {
    pub fn id(&self) -> RuleId {
        self.0.id
    }

    /// The `RateLimit-Policy` value of the rule's own limits.
    pub fn policy(&self) -> &str {
        &self.0.policy
    }
}

impl Deref for RuleRef {
    type Target = Rule;

    fn deref(&self) -> &Rule {
        &self.0.rule
    }
}

impl std::fmt::Debug for RuleRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "rule {} ({})", self.0.id.0, self.0.rule.name)
    }
}

/// Rules of one configuration are the same rule when their ids are.
impl PartialEq for RuleRef {
    fn eq(&self, other: &RuleRef) -> bool {
        self.id() == other.id()
    }
}

impl Eq for RuleRef {}

/// In configuration order.
impl Ord for RuleRef {
    fn cmp(&self, other: &RuleRef) -> Ordering {
        self.id().cmp(&other.id())
    }
}

impl PartialOrd for RuleRef {
    fn partial_cmp(&self, other: &RuleRef) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// The rules of one configuration, in order (cheap to clone: a shared handle, so the engine can
/// walk them while it changes its own state).
#[derive(Clone)]
pub struct Rules(Rc<[RuleRef]>);

impl Rules {
    pub fn new(rules: &[Rule]) -> Rules {
        let entries = rules.iter().enumerate().map(|(index, rule)| {
            RuleRef(Rc::new(Entry {
                id: RuleId(index),
                policy: headers::policy(&rule.name, &rule.limits),
                rule: rule.clone(),
            }))
        });
        Rules(entries.collect())
    }

    pub fn iter(&self) -> std::slice::Iter<'_, RuleRef> {
        self.0.iter()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The rule of an id that came from outside this configuration (another worker's message).
    pub fn get(&self, id: RuleId) -> Option<&RuleRef> {
        self.0.get(id.0)
    }

    /// The rule bucket key `key` (under `prefix`) belongs to, `<prefix>:{<rule>:…}`, for a check
    /// another worker sent with its rule's place `id` in the sender's configuration: the rule at
    /// `id` if it is that one, else the rule of that name (an old and a new configuration of one
    /// namespace, both live while a listener drains, may number their rules otherwise).
    pub fn of_key(&self, id: RuleId, prefix: &str, key: &str) -> Option<&RuleRef> {
        let (name, _) = crate::rule::parts_of_key(prefix, key)?;
        match self.get(id) {
            Some(rule) if rule.name == name => Some(rule),
            _ => self.named(name),
        }
    }

    /// The rule named `name` (what a previous configuration's rule is known by here).
    pub fn named(&self, name: &str) -> Option<&RuleRef> {
        self.0.iter().find(|r| r.name == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    #[test]
    fn a_key_finds_the_rule_it_names() {
        let config = Config::try_from(
            &br#"{"key_prefix":"tg","rules":[{"name":"a","rate":1},{"name":"ab","rate":1}]}"#[..],
        )
        .unwrap();
        let rules = Rules::new(&config.rules);
        let name = |id, key| {
            rules
                .of_key(RuleId::new(id), "tg", key)
                .map(|r| r.name.clone())
        };
        assert_eq!(name(0, "tg:{a:00ff}"), Some("a".to_string()));
        assert_eq!(name(1, "tg:{ab:00ff}"), Some("ab".to_string()));
        // Another configuration's rule 0 (or one past this configuration's rules): by its name.
        assert_eq!(name(0, "tg:{ab:00ff}"), Some("ab".to_string()));
        assert_eq!(name(1, "tg:{a:00ff}"), Some("a".to_string()));
        assert_eq!(name(2, "tg:{a:00ff}"), Some("a".to_string()));
        assert_eq!(
            name(0, "tg:{gone:00ff}"),
            None,
            "a rule this configuration lacks"
        );
        assert_eq!(name(0, "other:{a:00ff}"), None);
    }
}

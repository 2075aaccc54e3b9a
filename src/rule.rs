//! Rule matching and bucket-key extraction over a `RequestView` (no host calls here).
//!
//! Invariant: the bucket key is `<key_prefix>:{<rule>:<digest>}` where the digest is a SHA-256 of the
//! rule's key values, each length-prefixed, so no user text reaches Redis or a URL, and two different
//! value tuples never share a key.

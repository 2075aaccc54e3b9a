//! JWTs for the tests that run Envoy's `jwt_authn`: an RSA key made with `openssl`, its JWKS, and
//! RS256 tokens signed with it. Nothing leaves loopback.
//!
//! Invariant: every token is signed by the key whose public half is in [`Jwt::jwks`], under the
//! issuer the `Jwt` was made with, so a provider configured with both verifies it.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::http::base64url;

/// Runs `openssl` with `args` in `dir` (stdin from `input`), panicking with its stderr on failure.
pub fn openssl(dir: &Path, args: &[&str], input: Option<&[u8]>) -> Vec<u8> {
    use std::io::Write;
    let mut child = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("run openssl (make setup installs it): {e}"));
    let mut stdin = child.stdin.take().expect("openssl stdin");
    if let Some(bytes) = input {
        stdin.write_all(bytes).expect("write to openssl");
    }
    drop(stdin);
    let out = child.wait_with_output().expect("wait for openssl");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// An RSA key for RS256 (kept as `jwt.key` in a test's directory), its JWKS, and tokens signed
/// with it for one issuer.
pub struct Jwt {
    dir: PathBuf,
    issuer: String,
    /// The public key as a JWKS document (`{"keys":[…]}`), for `local_jwks`.
    pub jwks: String,
}

impl Jwt {
    /// A fresh key in `dir`, for tokens of `issuer`.
    pub fn new(dir: &Path, issuer: &str) -> Jwt {
        openssl(dir, &["genrsa", "-out", "jwt.key", "2048"], None);
        let modulus = openssl(dir, &["rsa", "-in", "jwt.key", "-noout", "-modulus"], None);
        let hex = String::from_utf8(modulus).expect("openssl prints ASCII");
        let hex = hex
            .trim()
            .strip_prefix("Modulus=")
            .expect("openssl -modulus output");
        let n: Vec<u8> = (0..hex.len())
            .step_by(2)
            .map(|i| {
                hex.get(i..i + 2)
                    .and_then(|b| u8::from_str_radix(b, 16).ok())
                    .expect("hex modulus")
            })
            .collect();
        let jwks = serde_json::json!({ "keys": [ {
            "kty": "RSA", "alg": "RS256", "use": "sig", "kid": "k1",
            "n": base64url(&n), "e": "AQAB" } ] })
        .to_string();
        Jwt {
            dir: dir.to_path_buf(),
            issuer: issuer.to_string(),
            jwks,
        }
    }

    /// A signed token with these claims and this `Jwt`'s issuer (`iss` is set here).
    pub fn token(&self, claims: serde_json::Value) -> String {
        let mut claims = claims;
        claims["iss"] = self.issuer.as_str().into();
        let header = base64url(br#"{"alg":"RS256","typ":"JWT","kid":"k1"}"#);
        let payload = base64url(claims.to_string().as_bytes());
        let signing_input = format!("{header}.{payload}");
        let sig = openssl(
            &self.dir,
            &["dgst", "-sha256", "-sign", "jwt.key"],
            Some(signing_input.as_bytes()),
        );
        format!("{signing_input}.{}", base64url(&sig))
    }
}

//! Static API tokens, for services without an identity provider: a TOML file (a mounted
//! Kubernetes Secret, say) of entries
//!
//! ```toml
//! [[token]]
//! name = "billing-service"        # recorded as producerSub of what it pushes
//! token = "a long random string"  # or sha256 = "<hex SHA-256 of the token>", to keep it out of the file
//! role = "read-write"             # read-only, read-write or admin, whatever auth.role_* says
//! queues = ["billing."]           # optional: queue name prefixes it is confined to
//! ```
//!
//! A `token` shorter than 16 bytes stops start-up.
//!
//! Only SHA-256 digests are kept in memory; a presented token is hashed and compared with every
//! entry in constant time, so neither the comparison nor the entry that matched shows in timing.

use std::path::Path;

use serde::Deserialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::{Identity, Role};
use crate::config::ConfigError;

const SETTING: &str = "auth.tokens_file";

/// Shortest token accepted in the file: anything shorter can be guessed.
const MIN_TOKEN_LEN: usize = 16;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    token: Vec<Entry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    name: String,
    token: Option<String>,
    sha256: Option<String>,
    role: String,
    queues: Option<Vec<String>>,
}

struct Token {
    digest: [u8; 32],
    identity: Identity,
}

pub struct StaticTokens {
    tokens: Vec<Token>,
}

fn invalid(problem: impl Into<String>) -> ConfigError {
    ConfigError { setting: SETTING.into(), problem: problem.into() }
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

fn hex_digest(hex: &str) -> Option<[u8; 32]> {
    let bytes = hex.as_bytes();
    if bytes.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, pair) in bytes.chunks(2).enumerate() {
        out[i] = u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok()?;
    }
    Some(out)
}

impl StaticTokens {
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text =
            std::fs::read_to_string(path).map_err(|e| invalid(format!("cannot read {}: {e}", path.display())))?;
        Self::parse(&text).map_err(|problem| invalid(format!("{}: {problem}", path.display())))
    }

    /// Role names are the defaults' (`read-only`, `read-write`, `admin`): a file is this broker's
    /// own configuration, not an identity provider's claims.
    fn parse(text: &str) -> Result<Self, String> {
        let file: File = toml::from_str(text).map_err(|e| e.message().to_owned())?;
        let mut tokens: Vec<Token> = Vec::with_capacity(file.token.len());
        for entry in file.token {
            let at = format!("token {:?}", entry.name);
            if entry.name.is_empty() {
                return Err("a token has an empty name".into());
            }
            let digest = match (&entry.token, &entry.sha256) {
                (Some(token), None) if token.len() >= MIN_TOKEN_LEN => digest(token),
                (Some(_), None) => return Err(format!("{at}: the token must be at least {MIN_TOKEN_LEN} characters")),
                (None, Some(hex)) => hex_digest(hex).ok_or_else(|| format!("{at}: sha256 must be 64 hex digits"))?,
                _ => return Err(format!("{at}: give exactly one of token and sha256")),
            };
            let role = match entry.role.as_str() {
                "read-only" => Role::ReadOnly,
                "read-write" => Role::ReadWrite,
                "admin" => Role::Admin,
                other => return Err(format!("{at}: role {other:?} is not read-only, read-write or admin")),
            };
            if entry.queues.as_ref().is_some_and(|prefixes| prefixes.iter().any(String::is_empty)) {
                return Err(format!("{at}: an empty queue prefix confines nothing; leave queues out for every queue"));
            }
            if tokens.iter().any(|t| t.identity.subject.as_deref() == Some(&entry.name)) {
                return Err(format!("{at} appears twice"));
            }
            if tokens.iter().any(|t| bool::from(t.digest.ct_eq(&digest))) {
                return Err(format!("{at} has the same token as another entry"));
            }
            tokens.push(Token {
                digest,
                identity: Identity { subject: Some(entry.name), role: Some(role), queues: entry.queues },
            });
        }
        Ok(Self { tokens })
    }

    /// The identity of the entry whose token this is. Every entry is compared, whichever matches.
    pub fn find(&self, token: &str) -> Option<Identity> {
        let presented = digest(token);
        let mut found = None;
        for entry in &self.tokens {
            if bool::from(entry.digest.ct_eq(&presented)) {
                found = Some(&entry.identity);
            }
        }
        found.cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = r#"
        [[token]]
        name = "billing"
        token = "billing-token-0123456789"
        role = "read-write"
        queues = ["billing."]

        [[token]]
        name = "ops"
        sha256 = "a1f3c6bcd0c0c0d2bb1f1c62bd0de2a4e0ddc0f6d6f0e0bb0f2e1ff4e27a4d1f"
        role = "admin"
    "#;

    #[test]
    fn tokens_are_found_by_their_value_or_digest() {
        let tokens = StaticTokens::parse(FILE).unwrap();
        let billing = tokens.find("billing-token-0123456789").unwrap();
        assert_eq!(billing.subject.as_deref(), Some("billing"));
        assert_eq!(billing.role, Some(Role::ReadWrite));
        assert!(billing.allows_queue("billing.invoices") && !billing.allows_queue("orders"));
        assert!(tokens.find("billing-token-012345678").is_none());
        assert!(tokens.find("").is_none());
        let by_digest = StaticTokens::parse(&format!(
            "[[token]]\nname = \"ops\"\nsha256 = \"{}\"\nrole = \"admin\"\n",
            "a1f3c6bcd0c0c0d2bb1f1c62bd0de2a4e0ddc0f6d6f0e0bb0f2e1ff4e27a4d1f".replace('a', "A")
        ))
        .unwrap();
        assert!(by_digest.find("anything").is_none());
        let ops_token = "ops-token-abcdefghijklmnop";
        let hex: String = digest(ops_token).iter().map(|b| format!("{b:02x}")).collect();
        let ops =
            StaticTokens::parse(&format!("[[token]]\nname = \"ops\"\nsha256 = \"{hex}\"\nrole = \"admin\"\n")).unwrap();
        assert_eq!(ops.find(ops_token).unwrap().role, Some(Role::Admin));
    }

    #[test]
    fn bad_entries_are_refused_with_what_is_wrong() {
        let error = |text: &str| StaticTokens::parse(text).err().unwrap();
        assert!(error("[[token]]\nname = \"a\"\ntoken = \"short\"\nrole = \"admin\"\n").contains("at least 16"));
        assert!(error("[[token]]\nname = \"a\"\ntoken = \"0123456789abcdef\"\nrole = \"root\"\n").contains("\"root\""));
        assert!(error("[[token]]\nname = \"a\"\nrole = \"admin\"\n").contains("exactly one"));
        assert!(
            error("[[token]]\nname = \"a\"\ntoken = \"0123456789abcdef\"\nrole = \"admin\"\nextra = 1\n")
                .contains("extra")
        );
        let twice = "[[token]]\nname = \"a\"\ntoken = \"0123456789abcdef\"\nrole = \"admin\"\n\
                     [[token]]\nname = \"b\"\ntoken = \"0123456789abcdef\"\nrole = \"admin\"\n";
        assert!(error(twice).contains("same token"));
        let everything = "[[token]]\nname = \"a\"\ntoken = \"0123456789abcdef\"\nrole = \"admin\"\nqueues = [\"\"]\n";
        assert!(error(everything).contains("empty queue prefix"));
    }
}

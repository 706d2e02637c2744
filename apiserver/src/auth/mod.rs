//! Authentication (client certificates signed by the cluster CA, bearer tokens from a static
//! token file, bootstrap and ServiceAccount tokens; anonymous requests get only what RBAC
//! grants them explicitly). Authorization is `rbac`.

pub mod rbac;
pub mod tokens;

use crate::error::{ApiError, ApiResult};
use axum::http::header;
use axum::http::request::Parts;
use std::collections::HashMap;
use std::path::Path;

/// An authenticated user.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct User {
    /// User name (certificate CN or token user).
    pub name: String,
    /// Groups (certificate O or token groups), plus `system:authenticated`.
    pub groups: Vec<String>,
}

impl User {
    /// A user with groups; `system:authenticated` is added.
    pub fn new(name: impl Into<String>, mut groups: Vec<String>) -> Self {
        if !groups.iter().any(|g| g == "system:authenticated") {
            groups.push("system:authenticated".into());
        }
        User {
            name: name.into(),
            groups,
        }
    }
}

/// The identity a TLS connection's verified client certificate carries, put on each request.
#[derive(Clone, Debug)]
pub struct PeerIdentity(pub Option<User>);

/// Reads CN (user) and O (groups) from a verified client certificate.
pub fn user_from_cert(der: &[u8]) -> Option<User> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let subject = cert.subject();
    let cn = subject.iter_common_name().next()?.as_str().ok()?.to_owned();
    let groups = subject
        .iter_organization()
        .filter_map(|o| o.as_str().ok().map(str::to_owned))
        .collect();
    Some(User::new(cn, groups))
}

/// A static token file could not be read.
#[derive(Debug, thiserror::Error)]
#[error("reading token file {path}: {reason}")]
pub struct TokenFileError {
    path: String,
    reason: String,
}

/// Authenticates requests: bearer tokens from the static file, then the connection's certificate.
#[derive(Clone, Debug, Default)]
pub struct Authenticator {
    tokens: HashMap<String, User>,
}

impl Authenticator {
    /// Loads a static token file (`token,user,uid,"group1,group2"` per line), if given.
    pub fn new(token_file: Option<&Path>) -> Result<Self, TokenFileError> {
        let mut tokens = HashMap::new();
        if let Some(path) = token_file {
            let err = |reason: String| TokenFileError {
                path: path.display().to_string(),
                reason,
            };
            let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
            for (n, line) in text.lines().enumerate() {
                let line = line.trim();
                if line.is_empty() || line.starts_with('#') {
                    continue;
                }
                let fields = split_csv(line);
                if fields.len() < 3 {
                    return Err(err(format!("line {}: want token,user,uid[,groups]", n + 1)));
                }
                let groups = fields
                    .get(3)
                    .map(|g| {
                        g.split(',')
                            .map(str::trim)
                            .filter(|g| !g.is_empty())
                            .map(str::to_owned)
                            .collect()
                    })
                    .unwrap_or_default();
                tokens.insert(fields[0].clone(), User::new(fields[1].clone(), groups));
            }
        }
        Ok(Authenticator { tokens })
    }

    /// The user of a static token, if it is one.
    pub fn static_token(&self, token: &str) -> Option<&User> {
        self.tokens.get(token)
    }

    /// Who sent the request: a user, a token to verify as a ServiceAccount token, or 401.
    pub fn authenticate(&self, parts: &Parts) -> ApiResult<Credential> {
        if let Some(auth) = parts.headers.get(header::AUTHORIZATION) {
            let token = auth
                .to_str()
                .ok()
                .and_then(|a| a.strip_prefix("Bearer "))
                .map(str::trim)
                .ok_or_else(ApiError::unauthorized)?;
            return Ok(match self.tokens.get(token) {
                Some(user) => Credential::User(user.clone()),
                None => Credential::Token(token.to_owned()),
            });
        }
        Ok(parts
            .extensions
            .get::<PeerIdentity>()
            .and_then(|p| p.0.clone())
            .map_or(Credential::Anonymous, Credential::User))
    }
}

/// The user of a request without credentials. It may do only what RBAC grants
/// `system:anonymous` or `system:unauthenticated` (the `cluster-info` ConfigMap joining nodes
/// read); anything else is answered 401, as if anonymous requests were off.
pub fn anonymous() -> User {
    User {
        name: "system:anonymous".into(),
        groups: vec!["system:unauthenticated".into()],
    }
}

/// What a request authenticated with.
#[derive(Debug)]
pub enum Credential {
    /// A known user (certificate or static token).
    User(User),
    /// A bearer token that is not a static one: verified as a bootstrap token or a
    /// ServiceAccount token.
    Token(String),
    /// No credentials at all.
    Anonymous,
}

fn split_csv(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let (mut cur, mut quoted) = (String::new(), false);
    for c in line.chars() {
        match c {
            '"' => quoted = !quoted,
            ',' if !quoted => out.push(std::mem::take(&mut cur).trim().to_owned()),
            _ => cur.push(c),
        }
    }
    out.push(cur.trim().to_owned());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_lines_parse_with_quoted_groups() {
        assert_eq!(
            split_csv(r#"abc,alice,1,"dev,ops""#),
            ["abc", "alice", "1", "dev,ops"]
        );
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens.csv");
        std::fs::write(&path, "# comment\nsecret,alice,1,\"dev,ops\"\n").unwrap();
        let a = Authenticator::new(Some(&path)).unwrap();
        let user = a.tokens.get("secret").unwrap();
        assert_eq!(user.name, "alice");
        assert_eq!(user.groups, ["dev", "ops", "system:authenticated"]);
    }
}

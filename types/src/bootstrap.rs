//! Bootstrap tokens as upstream defines them (`k8s.io/cluster-bootstrap`): the token format,
//! the `bootstrap.kubernetes.io/token` Secret that holds one, the user it authenticates as,
//! and the detached JWS that signs the `cluster-info` ConfigMap with it.

use base64::Engine;
use std::collections::BTreeMap;

/// The Secret type of a bootstrap token.
pub const SECRET_TYPE: &str = "bootstrap.kubernetes.io/token";
/// Bootstrap token Secrets are named `bootstrap-token-<id>` in this namespace.
pub const NAMESPACE: &str = "kube-system";
/// The prefix of a bootstrap token Secret's name.
pub const SECRET_PREFIX: &str = "bootstrap-token-";
/// The group every bootstrap token authenticates in.
pub const GROUP: &str = "system:bootstrappers";
/// The extra group `minik8s token create` puts node tokens in (kubeadm's name).
pub const NODE_GROUP: &str = "system:bootstrappers:kubeadm:default-node-token";
/// The namespace of the `cluster-info` ConfigMap.
pub const CLUSTER_INFO_NAMESPACE: &str = "kube-public";
/// The ConfigMap joining nodes read (anonymously) to find the cluster.
pub const CLUSTER_INFO: &str = "cluster-info";
/// The `cluster-info` key holding the kubeconfig (server and CA, no credentials).
pub const KUBECONFIG_KEY: &str = "kubeconfig";
/// The prefix of a `cluster-info` key holding the JWS of one token.
pub const JWS_PREFIX: &str = "jws-kubeconfig-";
/// The default lifetime of a new token (kubeadm's 24 h).
pub const DEFAULT_TTL_SECONDS: i64 = 24 * 3600;

/// Secret data keys.
pub mod keys {
    /// The token's public id.
    pub const ID: &str = "token-id";
    /// The token's secret part.
    pub const SECRET: &str = "token-secret";
    /// A free-form description.
    pub const DESCRIPTION: &str = "description";
    /// RFC 3339 time after which the token is invalid (and deleted by the token cleaner).
    pub const EXPIRATION: &str = "expiration";
    /// `"true"`: the token may authenticate to the apiserver.
    pub const USAGE_AUTHENTICATION: &str = "usage-bootstrap-authentication";
    /// `"true"`: the token signs the `cluster-info` ConfigMap.
    pub const USAGE_SIGNING: &str = "usage-bootstrap-signing";
    /// Comma-separated extra groups (each `system:bootstrappers:…`).
    pub const EXTRA_GROUPS: &str = "auth-extra-groups";
}

/// A token `<id>.<secret>`: 6 and 16 characters of `[a-z0-9]`.
#[derive(Clone, PartialEq, Eq)]
pub struct Token {
    /// The public part, also the Secret's name suffix and the JWS key id.
    pub id: String,
    /// The secret part.
    pub secret: String,
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Token({}.<redacted>)", self.id)
    }
}

impl std::fmt::Display for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.id, self.secret)
    }
}

fn token_chars(s: &str, len: usize) -> bool {
    s.len() == len
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
}

impl Token {
    /// Parses `<id>.<secret>`; `None` unless it has upstream's exact form.
    pub fn parse(s: &str) -> Option<Self> {
        let (id, secret) = s.split_once('.')?;
        (token_chars(id, 6) && token_chars(secret, 16)).then(|| Token {
            id: id.to_owned(),
            secret: secret.to_owned(),
        })
    }

    /// A new random token.
    pub fn generate() -> Self {
        use rand::Rng;
        const CHARS: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
        let mut rng = rand::rng();
        let mut pick = |n: usize| -> String {
            (0..n)
                .map(|_| CHARS[rng.random_range(0..CHARS.len())] as char)
                .collect()
        };
        Token {
            id: pick(6),
            secret: pick(16),
        }
    }

    /// Whether `other` is the same token (the secrets compared in constant time).
    pub fn matches(&self, other: &Token) -> bool {
        let (a, b) = (self.secret.as_bytes(), other.secret.as_bytes());
        self.id == other.id
            && a.len() == b.len()
            && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
    }

    /// The name of the Secret holding this token.
    pub fn secret_name(&self) -> String {
        format!("{SECRET_PREFIX}{}", self.id)
    }

    /// The user this token authenticates as.
    pub fn user(&self) -> String {
        format!("system:bootstrap:{}", self.id)
    }
}

/// What a bootstrap token Secret says, decoded from its `data`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TokenSecret {
    /// The token (id and secret), when both parts are present and well formed.
    pub token: Option<Token>,
    /// `expiration`, RFC 3339, if set.
    pub expiration: Option<String>,
    /// `description`.
    pub description: String,
    /// Whether `usage-bootstrap-authentication` is `"true"`.
    pub authentication: bool,
    /// Whether `usage-bootstrap-signing` is `"true"`.
    pub signing: bool,
    /// The extra groups, in order.
    pub extra_groups: Vec<String>,
}

impl TokenSecret {
    /// Reads a Secret object (JSON, `data` base64 as stored); `None` unless it is a bootstrap
    /// token Secret (right type, name `bootstrap-token-<id>` matching its `token-id`).
    pub fn from_secret(obj: &serde_json::Value) -> Option<Self> {
        if obj.get("type").and_then(|t| t.as_str()) != Some(SECRET_TYPE) {
            return None;
        }
        let name = obj.pointer("/metadata/name")?.as_str()?;
        let data: BTreeMap<String, String> = obj
            .get("data")
            .and_then(|d| d.as_object())
            .map(|d| {
                d.iter()
                    .filter_map(|(k, v)| {
                        let raw = base64::engine::general_purpose::STANDARD
                            .decode(v.as_str()?)
                            .ok()?;
                        Some((k.clone(), String::from_utf8(raw).ok()?))
                    })
                    .collect()
            })
            .unwrap_or_default();
        let get = |k: &str| data.get(k).map(String::as_str);
        let token = match (get(keys::ID), get(keys::SECRET)) {
            (Some(id), Some(secret)) => Token::parse(&format!("{id}.{secret}")),
            _ => None,
        };
        if token
            .as_ref()
            .is_some_and(|t| name != t.secret_name().as_str())
        {
            return None;
        }
        Some(TokenSecret {
            token,
            expiration: get(keys::EXPIRATION).map(str::to_owned),
            description: get(keys::DESCRIPTION).unwrap_or("").to_owned(),
            authentication: get(keys::USAGE_AUTHENTICATION) == Some("true"),
            signing: get(keys::USAGE_SIGNING) == Some("true"),
            extra_groups: get(keys::EXTRA_GROUPS)
                .map(|g| {
                    g.split(',')
                        .map(str::trim)
                        .filter(|g| !g.is_empty())
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default(),
        })
    }

    /// Whether the token has expired at `now_seconds` (Unix time); an unparsable expiration
    /// counts as expired, as upstream does.
    pub fn expired(&self, now_seconds: i64) -> bool {
        match &self.expiration {
            None => false,
            Some(t) => t
                .parse::<jiff::Timestamp>()
                .map_or(true, |t| t.as_second() <= now_seconds),
        }
    }

    /// The groups the token authenticates in: `system:bootstrappers` plus the extra groups,
    /// or an error naming a group outside `system:bootstrappers:`.
    pub fn groups(&self) -> Result<Vec<String>, String> {
        let mut out = vec![GROUP.to_owned()];
        for g in &self.extra_groups {
            let ok = g.strip_prefix("system:bootstrappers:").is_some_and(|rest| {
                !rest.is_empty()
                    && rest.len() <= 256
                    && rest.bytes().all(|b| {
                        b.is_ascii_lowercase() || b.is_ascii_digit() || b == b':' || b == b'-'
                    })
                    && !rest.ends_with([':', '-'])
            });
            if !ok {
                return Err(format!(
                    "{g:?} is not a valid bootstrap group (it must start with system:bootstrappers:)"
                ));
            }
            out.push(g.clone());
        }
        Ok(out)
    }

    /// The Secret's `data` for a new token (base64 values), as `minik8s token create` writes it.
    pub fn data(&self) -> serde_json::Map<String, serde_json::Value> {
        let b = |s: &str| {
            serde_json::Value::String(base64::engine::general_purpose::STANDARD.encode(s))
        };
        let mut m = serde_json::Map::new();
        if let Some(t) = &self.token {
            m.insert(keys::ID.into(), b(&t.id));
            m.insert(keys::SECRET.into(), b(&t.secret));
        }
        if !self.description.is_empty() {
            m.insert(keys::DESCRIPTION.into(), b(&self.description));
        }
        if let Some(e) = &self.expiration {
            m.insert(keys::EXPIRATION.into(), b(e));
        }
        if self.authentication {
            m.insert(keys::USAGE_AUTHENTICATION.into(), b("true"));
        }
        if self.signing {
            m.insert(keys::USAGE_SIGNING.into(), b("true"));
        }
        if !self.extra_groups.is_empty() {
            m.insert(keys::EXTRA_GROUPS.into(), b(&self.extra_groups.join(",")));
        }
        m
    }
}

fn b64url(data: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(data)
}

/// The detached JWS (`header..signature`, HS256 keyed with the token's secret, `kid` the token
/// id) of `content`, as upstream's bootstrap signer writes into `cluster-info`.
pub fn sign_detached(content: &str, token: &Token) -> String {
    let header = b64url(format!(r#"{{"alg":"HS256","kid":"{}"}}"#, token.id).as_bytes());
    let input = format!("{header}.{}", b64url(content.as_bytes()));
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, token.secret.as_bytes());
    let tag = ring::hmac::sign(&key, input.as_bytes());
    format!("{header}..{}", b64url(tag.as_ref()))
}

/// Whether `jws` is a valid detached signature of `content` by `token` (constant-time).
pub fn verify_detached(content: &str, jws: &str, token: &Token) -> bool {
    let Some((header, sig)) = jws.split_once("..") else {
        return false;
    };
    let Ok(header_json) = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(header) else {
        return false;
    };
    let Ok(h) = serde_json::from_slice::<serde_json::Value>(&header_json) else {
        return false;
    };
    if h.get("alg").and_then(|a| a.as_str()) != Some("HS256")
        || h.get("kid").and_then(|k| k.as_str()) != Some(token.id.as_str())
    {
        return false;
    }
    let Ok(sig) = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(sig) else {
        return false;
    };
    let input = format!("{header}.{}", b64url(content.as_bytes()));
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, token.secret.as_bytes());
    ring::hmac::verify(&key, input.as_bytes(), &sig).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn tokens_have_upstreams_exact_form() {
        let t = Token::parse("abcdef.0123456789abcdef").unwrap();
        assert_eq!(t.secret_name(), "bootstrap-token-abcdef");
        assert_eq!(t.user(), "system:bootstrap:abcdef");
        for bad in [
            "abcdef0123456789abcdef",
            "ABCDEF.0123456789abcdef",
            "abcde.0123456789abcdef",
            "abcdef.0123456789abcde",
            "abcdef.0123456789abcdef.x",
        ] {
            assert!(Token::parse(bad).is_none(), "{bad}");
        }
        let g = Token::generate();
        assert_eq!(Token::parse(&g.to_string()), Some(g.clone()));
        assert!(!format!("{g:?}").contains(&g.secret));
    }

    #[test]
    fn a_secret_round_trips_and_expires() {
        let s = TokenSecret {
            token: Token::parse("abcdef.0123456789abcdef"),
            expiration: Some("2026-01-01T00:00:00Z".into()),
            description: "join".into(),
            authentication: true,
            signing: true,
            extra_groups: vec![NODE_GROUP.into()],
        };
        let obj = json!({"type": SECRET_TYPE, "metadata": {"name": "bootstrap-token-abcdef"},
                         "data": s.data()});
        let back = TokenSecret::from_secret(&obj).unwrap();
        assert_eq!(back, s);
        let jan1 = "2026-01-01T00:00:00Z"
            .parse::<jiff::Timestamp>()
            .unwrap()
            .as_second();
        assert!(!back.expired(jan1 - 1));
        assert!(back.expired(jan1));
        assert_eq!(back.groups().unwrap(), [GROUP, NODE_GROUP]);
        // A Secret named for another id, or of another type, is not a token.
        let mut other = obj.clone();
        other["metadata"]["name"] = json!("bootstrap-token-zzzzzz");
        assert!(TokenSecret::from_secret(&other).is_none());
        other = obj.clone();
        other["type"] = json!("Opaque");
        assert!(TokenSecret::from_secret(&other).is_none());
        let bad = TokenSecret {
            extra_groups: vec!["system:masters".into()],
            ..s
        };
        assert!(bad.groups().is_err());
    }

    #[test]
    fn detached_signatures_verify_only_with_the_same_token_and_content() {
        let t = Token::parse("abcdef.0123456789abcdef").unwrap();
        let jws = sign_detached("kubeconfig", &t);
        assert!(jws.contains(".."));
        assert!(verify_detached("kubeconfig", &jws, &t));
        assert!(!verify_detached("kubeconfig2", &jws, &t));
        let other = Token::parse("abcdef.0123456789abcdee").unwrap();
        assert!(!verify_detached("kubeconfig", &jws, &other));
        // The header is upstream's (go-jose) exactly.
        assert_eq!(
            jws.split("..").next().unwrap(),
            b64url(br#"{"alg":"HS256","kid":"abcdef"}"#)
        );
    }
}

//! ServiceAccount tokens: ES256-signed JWTs issued through the TokenRequest subresource and
//! verified as bearer tokens (signature, expiry, audience, and that the ServiceAccount — and
//! the pod it is bound to — still exist).

use base64::Engine;
use ring::rand::SystemRandom;
use ring::signature::{
    ECDSA_P256_SHA256_FIXED, ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair,
    UnparsedPublicKey,
};
use rustls::pki_types::PrivateKeyDer;
use rustls::pki_types::pem::PemObject;
use serde_json::{Value, json};
use std::path::Path;

/// The issuer (and default audience) of the tokens this server signs.
pub const ISSUER: &str = "https://kubernetes.default.svc.cluster.local";

/// The issuer's OIDC discovery document and its key set (upstream's
/// ServiceAccountIssuerDiscovery), each also with a trailing slash.
pub const DISCOVERY_PATHS: [&str; 4] = [
    "/.well-known/openid-configuration",
    "/.well-known/openid-configuration/",
    "/openid/v1/jwks",
    "/openid/v1/jwks/",
];

/// Whether a non-resource path is one of the issuer's discovery documents.
pub fn is_discovery_path(path: &str) -> bool {
    DISCOVERY_PATHS.contains(&path)
}

/// The OIDC discovery document: the issuer, its key set's URL (in-cluster, beside the
/// issuer), and what it signs with.
pub fn openid_configuration() -> Value {
    json!({
        "issuer": ISSUER,
        "jwks_uri": format!("{ISSUER}/openid/v1/jwks"),
        "response_types_supported": ["id_token"],
        "subject_types_supported": ["public"],
        "id_token_signing_alg_values_supported": ["ES256"],
    })
}

/// Loading the signing key failed.
#[derive(Debug, thiserror::Error)]
#[error("service-account signing key {path}: {reason}")]
pub struct KeyError {
    path: String,
    reason: String,
}

/// Signs and verifies ServiceAccount tokens.
pub struct Issuer {
    key: EcdsaKeyPair,
    public: Vec<u8>,
    rng: SystemRandom,
    /// Shortest expiry a TokenRequest may ask for, in seconds (upstream: 600).
    pub min_seconds: i64,
}

impl std::fmt::Debug for Issuer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Issuer").finish_non_exhaustive()
    }
}

fn b64(data: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(data)
}

impl Issuer {
    /// Loads a PKCS#8 ECDSA P-256 key from a PEM file.
    pub fn load(path: &Path, min_seconds: i64) -> Result<Self, KeyError> {
        let err = |reason: String| KeyError {
            path: path.display().to_string(),
            reason,
        };
        let der = match PrivateKeyDer::from_pem_file(path).map_err(|e| err(e.to_string()))? {
            PrivateKeyDer::Pkcs8(k) => k.secret_pkcs8_der().to_vec(),
            _ => return Err(err("not a PKCS#8 key".into())),
        };
        let rng = SystemRandom::new();
        let key = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &der, &rng)
            .map_err(|e| err(e.to_string()))?;
        let public = key.public_key().as_ref().to_vec();
        Ok(Issuer {
            key,
            public,
            rng,
            min_seconds,
        })
    }

    /// The key id tokens name in their header.
    fn kid(&self) -> String {
        b64(&ring::digest::digest(&ring::digest::SHA256, &self.public).as_ref()[..16])
    }

    /// The public key set (JWKS) verifiers check tokens with: the P-256 key as a JWK.
    pub fn jwks(&self) -> Value {
        // An uncompressed point: 0x04, then x and y of 32 bytes each.
        let (x, y) = match self.public.as_slice() {
            [4, rest @ ..] if rest.len() == 64 => rest.split_at(32),
            _ => (&[][..], &[][..]),
        };
        json!({"keys": [{"use": "sig", "kty": "EC", "kid": self.kid(), "crv": "P-256",
            "alg": "ES256", "x": b64(x), "y": b64(y)}]})
    }

    /// Signs a set of claims.
    pub fn sign(&self, claims: &Value) -> String {
        let header = json!({"alg": "ES256", "typ": "JWT", "kid": self.kid()});
        let input = format!(
            "{}.{}",
            b64(header.to_string().as_bytes()),
            b64(claims.to_string().as_bytes())
        );
        let sig = self
            .key
            .sign(&self.rng, input.as_bytes())
            .expect("ECDSA signing");
        format!("{input}.{}", b64(sig.as_ref()))
    }

    /// The claims of a token this server signed that is valid now for our audience.
    pub fn verify(&self, token: &str) -> Option<Value> {
        let mut parts = token.split('.');
        let (h, p, s) = (parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() {
            return None;
        }
        let sig = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(s)
            .ok()?;
        UnparsedPublicKey::new(&ECDSA_P256_SHA256_FIXED, &self.public)
            .verify(format!("{h}.{p}").as_bytes(), &sig)
            .ok()?;
        let claims: Value = serde_json::from_slice(
            &base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(p)
                .ok()?,
        )
        .ok()?;
        let now = jiff::Timestamp::now().as_second();
        if claims.get("exp").and_then(Value::as_i64)? <= now
            || claims.get("nbf").and_then(Value::as_i64).unwrap_or(0) > now + 60
        {
            return None;
        }
        let aud_ok = match claims.get("aud")? {
            Value::String(a) => a == ISSUER,
            Value::Array(a) => a.iter().any(|x| x == ISSUER),
            _ => false,
        };
        (claims.get("iss").and_then(Value::as_str) == Some(ISSUER) && aud_ok).then_some(claims)
    }
}

/// The user of a bootstrap token (`<id>.<secret>`), as upstream's bootstrap authenticator:
/// its `bootstrap-token-<id>` Secret exists, is not being deleted, has not expired, allows
/// authentication and holds the same secret. The user is `system:bootstrap:<id>` in
/// `system:bootstrappers` and the token's extra groups; 401 otherwise.
pub async fn authenticate_bootstrap(
    api: &crate::Api,
    token: &minik8s_types::bootstrap::Token,
) -> crate::error::ApiResult<crate::auth::User> {
    use minik8s_storage::Store;
    use minik8s_types::bootstrap::{NAMESPACE, TokenSecret};
    let unauthorized = crate::error::ApiError::unauthorized;
    let key = format!("/registry/core/secrets/{NAMESPACE}/{}", token.secret_name());
    let kv = api.store.get(&key).await?.ok_or_else(unauthorized)?;
    let obj: Value = serde_json::from_slice(&kv.value).map_err(|_| unauthorized())?;
    if obj.pointer("/metadata/deletionTimestamp").is_some() {
        return Err(unauthorized());
    }
    let secret = TokenSecret::from_secret(&obj).ok_or_else(unauthorized)?;
    let same = secret.token.as_ref().is_some_and(|t| t.matches(token));
    if !same || !secret.authentication || secret.expired(jiff::Timestamp::now().as_second()) {
        tracing::debug!(id = %token.id, "bootstrap token refused");
        return Err(unauthorized());
    }
    let groups = secret.groups().map_err(|e| {
        tracing::warn!(id = %token.id, error = %e, "bootstrap token with bad extra groups");
        unauthorized()
    })?;
    Ok(crate::auth::User::new(token.user(), groups))
}

/// The user a bearer token that is not a static one stands for: a bootstrap token's or a
/// ServiceAccount token's; 401 otherwise.
pub async fn user_of(api: &crate::Api, token: &str) -> crate::error::ApiResult<crate::auth::User> {
    match minik8s_types::bootstrap::Token::parse(token) {
        Some(t) => authenticate_bootstrap(api, &t).await,
        None => authenticate(api, token).await,
    }
}

/// The extra information upstream attaches to a ServiceAccount token's user: the token's
/// id (`credential-id: JTI=…`) and the pod and node it is bound to. `None` for a token this
/// issuer did not sign.
pub fn extra_of(api: &crate::Api, token: &str) -> Option<Value> {
    let claims = api.tokens.as_ref()?.verify(token)?;
    let k = claims.get("kubernetes.io");
    let mut extra = serde_json::Map::new();
    let mut put = |key: &str, v: Option<&str>| {
        if let Some(v) = v.filter(|v| !v.is_empty()) {
            extra.insert(format!("authentication.kubernetes.io/{key}"), json!([v]));
        }
    };
    let text = |p: &str| k.and_then(|k| k.pointer(p)).and_then(Value::as_str);
    put("pod-name", text("/pod/name"));
    put("pod-uid", text("/pod/uid"));
    put("node-name", text("/node/name"));
    put("node-uid", text("/node/uid"));
    let jti = claims
        .get("jti")
        .and_then(Value::as_str)
        .map(|j| format!("JTI={j}"));
    put("credential-id", jti.as_deref());
    Some(Value::Object(extra))
}

/// The user of a ServiceAccount token, if it verifies and its ServiceAccount (and bound pod)
/// still exist; 401 otherwise.
pub async fn authenticate(
    api: &crate::Api,
    token: &str,
) -> crate::error::ApiResult<crate::auth::User> {
    use minik8s_storage::Store;
    let unauthorized = crate::error::ApiError::unauthorized;
    let claims = api
        .tokens
        .as_ref()
        .and_then(|i| i.verify(token))
        .ok_or_else(unauthorized)?;
    let k = claims.get("kubernetes.io").ok_or_else(unauthorized)?;
    let ns = k
        .get("namespace")
        .and_then(Value::as_str)
        .ok_or_else(unauthorized)?;
    let sa = k
        .pointer("/serviceaccount/name")
        .and_then(Value::as_str)
        .ok_or_else(unauthorized)?;
    let sa_uid = k
        .pointer("/serviceaccount/uid")
        .and_then(Value::as_str)
        .unwrap_or("");
    let exists = |key: String, uid: String| async move {
        match api.store.get(&key).await {
            Ok(Some(kv)) => serde_json::from_slice::<Value>(&kv.value)
                .ok()
                .is_some_and(|o| {
                    o.pointer("/metadata/uid").and_then(Value::as_str) == Some(uid.as_str())
                }),
            _ => false,
        }
    };
    if !exists(
        format!("/registry/core/serviceaccounts/{ns}/{sa}"),
        sa_uid.to_owned(),
    )
    .await
    {
        return Err(unauthorized());
    }
    // The object the token is bound to must still be there (a pod-bound token names its
    // pod's node too, which is not checked, as upstream).
    let bound = match (k.get("pod"), k.get("secret"), k.get("node")) {
        (Some(pod), _, _) => Some((pod, "pods", true)),
        (None, Some(secret), _) => Some((secret, "secrets", true)),
        (None, None, Some(node)) => Some((node, "nodes", false)),
        _ => None,
    };
    if let Some((object, plural, namespaced)) = bound {
        let name = object.get("name").and_then(Value::as_str).unwrap_or("");
        let uid = object.get("uid").and_then(Value::as_str).unwrap_or("");
        let key = match namespaced {
            true => format!("/registry/core/{plural}/{ns}/{name}"),
            false => format!("/registry/core/{plural}/{name}"),
        };
        if !exists(key, uid.to_owned()).await {
            return Err(unauthorized());
        }
    }
    Ok(crate::auth::User::new(
        format!("system:serviceaccount:{ns}:{sa}"),
        vec![
            "system:serviceaccounts".into(),
            format!("system:serviceaccounts:{ns}"),
        ],
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn issuer() -> (tempfile::TempDir, Issuer) {
        let dir = tempfile::tempdir().unwrap();
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
        let pem = format!(
            "-----BEGIN PRIVATE KEY-----\n{}\n-----END PRIVATE KEY-----\n",
            base64::engine::general_purpose::STANDARD.encode(pkcs8.as_ref())
        );
        let path = dir.path().join("sa.key");
        std::fs::write(&path, pem).unwrap();
        let i = Issuer::load(&path, 600).unwrap();
        (dir, i)
    }

    #[test]
    fn signed_tokens_verify_until_they_expire_and_tampering_fails() {
        let (_d, i) = issuer();
        let now = jiff::Timestamp::now().as_second();
        let good = i.sign(
            &json!({"iss": ISSUER, "aud": [ISSUER], "sub": "x", "exp": now + 60, "iat": now}),
        );
        assert_eq!(i.verify(&good).unwrap()["sub"], "x");
        let expired = i.sign(&json!({"iss": ISSUER, "aud": [ISSUER], "exp": now - 1}));
        assert!(i.verify(&expired).is_none());
        let other_aud = i.sign(&json!({"iss": ISSUER, "aud": ["vault"], "exp": now + 60}));
        assert!(i.verify(&other_aud).is_none());
        let mut forged = good.clone();
        forged.insert(good.find('.').unwrap() + 3, 'A');
        assert!(i.verify(&forged).is_none());
    }
}

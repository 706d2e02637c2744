//! Certificate signing requests: making one (a joining kubelet's key and PKCS#10 request),
//! reading one (what the approver and the signer check), signing one with the cluster CA (the
//! CSR signing controller), and the CA public-key pin `sha256:<hex>` a join checks.

use crate::pki::{cert_err, read};
use crate::{Error, Result};
use rcgen::{
    CertificateParams, CertificateSigningRequestParams, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType, SerialNumber,
};
use std::path::Path;
use x509_parser::prelude::FromDer;

/// A new private key and a PEM certificate request for subject `cn` (CN) in `orgs` (O).
/// Returns `(key_pem, csr_pem)`.
pub fn new_request(cn: &str, orgs: &[&str]) -> Result<(String, String)> {
    new_request_with_sans(cn, orgs, &[])
}

/// As [`new_request`], with subject alternative names (`sans`: IP addresses or DNS names),
/// for a serving certificate.
pub fn new_request_with_sans(cn: &str, orgs: &[&str], sans: &[String]) -> Result<(String, String)> {
    let mut p = CertificateParams::new(sans.to_vec()).map_err(cert_err(cn))?;
    let mut dn = DistinguishedName::new();
    for o in orgs {
        dn.push(DnType::OrganizationName, *o);
    }
    dn.push(DnType::CommonName, cn);
    p.distinguished_name = dn;
    let key = KeyPair::generate().map_err(cert_err("key"))?;
    let csr = p.serialize_request(&key).map_err(cert_err("request"))?;
    Ok((
        key.serialize_pem(),
        csr.pem().map_err(cert_err("request PEM"))?,
    ))
}

/// What a certificate request asks for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Request {
    /// The subject's common name.
    pub common_name: String,
    /// The subject's organizations.
    pub organizations: Vec<String>,
    /// DNS subject alternative names.
    pub dns_names: Vec<String>,
    /// IP subject alternative names.
    pub ips: Vec<std::net::IpAddr>,
    /// Whether it has other SANs (email, URI).
    pub other_names: bool,
}

/// Why a request was refused or could not be signed.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    /// Not a PEM `CERTIFICATE REQUEST` that parses with a valid signature.
    #[error("the request does not parse: {0}")]
    Parse(String),
    /// A usage the signer cannot put in a certificate.
    #[error("unsupported usage {0:?}")]
    Usage(String),
    /// Signing failed.
    #[error("signing: {0}")]
    Sign(String),
}

/// Reads a PEM certificate request (its signature verified).
pub fn parse_request(pem: &str) -> std::result::Result<Request, RequestError> {
    let params = CertificateSigningRequestParams::from_pem(pem)
        .map_err(|e| RequestError::Parse(e.to_string()))?;
    let mut out = Request::default();
    for (ty, value) in params.params.distinguished_name.iter() {
        let text = match value {
            rcgen::DnValue::PrintableString(s) => s.as_str().to_owned(),
            rcgen::DnValue::Utf8String(s) => s.clone(),
            other => format!("{other:?}"),
        };
        match ty {
            DnType::CommonName => out.common_name = text,
            DnType::OrganizationName => out.organizations.push(text),
            _ => {}
        }
    }
    for san in &params.params.subject_alt_names {
        match san {
            SanType::DnsName(n) => out.dns_names.push(n.as_str().to_owned()),
            SanType::IpAddress(ip) => out.ips.push(*ip),
            _ => out.other_names = true,
        }
    }
    Ok(out)
}

/// The cluster CA as a signer of approved requests.
pub struct Signer {
    issuer: Issuer<'static, KeyPair>,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signer").finish_non_exhaustive()
    }
}

impl Signer {
    /// Loads the CA certificate and key (PEM files).
    pub fn load(cert: &Path, key: &Path) -> Result<Self> {
        let ca_pem = read(cert)?;
        let ca_key = KeyPair::from_pem(&read(key)?).map_err(cert_err("CA key"))?;
        let issuer = Issuer::from_ca_cert_pem(&ca_pem, ca_key).map_err(cert_err("CA"))?;
        Ok(Signer { issuer })
    }

    /// Signs a PEM request for `seconds` with the given usages (upstream's names, such as
    /// `client auth`); the subject and SANs are the request's. Returns the PEM certificate.
    pub fn sign(
        &self,
        pem: &str,
        usages: &[String],
        seconds: i64,
    ) -> std::result::Result<String, RequestError> {
        let mut req = CertificateSigningRequestParams::from_pem(pem)
            .map_err(|e| RequestError::Parse(e.to_string()))?;
        let p = &mut req.params;
        p.key_usages.clear();
        p.extended_key_usages.clear();
        for u in usages {
            match u.as_str() {
                "signing" | "digital signature" => {
                    p.key_usages.push(KeyUsagePurpose::DigitalSignature)
                }
                "content commitment" => p.key_usages.push(KeyUsagePurpose::ContentCommitment),
                "key encipherment" => p.key_usages.push(KeyUsagePurpose::KeyEncipherment),
                "key agreement" => p.key_usages.push(KeyUsagePurpose::KeyAgreement),
                "data encipherment" => p.key_usages.push(KeyUsagePurpose::DataEncipherment),
                "cert sign" => p.key_usages.push(KeyUsagePurpose::KeyCertSign),
                "crl sign" => p.key_usages.push(KeyUsagePurpose::CrlSign),
                "encipher only" => p.key_usages.push(KeyUsagePurpose::EncipherOnly),
                "decipher only" => p.key_usages.push(KeyUsagePurpose::DecipherOnly),
                "any" => p.extended_key_usages.push(ExtendedKeyUsagePurpose::Any),
                "server auth" => p
                    .extended_key_usages
                    .push(ExtendedKeyUsagePurpose::ServerAuth),
                "client auth" => p
                    .extended_key_usages
                    .push(ExtendedKeyUsagePurpose::ClientAuth),
                "code signing" => p
                    .extended_key_usages
                    .push(ExtendedKeyUsagePurpose::CodeSigning),
                "email protection" => p
                    .extended_key_usages
                    .push(ExtendedKeyUsagePurpose::EmailProtection),
                "timestamping" => p
                    .extended_key_usages
                    .push(ExtendedKeyUsagePurpose::TimeStamping),
                "ocsp signing" => p
                    .extended_key_usages
                    .push(ExtendedKeyUsagePurpose::OcspSigning),
                other => return Err(RequestError::Usage(other.to_owned())),
            }
        }
        p.is_ca = IsCa::ExplicitNoCa;
        let now = time::OffsetDateTime::now_utc();
        // Backdated as upstream's signer does, so a slightly slow clock still accepts it (by
        // at most a tenth of a short lifetime, so its renewal point stays in the future).
        p.not_before = now - time::Duration::seconds((seconds / 10).min(300));
        p.not_after = now + time::Duration::seconds(seconds);
        let mut serial = [0u8; 16];
        rand::RngCore::fill_bytes(&mut rand::rng(), &mut serial);
        serial[0] &= 0x7f;
        p.serial_number = Some(SerialNumber::from_slice(&serial));
        p.use_authority_key_identifier_extension = true;
        let cert = req
            .signed_by(&self.issuer)
            .map_err(|e| RequestError::Sign(e.to_string()))?;
        Ok(cert.pem())
    }
}

/// The pin of a CA certificate (PEM) as kubeadm prints it: `sha256:` and the hex SHA-256 of
/// its DER SubjectPublicKeyInfo.
pub fn ca_hash(ca_pem: &str) -> Result<String> {
    let digest = with_cert(ca_pem, |cert| {
        ring::digest::digest(&ring::digest::SHA256, cert.public_key().raw)
    })?;
    Ok(format!(
        "sha256:{}",
        digest
            .as_ref()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    ))
}

/// When a PEM certificate starts and stops being valid, as Unix seconds.
pub fn validity(cert_pem: &str) -> Result<(i64, i64)> {
    with_cert(cert_pem, |cert| {
        let v = cert.validity();
        (v.not_before.timestamp(), v.not_after.timestamp())
    })
}

/// `f` of the first certificate in a PEM.
fn with_cert<T>(
    pem: &str,
    f: impl FnOnce(&x509_parser::certificate::X509Certificate<'_>) -> T,
) -> Result<T> {
    let der = rustls::pki_types::CertificateDer::pem_slice_iter(pem.as_bytes())
        .next()
        .and_then(|c| c.ok())
        .ok_or_else(|| Error::Invalid("no certificate in the PEM".into()))?;
    let (_, cert) = x509_parser::certificate::X509Certificate::from_der(&der)
        .map_err(|e| Error::Invalid(format!("the certificate does not parse: {e}")))?;
    Ok(f(&cert))
}

use rustls::pki_types::pem::PemObject;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_is_read_signed_and_chains_to_the_ca() {
        let dir = tempfile::tempdir().unwrap();
        let pki = crate::Pki::init(crate::PkiOptions {
            dir: dir.path().into(),
            cluster_name: "t".into(),
            server: "https://127.0.0.1:6443".into(),
            hostnames: vec![],
            ips: vec![],
        })
        .unwrap();
        let (_key, csr) = new_request("system:node:n1", &["system:nodes"]).unwrap();
        let req = parse_request(&csr).unwrap();
        assert_eq!(req.common_name, "system:node:n1");
        assert_eq!(req.organizations, ["system:nodes"]);
        assert!(req.dns_names.is_empty() && req.ips.is_empty() && !req.other_names);
        let signer = Signer::load(&dir.path().join("ca.crt"), &dir.path().join("ca.key")).unwrap();
        let usages = ["digital signature".to_owned(), "client auth".to_owned()];
        let cert = signer.sign(&csr, &usages, 3600).unwrap();
        let left = validity(&cert).unwrap().1 - jiff::Timestamp::now().as_second();
        assert!((3590..=3600).contains(&left), "{left}");
        let der = rustls::pki_types::CertificateDer::pem_slice_iter(cert.as_bytes())
            .next()
            .unwrap()
            .unwrap();
        let (_, parsed) = x509_parser::certificate::X509Certificate::from_der(&der).unwrap();
        let ca_der = rustls::pki_types::CertificateDer::pem_slice_iter(pki.ca_pem().as_bytes())
            .next()
            .unwrap()
            .unwrap();
        let (_, ca) = x509_parser::certificate::X509Certificate::from_der(&ca_der).unwrap();
        parsed.verify_signature(Some(ca.public_key())).unwrap();
        assert!(
            parsed
                .extended_key_usage()
                .unwrap()
                .unwrap()
                .value
                .client_auth
        );
        assert!(signer.sign(&csr, &["bogus".into()], 3600).is_err());
        assert!(parse_request("not a request").is_err());
        let hash = ca_hash(pki.ca_pem()).unwrap();
        assert!(hash.starts_with("sha256:") && hash.len() == 7 + 64);
    }
}

//! The spec validators of CertificateSigningRequests (upstream's `pkg/apis/certificates/validation`).

use super::*;

/// The key usages a CSR may ask for (upstream's `KeyUsage` values).
const KEY_USAGES: [&str; 22] = [
    "signing",
    "digital signature",
    "content commitment",
    "key encipherment",
    "key agreement",
    "data encipherment",
    "cert sign",
    "crl sign",
    "encipher only",
    "decipher only",
    "any",
    "server auth",
    "client auth",
    "code signing",
    "email protection",
    "s/mime",
    "ipsec end system",
    "ipsec tunnel",
    "ipsec user",
    "timestamping",
    "ocsp signing",
    "microsoft sgc",
];

/// The PEM blocks of base64-encoded `field` (a `[]byte` in JSON): their labels and DER.
pub(crate) fn pem_blocks(v: &Value) -> Option<Vec<(String, Vec<u8>)>> {
    use base64::Engine;
    let raw = base64::engine::general_purpose::STANDARD
        .decode(v.as_str()?)
        .ok()?;
    let mut out = Vec::new();
    for item in rustls::pki_types::pem::PemObject::pem_slice_iter(&raw) {
        let (kind, der): (rustls::pki_types::pem::SectionKind, Vec<u8>) = item.ok()?;
        let label = match kind {
            rustls::pki_types::pem::SectionKind::Certificate => "CERTIFICATE",
            rustls::pki_types::pem::SectionKind::Csr => "CERTIFICATE REQUEST",
            _ => "OTHER",
        };
        out.push((label.to_owned(), der));
    }
    Some(out)
}

/// A CertificateSigningRequest (upstream's `ValidateCertificateSigningRequestCreate` and the
/// condition rules of its status and approval updates).
pub(crate) fn csr(obj: &Value, causes: &mut Vec<Cause>) {
    use x509_parser::prelude::FromDer;
    let spec = obj.get("spec");
    match spec.and_then(|s| s.get("request")) {
        None => causes.push(Cause::required("spec.request", "")),
        Some(req) => {
            let blocks = pem_blocks(req).unwrap_or_default();
            let parsed = match blocks.first() {
                Some((label, der)) if label == "CERTIFICATE REQUEST" => {
                    x509_parser::certification_request::X509CertificationRequest::from_der(der)
                        .map(|_| ())
                        .map_err(|e| format!("the CSR does not parse: {e}"))
                }
                _ => Err("PEM block type must be CERTIFICATE REQUEST".to_owned()),
            };
            if let Err(msg) = parsed {
                causes.push(Cause::invalid("spec.request", "[]byte{...}", &msg));
            }
        }
    }
    match str_at(spec, "signerName") {
        None | Some("") => causes.push(Cause::required("spec.signerName", "")),
        Some("kubernetes.io/legacy-unknown") => causes.push(Cause::invalid(
            "spec.signerName",
            "kubernetes.io/legacy-unknown",
            "the legacy signerName is not allowed via this API version",
        )),
        Some(name) => {
            let ok = name.split_once('/').is_some_and(|(domain, path)| {
                is_subdomain(domain)
                    && !path.is_empty()
                    && path.len() <= 253
                    && path
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
            });
            if !ok {
                causes.push(Cause::invalid(
                    "spec.signerName",
                    name,
                    "must be a fully qualified domain and path of the form 'example.com/signer-name'",
                ));
            }
        }
    }
    if let Some(secs) = int(spec, "expirationSeconds")
        && secs < 600
    {
        causes.push(Cause::invalid(
            "spec.expirationSeconds",
            &secs.to_string(),
            "may not specify a duration less than 600 seconds (10 minutes)",
        ));
    }
    if let Some(spec) = spec {
        for (i, u) in items(spec, "usages") {
            let u = u.as_str().unwrap_or("");
            if !KEY_USAGES.contains(&u) {
                causes.push(Cause::not_supported(
                    &format!("spec.usages[{i}]"),
                    u,
                    &KEY_USAGES,
                ));
            }
        }
    }
    let status = obj.get("status");
    let mut seen = HashSet::new();
    if let Some(status) = status {
        for (i, c) in items(status, "conditions") {
            let ty = str_at(Some(c), "type").unwrap_or("");
            let path = format!("status.conditions[{i}]");
            if ty.is_empty() {
                causes.push(Cause::required(&format!("{path}.type"), ""));
            }
            let st = str_at(Some(c), "status").unwrap_or("");
            if ["Approved", "Denied", "Failed"].contains(&ty) {
                if !seen.insert(ty.to_owned()) {
                    causes.push(Cause::duplicate(&format!("{path}.type"), ty));
                }
                if st != "True" && !(ty == "Failed" && st.is_empty()) {
                    causes.push(Cause::not_supported(
                        &format!("{path}.status"),
                        st,
                        &["True"],
                    ));
                }
            } else if !["True", "False", "Unknown"].contains(&st) {
                causes.push(Cause::not_supported(
                    &format!("{path}.status"),
                    st,
                    &["False", "True", "Unknown"],
                ));
            }
        }
        if let Some(cert) = status.get("certificate") {
            let ok = pem_blocks(cert).is_some_and(|b| {
                !b.is_empty()
                    && b.iter().all(|(label, der)| {
                        label == "CERTIFICATE"
                            && x509_parser::certificate::X509Certificate::from_der(der).is_ok()
                    })
            });
            if !ok {
                causes.push(Cause::invalid(
                    "status.certificate",
                    "<certificate data>",
                    "must contain at least one CERTIFICATE PEM block",
                ));
            }
        }
    }
    if seen.contains("Approved") && seen.contains("Denied") {
        causes.push(Cause::invalid(
            "status.conditions",
            "Approved",
            "Approved and Denied conditions are mutually exclusive",
        ));
    }
}

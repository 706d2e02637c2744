//! The cluster CA and the certificates it signs.
//!
//! Files in the PKI folder: `ca.crt`/`ca.key` (created once, never overwritten),
//! `apiserver.crt`/`apiserver.key` (reissued on every `init`, so new host names and IPs take
//! effect), and per identity `<name>.crt`/`<name>.key`/`<name>.kubeconfig` (kept once made).
//! Every file is written with mode 0600.

use crate::{Error, Kubeconfig, Result};
use rand::RngCore;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType, SerialNumber,
};
use std::io::Write;
use std::net::IpAddr;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use time::{Duration, OffsetDateTime};

/// What to make the PKI for.
#[derive(Clone, Debug)]
pub struct PkiOptions {
    /// The folder holding every file.
    pub dir: PathBuf,
    /// The cluster's name in kubeconfigs.
    pub cluster_name: String,
    /// The apiserver URL written into kubeconfigs.
    pub server: String,
    /// Extra DNS names of the apiserver (localhost, the host name and the in-cluster names are always there).
    pub hostnames: Vec<String>,
    /// Extra IP addresses of the apiserver (127.0.0.1 and ::1 are always there).
    pub ips: Vec<IpAddr>,
}

/// A client identity: one certificate (CN = user, O = groups) and one kubeconfig.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// The file stem (`admin` → `admin.crt`, `admin.kubeconfig`).
    pub file: String,
    /// The user name (certificate CN).
    pub user: String,
    /// The groups (certificate O).
    pub groups: Vec<String>,
}

impl Identity {
    /// An identity named `file` for `user` in `groups`.
    pub fn new(file: &str, user: &str, groups: &[&str]) -> Self {
        Identity {
            file: file.into(),
            user: user.into(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
        }
    }

    /// The cluster administrator, in `system:masters`.
    pub fn admin() -> Self {
        Identity::new("admin", "minik8s-admin", &["system:masters"])
    }

    /// The identities of the cluster's own components (the kubelet's for node `node`).
    pub fn components(node: &str) -> Vec<Self> {
        vec![
            Identity::new("controller-manager", "system:kube-controller-manager", &[]),
            Identity::new("scheduler", "system:kube-scheduler", &[]),
            Identity::new("proxy", "system:kube-proxy", &[]),
            Identity::new("kubelet", &format!("system:node:{node}"), &["system:nodes"]),
            Identity::new(
                "apiserver-kubelet-client",
                "minik8s-apiserver",
                &["system:masters"],
            ),
        ]
    }
}

/// Paths of the apiserver's serving certificate and key.
#[derive(Clone, Debug)]
pub struct ServingCert {
    /// PEM certificate.
    pub cert: PathBuf,
    /// PEM private key.
    pub key: PathBuf,
}

/// The aggregation layer's front proxy: its own CA (upstream's `requestheader` CA, which
/// extension apiservers trust for `X-Remote-User`) and the client certificate the apiserver
/// presents to them (CN `front-proxy-client`, as kubeadm names it).
#[derive(Clone, Debug)]
pub struct FrontProxy {
    /// The front-proxy CA certificate (PEM).
    pub ca: PathBuf,
    /// The client certificate (PEM).
    pub cert: PathBuf,
    /// Its key (PEM).
    pub key: PathBuf,
}

/// The CN of the front proxy's client certificate (the allowed name extension apiservers check).
pub const FRONT_PROXY_CLIENT: &str = "front-proxy-client";

/// The cluster's PKI folder with its loaded CA.
pub struct Pki {
    options: PkiOptions,
    ca_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl std::fmt::Debug for Pki {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pki")
            .field("dir", &self.options.dir)
            .finish()
    }
}

pub(crate) fn cert_err(what: impl Into<String>) -> impl FnOnce(rcgen::Error) -> Error {
    let what = what.into();
    move |source| Error::Cert { what, source }
}

pub(crate) fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|source| Error::Io {
        what: "reading",
        path: path.into(),
        source,
    })
}

/// Writes a file readable only by its owner, replacing it atomically.
pub(crate) fn write_private(path: &Path, data: &[u8]) -> Result<()> {
    let io = |what| {
        let path = path.to_path_buf();
        move |source| Error::Io { what, path, source }
    };
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(io("creating"))?;
    f.write_all(data).map_err(io("writing"))?;
    f.sync_all().map_err(io("syncing"))?;
    std::fs::rename(&tmp, path).map_err(io("renaming into place"))
}

fn params(cn: &str, orgs: &[String], days: i64) -> Result<CertificateParams> {
    let mut p = CertificateParams::new(Vec::<String>::new()).map_err(cert_err(cn))?;
    let mut dn = DistinguishedName::new();
    for o in orgs {
        dn.push(DnType::OrganizationName, o.as_str());
    }
    dn.push(DnType::CommonName, cn);
    p.distinguished_name = dn;
    let now = OffsetDateTime::now_utc();
    p.not_before = now - Duration::minutes(5);
    p.not_after = now + Duration::days(days);
    let mut serial = [0u8; 16];
    rand::rng().fill_bytes(&mut serial);
    serial[0] &= 0x7f; // a positive integer
    p.serial_number = Some(SerialNumber::from_slice(&serial));
    Ok(p)
}

impl Pki {
    /// Loads the CA from `options.dir`, creating it (and the folder) if it is not there yet.
    pub fn init(options: PkiOptions) -> Result<Self> {
        let dir = &options.dir;
        std::fs::create_dir_all(dir).map_err(|source| Error::Io {
            what: "creating",
            path: dir.clone(),
            source,
        })?;
        let (crt, key) = (dir.join("ca.crt"), dir.join("ca.key"));
        if !crt.exists() || !key.exists() {
            let mut p = params("minik8s-ca", &[], 3650)?;
            p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            p.key_usages = vec![
                KeyUsagePurpose::KeyCertSign,
                KeyUsagePurpose::CrlSign,
                KeyUsagePurpose::DigitalSignature,
            ];
            let k = KeyPair::generate().map_err(cert_err("CA key"))?;
            let cert = p.self_signed(&k).map_err(cert_err("CA"))?;
            write_private(&key, k.serialize_pem().as_bytes())?;
            write_private(&crt, cert.pem().as_bytes())?;
            tracing::info!(dir = %dir.display(), "created cluster CA");
        }
        let ca_pem = read(&crt)?;
        let ca_key = KeyPair::from_pem(&read(&key)?).map_err(cert_err("CA key"))?;
        let issuer = Issuer::from_ca_cert_pem(&ca_pem, ca_key).map_err(cert_err("CA"))?;
        Ok(Pki {
            options,
            ca_pem,
            issuer,
        })
    }

    /// The front-proxy CA and client certificate (`front-proxy-ca.*`, `front-proxy-client.*`),
    /// made once, as kubeadm's.
    pub fn front_proxy(&self) -> Result<FrontProxy> {
        let dir = &self.options.dir;
        let out = FrontProxy {
            ca: dir.join("front-proxy-ca.crt"),
            cert: dir.join("front-proxy-client.crt"),
            key: dir.join("front-proxy-client.key"),
        };
        let ca_key = dir.join("front-proxy-ca.key");
        if !out.ca.exists() || !ca_key.exists() {
            let mut p = params("front-proxy-ca", &[], 3650)?;
            p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            p.key_usages = vec![
                KeyUsagePurpose::KeyCertSign,
                KeyUsagePurpose::CrlSign,
                KeyUsagePurpose::DigitalSignature,
            ];
            let k = KeyPair::generate().map_err(cert_err("front-proxy CA key"))?;
            let cert = p.self_signed(&k).map_err(cert_err("front-proxy CA"))?;
            write_private(&ca_key, k.serialize_pem().as_bytes())?;
            write_private(&out.ca, cert.pem().as_bytes())?;
            // A new CA invalidates the old client certificate.
            let _ = std::fs::remove_file(&out.cert);
        }
        if !out.cert.exists() || !out.key.exists() {
            let ca_pem = read(&out.ca)?;
            let issuer = Issuer::from_ca_cert_pem(
                &ca_pem,
                KeyPair::from_pem(&read(&ca_key)?).map_err(cert_err("front-proxy CA key"))?,
            )
            .map_err(cert_err("front-proxy CA"))?;
            let mut p = params(FRONT_PROXY_CLIENT, &[], 365)?;
            p.key_usages = vec![
                KeyUsagePurpose::DigitalSignature,
                KeyUsagePurpose::KeyEncipherment,
            ];
            p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
            let k = KeyPair::generate().map_err(cert_err("front-proxy-client key"))?;
            let cert = p
                .signed_by(&k, &issuer)
                .map_err(cert_err("front-proxy-client"))?;
            write_private(&out.key, k.serialize_pem().as_bytes())?;
            write_private(&out.cert, cert.pem().as_bytes())?;
        }
        Ok(out)
    }

    /// The key that signs ServiceAccount tokens (`sa.key`, ECDSA P-256, PKCS#8 PEM), made once.
    pub fn service_account_key(&self) -> Result<PathBuf> {
        let path = self.options.dir.join("sa.key");
        if !path.exists() {
            let k = KeyPair::generate().map_err(cert_err("service-account key"))?;
            write_private(&path, k.serialize_pem().as_bytes())?;
        }
        Ok(path)
    }

    /// The CA certificate in PEM.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The path of the CA certificate.
    pub fn ca_path(&self) -> PathBuf {
        self.options.dir.join("ca.crt")
    }

    /// The path of an identity's kubeconfig.
    pub fn kubeconfig_path(&self, identity: &Identity) -> PathBuf {
        self.options
            .dir
            .join(format!("{}.kubeconfig", identity.file))
    }

    /// Issues the apiserver's serving certificate for every name it may be reached by.
    pub fn issue_serving_cert(&self) -> Result<ServingCert> {
        let mut p = params("minik8s-apiserver", &[], 365)?;
        let mut names: Vec<String> = vec![
            "localhost".into(),
            "kubernetes".into(),
            "kubernetes.default".into(),
            "kubernetes.default.svc".into(),
            "kubernetes.default.svc.cluster.local".into(),
        ];
        if let Ok(host) = std::fs::read_to_string("/proc/sys/kernel/hostname") {
            names.push(host.trim().to_owned());
        }
        names.extend(self.options.hostnames.iter().cloned());
        names.sort();
        names.dedup();
        names.retain(|n| !n.is_empty());
        // The `kubernetes` Service's ClusterIP (the first of 10.96.0.0/12) too: pods reach the
        // apiserver there (upstream's apiserver puts its service IP in its certificate).
        let mut ips: Vec<IpAddr> = vec![
            "127.0.0.1".parse().expect("ip"),
            "::1".parse().expect("ip"),
            "10.96.0.1".parse().expect("ip"),
        ];
        ips.extend(self.options.ips.iter().copied());
        ips.sort();
        ips.dedup();
        for n in &names {
            let n = n
                .clone()
                .try_into()
                .map_err(cert_err(format!("DNS name {n}")))?;
            p.subject_alt_names.push(SanType::DnsName(n));
        }
        p.subject_alt_names
            .extend(ips.into_iter().map(SanType::IpAddress));
        p.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let k = KeyPair::generate().map_err(cert_err("apiserver key"))?;
        let cert = p
            .signed_by(&k, &self.issuer)
            .map_err(cert_err("apiserver"))?;
        let out = ServingCert {
            cert: self.options.dir.join("apiserver.crt"),
            key: self.options.dir.join("apiserver.key"),
        };
        write_private(&out.key, k.serialize_pem().as_bytes())?;
        write_private(&out.cert, cert.pem().as_bytes())?;
        Ok(out)
    }

    /// Issues a client certificate for `identity` and writes its kubeconfig, unless it exists.
    /// Returns the kubeconfig's path.
    pub fn ensure_identity(&self, identity: &Identity) -> Result<PathBuf> {
        let path = self.kubeconfig_path(identity);
        if path.exists() {
            return Ok(path);
        }
        let mut p = params(&identity.user, &identity.groups, 365)?;
        p.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let k = KeyPair::generate().map_err(cert_err(format!("{} key", identity.file)))?;
        let cert = p
            .signed_by(&k, &self.issuer)
            .map_err(cert_err(identity.file.clone()))?;
        let (cert_pem, key_pem) = (cert.pem(), k.serialize_pem());
        let dir = &self.options.dir;
        write_private(
            &dir.join(format!("{}.key", identity.file)),
            key_pem.as_bytes(),
        )?;
        write_private(
            &dir.join(format!("{}.crt", identity.file)),
            cert_pem.as_bytes(),
        )?;
        Kubeconfig::new(
            &self.options.cluster_name,
            &self.options.server,
            &self.ca_pem,
            &identity.user,
            Kubeconfig::cert_user(&cert_pem, &key_pem),
        )
        .write(&path)?;
        Ok(path)
    }
}

/// The files of an etcd cluster's TLS, as kubeadm lays them out: `etcd/server.*` (client
/// URLs), `etcd/peer.*` (between members) and `apiserver-etcd-client.*` (the apiserver's
/// client certificate), every one signed by the cluster CA.
#[derive(Clone, Debug)]
pub struct EtcdCerts {
    /// The CA certificate members and clients verify each other with.
    pub ca: PathBuf,
    /// The members' serving certificate and key (server and client auth).
    pub server: (PathBuf, PathBuf),
    /// The members' peer certificate and key (server and client auth).
    pub peer: (PathBuf, PathBuf),
    /// The apiserver's client certificate and key.
    pub client: (PathBuf, PathBuf),
}

/// The apiserver's etcd client certificate's CN (kubeadm's).
pub const ETCD_CLIENT: &str = "kube-apiserver-etcd-client";

impl Pki {
    /// The etcd certificates (see [`EtcdCerts`]) for members reached at `ips` (loopback and
    /// `localhost` always): issued when missing, or when `ips` names an address the
    /// members' certificates do not.
    pub fn ensure_etcd_certs(&self, ips: &[IpAddr]) -> Result<EtcdCerts> {
        let dir = &self.options.dir;
        let etcd = dir.join("etcd");
        std::fs::create_dir_all(&etcd).map_err(|source| Error::Io {
            what: "creating",
            path: etcd.clone(),
            source,
        })?;
        let pair = |stem: &str| {
            (
                etcd.join(format!("{stem}.crt")),
                etcd.join(format!("{stem}.key")),
            )
        };
        let out = EtcdCerts {
            ca: self.ca_path(),
            server: pair("server"),
            peer: pair("peer"),
            client: (
                dir.join("apiserver-etcd-client.crt"),
                dir.join("apiserver-etcd-client.key"),
            ),
        };
        let mut all_ips: Vec<IpAddr> =
            vec!["127.0.0.1".parse().expect("ip"), "::1".parse().expect("ip")];
        all_ips.extend(ips.iter().copied());
        all_ips.sort();
        all_ips.dedup();
        // The IPs a member certificate names, one per line beside it, to know when to reissue.
        let ips_file = etcd.join("ips");
        let wanted = all_ips
            .iter()
            .map(|ip| format!("{ip}\n"))
            .collect::<String>();
        let current = std::fs::read_to_string(&ips_file).unwrap_or_default();
        for (stem, (crt, key)) in [("server", &out.server), ("peer", &out.peer)] {
            if crt.exists() && key.exists() && current == wanted {
                continue;
            }
            let mut p = params(&format!("minik8s-etcd-{stem}"), &[], 365)?;
            p.subject_alt_names.push(SanType::DnsName(
                "localhost".try_into().map_err(cert_err("localhost"))?,
            ));
            p.subject_alt_names
                .extend(all_ips.iter().copied().map(SanType::IpAddress));
            p.key_usages = vec![
                KeyUsagePurpose::DigitalSignature,
                KeyUsagePurpose::KeyEncipherment,
            ];
            p.extended_key_usages = vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ];
            let k = KeyPair::generate().map_err(cert_err(format!("etcd {stem} key")))?;
            let cert = p
                .signed_by(&k, &self.issuer)
                .map_err(cert_err(format!("etcd {stem}")))?;
            write_private(key, k.serialize_pem().as_bytes())?;
            write_private(crt, cert.pem().as_bytes())?;
        }
        write_private(&ips_file, wanted.as_bytes())?;
        let (crt, key) = &out.client;
        if !crt.exists() || !key.exists() {
            let mut p = params(ETCD_CLIENT, &[], 365)?;
            p.key_usages = vec![
                KeyUsagePurpose::DigitalSignature,
                KeyUsagePurpose::KeyEncipherment,
            ];
            p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
            let k = KeyPair::generate().map_err(cert_err("etcd client key"))?;
            let cert = p
                .signed_by(&k, &self.issuer)
                .map_err(cert_err("etcd client"))?;
            write_private(key, k.serialize_pem().as_bytes())?;
            write_private(crt, cert.pem().as_bytes())?;
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn options(dir: &Path) -> PkiOptions {
        PkiOptions {
            dir: dir.into(),
            cluster_name: "minik8s".into(),
            server: "https://127.0.0.1:6443".into(),
            hostnames: vec!["node-a".into()],
            ips: vec!["10.1.2.3".parse().unwrap()],
        }
    }

    #[test]
    fn etcd_certs_are_made_once_and_reissued_for_new_member_addresses() {
        let dir = tempfile::tempdir().unwrap();
        let pki = Pki::init(options(dir.path())).unwrap();
        let certs = pki.ensure_etcd_certs(&[]).unwrap();
        let read = |p: &Path| std::fs::read_to_string(p).unwrap();
        let (server, client) = (read(&certs.server.0), read(&certs.client.0));
        for p in [&certs.server.1, &certs.peer.1, &certs.client.1] {
            let mode = std::fs::metadata(p).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600, "{}", p.display());
        }
        // The same addresses: kept.
        let again = pki.ensure_etcd_certs(&[]).unwrap();
        assert_eq!(read(&again.server.0), server);
        // A member address they do not name: the members' certificates are reissued, the
        // apiserver's client certificate is kept.
        let moved = pki
            .ensure_etcd_certs(&["10.250.0.2".parse().unwrap()])
            .unwrap();
        assert_ne!(read(&moved.server.0), server);
        assert_eq!(read(&moved.client.0), client);
    }

    #[test]
    fn init_creates_a_ca_once_and_keeps_it() {
        let dir = tempfile::tempdir().unwrap();
        let first = Pki::init(options(dir.path())).unwrap().ca_pem().to_owned();
        let second = Pki::init(options(dir.path())).unwrap().ca_pem().to_owned();
        assert_eq!(first, second, "re-running must not replace the CA");
        for f in ["ca.crt", "ca.key"] {
            let mode = std::fs::metadata(dir.path().join(f))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600, "{f}");
        }
    }

    #[test]
    fn identities_get_a_private_kubeconfig_with_embedded_credentials() {
        let dir = tempfile::tempdir().unwrap();
        let pki = Pki::init(options(dir.path())).unwrap();
        let path = pki.ensure_identity(&Identity::admin()).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let kc: Kubeconfig = serde_yaml::from_str(&text).unwrap();
        assert_eq!(kc.clusters[0].cluster.server, "https://127.0.0.1:6443");
        assert_eq!(kc.users[0].name, "minik8s-admin");
        assert!(kc.users[0].user.client_certificate_data.is_some());
        assert_eq!(kc.current_context, kc.contexts[0].name);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        // Kept once made.
        assert_eq!(pki.ensure_identity(&Identity::admin()).unwrap(), path);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), text);
    }

    #[test]
    fn the_serving_cert_is_signed_by_the_ca_and_names_every_address() {
        let dir = tempfile::tempdir().unwrap();
        let pki = Pki::init(options(dir.path())).unwrap();
        let serving = pki.issue_serving_cert().unwrap();
        let pem = std::fs::read(&serving.cert).unwrap();
        let (_, pem) = x509_parser::pem::parse_x509_pem(&pem).unwrap();
        let cert = pem.parse_x509().unwrap();
        let (_, ca) = x509_parser::pem::parse_x509_pem(pki.ca_pem().as_bytes()).unwrap();
        let ca = ca.parse_x509().unwrap();
        cert.verify_signature(Some(ca.public_key()))
            .expect("signed by the CA");
        let sans = format!(
            "{:?}",
            cert.subject_alternative_name().unwrap().unwrap().value
        );
        for want in [
            "localhost",
            "node-a",
            "kubernetes.default.svc",
            "127.0.0.1",
            "10.1.2.3",
        ] {
            let want = match want.parse::<IpAddr>() {
                Ok(IpAddr::V4(ip)) => format!("{:?}", ip.octets()),
                _ => want.to_owned(),
            };
            assert!(sans.contains(&want), "{want} missing from {sans}");
        }
    }
}

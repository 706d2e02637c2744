//! The keys control-plane machines share, carried from one to another as kubeadm's
//! `init --upload-certs` / `join --control-plane --certificate-key` do: each file is sealed
//! with AES-256-GCM under a random 32-byte key the operator passes along in hex (the
//! certificate key), stored nonce first, as kubeadm's `cryptoutil.EncryptBytes`. The sealed
//! files travel in the Secret `kube-system/kubeadm-certs`; without the key they are useless.

use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The Secret holding the sealed files (kubeadm's name).
pub const SECRET: &str = "kubeadm-certs";
/// The Role and RoleBinding that let bootstrap tokens read [`SECRET`] (kubeadm's name).
pub const ROLE: &str = "kubeadm:kubeadm-certs";
/// How long the sealed files stay in the cluster (kubeadm's `DefaultCertTokenDuration`).
pub const TTL_SECONDS: i64 = 2 * 3600;
/// The description of the short-lived token that owns the Secret (kubeadm's).
pub const TOKEN_DESCRIPTION: &str = "Proxy for managing TTL for the kubeadm-certs secret";

/// The files shared by every control-plane machine: (the Secret's key, the file in the PKI
/// folder). The names are kubeadm's, `external-etcd*` being the apiserver's etcd client
/// identity (the cluster CA signs etcd's certificates, so `external-etcd-ca.crt` is the CA).
pub const FILES: [(&str, &str); 8] = [
    ("ca.crt", "ca.crt"),
    ("ca.key", "ca.key"),
    ("sa.key", "sa.key"),
    ("front-proxy-ca.crt", "front-proxy-ca.crt"),
    ("front-proxy-ca.key", "front-proxy-ca.key"),
    ("external-etcd-ca.crt", "ca.crt"),
    ("external-etcd.crt", "apiserver-etcd-client.crt"),
    ("external-etcd.key", "apiserver-etcd-client.key"),
];

/// Why sealing or opening the shared files failed. The messages are kubeadm's.
#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    /// The certificate key is not 64 hex digits.
    #[error("error decoding certificate key: {0}")]
    BadKey(String),
    /// A sealed file does not open with the key (a wrong key, or altered data).
    #[error("error decoding secret data with provided key: {0}")]
    Decrypt(&'static str),
    /// The Secret lacks a file.
    #[error(
        "the Secret does not include the required certificate or key - name: {name}, path: {path}"
    )]
    Missing {
        /// The Secret's key.
        name: String,
        /// Where it would be written.
        path: PathBuf,
    },
    /// A file could not be read or written.
    #[error(transparent)]
    Pki(#[from] crate::Error),
}

/// A new random certificate key: 32 bytes, hex-encoded.
pub fn new_key() -> String {
    let mut key = [0u8; 32];
    rand::RngCore::fill_bytes(&mut rand::rng(), &mut key);
    hex(&key)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The AES-256 key a certificate key names.
pub fn parse_key(key: &str) -> Result<[u8; 32], CopyError> {
    if !key.len().is_multiple_of(2) {
        return Err(CopyError::BadKey(
            "encoding/hex: odd length hex string".into(),
        ));
    }
    let mut bytes = Vec::with_capacity(key.len() / 2);
    for (i, pair) in key.as_bytes().chunks(2).enumerate() {
        let digit = |c: u8, at: usize| {
            (c as char).to_digit(16).ok_or_else(|| {
                CopyError::BadKey(format!(
                    "encoding/hex: invalid byte: U+{:04X} {:?} at {at}",
                    c, c as char
                ))
            })
        };
        bytes.push((digit(pair[0], 2 * i)? * 16 + digit(pair[1], 2 * i + 1)?) as u8);
    }
    bytes.try_into().map_err(|b: Vec<u8>| {
        CopyError::BadKey(format!(
            "crypto/aes: invalid key size {}: the certificate key is 32 bytes (64 hex digits)",
            b.len()
        ))
    })
}

fn aead(key: &[u8; 32]) -> LessSafeKey {
    LessSafeKey::new(UnboundKey::new(&AES_256_GCM, key).expect("a 32-byte AES key"))
}

/// Seals `data`: a random nonce, then the ciphertext and its tag.
pub fn seal(data: &[u8], key: &[u8; 32]) -> Vec<u8> {
    let mut nonce = [0u8; NONCE_LEN];
    rand::RngCore::fill_bytes(&mut rand::rng(), &mut nonce);
    let mut out = nonce.to_vec();
    let mut body = data.to_vec();
    aead(key)
        .seal_in_place_append_tag(Nonce::assume_unique_for_key(nonce), Aad::empty(), &mut body)
        .expect("sealing a file of a few kilobytes");
    out.extend(body);
    out
}

/// Opens what [`seal`] made.
pub fn open(sealed: &[u8], key: &[u8; 32]) -> Result<Vec<u8>, CopyError> {
    if sealed.len() < NONCE_LEN {
        return Err(CopyError::Decrypt(
            "size of data is less than the nonce size",
        ));
    }
    let (nonce, body) = sealed.split_at(NONCE_LEN);
    let nonce = Nonce::try_assume_unique_for_key(nonce).expect("a 12-byte nonce");
    let mut body = body.to_vec();
    let plain = aead(key)
        .open_in_place(nonce, Aad::empty(), &mut body)
        .map_err(|_| CopyError::Decrypt("cipher: message authentication failed"))?;
    Ok(plain.to_vec())
}

/// The shared files of the PKI folder `dir`, sealed under `key`, as the Secret's data. A file
/// that does not exist is stored empty (as kubeadm does).
pub fn seal_dir(dir: &Path, key: &[u8; 32]) -> Result<BTreeMap<String, Vec<u8>>, CopyError> {
    let mut out = BTreeMap::new();
    for (name, file) in FILES {
        let path = dir.join(file);
        let sealed = match std::fs::read(&path) {
            Ok(data) => seal(&data, key),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(source) => {
                return Err(crate::Error::Io {
                    what: "reading",
                    path,
                    source,
                }
                .into());
            }
        };
        out.insert(name.to_owned(), sealed);
    }
    Ok(out)
}

/// Opens the Secret's `data` with `key` and writes the shared files into the PKI folder `dir`
/// (private keys readable by their owner only). Nothing is written unless every file opens.
pub fn open_into(
    data: &BTreeMap<String, Vec<u8>>,
    key: &[u8; 32],
    dir: &Path,
) -> Result<Vec<PathBuf>, CopyError> {
    let mut files = Vec::new();
    for (name, file) in FILES {
        let path = dir.join(file);
        let sealed = data.get(name).ok_or_else(|| CopyError::Missing {
            name: name.to_owned(),
            path: path.clone(),
        })?;
        if sealed.is_empty() {
            continue;
        }
        files.push((path, open(sealed, key)?));
    }
    std::fs::create_dir_all(dir).map_err(|source| crate::Error::Io {
        what: "creating",
        path: dir.to_path_buf(),
        source,
    })?;
    let mut written = Vec::new();
    for (path, data) in files {
        crate::pki::write_private(&path, &data)?;
        written.push(path);
    }
    written.sort();
    written.dedup();
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sealed_files_open_with_the_key_only() {
        let key = parse_key(&new_key()).unwrap();
        let sealed = seal(b"-----BEGIN CERTIFICATE-----", &key);
        assert_eq!(sealed.len(), NONCE_LEN + 27 + 16);
        assert_eq!(open(&sealed, &key).unwrap(), b"-----BEGIN CERTIFICATE-----");
        let other = parse_key(&new_key()).unwrap();
        assert_eq!(
            open(&sealed, &other).unwrap_err().to_string(),
            "error decoding secret data with provided key: cipher: message authentication failed"
        );
        assert!(open(&sealed[..5], &key).is_err());
    }

    #[test]
    fn keys_are_64_hex_digits() {
        assert_eq!(new_key().len(), 64);
        assert!(parse_key(&"ab".repeat(32)).is_ok());
        assert!(
            parse_key("abc")
                .unwrap_err()
                .to_string()
                .contains("odd length")
        );
        assert!(
            parse_key(&"zz".repeat(32))
                .unwrap_err()
                .to_string()
                .contains("invalid byte")
        );
        assert!(
            parse_key("abcd")
                .unwrap_err()
                .to_string()
                .contains("invalid key size 2")
        );
    }

    #[test]
    fn a_folder_round_trips_and_nothing_is_written_on_a_wrong_key() {
        let from = tempfile::tempdir().unwrap();
        std::fs::write(from.path().join("ca.crt"), "CA").unwrap();
        std::fs::write(from.path().join("ca.key"), "KEY").unwrap();
        let key = parse_key(&new_key()).unwrap();
        let data = seal_dir(from.path(), &key).unwrap();
        assert_eq!(data.len(), FILES.len());
        assert!(data["sa.key"].is_empty());
        let to = tempfile::tempdir().unwrap();
        let wrong = parse_key(&new_key()).unwrap();
        assert!(open_into(&data, &wrong, to.path()).is_err());
        assert_eq!(std::fs::read_dir(to.path()).unwrap().count(), 0);
        let written = open_into(&data, &key, to.path()).unwrap();
        assert_eq!(written.len(), 2);
        assert_eq!(
            std::fs::read_to_string(to.path().join("ca.key")).unwrap(),
            "KEY"
        );
    }
}

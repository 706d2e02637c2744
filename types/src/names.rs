//! Generated object names: upstream's `generateName` suffix alphabet (no vowels, no
//! look-alikes).

/// The characters generated name suffixes use.
pub const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

/// Five random characters of [`ALPHABET`].
pub fn random_suffix() -> String {
    use rand::Rng;
    let mut rng = rand::rng();
    (0..5)
        .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
        .collect()
}

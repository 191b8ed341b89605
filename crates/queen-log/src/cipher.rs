//! Encryption at rest: AES-256-GCM over a segment body (after compression) or one payload, each
//! sealed under a fresh random 96-bit nonce. A sealed blob is
//!
//! ```text
//! "QSE1" | u8[12] nonce | ciphertext | u8[16] tag
//! ```
//!
//! and its magic is something neither a zstd frame (which starts `28 B5 2F FD`) nor JSON text
//! can start with, so a reader tells sealed bytes from plain ones by looking, whatever the
//! queue's setting is now.

use aes_gcm::aead::{Aead, AeadCore, KeyInit, OsRng};
use aes_gcm::{Aes256Gcm, Key, Nonce};

use crate::{DecodeError, EncodeError};

/// The first bytes of every sealed blob.
pub const SEALED_MAGIC: &[u8; 4] = b"QSE1";
const NONCE_LEN: usize = 12;
const TAG_LEN: usize = 16;

/// Whether the bytes are a sealed blob.
pub fn is_sealed(bytes: &[u8]) -> bool {
    bytes.starts_with(SEALED_MAGIC)
}

/// Why a key cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("an encryption key is 64 hexadecimal characters (32 bytes); {0}")]
pub struct KeyError(String);

/// An AES-256-GCM key. Its `Debug` never shows the key.
#[derive(Clone)]
pub struct Cipher {
    aead: Aes256Gcm,
}

impl std::fmt::Debug for Cipher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Cipher(AES-256-GCM)")
    }
}

impl Cipher {
    /// The key written as 64 hexadecimal characters (upstream Queen's `QUEEN_ENCRYPTION_KEY`).
    pub fn from_hex(hex: &str) -> Result<Self, KeyError> {
        let hex = hex.trim();
        if hex.len() != 64 {
            return Err(KeyError(format!("this one has {} characters", hex.len())));
        }
        if let Some(other) = hex.chars().find(|c| !c.is_ascii_hexdigit()) {
            return Err(KeyError(format!("this one holds {other:?}, which is not a hexadecimal digit")));
        }
        let mut key = [0u8; 32];
        for (i, byte) in key.iter_mut().enumerate() {
            // Checked above: 64 ASCII hex digits, so every pair parses.
            *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).map_err(|e| KeyError(e.to_string()))?;
        }
        Ok(Cipher { aead: Aes256Gcm::new(Key::<Aes256Gcm>::from_slice(&key)) })
    }

    /// The bytes sealed under a fresh nonce.
    pub fn seal(&self, plain: &[u8]) -> Result<Vec<u8>, EncodeError> {
        let nonce = Aes256Gcm::generate_nonce(&mut OsRng);
        let sealed = self.aead.encrypt(&nonce, plain).map_err(|_| EncodeError::Seal)?;
        let mut out = Vec::with_capacity(SEALED_MAGIC.len() + NONCE_LEN + sealed.len());
        out.extend_from_slice(SEALED_MAGIC);
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&sealed);
        Ok(out)
    }

    /// The plain bytes of a sealed blob; an error when it is not one, was sealed under another
    /// key, or was altered.
    pub fn open(&self, sealed: &[u8]) -> Result<Vec<u8>, DecodeError> {
        let header = SEALED_MAGIC.len() + NONCE_LEN;
        if !is_sealed(sealed) || sealed.len() < header + TAG_LEN {
            return Err(DecodeError::Unseal("not a sealed blob".into()));
        }
        let nonce = Nonce::from_slice(&sealed[SEALED_MAGIC.len()..header]);
        self.aead
            .decrypt(nonce, &sealed[header..])
            .map_err(|_| DecodeError::Unseal("sealed under another key, or altered".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

    #[test]
    fn sealed_bytes_open_back_and_hide_the_plain_text() {
        let cipher = Cipher::from_hex(KEY).unwrap();
        let plain = br#"{"card": "4111 1111 1111 1111"}"#;
        let sealed = cipher.seal(plain).unwrap();
        assert!(is_sealed(&sealed));
        assert!(!sealed.windows(4).any(|w| w == b"4111"), "no plain text in the sealed bytes");
        assert_eq!(cipher.open(&sealed).unwrap(), plain);
        assert_ne!(cipher.seal(plain).unwrap(), sealed, "a fresh nonce every time");
    }

    #[test]
    fn another_key_or_an_altered_byte_does_not_open() {
        let cipher = Cipher::from_hex(KEY).unwrap();
        let mut sealed = cipher.seal(b"secret").unwrap();
        let other = Cipher::from_hex(&KEY.replace('0', "f")).unwrap();
        assert!(other.open(&sealed).is_err());
        let last = sealed.len() - 1;
        sealed[last] ^= 1;
        assert!(cipher.open(&sealed).is_err());
        assert!(cipher.open(b"QSE1").is_err(), "truncated");
        assert!(cipher.open(b"{\"plain\": 1}").is_err(), "not sealed");
    }

    #[test]
    fn keys_are_64_hex_characters() {
        assert!(Cipher::from_hex(KEY).is_ok());
        assert!(Cipher::from_hex(&KEY[..62]).is_err());
        let not_hex = Cipher::from_hex(&KEY.replace('0', "g")).expect_err("not hex").to_string();
        assert!(not_hex.contains("holds 'g', which is not a hexadecimal digit"), "{not_hex}");
        assert_eq!(format!("{:?}", Cipher::from_hex(KEY).unwrap()), "Cipher(AES-256-GCM)");
    }

    #[test]
    fn plain_segments_and_json_are_never_taken_for_sealed() {
        let zstd = zstd::bulk::compress(b"frames", 1).unwrap();
        assert!(!is_sealed(&zstd));
        for json in [&b"{}"[..], b"[1]", b"\"QSE1\"", b"null", b" 1"] {
            assert!(!is_sealed(json));
        }
    }
}

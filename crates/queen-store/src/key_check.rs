//! Which encryption key the fleet seals with (`queen.system_state`, key `encryption_key_check`):
//! the first broker started with a key records a value sealed under it, and a broker started
//! with another key is told so before it serves: it could open nothing its fleet sealed, and
//! would seal what its fleet cannot open.

use deadpool_postgres::GenericClient;
use queen_log::Cipher;
use serde_json::json;

use crate::StoreError;

const STATE_KEY: &str = "encryption_key_check";

/// What the recorded value is sealed from.
const PLAIN: &[u8] = b"queen encryption key check";

/// How a broker's key compares with the fleet's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyCheck {
    /// No key was recorded: this one now is.
    Recorded,
    /// The recorded value opens under this key.
    Same,
    /// It does not: the fleet seals with another key.
    Different,
}

/// Records the fleet's key check with this key if none is, or compares this key with it. Data
/// sealed before any check was recorded (by brokers older than it) is looked at first: a key
/// that cannot open it is not recorded.
pub async fn check(client: &impl GenericClient, cipher: &Cipher) -> Result<KeyCheck, StoreError> {
    if !recorded(client).await?
        && let Some(sealed) = some_sealed_segment(client).await?
        && cipher.open(&sealed).is_err()
    {
        return Ok(KeyCheck::Different);
    }
    let sealed = hex(&cipher.seal(PLAIN)?);
    let inserted = client
        .execute(
            "INSERT INTO queen.system_state (key, value) VALUES ($1, $2) ON CONFLICT (key) DO NOTHING",
            &[&STATE_KEY, &json!({ "sealed": sealed })],
        )
        .await?;
    if inserted == 1 {
        return Ok(KeyCheck::Recorded);
    }
    let row = client.query_one("SELECT value FROM queen.system_state WHERE key = $1", &[&STATE_KEY]).await?;
    let value: serde_json::Value = row.get(0);
    let recorded = value["sealed"].as_str().and_then(unhex).unwrap_or_default();
    let opens = cipher.open(&recorded).is_ok_and(|plain| plain == PLAIN);
    Ok(if opens { KeyCheck::Same } else { KeyCheck::Different })
}

/// Whether a broker of the fleet has recorded a key: the fleet seals what its encrypted queues hold.
pub async fn recorded(client: &impl GenericClient) -> Result<bool, StoreError> {
    let row =
        client.query_one("SELECT EXISTS (SELECT 1 FROM queen.system_state WHERE key = $1)", &[&STATE_KEY]).await?;
    Ok(row.get(0))
}

/// The smallest of the newest segments of encrypted queues' partitions that is sealed, if any.
async fn some_sealed_segment(client: &impl GenericClient) -> Result<Option<Vec<u8>>, StoreError> {
    let row = client
        .query_opt(
            "SELECT s.body FROM queen.queues q
               JOIN queen.partitions p ON p.queue_id = q.id
              CROSS JOIN LATERAL (SELECT body FROM queen.log_segments s
                                   WHERE s.partition_id = p.id ORDER BY s.base_offset DESC LIMIT 1) s
              WHERE q.encryption_enabled AND substring(s.body FROM 1 FOR 4) = $1
              ORDER BY octet_length(s.body) LIMIT 1",
            &[&&queen_log::SEALED_MAGIC[..]],
        )
        .await?;
    Ok(row.map(|row| row.get(0)))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::{hex, unhex};

    #[test]
    fn hex_goes_both_ways_and_refuses_what_is_not_hex() {
        let bytes = [0u8, 1, 0xab, 0xff];
        assert_eq!(hex(&bytes), "0001abff");
        assert_eq!(unhex("0001abff").as_deref(), Some(&bytes[..]));
        assert_eq!(unhex("abc"), None);
        assert_eq!(unhex("zz"), None);
    }
}

//! The messages every scenario (and the ceiling) pushes: one stream of numbered messages per
//! queue, each with a transaction id that names the stream and the sequence number, and a JSON
//! payload of about 100 bytes that carries its sequence number and when it was sent.

use std::time::Instant;

use serde::Deserialize;

/// Size of every payload, in bytes of JSON text.
pub const PAYLOAD_BYTES: usize = 100;

/// The fields of a payload a consumer reads back.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PayloadStamp {
    /// Microseconds from the generator's epoch to just before the push request was sent.
    pub sent_us: u64,
}

/// Makes the messages of one stream.
#[derive(Debug, Clone)]
pub struct MessageGenerator {
    stream: String,
    epoch: Instant,
}

impl MessageGenerator {
    /// `stream` prefixes every transaction id; `epoch` is the zero of the payloads' send times,
    /// shared with the consumers that compute latencies.
    pub fn new(stream: impl Into<String>, epoch: Instant) -> Self {
        Self { stream: stream.into(), epoch }
    }

    pub fn stream(&self) -> &str {
        &self.stream
    }

    pub fn transaction_id(&self, seq: u64) -> String {
        format!("{}-{seq:010}", self.stream)
    }

    /// The sequence number of one of this stream's transaction ids; `None` for anything else.
    pub fn sequence_of(&self, transaction_id: &str) -> Option<u64> {
        let (stream, seq) = transaction_id.rsplit_once('-')?;
        if stream != self.stream || seq.len() != 10 {
            return None;
        }
        seq.parse().ok()
    }

    /// Microseconds from the epoch to now, for a payload's `sentUs`.
    pub fn now_us(&self) -> u64 {
        micros(self.epoch.elapsed())
    }

    /// Microseconds from a `sentUs` to now.
    pub fn latency_us(&self, stamp: PayloadStamp) -> u64 {
        self.now_us().saturating_sub(stamp.sent_us)
    }

    /// A JSON object of exactly [`PAYLOAD_BYTES`] bytes. The padding is pseudo-random letters
    /// seeded by the sequence number, so zstd sees text about as compressible as real data
    /// rather than a run of one byte.
    pub fn payload(&self, seq: u64, sent_us: u64) -> String {
        let mut payload = format!(r#"{{"seq":{seq},"sentUs":{sent_us},"body":""#);
        let padding = PAYLOAD_BYTES.saturating_sub(payload.len() + 2);
        let mut state = seq.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        for _ in 0..padding {
            // xorshift64: cheap, deterministic, good enough to defeat run-length compression.
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            payload.push(char::from(b'a' + (state % 26) as u8));
        }
        payload.push_str("\"}");
        payload
    }

    /// The message the storage ceiling appends, as the broker would after parsing a push item.
    pub fn new_message(&self, seq: u64) -> queen_store::log::NewMessage {
        queen_store::log::NewMessage {
            message_id: queen_log::new_message_id(),
            transaction_id: self.transaction_id(seq),
            trace_id: None,
            producer: None,
            payload: self.payload(seq, self.now_us()).into_bytes(),
            received: None,
        }
    }
}

fn micros(duration: std::time::Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transaction_ids_round_trip_and_name_their_stream() {
        let generator = MessageGenerator::new("push-b10", Instant::now());
        let id = generator.transaction_id(42);
        assert_eq!(id, "push-b10-0000000042");
        assert_eq!(generator.sequence_of(&id), Some(42));
        assert_eq!(MessageGenerator::new("push-b1", Instant::now()).sequence_of(&id), None);
        assert_eq!(generator.sequence_of("push-b10-42"), None);
        assert_eq!(generator.sequence_of("something else"), None);
    }

    #[test]
    fn payloads_are_fixed_size_json_with_their_stamp() {
        let generator = MessageGenerator::new("s", Instant::now());
        for seq in [0, 7, 123_456_789] {
            let payload = generator.payload(seq, 987_654);
            assert_eq!(payload.len(), PAYLOAD_BYTES);
            let stamp: PayloadStamp = serde_json::from_str(&payload).unwrap();
            assert_eq!(stamp.sent_us, 987_654);
            assert!(payload.starts_with(&format!(r#"{{"seq":{seq},"#)));
        }
        assert_ne!(generator.payload(1, 0)[30..], generator.payload(2, 0)[30..]);
    }
}

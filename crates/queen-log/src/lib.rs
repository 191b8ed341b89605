//! The message log format of Queen.
//!
//! A partition is an append-only log. Each push batch that the broker commits becomes one
//! *segment*: the batch's messages encoded as *frames*, concatenated and compressed with zstd.
//! A message's identity inside its partition is its offset: frame `i` of a segment whose base
//! offset is `b` has offset `b + i`.
//!
//! The frame layout is the stored-frame layout of the official client's binary formats (QPB1
//! push groups and QPF1 framed pop records), so a segment can be shipped to a client as it is.
//!
//! The same frames, tagged with their queue and partition, make the records of a broker's push
//! journal (`journal`), where pushes accepted during push maintenance wait for the log.
//!
//! Segments and payloads of encrypted queues are sealed at rest (`cipher`, AES-256-GCM).
//!
//! This crate does no IO; every decoder returns an error, never panics, on truncated or corrupt
//! input.

mod cipher;
mod error;
mod frame;
mod ids;
mod journal;
mod segment;
pub mod zstd_contexts;

pub use cipher::{Cipher, KeyError, SEALED_MAGIC, is_sealed};
pub use error::{DecodeError, EncodeError};
pub use frame::{Frame, FrameIter, FrameOwned, encode_frame, encoded_len};
pub use ids::new_message_id;
pub use journal::{JOURNAL_MAGIC, JournalDefect, JournalEntry, JournalReader, encode_record};
pub use segment::{DecodedSegment, EncodedSegment, SegmentBuilder, decode_segment, window_within_streaming_limit};

/// Frame flag: a 16-byte trace id follows the message id.
pub const FLAG_TRACE: u8 = 0x01;
/// Frame flag: a length-prefixed producer name follows the transaction id.
pub const FLAG_PRODUCER: u8 = 0x02;
/// Frame flag: the payload is encrypted (not produced or accepted by this broker).
pub const FLAG_ENCRYPTED: u8 = 0x04;

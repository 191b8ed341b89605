use thiserror::Error;

/// Why bytes could not be read as frames or as a segment.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DecodeError {
    #[error("truncated frame data: needed {needed} more bytes at byte {at}")]
    Truncated { at: usize, needed: usize },
    #[error("frame at byte {at} declares a body of {len} bytes, shorter than its header")]
    BodyTooShort { at: usize, len: usize },
    #[error("frame at byte {at} has unknown or unsupported flags {flags:#04x}")]
    UnsupportedFlags { at: usize, flags: u8 },
    #[error("frame at byte {at} has a transaction id that is not UTF-8")]
    TransactionIdNotUtf8 { at: usize },
    #[error("frame at byte {at} has a producer that is not UTF-8")]
    ProducerNotUtf8 { at: usize },
    #[error("queue or partition name at byte {at} is not UTF-8")]
    NameNotUtf8 { at: usize },
    #[error("segment decompresses to {actual} bytes, expected {expected}")]
    LengthMismatch { expected: usize, actual: usize },
    #[error("segment holds {actual} frames, expected {expected}")]
    CountMismatch { expected: usize, actual: usize },
    #[error("segment would decompress to {len} bytes, over the limit of {limit}")]
    TooLarge { len: usize, limit: usize },
    #[error("segment is not a valid zstd frame: {0}")]
    Zstd(String),
    #[error("cannot open sealed bytes: {0}")]
    Unseal(String),
}

/// Why a message could not be encoded as a frame.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum EncodeError {
    #[error("{field} is {len} bytes long; a frame holds at most {max}")]
    FieldTooLong { field: &'static str, len: usize, max: usize },
    #[error("frame body of {len} bytes does not fit a frame")]
    FrameTooLarge { len: usize },
    #[error("compression failed: {0}")]
    Zstd(String),
    #[error("sealing failed")]
    Seal,
}

use uuid::Uuid;

/// A new message id: a UUIDv7, so ids minted by one broker sort by time.
pub fn new_message_id() -> Uuid {
    Uuid::now_v7()
}

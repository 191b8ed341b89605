//! What a queue, partition, consumer group or transaction id may be.
//!
//! Names travel raw in URL paths (`/pop/queue/{queue}/partition/{partition}`), so they may not
//! contain `/`; no name may contain control characters, and none may exceed
//! [`MAX_NAME_BYTES`].

/// Longest queue, partition, consumer group or transaction id, in bytes.
pub const MAX_NAME_BYTES: usize = 255;

/// The consumer group of a consumer that names none.
pub const QUEUE_MODE_GROUP: &str = "__QUEUE_MODE__";

/// A consumer group name the API's own paths take.
const RESERVED_GROUP: &str = "lagging";

/// The partition of a push that names none.
pub const DEFAULT_PARTITION: &str = "Default";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameKind {
    Queue,
    Partition,
    ConsumerGroup,
    TransactionId,
}

impl NameKind {
    fn noun(self) -> &'static str {
        match self {
            NameKind::Queue => "queue name",
            NameKind::Partition => "partition name",
            NameKind::ConsumerGroup => "consumer group",
            NameKind::TransactionId => "transaction id",
        }
    }
}

/// Checks a name; the error says what is wrong, naming `field` (only written out then).
pub fn check(kind: NameKind, field: impl std::fmt::Display, value: &str) -> Result<(), String> {
    let noun = kind.noun();
    if value.is_empty() {
        return Err(format!("{field}: the {noun} must not be empty"));
    }
    if value.len() > MAX_NAME_BYTES {
        return Err(format!("{field}: the {noun} is {} bytes long; at most {MAX_NAME_BYTES} are allowed", value.len()));
    }
    if value.chars().any(char::is_control) {
        return Err(format!("{field}: the {noun} must not contain control characters"));
    }
    // In a path, `.` and `..` are dot segments that browsers and URL libraries resolve away: the
    // name could never be read or deleted by its own route. A transaction id may hold `/`, so
    // none of its segments may be one (`x/../y` would be read as `y`).
    if value == "." || value == ".." {
        return Err(format!("{field}: the {noun} must not be {value:?}, which a URL path cannot carry"));
    }
    if kind == NameKind::TransactionId && value.split('/').any(|segment| segment == "." || segment == "..") {
        return Err(format!(
            "{field}: the {noun} must not have '.' or '..' between its '/'s, which a URL path resolves away"
        ));
    }
    if kind != NameKind::TransactionId && value.contains('/') {
        return Err(format!("{field}: the {noun} must not contain '/'"));
    }
    if kind == NameKind::ConsumerGroup && value == RESERVED_GROUP {
        return Err(format!(
            "{field}: the {noun} {RESERVED_GROUP:?} is reserved: /api/v1/consumer-groups/{RESERVED_GROUP} lists the \
             lagging groups, so a group of that name could not be read or deleted there"
        ));
    }
    Ok(())
}

/// Checks the name of a queue or partition a request creates (or may create): besides
/// [`check`], it may not hold what the official clients' raw URL paths cut or change: `#` (the
/// rest is a fragment, so a pop of `orders#eu` would pop `orders`), `?` (the rest is a query) or
/// a `%` escape (`%41`, which the router decodes: `a%41` would be `aA`; a `%` not followed by two
/// hex digits is sent escaped). Names stored before are still read.
pub fn check_new(kind: NameKind, field: impl std::fmt::Display, value: &str) -> Result<(), String> {
    check(kind, &field, value)?;
    if !matches!(kind, NameKind::Queue | NameKind::Partition) {
        return Ok(());
    }
    let noun = kind.noun();
    if let Some(c) = value.chars().find(|c| matches!(c, '#' | '?')) {
        return Err(format!("{field}: the {noun} must not contain {c:?}, which ends a URL path"));
    }
    let escape = value.as_bytes().windows(3).find(|w| w[0] == b'%' && w[1..].iter().all(u8::is_ascii_hexdigit));
    if let Some(escape) = escape {
        let escape = String::from_utf8_lossy(escape);
        return Err(format!("{field}: the {noun} must not contain {escape:?}, which a URL path reads as an escape"));
    }
    Ok(())
}

/// Checks a label: a queue's namespace or task, or a trace's names. It is at most
/// [`MAX_NAME_BYTES`] without control characters but may hold `/`, as it travels in bodies and
/// query strings; the error names `field`.
pub fn check_label(field: impl std::fmt::Display, value: &str) -> Result<(), String> {
    if value.len() > MAX_NAME_BYTES {
        return Err(format!("{field} is {} bytes long; at most {MAX_NAME_BYTES} are allowed", value.len()));
    }
    if value.chars().any(char::is_control) {
        return Err(format!("{field} must not contain control characters"));
    }
    Ok(())
}

/// The longest part of a member's name an error quotes.
pub const QUOTED_MEMBER_CHARS: usize = 64;

/// A member name a request sent, as an error quotes it: escaped, and cut (with `…`) past
/// [`QUOTED_MEMBER_CHARS`] characters, since the name is the client's and may be anything.
pub fn quoted_member(name: &str) -> String {
    let quoted: String = name.chars().take(QUOTED_MEMBER_CHARS).collect();
    let cut = if quoted.len() < name.len() { "…" } else { "" };
    format!("{}{cut}", quoted.escape_debug())
}

/// The stored group name for what a request sent: absent, `null` and `__QUEUE_MODE__` are all
/// queue mode.
pub fn group_or_queue_mode(group: Option<&str>) -> &str {
    match group {
        Some(group) if !group.is_empty() => group,
        _ => QUEUE_MODE_GROUP,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits() {
        assert!(check(NameKind::Queue, "queue", "orders.eu-1").is_ok());
        assert!(check(NameKind::Queue, "queue", "").is_err());
        assert!(check(NameKind::Queue, "queue", &"q".repeat(MAX_NAME_BYTES)).is_ok());
        assert!(check(NameKind::Queue, "queue", &"q".repeat(MAX_NAME_BYTES + 1)).is_err());
        assert!(check(NameKind::Partition, "partition", "a/b").is_err());
        assert!(check(NameKind::TransactionId, "transactionId", "a/b").is_ok());
        assert!(check(NameKind::ConsumerGroup, "consumerGroup", "a\nb").is_err());
        for kind in [NameKind::Queue, NameKind::Partition, NameKind::ConsumerGroup, NameKind::TransactionId] {
            assert!(check(kind, "name", "..").is_err() && check(kind, "name", ".").is_err());
            assert!(check(kind, "name", "...").is_ok() && check(kind, "name", ".hidden").is_ok());
        }
    }

    #[test]
    fn the_error_names_the_field() {
        let err = check(NameKind::Queue, "items[3].queue", "").unwrap_err();
        assert!(err.starts_with("items[3].queue"), "{err}");
    }
}

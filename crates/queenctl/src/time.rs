//! Times given on the command line.

use chrono::{DateTime, NaiveDate, NaiveDateTime, Utc};

/// An ISO-8601 time: `2026-07-29T14:00:00Z` or with an offset (`+02:00`); without an offset
/// (`2026-07-29T14:00:00`, `2026-07-29 14:00`) or a date alone (`2026-07-29`, midnight), UTC.
pub fn parse(text: &str) -> Result<DateTime<Utc>, String> {
    let text = text.trim();
    if let Ok(at) = DateTime::parse_from_rfc3339(text) {
        return Ok(at.with_timezone(&Utc));
    }
    for format in ["%Y-%m-%dT%H:%M:%S%.f", "%Y-%m-%d %H:%M:%S%.f", "%Y-%m-%dT%H:%M", "%Y-%m-%d %H:%M"] {
        if let Ok(at) = NaiveDateTime::parse_from_str(text, format) {
            return Ok(at.and_utc());
        }
    }
    if let Ok(day) = NaiveDate::parse_from_str(text, "%Y-%m-%d") {
        return Ok(day.and_hms_opt(0, 0, 0).expect("midnight exists").and_utc());
    }
    Err(format!("{text:?} is not an ISO-8601 time (e.g. 2026-07-29T14:00:00Z; without an offset it is UTC)"))
}

/// Where a reader starts: `all`, `new`, or a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// The oldest retained message.
    All,
    /// What is pushed from now on.
    New,
    /// The first message stored at or after this time.
    At(DateTime<Utc>),
}

/// `all`, `new` or an ISO-8601 time.
pub fn parse_start(text: &str) -> Result<Start, String> {
    match text.trim().to_ascii_lowercase().as_str() {
        "all" => Ok(Start::All),
        "new" => Ok(Start::New),
        _ => parse(text).map(Start::At).map_err(|_| format!("{text:?} is not `all`, `new` or an ISO-8601 time")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_read_as_iso_8601_and_utc_without_an_offset() {
        let utc = parse("2026-07-29T14:00:00Z").unwrap();
        assert_eq!(parse("2026-07-29T16:00:00+02:00").unwrap(), utc);
        assert_eq!(parse("2026-07-29T14:00:00").unwrap(), utc);
        assert_eq!(parse("2026-07-29 14:00").unwrap(), utc);
        assert_eq!(parse("2026-07-29").unwrap(), parse("2026-07-29T00:00:00Z").unwrap());
        assert!(parse("yesterday").is_err());
        assert!(parse("2026-13-01").is_err());
    }

    #[test]
    fn starts_are_all_new_or_a_time() {
        assert_eq!(parse_start("all").unwrap(), Start::All);
        assert_eq!(parse_start("NEW").unwrap(), Start::New);
        assert!(matches!(parse_start("2026-07-29").unwrap(), Start::At(_)));
        assert!(parse_start("later").is_err());
    }
}

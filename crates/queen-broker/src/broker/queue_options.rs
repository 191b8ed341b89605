//! The queue options of the client contract (`POST /api/v1/configure` → `options`): their names on
//! the wire, what each takes, and the echo of a queue's effective options. One table serves the
//! checks and the echo, so an option cannot be accepted without being echoed, or the reverse.
//!
//! The client passes any key a user gives it through unchanged. A key not in the table is
//! refused with a 400 that names it: an option the broker stored without acting on it would let
//! a user believe it holds.

use queen_store::queues::{QueueOptions, QueueOptionsPatch};
use serde_json::{Map, Value};

use super::BrokerError;
use crate::names;

/// What an option takes.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Integer { min: i64, max: i64 },
    Boolean,
}

struct KnownOption {
    name: &'static str,
    kind: Kind,
    /// The stored value, as echoed.
    get: fn(&QueueOptions) -> Value,
    /// Records a value, already checked against `kind`.
    set: fn(&mut QueueOptionsPatch, &Value),
}

const INT: i64 = i32::MAX as i64;

/// A table row: the option's wire name, the field of [`QueueOptions`] (and of the patch) it
/// sets, and what it takes.
macro_rules! option {
    ($name:literal, $field:ident, integer($min:expr, $max:expr)) => {
        KnownOption {
            name: $name,
            kind: Kind::Integer { min: $min, max: $max },
            get: |o| o.$field.into(),
            set: |p, v| p.$field = v.as_i64().and_then(|v| v.try_into().ok()),
        }
    };
    ($name:literal, $field:ident, boolean) => {
        KnownOption { name: $name, kind: Kind::Boolean, get: |o| o.$field.into(), set: |p, v| p.$field = v.as_bool() }
    };
}

/// Every option the broker acts on (the tables of the wire reference, §5). Durations are in
/// seconds except `retryDelay` (milliseconds).
const KNOWN: &[KnownOption] = &[
    option!("leaseTime", lease_time_seconds, integer(1, INT)),
    option!("retryLimit", retry_limit, integer(0, INT)),
    option!("retryDelay", retry_delay_ms, integer(0, INT)),
    option!("priority", priority, integer(-INT - 1, INT)),
    option!("delayedProcessing", delayed_processing_seconds, integer(0, INT)),
    option!("windowBuffer", window_buffer_seconds, integer(0, INT)),
    option!("maxSize", max_size, integer(0, i64::MAX)),
    option!("ttl", ttl_seconds, integer(0, INT)),
    option!("maxWaitTimeSeconds", max_wait_seconds, integer(0, INT)),
    option!("deadLetterQueue", dead_letter_queue, boolean),
    option!("dlqAfterMaxRetries", dlq_after_max_retries, boolean),
    option!("retentionEnabled", retention_enabled, boolean),
    option!("retentionSeconds", retention_seconds, integer(0, INT)),
    option!("completedRetentionSeconds", completed_retention_seconds, integer(0, INT)),
    option!("encryptionEnabled", encryption_enabled, boolean),
    option!("dedupWindowSeconds", dedup_window_seconds, integer(0, INT)),
];

/// The options of a configure request checked into a patch (a `null` value leaves the stored one
/// as it is). A name this broker does not act on is refused.
pub fn parse(options: &Map<String, Value>) -> Result<QueueOptionsPatch, BrokerError> {
    let mut patch = QueueOptionsPatch::default();
    for (key, value) in options {
        let Some(known) = KNOWN.iter().find(|o| o.name == key) else {
            let names: Vec<&str> = KNOWN.iter().map(|o| o.name).collect();
            return Err(BrokerError::invalid(format!(
                "options.{} is not a queue option this broker acts on; the options are {}",
                names::quoted_member(key),
                names.join(", ")
            )));
        };
        if value.is_null() {
            continue;
        }
        let fits = match known.kind {
            Kind::Integer { min, max } => value.as_i64().is_some_and(|v| (min..=max).contains(&v)),
            Kind::Boolean => value.is_boolean(),
        };
        if !fits {
            return Err(BrokerError::invalid(match known.kind {
                Kind::Integer { min, max } => format!("options.{key} must be an integer from {min} to {max}"),
                Kind::Boolean => format!("options.{key} must be true or false"),
            }));
        }
        (known.set)(&mut patch, value);
    }
    Ok(patch)
}

/// Every option with its effective value (defaults included).
pub fn echo(options: &QueueOptions) -> Map<String, Value> {
    KNOWN.iter().map(|o| (o.name.to_owned(), (o.get)(options))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(json: &str) -> Map<String, Value> {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn the_client_defaults_are_known_options() {
        let defaults = options(
            r#"{"leaseTime": 300, "retryLimit": 3, "priority": 0, "delayedProcessing": 0, "windowBuffer": 0,
                "maxSize": 0, "retentionSeconds": 0, "completedRetentionSeconds": 0, "encryptionEnabled": false}"#,
        );
        let patch = parse(&defaults).unwrap();
        assert_eq!(patch.lease_time_seconds, Some(300));
        assert_eq!(patch.max_size, Some(0));
        assert_eq!(patch.encryption_enabled, Some(false));
        assert_eq!(patch.retention_enabled, None);
    }

    #[test]
    fn null_leaves_the_stored_value() {
        assert_eq!(
            parse(&options(r#"{"retryDelay": null, "leaseTime": null}"#)).unwrap(),
            QueueOptionsPatch::default()
        );
    }

    #[test]
    fn an_unknown_option_is_refused_by_name() {
        for (json, quoted) in [
            (r#"{"leaseTime": 30, "maxPartitions": 4}"#, "options.maxPartitions is not"),
            (r#"{"xFoobar": null}"#, "options.xFoobar is not"),
            (r#"{"lease_time": 30}"#, "options.lease_time is not"),
            (r#"{"nul\u0000": 1}"#, "options.nul\\0 is not"),
        ] {
            match parse(&options(json)) {
                Err(BrokerError::Invalid(message)) => {
                    assert!(message.starts_with(quoted), "{message}");
                    assert!(message.ends_with("encryptionEnabled, dedupWindowSeconds"), "{message}");
                }
                other => panic!("{json}: expected a 400, got {other:?}"),
            }
        }
        let long = format!(r#"{{"{}": 1}}"#, "é".repeat(1000));
        match parse(&options(&long)) {
            Err(BrokerError::Invalid(message)) => {
                assert!(
                    message.starts_with(&format!("options.{}… is not", "é".repeat(names::QUOTED_MEMBER_CHARS))),
                    "{message}"
                )
            }
            other => panic!("expected a 400, got {other:?}"),
        }
    }

    #[test]
    fn bad_option_values_are_named() {
        for (json, field) in [
            (r#"{"leaseTime": 0}"#, "options.leaseTime"),
            (r#"{"leaseTime": "300"}"#, "options.leaseTime"),
            (r#"{"retryLimit": -1}"#, "options.retryLimit"),
            (r#"{"retryLimit": 1.5}"#, "options.retryLimit"),
            (r#"{"retentionEnabled": "yes"}"#, "options.retentionEnabled"),
            (r#"{"maxSize": -1}"#, "options.maxSize"),
            (r#"{"ttl": 4294967296}"#, "options.ttl"),
            (r#"{"deadLetterQueue": 1}"#, "options.deadLetterQueue"),
        ] {
            match parse(&options(json)) {
                Err(BrokerError::Invalid(message)) => assert!(message.starts_with(field), "{message}"),
                other => panic!("{json}: expected a 400, got {other:?}"),
            }
        }
    }

    #[test]
    fn every_known_option_is_echoed_once() {
        let mut names: Vec<&str> = KNOWN.iter().map(|o| o.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), KNOWN.len(), "an option is listed twice");
    }
}

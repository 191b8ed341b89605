//! How answers are shown: aligned columns and `key: value` lines for people, JSON for scripts.

use std::io::Write;

use chrono::{DateTime, SecondsFormat, Utc};
use serde::Serialize;
use serde_json::Value;

use crate::error::Result;

/// `--output`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Aligned columns for people.
    Table,
    /// One JSON document per command (one object per line for `tail`).
    Json,
}

/// Writes `text` to stdout as it is.
pub fn print(text: &str) -> Result {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())?;
    out.flush()?;
    Ok(())
}

/// Writes one line to stdout.
pub fn line(text: &str) -> Result {
    print(&format!("{text}\n"))
}

/// An answer as a JSON value. Through a value, so that members come out in one order (by name)
/// whatever the type, and payloads are indented with the rest.
fn value(answer: &impl Serialize) -> Value {
    serde_json::to_value(answer).expect("answers always encode as JSON")
}

/// Writes an answer to stdout as a JSON document, indented.
pub fn json(answer: &impl Serialize) -> Result {
    line(&serde_json::to_string_pretty(&value(answer)).expect("a JSON value always encodes"))
}

/// Writes an answer to stdout as JSON on one line (a stream of them for `tail`).
pub fn json_line(answer: &impl Serialize) -> Result {
    line(&serde_json::to_string(&value(answer)).expect("a JSON value always encodes"))
}

/// A unit enum's wire name (`queued`, `completed`, `live`), as its JSON says it.
pub fn word(variant: &impl Serialize) -> String {
    match value(variant) {
        Value::String(word) => word,
        other => other.to_string(),
    }
}

/// A note for people, on stderr: never part of what a script reads.
pub fn note(text: &str) {
    eprintln!("{text}");
}

/// Columns aligned under upper-case headers, two spaces apart, the last one not padded (it is
/// often a payload). No borders, so that `grep`, `awk` and `cut` work on it.
pub struct Table {
    headers: Vec<&'static str>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(headers: &[&'static str]) -> Table {
        Table { headers: headers.to_vec(), rows: Vec::new() }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        debug_assert_eq!(cells.len(), self.headers.len());
        self.rows.push(cells);
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    pub fn render(&self) -> String {
        let width = |cell: &str| cell.chars().count();
        let mut widths: Vec<usize> = self.headers.iter().map(|h| width(h)).collect();
        for row in &self.rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(width(cell));
            }
        }
        let mut text = String::new();
        let headers: Vec<String> = self.headers.iter().map(|h| h.to_string()).collect();
        for row in std::iter::once(&headers).chain(&self.rows) {
            let last = row.len() - 1;
            for (i, cell) in row.iter().enumerate() {
                text.push_str(cell);
                if i < last {
                    text.extend(std::iter::repeat_n(' ', widths[i] - width(cell) + 2));
                }
            }
            text.push('\n');
        }
        text
    }

    /// Prints the table, or, when it has no rows, `empty` as a note on stderr.
    pub fn print_or(&self, empty: &str) -> Result {
        if self.is_empty() {
            note(empty);
            Ok(())
        } else {
            print(&self.render())
        }
    }
}

/// `key: value` lines, the values aligned.
pub struct Fields {
    pairs: Vec<(String, String)>,
}

impl Fields {
    pub fn new() -> Fields {
        Fields { pairs: Vec::new() }
    }

    pub fn add(&mut self, key: &str, value: impl Into<String>) -> &mut Fields {
        self.pairs.push((key.to_owned(), value.into()));
        self
    }

    pub fn render(&self) -> String {
        let width = self.pairs.iter().map(|(k, _)| k.chars().count()).max().unwrap_or(0);
        let mut text = String::new();
        for (key, value) in &self.pairs {
            let pad = width - key.chars().count();
            text.push_str(&format!("{key}:{}  {value}\n", " ".repeat(pad)));
        }
        text
    }

    pub fn print(&self) -> Result {
        print(&self.render())
    }
}

/// A time as people read it: UTC, to the millisecond.
pub fn time(at: &DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// An optional time; `-` for none.
pub fn maybe_time(at: Option<&DateTime<Utc>>) -> String {
    at.map_or_else(|| "-".to_owned(), time)
}

/// An optional text; `-` for none.
pub fn maybe(text: Option<&str>) -> String {
    text.unwrap_or("-").to_owned()
}

/// An age in seconds as `1h02m`, `3m05s`, `4.2s`; `-` for none.
pub fn age(seconds: f64) -> String {
    if !seconds.is_finite() || seconds <= 0.0 {
        return "-".to_owned();
    }
    let whole = seconds.round() as u64;
    match whole {
        0..10 => format!("{seconds:.1}s"),
        10..60 => format!("{whole}s"),
        60..3600 => format!("{}m{:02}s", whole / 60, whole % 60),
        3600..86400 => format!("{}h{:02}m", whole / 3600, whole % 3600 / 60),
        _ => format!("{}d{:02}h", whole / 86400, whole % 86400 / 3600),
    }
}

/// Text cut to `max` characters, with `…` when cut: payloads in listings.
pub fn cut(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_owned();
    }
    let mut cut: String = text.chars().take(max.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_line_up_and_the_last_is_not_padded() {
        let mut table = Table::new(&["A", "LONGER", "DATA"]);
        table.row(vec!["xyz".into(), "1".into(), "{}".into()]);
        table.row(vec!["é".into(), "22".into(), "[1]".into()]);
        assert_eq!(table.render(), "A    LONGER  DATA\nxyz  1       {}\né    22      [1]\n");
    }

    #[test]
    fn fields_align_their_values() {
        let mut fields = Fields::new();
        fields.add("queue", "orders").add("partitions", "3");
        assert_eq!(fields.render(), "queue:       orders\npartitions:  3\n");
    }

    #[test]
    fn ages_read_at_a_glance() {
        assert_eq!(age(0.0), "-");
        assert_eq!(age(4.24), "4.2s");
        assert_eq!(age(42.0), "42s");
        assert_eq!(age(185.0), "3m05s");
        assert_eq!(age(3720.0), "1h02m");
        assert_eq!(age(90000.0), "1d01h");
        assert_eq!(cut("abcdef", 4), "abc…");
        assert_eq!(cut("abc", 4), "abc");
    }
}

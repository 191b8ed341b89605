//! Structure-aware fuzzing of every request body the broker parses: push, ack, ack batch,
//! transaction (with its `kv` and `timers` riders), configure, seek, subscription update, lease
//! extension, key/value batches, locks, timers, trace events, fetch and changed partitions.
//!
//! Each test builds bodies that are mostly right (the right field names, values of the right
//! families, references to real partitions, messages and leases set up for the case) and then
//! breaks them as clients and attackers do: wrong types, missing and extra fields, nulls, numbers
//! out of every range, empty, huge and exotic strings, deep nesting, arrays where objects go,
//! duplicate keys, bytes that are not UTF-8, truncated text, other content types. Every case checks
//!
//! 1. that the broker answers, and never with a 5xx (a panicking handler shows as a 500 or a
//!    dropped connection);
//! 2. that a 4xx is a JSON object with an `error` string;
//! 3. that a 4xx wrote nothing: the row versions of the queen schema's tables are the same after;
//! 4. that what was accepted took effect as asked: pushed messages pop back with the payload text
//!    and transaction id they were sent with, configured options are echoed and read back, acks
//!    commit, transactions apply, leases extend, seeks and subscription updates move what they
//!    name, key/value writes read back, locks granted are held, timers peek back (or, due, are
//!    delivered and pop back), trace events read back by message, fetches return the records of
//!    the partitions they name and changed-partition pages list the partitions of their queue;
//!
//! and, for a case sent as built (no mutation, well-formed JSON), that a body of good fields is
//! accepted and one with a field known to be bad is refused with a 400.
//!
//! Each test runs `PROPTEST_CASES` cases (default [`DEFAULT_CASES`]) against one broker and
//! database; failing cases are shrunk a little and never persisted to files.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::future::Future;

use actix_web::rt::{System, SystemRunner};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use chrono::{DateTime, Utc};
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{TestCaseError, TestRunner};
use queen_broker::config::Config;
use reqwest::StatusCode;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::value::RawValue;
use serde_json::{Map, Value, json};
use uuid::Uuid;

use crate::helpers::{TestApp, row_versions};

/// Cases per test unless `PROPTEST_CASES` asks for more (or fewer).
const DEFAULT_CASES: u32 = 64;

/// `push.max_items` of the brokers under test: small, so that bodies past it are cheap.
const MAX_ITEMS: usize = 16;

/// A string `RAW` + text goes on the wire as the bare text: numbers no `Value` holds, lone
/// surrogates, deep nesting, broken JSON.
const RAW: &str = "@@raw@@";
/// A string `REF` + name is replaced by the case's value of that name (a lease, a partition id).
const REF: &str = "@@ref@@";
/// A body that is this string goes out as no body at all.
const NO_BODY: &str = "@@no-body@@";

/// The encryption key of the configure test's broker, so that `encryptionEnabled: true` is good.
const KEY: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";

type Refs = BTreeMap<String, Value>;

fn cases_from_env_or(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES").ok().and_then(|cases| cases.trim().parse().ok()).unwrap_or(default)
}

fn proptest_config() -> ProptestConfig {
    ProptestConfig {
        cases: cases_from_env_or(DEFAULT_CASES),
        failure_persistence: None,
        max_shrink_iters: 128,
        max_shrink_time: 60_000,
        ..ProptestConfig::default()
    }
}

// ---------------------------------------------------------------------------------------------
// What a body is made of, and what it should get.

/// What a body, or one of its parts, deserves. A body is as bad as its worst part.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Verdict {
    /// Well-formed and naming what exists: must be accepted (2xx).
    Good,
    /// Well-formed but naming what does not exist, or where the contract leaves the outcome open:
    /// any 2xx or 4xx will do.
    Stray,
    /// Malformed: must be refused with a 400.
    Bad,
}
use Verdict::{Bad, Good, Stray};

/// One member of a body being built: its value (`None`: left out) and what it deserves.
type Member = (Option<Value>, Verdict);

/// An object being built, member by member.
#[derive(Debug, Clone, Default)]
struct Draft(Vec<(&'static str, Member)>);

impl Draft {
    fn verdict(&self) -> Verdict {
        self.0.iter().map(|(_, (_, verdict))| *verdict).max().unwrap_or(Good)
    }

    fn value(&self) -> Value {
        Value::Object(
            self.0.iter().filter_map(|(key, (value, _))| value.clone().map(|v| ((*key).to_owned(), v))).collect(),
        )
    }

    fn built(&self) -> (Value, Verdict) {
        (self.value(), self.verdict())
    }

    fn get_mut(&mut self, key: &str) -> Option<&mut Member> {
        self.0.iter_mut().find(|(k, _)| *k == key).map(|(_, member)| member)
    }
}

/// Objects in an array; the array is as bad as its worst element.
fn array_of(drafts: &[Draft]) -> (Value, Verdict) {
    let verdict = drafts.iter().map(Draft::verdict).max().unwrap_or(Good);
    (Value::Array(drafts.iter().map(Draft::value).collect()), verdict)
}

fn raw(text: &str) -> Value {
    Value::String(format!("{RAW}{text}"))
}

fn reference(name: &str) -> Value {
    Value::String(format!("{REF}{name}"))
}

/// One way to fill a member: its weight among the others, what it makes of the body, and the
/// values it takes.
type Arm<T = Member> = (u32, Verdict, BoxedStrategy<T>);

fn with(weight: u32, verdict: Verdict, values: impl Strategy<Value = Value> + 'static) -> Arm {
    (weight, verdict, values.prop_map(move |value| (Some(value), verdict)).boxed())
}

fn left_out(weight: u32, verdict: Verdict) -> Arm {
    (weight, verdict, Just((None, verdict)).boxed())
}

/// One of the ways `arms` give, by weight; for a pristine body (one built of good parts only),
/// one of the good ways.
fn choose<T: std::fmt::Debug + 'static>(pristine: bool, arms: Vec<Arm<T>>) -> BoxedStrategy<T> {
    let arms: Vec<(u32, BoxedStrategy<T>)> =
        arms.into_iter().filter(|(_, verdict, _)| !pristine || *verdict == Good).map(|(w, _, s)| (w, s)).collect();
    assert!(!arms.is_empty(), "no good way to build this part");
    proptest::strategy::Union::new_weighted(arms).boxed()
}

fn member(pristine: bool, arms: Vec<Arm>) -> BoxedStrategy<Member> {
    choose(pristine, arms)
}

fn values(items: Vec<Value>) -> BoxedStrategy<Value> {
    prop::sample::select(items).boxed()
}

fn strings(items: &[&str]) -> BoxedStrategy<Value> {
    values(items.iter().map(|s| json!(s)).collect())
}

/// Member names of every body, for extra members that mean something elsewhere.
const FIELD_NAMES: &[&str] = &[
    "items",
    "queue",
    "partition",
    "payload",
    "transactionId",
    "traceId",
    "producerSub",
    "partitionId",
    "leaseId",
    "status",
    "error",
    "consumerGroup",
    "acknowledgments",
    "operations",
    "type",
    "requiredLeases",
    "kv",
    "timers",
    "options",
    "namespace",
    "task",
    "toEnd",
    "timestamp",
    "subscriptionTimestamp",
    "seconds",
    "__proto__",
];

/// Strings that have broken parsers before.
const SPECIAL_STRINGS: &[&str] = &[
    "",
    " ",
    "\u{0}",
    "nul\u{0}inside",
    "\u{7}",
    "tab\there",
    "line\nbreak",
    "\u{7f}",
    "\u{85}",
    "\u{feff}bom",
    "\u{200b}",
    "\u{202e}rtl",
    "e\u{301}",
    "🦀",
    "\u{10ffff}",
    "\u{fffd}",
    "\\",
    "\"",
    "'",
    "a/b",
    "..",
    "%00",
    "%2F",
    "+",
    "null",
    "true",
    "1",
    "-1",
    "1.5",
    " 7 ",
    "0x10",
    "1e400",
    "NaN",
    "__QUEUE_MODE__",
    "Default",
    "<script>alert(1)</script>",
    "'; DROP TABLE queen.queues; --",
    "日本語のキュー",
];

/// Any string: short, exotic, control characters included, or long.
fn text() -> BoxedStrategy<String> {
    prop_oneof![
        3 => "[a-z0-9]{1,8}",
        3 => "\\PC{0,24}",
        1 => "(?s).{0,12}",
        2 => prop::sample::select(SPECIAL_STRINGS).prop_map(str::to_owned),
        1 => (prop::sample::select(vec!["x", "é", "🦀", "\u{0}"]), prop::sample::select(vec![255, 256, 4096, 70_000]))
            .prop_map(|(s, n)| s.repeat(n)),
    ]
    .boxed()
}

fn key() -> BoxedStrategy<String> {
    prop_oneof![3 => text(), 1 => prop::sample::select(FIELD_NAMES).prop_map(str::to_owned)].boxed()
}

/// Which bare texts a JSON value may carry.
#[derive(Debug, Clone, Copy)]
enum Raw {
    /// None: every value is one `serde_json::Value` holds.
    Plain,
    /// Valid JSON that `Value` may not hold: huge numbers, lone surrogates, deep nesting.
    Valid,
    /// Anything, broken JSON included.
    Any,
}

const RAW_VALID: &[&str] = &[
    "1e400",
    "-1e400",
    "1E+2",
    "-0",
    "0.0",
    "123456789012345678901234567890",
    "9223372036854775808",
    "-9223372036854775809",
    "18446744073709551616",
    "1.000000000000000000000000001",
    "4.9e-325",
    "\"\\ud800\"",
    "\"\\udc00\\ud800\"",
    "\"\\u0000\"",
    "{\"a\": 1, \"a\": 2}",
];

const RAW_BROKEN: &[&str] = &[
    "NaN",
    "Infinity",
    "-",
    "01",
    "+1",
    ".5",
    "1.",
    "0x10",
    "tru",
    "nul",
    "'x'",
    "\"unterminated",
    "[1,]",
    "{\"a\"}",
    "{,}",
    "\"\\x\"",
    "\"\u{1}\"",
    "\"\\u12\"",
];

/// Arrays nested `levels` deep, as bare text.
fn nested(levels: usize) -> Value {
    raw(&format!("{}1{}", "[".repeat(levels), "]".repeat(levels)))
}

/// Any JSON value, as deep as a few levels.
fn json_value(raw_kind: Raw) -> BoxedStrategy<Value> {
    let mut leaves = vec![
        (1, Just(Value::Null).boxed()),
        (1, any::<bool>().prop_map(Value::Bool).boxed()),
        (2, any::<i64>().prop_map(Value::from).boxed()),
        (1, any::<u64>().prop_map(Value::from).boxed()),
        (
            2,
            prop::sample::select(vec![
                0i64,
                -1,
                1,
                255,
                256,
                i32::MAX.into(),
                i64::from(i32::MAX) + 1,
                i64::MIN,
                i64::MAX,
            ])
            .prop_map(Value::from)
            .boxed(),
        ),
        (
            1,
            prop::sample::select(vec![0.5f64, -0.0, 1.5, 300.0, 1e308, -1e308, 5e-324, 1e-300])
                .prop_map(|f| json!(f))
                .boxed(),
        ),
        (1, any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(|f| json!(f)).boxed()),
        (4, text().prop_map(Value::String).boxed()),
    ];
    match raw_kind {
        Raw::Plain => {}
        Raw::Valid => {
            leaves.push((1, prop::sample::select(RAW_VALID).prop_map(raw).boxed()));
            leaves.push((1, Just(nested(100)).boxed()));
        }
        Raw::Any => {
            leaves.push((1, prop::sample::select(RAW_VALID).prop_map(raw).boxed()));
            leaves.push((1, prop::sample::select(RAW_BROKEN).prop_map(raw).boxed()));
            leaves.push((1, prop::sample::select(vec![127usize, 128, 129, 20_000]).prop_map(nested).boxed()));
        }
    }
    proptest::strategy::Union::new_weighted(leaves)
        .prop_recursive(3, 24, 5, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
                prop::collection::btree_map(key(), inner, 0..5).prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
        .boxed()
}

fn junk() -> BoxedStrategy<Value> {
    json_value(Raw::Any)
}

/// Names that are good but may not be spelled in a URL path this broker decodes (`%`, dot
/// segments): see [`addressable`].
const GOOD_NAMES: &[&str] = &[
    "orders",
    "q-1",
    "ünïcödé",
    "队列",
    "emoji 🦀",
    "with.dots:and-colons",
    "a+b",
    "100%",
    "?query#frag",
    "quote\"s and \\",
    "'; DROP TABLE queen.queues; --",
    " leading and trailing ",
    "__QUEUE_MODE__",
    "Default",
];

/// A good queue, partition or group name (`.` and `..`, which a URL path cannot carry, are none).
fn name() -> BoxedStrategy<String> {
    prop_oneof![
        3 => prop::sample::select(GOOD_NAMES).prop_map(str::to_owned),
        3 => "[a-z][a-z0-9._-]{0,15}",
        2 => "\\PC{1,16}".prop_map(|s| s.replace('/', "-")),
        1 => Just("q".repeat(255)),
        1 => Just("é".repeat(127)),
    ]
    .prop_filter("not a dot segment", |name| name != "." && name != "..")
    .boxed()
}

/// A good name for a queue or partition a request creates: none of what the official clients'
/// raw URL paths would cut or change (`#`, `?`, a `%` escape).
fn created_name() -> BoxedStrategy<String> {
    name()
        .prop_filter("carried by a raw URL path", |name| {
            !name.contains(['#', '?'])
                && !name.as_bytes().windows(3).any(|w| w[0] == b'%' && w[1..].iter().all(u8::is_ascii_hexdigit))
        })
        .boxed()
}

/// A good name that a URL path can carry to this broker.
fn path_name() -> BoxedStrategy<String> {
    name().prop_filter("addressable", |name| addressable(name)).boxed()
}

/// Whether a name survives the trip through a URL path: dot segments are normalised away by the
/// client.
fn addressable(name: &str) -> bool {
    !name.trim_matches('.').is_empty()
}

/// Names no queue, partition or group may have, and values that are no name at all.
/// A name refused for a queue or partition a request creates: a bad name, or one the official
/// clients' raw URL paths would cut or change.
fn bad_created_name() -> BoxedStrategy<Value> {
    prop_oneof![6 => bad_name(), 1 => values(vec![json!("orders#eu"), json!("what?"), json!("a%41")])].boxed()
}

fn bad_name() -> BoxedStrategy<Value> {
    values(vec![
        json!(""),
        json!("a/b"),
        json!("/"),
        json!("."),
        json!(".."),
        json!("q".repeat(256)),
        json!("é".repeat(128)),
        json!("bell\u{7}"),
        json!("nul\u{0}"),
        json!("next\u{85}line"),
        json!("tab\there"),
        json!(5),
        json!(-1),
        json!(1.5),
        json!(true),
        json!([]),
        json!(["q"]),
        json!({}),
        json!({"name": "q"}),
    ])
}

/// Transaction ids may hold `/`; otherwise they are names.
fn bad_transaction_id() -> BoxedStrategy<Value> {
    values(vec![
        json!(""),
        json!("t".repeat(256)),
        json!("bell\u{7}"),
        json!("nul\u{0}"),
        json!(7),
        json!(false),
        json!([]),
        json!({}),
    ])
}

fn uuid_text() -> BoxedStrategy<String> {
    (any::<u128>(), 0..4u8)
        .prop_map(|(n, form)| {
            let id = Uuid::from_u128(n);
            match form {
                0 => id.to_string(),
                1 => id.simple().to_string(),
                2 => id.to_string().to_uppercase(),
                _ => id.braced().to_string(),
            }
        })
        .boxed()
}

/// RFC 3339 timestamps chrono reads, from year 0 to 9999, with fractions and offsets.
fn good_timestamp() -> BoxedStrategy<String> {
    let offset = prop_oneof![
        2 => Just("Z".to_owned()),
        1 => Just("+00:00".to_owned()),
        2 => (0u32..=14, 0u32..60, prop::sample::select(vec!['+', '-']))
            .prop_map(|(h, m, sign)| format!("{sign}{h:02}:{m:02}")),
    ];
    let generated =
        (0u32..=9999, 1u32..=12, 1u32..=28, 0u32..24, 0u32..60, 0u32..60, prop::option::of("[0-9]{1,9}"), offset)
            .prop_map(|(y, mo, d, h, mi, s, fraction, offset)| {
                let fraction = fraction.map(|f| format!(".{f}")).unwrap_or_default();
                format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}{fraction}{offset}")
            });
    prop_oneof![
        4 => generated,
        1 => prop::sample::select(vec![
            "2026-07-29T14:00:00Z",
            "1970-01-01T00:00:00Z",
            "9999-12-31T23:59:59.999999999-14:00",
            "0000-01-01T00:00:00+14:00",
            "2024-02-29T12:00:00.5+05:30",
        ])
        .prop_map(str::to_owned),
    ]
    .boxed()
}

/// Timestamps whose reading the contract leaves open.
const STRAY_TIMESTAMPS: &[&str] = &[
    "2016-12-31T23:59:60Z",
    "2026-07-29t14:00:00z",
    "2026-07-29 14:00:00Z",
    "2026-07-29T14:00:00+23:59",
    "2026-07-29T14:00:00+24:00",
    "2026-07-29T14:00:00.1234567890123Z",
    "2026-07-29T14:00:00-00:00",
];

/// Texts that are no timestamp.
const BAD_TIMESTAMPS: &[&str] = &[
    "",
    "yesterday",
    "now",
    "2026-13-01T00:00:00Z",
    "2026-02-30T00:00:00Z",
    "14:00:00Z",
    "1700000000",
    "2026-07-29T25:00:00Z",
    "+275760-09-13T00:00:00Z",
    "2026-07-29T14:00Z",
];

fn timestamp_member(pristine: bool) -> BoxedStrategy<Member> {
    member(
        pristine,
        vec![
            with(6, Good, good_timestamp().prop_map(Value::String)),
            with(2, Good, naive_timestamp()),
            with(1, Stray, strings(STRAY_TIMESTAMPS)),
            with(2, Bad, strings(BAD_TIMESTAMPS)),
            with(
                1,
                Bad,
                values(vec![json!(1_700_000_000), json!(true), json!([]), json!({}), json!(["2026-07-29T14:00:00Z"])]),
            ),
            left_out(1, Bad),
            with(1, Bad, Just(Value::Null)),
        ],
    )
}

// ---------------------------------------------------------------------------------------------
// Breaking a body: mutations of its structure, and of its text on the wire.

#[derive(Debug, Clone)]
enum Mutation {
    /// A node becomes another value (of another shape, mostly).
    Replace(Index, Value),
    /// An object member is dropped.
    Remove(Index),
    /// A node becomes null.
    Null(Index),
    /// An object gets one more member.
    Extra(Index, String, Value),
    /// A node is wrapped in an array.
    InArray(Index),
    /// A node is buried that many levels deep, in arrays or (true) objects.
    Bury(Index, usize, bool),
    /// An array element is repeated.
    Twice(Index),
}

#[derive(Debug, Clone)]
enum Step {
    Key(String),
    At(usize),
}

fn paths(value: &Value, here: &mut Vec<Step>, out: &mut Vec<Vec<Step>>) {
    out.push(here.clone());
    match value {
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                here.push(Step::At(i));
                paths(item, here, out);
                here.pop();
            }
        }
        Value::Object(members) => {
            for (key, member) in members {
                here.push(Step::Key(key.clone()));
                paths(member, here, out);
                here.pop();
            }
        }
        _ => {}
    }
}

fn node_ref<'a>(value: &'a Value, path: &[Step]) -> &'a Value {
    path.iter().fold(value, |v, step| match step {
        Step::Key(key) => &v[key.as_str()],
        Step::At(i) => &v[*i],
    })
}

fn node<'a>(value: &'a mut Value, path: &[Step]) -> &'a mut Value {
    path.iter().fold(value, |v, step| match step {
        Step::Key(key) => &mut v[key.as_str()],
        Step::At(i) => &mut v[*i],
    })
}

fn mutate(value: &mut Value, mutation: &Mutation) {
    let mut all = Vec::new();
    paths(value, &mut Vec::new(), &mut all);
    let pick =
        |index: &Index, among: &[Vec<Step>]| (!among.is_empty()).then(|| among[index.index(among.len())].clone());
    let members: Vec<Vec<Step>> = all.iter().filter(|p| matches!(p.last(), Some(Step::Key(_)))).cloned().collect();
    let elements: Vec<Vec<Step>> = all.iter().filter(|p| matches!(p.last(), Some(Step::At(_)))).cloned().collect();
    let objects: Vec<Vec<Step>> = all.iter().filter(|p| node_ref(value, p).is_object()).cloned().collect();
    match mutation {
        Mutation::Replace(at, junk) => *node(value, &pick(at, &all).unwrap_or_default()) = junk.clone(),
        Mutation::Null(at) => *node(value, &pick(at, &all).unwrap_or_default()) = Value::Null,
        Mutation::Remove(at) => {
            if let Some(path) = pick(at, &members)
                && let Some((Step::Key(key), parent)) = path.split_last()
                && let Some(object) = node(value, parent).as_object_mut()
            {
                object.remove(key);
            }
        }
        Mutation::Extra(at, key, junk) => {
            if let Some(path) = pick(at, &objects)
                && let Some(object) = node(value, &path).as_object_mut()
            {
                object.insert(key.clone(), junk.clone());
            }
        }
        Mutation::InArray(at) => {
            let target = node(value, &pick(at, &all).unwrap_or_default());
            *target = Value::Array(vec![target.take()]);
        }
        Mutation::Bury(at, depth, in_objects) => {
            let target = node(value, &pick(at, &all).unwrap_or_default());
            let (open, close) = if *in_objects { ("{\"deep\":", "}") } else { ("[", "]") };
            *target = raw(&format!("{}{}{}", open.repeat(*depth), render(target), close.repeat(*depth)));
        }
        Mutation::Twice(at) => {
            if let Some(path) = pick(at, &elements)
                && let Some((Step::At(i), parent)) = path.split_last()
                && let Some(array) = node(value, parent).as_array_mut()
            {
                let copy = array[*i].clone();
                array.insert(*i + 1, copy);
            }
        }
    }
}

fn mutation() -> BoxedStrategy<Mutation> {
    prop_oneof![
        3 => (any::<Index>(), junk()).prop_map(|(at, v)| Mutation::Replace(at, v)),
        2 => any::<Index>().prop_map(Mutation::Remove),
        2 => any::<Index>().prop_map(Mutation::Null),
        2 => (any::<Index>(), key(), junk()).prop_map(|(at, k, v)| Mutation::Extra(at, k, v)),
        1 => any::<Index>().prop_map(Mutation::InArray),
        1 => (any::<Index>(), prop::sample::select(vec![3usize, 100, 127, 128, 129, 200, 20_000]), any::<bool>())
            .prop_map(|(at, depth, objects)| Mutation::Bury(at, depth, objects)),
        1 => any::<Index>().prop_map(Mutation::Twice),
    ]
    .boxed()
}

/// How the body's text goes on the wire.
#[derive(Debug, Clone)]
enum Wire {
    Json,
    /// Whitespace around the text.
    Spaced,
    /// The text cut short (past its first byte).
    Truncated(Index),
    /// Bytes that are not UTF-8, put right after a quote (inside a string, mostly).
    NotUtf8(Index, &'static [u8]),
    /// The object's first member sent twice: with another value before it, or (true) after it.
    DuplicateKey(Value, bool),
    /// Something after the JSON text.
    Trailing(&'static str),
    /// A UTF-8 byte order mark first.
    Bom,
    /// No body.
    Empty,
    /// Bytes, any.
    Bytes(Vec<u8>),
}

fn wire() -> BoxedStrategy<Wire> {
    prop_oneof![
        26 => Just(Wire::Json),
        2 => Just(Wire::Spaced),
        3 => any::<Index>().prop_map(Wire::Truncated),
        2 => (
            any::<Index>(),
            prop::sample::select(vec![
                &[0xff][..],
                &[0xc3],
                &[0xed, 0xa0, 0x80],
                &[0xc0, 0xaf],
                &[0xf4, 0x90, 0x80, 0x80],
                &[0x80],
                &[0x00],
            ]),
        )
            .prop_map(|(at, bytes)| Wire::NotUtf8(at, bytes)),
        2 => (junk(), any::<bool>()).prop_map(|(junk, after)| Wire::DuplicateKey(junk, after)),
        1 => prop::sample::select(vec!["}", ",", "x", "{}", "\u{0}", " // comment"]).prop_map(Wire::Trailing),
        1 => Just(Wire::Bom),
        1 => Just(Wire::Empty),
        1 => prop::collection::vec(any::<u8>(), 0..64).prop_map(Wire::Bytes),
    ]
    .boxed()
}

fn content_type() -> BoxedStrategy<Option<&'static str>> {
    prop_oneof![
        17 => Just(Some("application/json")),
        1 => Just(Some("application/json; charset=utf-8")),
        1 => Just(None),
        1 => prop::sample::select(vec![
            Some("text/plain"),
            Some("application/x-www-form-urlencoded"),
            Some("application/x-queen-push"),
            Some("multipart/form-data; boundary=x"),
        ]),
    ]
    .boxed()
}

/// The JSON text of `value`, each `RAW` string replaced by the text it carries.
fn render(value: &Value) -> String {
    let text = serde_json::to_string(value).expect("a value renders");
    let marker = format!("\"{RAW}");
    let mut out = String::with_capacity(text.len());
    let mut rest = text.as_str();
    while let Some(at) = rest.find(&marker) {
        out.push_str(&rest[..at]);
        let literal = &rest[at..];
        let bytes = literal.as_bytes();
        let mut end = 1;
        while bytes[end] != b'"' {
            end += if bytes[end] == b'\\' { 2 } else { 1 };
        }
        let inner: String = serde_json::from_str(&literal[..=end]).expect("a string literal");
        out.push_str(&inner[RAW.len()..]);
        rest = &literal[end + 1..];
    }
    out.push_str(rest);
    out
}

fn resolve(value: &mut Value, refs: &Refs) {
    match value {
        Value::String(s) => {
            if let Some(name) = s.strip_prefix(REF) {
                let resolved = refs.get(name).cloned().unwrap_or_else(|| panic!("the case has no {name}"));
                *value = resolved;
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|item| resolve(item, refs)),
        Value::Object(members) => members.values_mut().for_each(|member| resolve(member, refs)),
        _ => {}
    }
}

fn wire_bytes(value: &Value, wire: &Wire) -> Vec<u8> {
    let text = if value.as_str() == Some(NO_BODY) { String::new() } else { render(value) };
    match wire {
        Wire::Json => text.into_bytes(),
        Wire::Spaced => format!(" \n\t{text}\r\n ").into_bytes(),
        Wire::Truncated(at) if text.len() > 1 => text.as_bytes()[..1 + at.index(text.len() - 1)].to_vec(),
        Wire::Truncated(_) => text.into_bytes(),
        Wire::NotUtf8(at, bad) => {
            let quotes: Vec<usize> = text.match_indices('"').map(|(i, _)| i + 1).collect();
            let cut = if quotes.is_empty() { at.index(text.len() + 1) } else { quotes[at.index(quotes.len())] };
            let mut bytes = text.as_bytes()[..cut].to_vec();
            bytes.extend_from_slice(bad);
            bytes.extend_from_slice(&text.as_bytes()[cut..]);
            bytes
        }
        Wire::DuplicateKey(junk, after) => match value.as_object().and_then(|members| members.keys().next()) {
            Some(first) => {
                let member = format!("{}:{}", serde_json::to_string(first).expect("a key"), render(junk));
                if *after {
                    format!("{},{member}}}", &text[..text.len() - 1]).into_bytes()
                } else {
                    format!("{{{member},{}", &text[1..]).into_bytes()
                }
            }
            None => text.into_bytes(),
        },
        Wire::Trailing(tail) => format!("{text}{tail}").into_bytes(),
        Wire::Bom => format!("\u{feff}{text}").into_bytes(),
        Wire::Empty => Vec::new(),
        Wire::Bytes(bytes) => bytes.clone(),
    }
}

/// A body as built, and how it is broken.
#[derive(Debug, Clone)]
struct Case {
    body: Value,
    verdict: Verdict,
    mutations: Vec<Mutation>,
    wire: Wire,
    content_type: Option<&'static str>,
}

/// Cases of a body: two in five built of good parts only and sent as built (so that accepted
/// bodies get checked too), the others of any parts, broken or not. `body(pristine)` builds the
/// body.
fn case(body: impl Fn(bool) -> BoxedStrategy<(Value, Verdict)>) -> BoxedStrategy<Case> {
    let as_built = (body(true), prop_oneof![9 => Just(Wire::Json), 1 => Just(Wire::Spaced)]).prop_map(
        |((body, verdict), wire)| Case {
            body,
            verdict,
            mutations: Vec::new(),
            wire,
            content_type: Some("application/json"),
        },
    );
    let mutations = prop_oneof![1 => Just(Vec::new()), 1 => prop::collection::vec(mutation(), 1..4)];
    let broken = (body(false), mutations, wire(), content_type()).prop_map(
        |((body, verdict), mutations, wire, content_type)| Case { body, verdict, mutations, wire, content_type },
    );
    prop_oneof![2 => as_built, 3 => broken].boxed()
}

/// What goes on the wire for a case, and what it must get.
struct Sent {
    /// The body after mutation, before its text was broken.
    value: Value,
    bytes: Vec<u8>,
    content_type: Option<&'static str>,
    expected: Verdict,
}

impl Case {
    /// The case with its references resolved, broken as it says. `also` is what the rest of the
    /// request (its path) deserves.
    fn send(&self, refs: &Refs, also: Verdict) -> Sent {
        let mut value = self.body.clone();
        resolve(&mut value, refs);
        for mutation in &self.mutations {
            mutate(&mut value, mutation);
        }
        let intact = self.mutations.is_empty()
            && matches!(self.wire, Wire::Json | Wire::Spaced)
            && self.content_type.is_some_and(|t| t.starts_with("application/json"));
        let expected = if intact { self.verdict.max(also) } else { Stray.max(also) };
        Sent { bytes: wire_bytes(&value, &self.wire), value, content_type: self.content_type, expected }
    }
}

impl Sent {
    fn shown(&self) -> String {
        let text = String::from_utf8_lossy(&self.bytes);
        let cut: String = text.chars().take(1500).collect();
        let more = if cut.len() < text.len() { format!("... ({} bytes)", self.bytes.len()) } else { String::new() };
        format!("[{}] {cut}{more}", self.content_type.unwrap_or("no content type"))
    }
}

// ---------------------------------------------------------------------------------------------
// The harness: one broker and database per test, driven from proptest's synchronous closure.

struct Reply {
    status: StatusCode,
    text: String,
    json: Option<Value>,
}

impl Reply {
    fn shown(&self) -> String {
        let cut: String = self.text.chars().take(1500).collect();
        format!("{} {cut}", self.status)
    }

    fn array(&self) -> Result<&Vec<Value>, TestCaseError> {
        self.json.as_ref().and_then(Value::as_array).ok_or_else(|| fail(format!("not a JSON array: {}", self.shown())))
    }

    /// The answer's members, each kept as raw JSON: a whole answer may nest deeper than a JSON
    /// reader takes (a value read back at the depth a body carried it, inside the answer's own
    /// levels).
    fn members(&self) -> Result<Members<'_>, TestCaseError> {
        serde_json::from_str(&self.text)
            .map_err(|e| fail(format!("the answer is no JSON object ({e}): {}", self.shown())))
    }

    /// The answer's `results`, each read on its own.
    fn results(&self) -> Result<Vec<Value>, TestCaseError> {
        let members = self.members()?;
        let results = present(&members, "results").ok_or_else(|| fail(format!("no results: {}", self.shown())))?;
        raw_array(results)?
            .into_iter()
            .map(|result| {
                serde_json::from_str(result.get()).map_err(|e| fail(format!("a result ({e}): {}", self.shown())))
            })
            .collect()
    }
}

fn fail(message: impl Into<String>) -> TestCaseError {
    TestCaseError::fail(message.into())
}

struct Fuzz {
    app: TestApp,
    db: tokio_postgres::Client,
    serial: Cell<u64>,
    /// (partition id, transaction id) of every message pushed through a fuzzed body so far.
    stored: RefCell<HashSet<(String, String)>>,
    /// The partition id of each (queue, partition) pushed to.
    partitions: RefCell<HashMap<(String, String), String>>,
    /// How many cases of each expectation, and answers of each status, were seen.
    tally: RefCell<BTreeMap<String, u32>>,
    /// Dropped last: the runtime the broker's tasks and the connections live on.
    system: SystemRunner,
}

impl Fuzz {
    fn start(tweak: impl FnOnce(&mut Config)) -> Fuzz {
        let system = System::new();
        let (app, db) = system.block_on(async {
            let app = TestApp::spawn_with(|config| {
                config.push.max_items = MAX_ITEMS;
                // No creation limit: a long run creates thousands of queues, partitions and groups.
                config.limits.max_queues = 0;
                config.limits.max_partitions_per_queue = 0;
                config.limits.max_groups_per_queue = 0;
                // Maintenance passes write (their record, expired keys) on their own schedule: not
                // while cases are checked.
                config.maintenance.interval_ms = 3_600_000;
                // Due timers are delivered within milliseconds, and waited for.
                config.timers.sweep_interval_ms = 10;
                tweak(config);
            })
            .await;
            let db = app.db.connect().await;
            (app, db)
        });
        Fuzz {
            app,
            db,
            serial: Cell::new(0),
            stored: RefCell::default(),
            partitions: RefCell::default(),
            tally: RefCell::default(),
            system,
        }
    }

    fn block_on<F: Future>(&self, future: F) -> F::Output {
        self.system.block_on(future)
    }

    fn next(&self) -> u64 {
        self.serial.set(self.serial.get() + 1);
        self.serial.get()
    }

    /// Runs the cases, and says what they were (how many of each expectation, and of each
    /// answer status).
    fn run<S: Strategy>(&self, strategy: S, test: impl Fn(S::Value) -> Result<(), TestCaseError>) {
        let started = std::time::Instant::now();
        let result = TestRunner::new(proptest_config()).run(&strategy, test);
        println!("{:?} in {:.1?}", self.tally.borrow(), started.elapsed());
        if let Err(failure) = result {
            panic!("{failure}");
        }
    }

    async fn send(&self, path: &str, sent: &Sent) -> Result<Reply, TestCaseError> {
        let mut request = self.app.http.post(self.app.url(path)).body(sent.bytes.clone());
        if let Some(content_type) = sent.content_type {
            request = request.header("content-type", content_type);
        }
        let shown = || format!("POST {path} {}", sent.shown());
        let response =
            request.send().await.map_err(|e| fail(format!("no answer ({e}); did the handler panic? {}", shown())))?;
        let status = response.status();
        let text = response.text().await.map_err(|e| fail(format!("the answer broke off ({e}): {}", shown())))?;
        let json = serde_json::from_str(&text).ok();
        Ok(Reply { status, text, json })
    }

    async fn get(&self, path: &str) -> Result<Reply, TestCaseError> {
        let response =
            self.app.http.get(self.app.url(path)).send().await.map_err(|e| fail(format!("GET {path}: {e}")))?;
        let status = response.status();
        let text = response.text().await.map_err(|e| fail(format!("GET {path}: {e}")))?;
        let json = serde_json::from_str(&text).ok();
        Ok(Reply { status, text, json })
    }

    /// Sends a case and checks what every answer must satisfy (no 5xx; a 4xx is a JSON error; a
    /// 4xx, or a 2xx saying `success: false`, wrote nothing; the verdict of an intact case); the
    /// answer.
    async fn exchange(&self, path: &str, sent: &Sent) -> Result<Reply, TestCaseError> {
        let before = row_versions(&self.db).await;
        let reply = self.send(path, sent).await?;
        for seen in [format!("{:?}", sent.expected), reply.status.as_u16().to_string()] {
            *self.tally.borrow_mut().entry(seen).or_default() += 1;
        }
        let shown = || format!("POST {path} {}\n  → {}", sent.shown(), reply.shown());
        prop_assert!(!reply.status.is_server_error(), "a server error: {}", shown());
        prop_assert!(reply.status.is_success() || reply.status.is_client_error(), "neither 2xx nor 4xx: {}", shown());
        if reply.status.is_client_error() {
            let error = reply.json.as_ref().and_then(|body| body.get("error")).and_then(Value::as_str);
            prop_assert!(
                reply.json.as_ref().is_some_and(Value::is_object) && error.is_some(),
                "a 4xx without a JSON error: {}",
                shown()
            );
        }
        let unsuccessful = reply.json.as_ref().and_then(|body| body.get("success")) == Some(&json!(false));
        if reply.status.is_client_error() || unsuccessful {
            let after = row_versions(&self.db).await;
            let changed: Vec<&String> =
                after.iter().filter(|(t, f)| before.get(*t) != Some(f)).map(|(t, _)| t).collect();
            prop_assert!(changed.is_empty(), "a refusal ({}) wrote to {changed:?}: {}", reply.status, shown());
        }
        match sent.expected {
            Good => prop_assert!(reply.status.is_success(), "a good body was refused: {}", shown()),
            Bad => prop_assert_eq!(reply.status, StatusCode::BAD_REQUEST, "a bad body was not refused: {}", shown()),
            Stray => {}
        }
        Ok(reply)
    }

    async fn number(&self, sql: &str, params: &[&(dyn tokio_postgres::types::ToSql + Sync)]) -> Option<i64> {
        self.db.query_opt(sql, params).await.unwrap_or_else(|e| panic!("{sql}: {e}")).and_then(|row| row.get(0))
    }

    /// A fresh partition of `queue` with `n` messages, popped by `group` under one lease.
    async fn leased(&self, queue: &str, group: Option<&str>, n: usize) -> Result<Leased, TestCaseError> {
        let partition = format!("p-{}", self.next());
        let transaction_ids: Vec<String> = (0..n).map(|i| format!("{partition}-m{i}")).collect();
        let items: Vec<Value> = transaction_ids
            .iter()
            .enumerate()
            .map(|(i, t)| json!({"queue": queue, "partition": partition, "transactionId": t, "payload": {"i": i}}))
            .collect();
        self.app.push(Value::Array(items)).await;
        let popped = self.pop(queue, &partition, group, n).await?;
        let pushed: Vec<&str> = popped.messages.iter().map(|m| m.transaction_id.as_str()).collect();
        prop_assert_eq!(&pushed, &transaction_ids, "the set-up pop of {}", partition);
        let lease = popped.lease_id.as_deref().and_then(|l| Uuid::parse_str(l).ok()).ok_or_else(|| fail("no lease"))?;
        let partition_id = popped.partition_id.parse().map_err(|_| fail("no partition id"))?;
        Ok(Leased { partition, partition_id, lease, transaction_ids })
    }

    /// Pops up to `batch` messages of one partition for `group` (`None`: queue mode).
    async fn pop(
        &self,
        queue: &str,
        partition: &str,
        group: Option<&str>,
        batch: usize,
    ) -> Result<Popped, TestCaseError> {
        let group = group.map(|g| format!("&consumerGroup={}", segment(g))).unwrap_or_default();
        let path = format!(
            "/api/v1/pop/queue/{}/partition/{}?batch={batch}&subscriptionMode=all{group}",
            segment(queue),
            segment(partition)
        );
        let reply = self.get(&path).await?;
        match reply.status {
            StatusCode::NO_CONTENT => Ok(Popped::default()),
            StatusCode::OK => {
                serde_json::from_str(&reply.text).map_err(|e| fail(format!("{path}: {e}: {}", reply.shown())))
            }
            _ => Err(fail(format!("{path}: {}", reply.shown()))),
        }
    }

    /// Checks the results of accepted push items, and pops what was queued back (in queue mode
    /// of a group of its own, acknowledging it as it goes): the same transaction ids, in order,
    /// with the payload text byte for byte.
    async fn verify_pushed(&self, items: &[(usize, SentItem)], results: &[&Value]) -> Result<(), TestCaseError> {
        prop_assert_eq!(results.len(), items.len(), "one result per item: {:?}", results);
        let mut expected = Queued::new();
        for ((index, item), result) in items.iter().zip(results) {
            let shown = || format!("item {index} {item:?} → {result}");
            prop_assert_eq!(result["index"].as_u64(), Some(*index as u64), "{}", shown());
            let transaction_id = result["transaction_id"].as_str().unwrap_or_default().to_owned();
            let partition_id = result["partition_id"].as_str().unwrap_or_default().to_owned();
            match &item.transaction_id {
                Some(sent) => prop_assert_eq!(&transaction_id, sent, "{}", shown()),
                None => prop_assert!(!transaction_id.is_empty(), "no transaction id was minted: {}", shown()),
            }
            prop_assert!(partition_id.parse::<i64>().is_ok_and(|id| id > 0), "{}", shown());
            let key = (item.queue.clone(), item.partition.clone());
            {
                let mut partitions = self.partitions.borrow_mut();
                let other =
                    partitions.iter().find(|(k, id)| **id == partition_id && **k != key).map(|(k, _)| k.clone());
                prop_assert!(other.is_none(), "{:?} and {:?} share a partition: {}", other, key, shown());
                let known = partitions.entry(key.clone()).or_insert_with(|| partition_id.clone());
                prop_assert_eq!(&*known, &partition_id, "a partition id changed: {}", shown());
            }
            let mut stored = self.stored.borrow_mut();
            match result["status"].as_str() {
                Some("queued") => {
                    let new = stored.insert((partition_id.clone(), transaction_id.clone()));
                    prop_assert!(new, "queued twice (no dedup): {}", shown());
                    let entry = expected.entry(key).or_insert_with(|| (partition_id.clone(), Vec::new()));
                    entry.1.push((transaction_id, item.payload.clone()));
                }
                Some("duplicate") => {
                    let known = stored.contains(&(partition_id, transaction_id));
                    prop_assert!(known, "a duplicate of nothing pushed: {}", shown());
                }
                _ => return Err(fail(format!("an unexpected status: {}", shown()))),
            }
        }
        for ((queue, partition), (partition_id, messages)) in expected {
            if !addressable(&queue) || !addressable(&partition) {
                let id: i64 = partition_id.parse().expect("checked above");
                for (transaction_id, _) in &messages {
                    let sql =
                        "SELECT count(*) FROM queen.log_message_ids WHERE partition_id = $1 AND transaction_id = $2";
                    prop_assert_eq!(
                        self.number(sql, &[&id, transaction_id]).await,
                        Some(1),
                        "{} not stored",
                        transaction_id
                    );
                }
                continue;
            }
            let popped = self.consume(&queue, &partition, "fuzz-round-trip").await?;
            let got: Vec<(String, String)> =
                popped.messages.iter().map(|m| (m.transaction_id.clone(), m.data.get().to_owned())).collect();
            prop_assert_eq!(&got, &messages, "{:?}/{:?} popped back otherwise", queue, partition);
        }
        Ok(())
    }

    /// Pops what `group` has not consumed of a partition yet, and acknowledges it.
    async fn consume(&self, queue: &str, partition: &str, group: &str) -> Result<Popped, TestCaseError> {
        let popped = self.pop(queue, partition, Some(group), 10_000).await?;
        if !popped.messages.is_empty() {
            let acks: Vec<Value> = popped
                .messages
                .iter()
                .map(|m| {
                    json!({"transactionId": m.transaction_id, "partitionId": m.partition_id,
                           "leaseId": popped.lease_id})
                })
                .collect();
            let answer =
                self.app.post("/api/v1/ack/batch", &json!({"acknowledgments": acks, "consumerGroup": group})).await;
            prop_assert!(answer.body.as_array().is_some_and(|r| r.iter().all(|r| r["success"] == true)), "{answer:?}");
        }
        Ok(popped)
    }
}

/// For each (queue, partition) pushed to: its id, and the (transaction id, payload) of each
/// message queued there, in order.
type Queued = BTreeMap<(String, String), (String, Vec<(String, String)>)>;

fn segment(name: &str) -> String {
    name.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~+".contains(&b) {
                char::from(b).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Popped {
    #[serde(default)]
    messages: Vec<PoppedMessage>,
    lease_id: Option<String>,
    #[serde(default)]
    partition_id: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct PoppedMessage {
    #[serde(default)]
    id: String,
    transaction_id: String,
    partition_id: String,
    data: Box<RawValue>,
}

/// Messages set up for a case, under one lease.
struct Leased {
    partition: String,
    partition_id: i64,
    lease: Uuid,
    transaction_ids: Vec<String>,
}

impl Leased {
    fn refs(&self) -> Refs {
        let mut refs = lease_refs(self.lease);
        refs.insert("partition".into(), json!(self.partition_id.to_string()));
        refs.insert("partition#".into(), json!(self.partition_id));
        for (i, transaction_id) in self.transaction_ids.iter().enumerate() {
            refs.insert(format!("txn{i}"), json!(transaction_id));
        }
        refs
    }
}

/// The spellings of a lease id the broker reads as that lease.
const LEASE_FORMS: &[&str] = &["lease", "lease:upper", "lease:simple", "lease:braced", "lease:urn"];

fn lease_refs(lease: Uuid) -> Refs {
    let forms = [
        lease.to_string(),
        lease.to_string().to_uppercase(),
        lease.simple().to_string(),
        lease.braced().to_string(),
        lease.urn().to_string(),
    ];
    LEASE_FORMS.iter().zip(forms).map(|(name, form)| ((*name).to_owned(), json!(form))).collect()
}

fn lease_form() -> BoxedStrategy<Value> {
    prop_oneof![4 => Just(reference("lease")), 1 => prop::sample::select(LEASE_FORMS).prop_map(reference)].boxed()
}

// ---------------------------------------------------------------------------------------------
// What the broker read: the oracle for round trips, reading a sent body as the broker does
// (members kept as raw JSON, the last of repeated keys winning).

#[derive(Debug)]
struct SentItem {
    queue: String,
    partition: String,
    transaction_id: Option<String>,
    payload: String,
}

type Members<'a> = BTreeMap<String, &'a RawValue>;

fn members_of(text: &str) -> Result<Members<'_>, TestCaseError> {
    serde_json::from_str(text).map_err(|e| fail(format!("accepted what is no JSON object ({e}): {text:.500}")))
}

fn accepted_text(bytes: &[u8]) -> Result<&str, TestCaseError> {
    let text = std::str::from_utf8(bytes).map_err(|e| fail(format!("accepted a body that is not UTF-8: {e}")))?;
    Ok(if text.trim().is_empty() { "{}" } else { text })
}

fn present<'a>(members: &Members<'a>, key: &str) -> Option<&'a RawValue> {
    members.get(key).copied().filter(|raw| raw.get() != "null")
}

/// Member `key` as the broker read it (absent and null are none).
fn read_of<T: DeserializeOwned>(members: &Members<'_>, key: &str) -> Result<Option<T>, TestCaseError> {
    present(members, key)
        .map(|raw| {
            serde_json::from_str(raw.get()).map_err(|e| fail(format!("accepted a {key} of {:.200}: {e}", raw.get())))
        })
        .transpose()
}

fn string_of(members: &Members<'_>, key: &str) -> Result<Option<String>, TestCaseError> {
    read_of(members, key)
}

/// The elements of an array, each kept as raw JSON.
fn raw_array(raw: &RawValue) -> Result<Vec<&RawValue>, TestCaseError> {
    serde_json::from_str(raw.get()).map_err(|e| fail(format!("accepted what is no array ({e}): {:.200}", raw.get())))
}

fn sent_items(items: &RawValue) -> Result<Vec<SentItem>, TestCaseError> {
    let items: Vec<&RawValue> =
        serde_json::from_str(items.get()).map_err(|e| fail(format!("accepted items that are no array: {e}")))?;
    items
        .into_iter()
        .map(|item| {
            let members = members_of(item.get())?;
            Ok(SentItem {
                queue: string_of(&members, "queue")?.ok_or_else(|| fail("accepted an item without a queue"))?,
                partition: string_of(&members, "partition")?.unwrap_or_else(|| "Default".into()),
                transaction_id: string_of(&members, "transactionId")?,
                payload: members.get("payload").map_or("null", |raw| raw.get()).to_owned(),
            })
        })
        .collect()
}

/// The entries of a transaction body in the flat index space of its results: one per ack, one
/// per pushed item, in operation order; then the `kv` rider's operations, then the `timers`
/// rider's.
struct Entries {
    /// Each pushed item, with its index.
    pushed: Vec<(usize, SentItem)>,
    /// The index of each ack.
    acked: Vec<usize>,
    /// How many acks and pushed items.
    count: usize,
    kv: Vec<KvRead>,
    timers: Vec<TimerRead>,
}

fn bundle_entries(bytes: &[u8]) -> Result<Entries, TestCaseError> {
    let body = members_of(accepted_text(bytes)?)?;
    let operations: Vec<&RawValue> = present(&body, "operations")
        .map(|raw| serde_json::from_str(raw.get()))
        .transpose()
        .map_err(|e| fail(e.to_string()))?
        .unwrap_or_default();
    let (mut pushed, mut acked, mut index) = (Vec::new(), Vec::new(), 0);
    for operation in operations {
        let members = members_of(operation.get())?;
        match string_of(&members, "type")?.as_deref() {
            Some("push") => {
                for item in sent_items(present(&members, "items").ok_or_else(|| fail("a push without items"))?)? {
                    pushed.push((index, item));
                    index += 1;
                }
            }
            Some("ack") => {
                acked.push(index);
                index += 1;
            }
            other => return Err(fail(format!("accepted an operation of type {other:?}"))),
        }
    }
    let kv = present(&body, "kv").map(kv_reads).transpose()?.unwrap_or_default();
    let timers = present(&body, "timers").map(timer_reads).transpose()?.unwrap_or_default();
    Ok(Entries { pushed, acked, count: index, kv, timers })
}

fn statuses_complete(statuses: &[Option<&str>]) -> bool {
    statuses.iter().all(|s| matches!(s, None | Some("completed" | "success")))
}

// ---------------------------------------------------------------------------------------------
// Push.

const PUSH_QUEUES: &[&str] = &["orders", "ünïcödé queue", "a+b", "100%", "emoji 🦀"];
const PUSH_PARTITIONS: &[&str] = &["Default", "p1", "客户-42", "with space"];
const TRANSACTION_IDS: &[&str] = &["t-1", "t-2", "ünï-tx", "a/b/c", "0192f0c4-0000-7000-8000-000000000001"];

/// A good queue or partition name: one of `pool` mostly, or any.
fn pooled_name(pool: &'static [&'static str]) -> BoxedStrategy<Value> {
    prop_oneof![3 => strings(pool), 1 => created_name().prop_map(Value::String)].boxed()
}

/// A queue or partition name that must be given (`good` ones), or not.
fn required_name_member(
    good: BoxedStrategy<Value>,
    bad: BoxedStrategy<Value>,
    pristine: bool,
) -> BoxedStrategy<Member> {
    member(pristine, vec![with(12, Good, good), with(1, Bad, bad), left_out(1, Bad), with(1, Bad, Just(Value::Null))])
}

/// A partition name that may be left out: one of `pool` mostly, any good name, or not.
fn optional_name_member(
    pool: &'static [&'static str],
    bad: BoxedStrategy<Value>,
    pristine: bool,
) -> BoxedStrategy<Member> {
    member(
        pristine,
        vec![left_out(2, Good), with(1, Good, Just(Value::Null)), with(5, Good, pooled_name(pool)), with(1, Bad, bad)],
    )
}

/// A transaction id that may be left out (the broker mints one).
fn transaction_id_member(pristine: bool) -> BoxedStrategy<Member> {
    member(
        pristine,
        vec![
            left_out(2, Good),
            with(1, Good, Just(Value::Null)),
            with(3, Good, strings(TRANSACTION_IDS)),
            with(3, Good, "[a-z0-9-]{8,24}".prop_map(Value::String)),
            with(1, Good, Just(json!("x".repeat(255)))),
            with(1, Bad, bad_transaction_id()),
        ],
    )
}

fn push_item(pristine: bool) -> BoxedStrategy<Draft> {
    let queue = required_name_member(pooled_name(PUSH_QUEUES), bad_created_name(), pristine);
    let partition = optional_name_member(PUSH_PARTITIONS, bad_created_name(), pristine);
    let transaction_id = transaction_id_member(pristine);
    let trace_id = member(
        pristine,
        vec![
            left_out(6, Good),
            with(1, Good, Just(Value::Null)),
            with(2, Good, uuid_text().prop_map(Value::String)),
            with(1, Bad, values(vec![json!("nope"), json!(""), json!("0192f0c4"), json!(5), json!(true), json!([])])),
        ],
    );
    let payload = member(pristine, vec![left_out(1, Good), with(6, Good, json_value(Raw::Valid))]);
    (queue, partition, transaction_id, trace_id, payload)
        .prop_map(|(queue, partition, transaction_id, trace_id, payload)| {
            Draft(vec![
                ("queue", queue),
                ("partition", partition),
                ("transactionId", transaction_id),
                ("traceId", trace_id),
                ("payload", payload),
            ])
        })
        .boxed()
}

/// An array of push items, as a member: as bad as its worst item, or as its length past
/// `push.max_items`.
fn push_items(pristine: bool, counts: std::ops::Range<usize>) -> BoxedStrategy<Member> {
    prop::collection::vec(push_item(pristine), counts)
        .prop_map(|items| {
            let (value, verdict) = array_of(&items);
            (Some(value), verdict.max(if items.len() > MAX_ITEMS { Bad } else { Good }))
        })
        .boxed()
}

fn push_body(pristine: bool) -> BoxedStrategy<(Value, Verdict)> {
    let near_the_limit = if pristine { MAX_ITEMS - 2..MAX_ITEMS + 1 } else { MAX_ITEMS - 2..MAX_ITEMS + 4 };
    let items = member(
        pristine,
        vec![
            (9, Good, push_items(pristine, 0..5)),
            (1, Good, push_items(pristine, near_the_limit)),
            left_out(1, Bad),
            with(
                1,
                Bad,
                values(vec![
                    Value::Null,
                    json!("items"),
                    json!(5),
                    json!({}),
                    json!({"queue": "q"}),
                    json!([1]),
                    json!([[]]),
                ]),
            ),
        ],
    );
    items.prop_map(|items| Draft(vec![("items", items)]).built()).boxed()
}

#[test]
fn fuzzed_push_bodies() {
    let fuzz = Fuzz::start(|_| {});
    fuzz.run(case(push_body), |case| {
        fuzz.block_on(async {
            let sent = case.send(&Refs::new(), Good);
            let reply = fuzz.exchange("/api/v1/push", &sent).await?;
            if reply.status.is_success() {
                prop_assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.shown());
                let text = accepted_text(&sent.bytes)?;
                let body = members_of(text)?;
                let items = sent_items(present(&body, "items").ok_or_else(|| fail("accepted a push without items"))?)?;
                let results: Vec<&Value> = reply.array()?.iter().collect();
                fuzz.verify_pushed(&items.into_iter().enumerate().collect::<Vec<_>>(), &results).await?;
            }
            Ok(())
        })
    });
}

// ---------------------------------------------------------------------------------------------
// Ack and ack batch: bodies about messages leased for the case.

/// The group the case's messages are popped by: queue mode (spelled two ways) or named.
const GROUPS: &[Option<&str>] = &[None, Some("__QUEUE_MODE__"), Some("g-acks"), Some("ünï 组")];

/// Values no consumer group may be.
fn bad_group() -> BoxedStrategy<Value> {
    values(vec![json!("a/b"), json!("g".repeat(256)), json!("bell\u{7}"), json!(5), json!(true), json!([]), json!({})])
}

fn group_member(group: Option<&'static str>, pristine: bool) -> BoxedStrategy<Member> {
    let bad = with(1, Bad, bad_group());
    let arms = match group {
        None | Some("__QUEUE_MODE__") => vec![
            left_out(4, Good),
            with(3, Good, values(vec![Value::Null, json!(""), json!("__QUEUE_MODE__")])),
            with(1, Stray, strings(&["g-acks", "other"])),
            bad,
        ],
        Some(name) => vec![
            with(8, Good, Just(json!(name))),
            left_out(1, Stray),
            with(1, Stray, values(vec![Value::Null, json!("other"), json!("__QUEUE_MODE__")])),
            bad,
        ],
    };
    member(pristine, arms)
}

fn partition_member(pristine: bool) -> BoxedStrategy<Member> {
    member(
        pristine,
        vec![
            with(6, Good, Just(reference("partition"))),
            with(4, Good, Just(reference("partition#"))),
            with(1, Stray, values(vec![json!("987654321"), json!(987_654_321), json!("+987654321")])),
            with(
                2,
                Bad,
                values(vec![
                    json!("abc"),
                    json!("0"),
                    json!(0),
                    json!("-1"),
                    json!(-7),
                    json!(1.5),
                    json!("1.5"),
                    json!("9223372036854775808"),
                    raw("9223372036854775808"),
                    raw("1e2"),
                    json!(""),
                    json!(" 1"),
                    json!(true),
                    json!([]),
                    json!({}),
                    Value::Null,
                ]),
            ),
            left_out(1, Bad),
        ],
    )
}

fn lease_member(pristine: bool) -> BoxedStrategy<Member> {
    member(
        pristine,
        vec![
            with(10, Good, lease_form()),
            left_out(1, Stray),
            with(1, Stray, values(vec![Value::Null, json!("")])),
            with(1, Stray, uuid_text().prop_map(Value::String)),
            with(
                1,
                Bad,
                values(vec![
                    json!("nope"),
                    json!("0192f0c4-0000-7000-8000-00000000000"),
                    json!(5),
                    json!(true),
                    json!([]),
                    json!({}),
                ]),
            ),
        ],
    )
}

/// Whether an ack names no lease of its own (absent, null or empty).
fn unfenced(member: &Member) -> bool {
    matches!(&member.0, None | Some(Value::Null)) || member.0.as_ref().and_then(Value::as_str) == Some("")
}

fn status_member(completions_only: bool, pristine: bool) -> BoxedStrategy<Member> {
    let other = if completions_only { Stray } else { Good };
    member(
        pristine,
        vec![
            left_out(2, Good),
            with(2, Good, Just(json!("completed"))),
            with(1, Good, values(vec![json!("success"), Value::Null])),
            with(3, other, strings(&["failed", "retry", "dlq"])),
            with(1, Bad, values(vec![json!("COMPLETED"), json!("maybe"), json!(""), json!(1), json!(true), json!([])])),
        ],
    )
}

fn error_member(pristine: bool) -> BoxedStrategy<Member> {
    member(
        pristine,
        vec![
            left_out(3, Good),
            with(1, Good, Just(Value::Null)),
            with(3, Good, text().prop_map(Value::String)),
            with(2, Good, strings(&["nul\u{0}inside", "\u{0}", "trace:\n  at x (y.js:1)\u{0}"])),
            with(1, Bad, values(vec![json!(5), json!(true), json!([]), json!({"message": "x"})])),
        ],
    )
}

fn transaction_member(i: usize, pristine: bool) -> BoxedStrategy<Member> {
    member(
        pristine,
        vec![
            with(10, Good, Just(reference(&format!("txn{i}")))),
            with(1, Stray, "[a-z]{4,12}".prop_map(Value::String)),
            with(1, Bad, bad_transaction_id()),
            left_out(1, Bad),
            with(1, Bad, Just(Value::Null)),
        ],
    )
}

/// An acknowledgement of the case's `i`th message.
fn ack_draft(i: usize, completions_only: bool, pristine: bool) -> BoxedStrategy<Draft> {
    (
        transaction_member(i, pristine),
        partition_member(pristine),
        lease_member(pristine),
        status_member(completions_only, pristine),
        error_member(pristine),
    )
        .prop_map(|(transaction_id, partition_id, lease_id, status, error)| {
            Draft(vec![
                ("transactionId", transaction_id),
                ("partitionId", partition_id),
                ("leaseId", lease_id),
                ("status", status),
                ("error", error),
            ])
        })
        .boxed()
}

#[derive(Debug, Clone)]
struct AckCase {
    group: Option<&'static str>,
    messages: usize,
    case: Case,
}

fn ack_case() -> BoxedStrategy<AckCase> {
    prop::sample::select(GROUPS)
        .prop_flat_map(|group| {
            let body = move |pristine| {
                (ack_draft(0, false, pristine), group_member(group, pristine))
                    .prop_map(|(mut draft, group)| {
                        draft.0.push(("consumerGroup", group));
                        draft.built()
                    })
                    .boxed()
            };
            (Just(group), case(body))
        })
        .prop_map(|(group, case)| AckCase { group, messages: 1, case })
        .boxed()
}

fn ack_batch_case() -> BoxedStrategy<AckCase> {
    (prop::sample::select(GROUPS), 1..=3usize)
        .prop_flat_map(|(group, n)| {
            let body = move |pristine| {
                let acks: Vec<BoxedStrategy<Draft>> = (0..n).map(|i| ack_draft(i, true, pristine)).collect();
                let acks = acks.prop_map(|drafts| {
                    let (value, verdict) = array_of(&drafts);
                    (Some(value), verdict)
                });
                let acks = member(
                    pristine,
                    vec![
                        (10, Good, acks.boxed()),
                        left_out(1, Bad),
                        with(
                            1,
                            Bad,
                            values(vec![Value::Null, json!([]), json!("x"), json!({}), json!([1]), json!([[]])]),
                        ),
                    ],
                );
                (acks, group_member(group, pristine))
                    .prop_map(|(acks, group)| Draft(vec![("acknowledgments", acks), ("consumerGroup", group)]).built())
                    .boxed()
            };
            (Just(group), Just(n), case(body))
        })
        .prop_map(|(group, messages, case)| AckCase { group, messages, case })
        .boxed()
}

/// Sends an ack body about freshly leased messages; on success, checks that each verdict came
/// back and, for a good body, that the acks took effect.
async fn check_ack(fuzz: &Fuzz, ack: AckCase, batch: bool) -> Result<(), TestCaseError> {
    const QUEUE: &str = "fuzz-acks";
    let leased = fuzz.leased(QUEUE, ack.group, ack.messages).await?;
    let sent = ack.case.send(&leased.refs(), Good);
    let path = if batch { "/api/v1/ack/batch" } else { "/api/v1/ack" };
    let reply = fuzz.exchange(path, &sent).await?;
    if !reply.status.is_success() {
        return Ok(());
    }
    prop_assert_eq!(reply.status, StatusCode::OK, "{}", reply.shown());
    let body = members_of(accepted_text(&sent.bytes)?)?;
    let sent_acks = match present(&body, "acknowledgments") {
        Some(raw) if batch => serde_json::from_str::<Vec<&RawValue>>(raw.get()).map_err(|e| fail(e.to_string()))?.len(),
        _ => 1,
    };
    let results = reply.array()?;
    prop_assert_eq!(results.len(), sent_acks, "one verdict per ack: {}", reply.shown());
    prop_assert!(results.iter().all(|r| r["success"].is_boolean()), "{}", reply.shown());
    if sent.expected != Good {
        return Ok(());
    }
    prop_assert!(
        results.iter().all(|r| r["success"] == true),
        "a good ack failed: {}\n  → {}",
        sent.shown(),
        reply.shown()
    );
    let items: Vec<&Value> = if batch {
        sent.value["acknowledgments"].as_array().into_iter().flatten().collect()
    } else {
        vec![&sent.value]
    };
    let statuses: Vec<Option<&str>> = items.iter().map(|item| item["status"].as_str()).collect();
    let again = fuzz.pop(QUEUE, &leased.partition, ack.group, 10).await?;
    let redelivered: Vec<&str> = again.messages.iter().map(|m| m.transaction_id.as_str()).collect();
    if statuses_complete(&statuses) || statuses == [Some("dlq")] {
        prop_assert!(redelivered.is_empty(), "acknowledged messages came back: {redelivered:?}");
    } else {
        prop_assert_eq!(
            redelivered.first().copied(),
            Some(leased.transaction_ids[0].as_str()),
            "a failed message not retried"
        );
    }
    if statuses == [Some("dlq")] {
        let sql = "SELECT count(*) FROM queen.log_dlq WHERE partition_id = $1 AND transaction_id = $2";
        prop_assert_eq!(fuzz.number(sql, &[&leased.partition_id, &leased.transaction_ids[0]]).await, Some(1));
        // The error is kept, U+0000 (which PostgreSQL text cannot hold) as U+FFFD.
        let sql = "SELECT error_message FROM queen.log_dlq WHERE partition_id = $1 AND transaction_id = $2";
        let row = fuzz.db.query_one(sql, &[&leased.partition_id, &leased.transaction_ids[0]]).await;
        let stored: Option<String> = row.map_err(|e| fail(e.to_string()))?.get(0);
        let sent_error = sent.value["error"].as_str().map(|e| e.replace('\0', "\u{FFFD}"));
        prop_assert_eq!(stored, sent_error, "the dead letter's error");
    }
    Ok(())
}

#[test]
fn fuzzed_ack_bodies() {
    let fuzz = Fuzz::start(|_| {});
    fuzz.run(ack_case(), |ack| fuzz.block_on(check_ack(&fuzz, ack, false)));
}

#[test]
fn fuzzed_ack_batch_bodies() {
    let fuzz = Fuzz::start(|_| {});
    fuzz.run(ack_batch_case(), |ack| fuzz.block_on(check_ack(&fuzz, ack, true)));
}

// ---------------------------------------------------------------------------------------------
// Transactions: acks of leased messages and pushes, interleaved.

fn type_member(kind: &'static str, pristine: bool) -> BoxedStrategy<Member> {
    member(
        pristine,
        vec![
            with(16, Good, Just(json!(kind))),
            left_out(1, Bad),
            with(1, Bad, values(vec![Value::Null, json!("ACK"), json!("nap"), json!(""), json!(5), json!(["ack"])])),
        ],
    )
}

fn push_operation(pristine: bool) -> BoxedStrategy<Draft> {
    let items = member(
        pristine,
        vec![
            (10, Good, push_items(pristine, 1..4)),
            left_out(1, Bad),
            with(1, Bad, values(vec![json!([]), Value::Null, json!("x"), json!({})])),
        ],
    );
    (type_member("push", pristine), items)
        .prop_map(|(kind, items)| Draft(vec![("type", kind), ("items", items)]))
        .boxed()
}

/// `requiredLeases`, and whether it names the case's lease (so it fences acks without one).
fn required_leases_member(pristine: bool, leased: bool) -> BoxedStrategy<(Member, bool)> {
    let naming = values(vec![
        json!([reference("lease")]),
        json!([reference("lease"), reference("lease:upper")]),
        json!([reference("lease:braced")]),
    ]);
    // With nothing leased the lease named does not exist: whether that fails the bundle is open.
    let naming_verdict = if leased { Good } else { Stray };
    let fencing = |(weight, verdict, strategy): Arm, fences: bool| -> Arm<(Member, bool)> {
        (weight, verdict, strategy.prop_map(move |m| (m, fences)).boxed())
    };
    choose(
        pristine,
        vec![
            fencing(left_out(3, Good), false),
            fencing(with(1, Good, values(vec![Value::Null, json!([])])), false),
            fencing(with(3, naming_verdict, naming), true),
            fencing(with(1, Stray, uuid_text().prop_map(|u| json!([u]))), false),
            fencing(
                with(1, Bad, values(vec![json!("x"), json!(["nope"]), json!([5]), json!({}), json!([null])])),
                false,
            ),
        ],
    )
}

#[derive(Debug, Clone)]
struct TransactionCase {
    group: Option<&'static str>,
    messages: usize,
    case: Case,
}

fn transaction_case() -> BoxedStrategy<TransactionCase> {
    (prop::sample::select(GROUPS), 0..=2usize)
        .prop_flat_map(|(group, n)| {
            let body = move |pristine| transaction_body(group, n, pristine);
            (Just(group), Just(n), case(body))
        })
        .prop_map(|(group, messages, case)| TransactionCase { group, messages, case })
        .boxed()
}

/// A bundle about `n` messages leased by `group`: an ack of each, in order, pushes woven in.
fn transaction_body(group: Option<&'static str>, n: usize, pristine: bool) -> BoxedStrategy<(Value, Verdict)> {
    let acks: Vec<BoxedStrategy<Draft>> = (0..n)
        .map(|i| {
            (type_member("ack", pristine), ack_draft(i, true, pristine), group_member(group, pristine))
                .prop_map(|(kind, mut draft, group)| {
                    draft.0.insert(0, ("type", kind));
                    draft.0.push(("consumerGroup", group));
                    draft
                })
                .boxed()
        })
        .collect();
    // A bundle of nothing is refused, one of rider operations alone is not (see below).
    let pushes = prop::collection::vec(push_operation(pristine), 0..3);
    let rider = |operations: BoxedStrategy<(Value, Verdict)>| {
        member(
            pristine,
            vec![
                left_out(6, Good),
                with(1, Good, Just(Value::Null)),
                (3, Good, operations.prop_map(|(value, verdict)| (Some(value), verdict)).boxed()),
                with(1, Bad, json_value(Raw::Plain).prop_filter("not null", |v| !v.is_null())),
            ],
        )
    };
    let riders = (rider(kv_operations(true, pristine)), rider(timer_operations(pristine)));
    let order = prop::collection::vec(any::<bool>(), 6);
    let replaced: BoxedStrategy<Option<Member>> = choose(
        pristine,
        vec![
            (10, Good, Just(None).boxed()),
            (1, Bad, Just(Some((None, Bad))).boxed()),
            (
                1,
                Bad,
                values(vec![Value::Null, json!([]), json!({}), json!("ops"), json!([1])])
                    .prop_map(|v| Some((Some(v), Bad)))
                    .boxed(),
            ),
        ],
    );
    (acks, pushes, required_leases_member(pristine, n > 0), riders, order, replaced)
        .prop_map(|(mut acks, pushes, (required, fences), (kv, timers), order, replaced)| {
            if fences {
                // The bundle's required leases fence the acks that name no lease of their own.
                for ack in &mut acks {
                    if let Some(lease) = ack.get_mut("leaseId")
                        && unfenced(lease)
                    {
                        lease.1 = Good;
                    }
                }
            }
            let (mut acks, mut pushes) = (acks.into_iter().peekable(), pushes.into_iter().peekable());
            let mut operations = Vec::new();
            let mut push_next = order.into_iter().cycle();
            while acks.peek().is_some() || pushes.peek().is_some() {
                let push = (push_next.next().unwrap_or(true) && pushes.peek().is_some()) || acks.peek().is_none();
                operations.extend(if push { pushes.next() } else { acks.next() });
            }
            // A bundle of rider operations alone is a bundle.
            let ridden = [&kv, &timers].iter().any(|(rider, _)| rider.as_ref().is_some_and(|r| !r.is_null()));
            let operations = match replaced {
                // An empty array in their place is a bundle of the riders alone, when there are any.
                Some((Some(Value::Array(empty)), _)) if empty.is_empty() && ridden => (Some(Value::Array(empty)), Good),
                Some(replaced) => replaced,
                None => {
                    let (value, verdict) = array_of(&operations);
                    (Some(value), if operations.is_empty() && !ridden { Bad } else { verdict })
                }
            };
            Draft(vec![("operations", operations), ("requiredLeases", required), ("kv", kv), ("timers", timers)])
                .built()
        })
        .boxed()
}

#[test]
fn fuzzed_transaction_bodies() {
    const QUEUE: &str = "fuzz-transaction-acks";
    let fuzz = Fuzz::start(|_| {});
    fuzz.run(transaction_case(), |tx| {
        fuzz.block_on(async {
            let leased = if tx.messages > 0 { Some(fuzz.leased(QUEUE, tx.group, tx.messages).await?) } else { None };
            let refs = leased.as_ref().map(Leased::refs).unwrap_or_else(|| lease_refs(Uuid::now_v7()));
            let sent = tx.case.send(&refs, Good);
            // A bundle rolled back writes nothing, not even the queues and partitions it named.
            let reply = fuzz.exchange("/api/v1/transaction", &sent).await?;
            if !reply.status.is_success() && reply.status != StatusCode::CONFLICT {
                return Ok(());
            }
            let answer = reply.members()?;
            let success: Option<bool> = read_of(&answer, "success")?;
            let entries = bundle_entries(&sent.bytes)?;
            if success != Some(true) {
                // Rolled back: by an ack or a queue's capacity (409), or by a key/value
                // precondition (a 200 the client returns rather than raises).
                if reply.status == StatusCode::CONFLICT {
                    let error: String = read_of(&answer, "error")?.unwrap_or_default();
                    prop_assert!(error.contains("rolled back") && success == Some(false), "{}", reply.shown());
                } else {
                    let reason: Option<String> = read_of(&answer, "reason")?;
                    prop_assert_eq!(reason.as_deref(), Some("kv_precondition"), "{}", reply.shown());
                    let failed: Option<usize> = read_of(&answer, "failedIndex")?;
                    let operation = failed.and_then(|i| i.checked_sub(entries.count)).and_then(|i| entries.kv.get(i));
                    prop_assert!(
                        operation.is_some_and(|op| op.required && op.may_fail()),
                        "failedIndex is no required key/value operation that may fail: {}",
                        reply.shown()
                    );
                }
                return Ok(());
            }
            prop_assert_eq!(reply.status, StatusCode::OK, "{}", reply.shown());
            let Entries { pushed, acked, count, kv, timers } = entries;
            let results = reply.results()?;
            let riders = count + kv.len();
            prop_assert_eq!(
                results.len(),
                riders + timers.len(),
                "one result per ack, item and rider operation: {}",
                reply.shown()
            );
            for &at in &acked {
                prop_assert!(
                    results[at]["success"] == true,
                    "an ack of a committed transaction failed: {}",
                    reply.shown()
                );
            }
            let push_results: Vec<&Value> = pushed.iter().map(|(at, _)| &results[*at]).collect();
            fuzz.verify_pushed(&pushed, &push_results).await?;
            fuzz.verify_kv(&kv, &results[count..riders]).await?;
            fuzz.verify_timers(&timers, &results[riders..], Some(riders)).await?;
            if sent.expected == Good
                && let Some(leased) = &leased
                && acked.len() == tx.messages
            {
                let again = fuzz.pop(QUEUE, &leased.partition, tx.group, 10).await?;
                prop_assert!(again.messages.is_empty(), "acknowledged messages came back: {:?}", again.messages);
            }
            Ok(())
        })
    });
}

// ---------------------------------------------------------------------------------------------
// Configure.

const INT: i64 = i32::MAX as i64;

/// The integer options and their ranges, as `queue_options` declares them.
const INTEGER_OPTIONS: &[(&str, i64, i64)] = &[
    ("leaseTime", 1, INT),
    ("retryLimit", 0, INT),
    ("retryDelay", 0, INT),
    ("priority", -INT - 1, INT),
    ("delayedProcessing", 0, INT),
    ("windowBuffer", 0, INT),
    ("maxSize", 0, i64::MAX),
    ("ttl", 0, INT),
    ("maxWaitTimeSeconds", 0, INT),
    ("retentionSeconds", 0, INT),
    ("completedRetentionSeconds", 0, INT),
    ("dedupWindowSeconds", 0, INT),
];

const BOOLEAN_OPTIONS: &[&str] = &["deadLetterQueue", "dlqAfterMaxRetries", "retentionEnabled", "encryptionEnabled"];

fn known_option(key: &str) -> bool {
    INTEGER_OPTIONS.iter().any(|(name, _, _)| *name == key) || BOOLEAN_OPTIONS.contains(&key)
}

fn option_entry(pristine: bool) -> BoxedStrategy<(String, Value, Verdict)> {
    let integer = prop::sample::select(INTEGER_OPTIONS);
    // An option the broker does not act on is refused, whatever its value.
    let unknown_key = prop_oneof![
        3 => text().prop_filter("unknown", |k| !known_option(k)),
        1 => prop::sample::select(&["maxPartitions", "lease_time", "LeaseTime", "nul\u{0}"][..]).prop_map(str::to_owned),
    ];
    let unknown = (unknown_key, json_value(Raw::Plain)).prop_map(|(k, v)| (k, v, Bad));
    let good_integer = integer
        .clone()
        .prop_flat_map(|(name, min, max)| {
            (Just(name), prop_oneof![Just(min), Just(max), min..=max, min.max(0)..=max.min(1000)])
        })
        .prop_map(|(name, v)| (name.to_owned(), json!(v), Good));
    let bad_integer = (integer.clone(), 0..6u8).prop_map(|((name, min, max), kind)| {
        let bad = match kind {
            0 if min > i64::MIN => json!(min - 1),
            1 if max < i64::MAX => json!(max + 1),
            1 => raw("9223372036854775808"),
            2 => json!(1.5),
            3 => json!(300.0),
            4 => json!("300"),
            _ => json!(true),
        };
        (name.to_owned(), bad, Bad)
    });
    let booleans = || prop::sample::select(BOOLEAN_OPTIONS);
    let bad_boolean = values(vec![json!(1), json!(0), json!("true"), json!([]), json!({})]);
    choose(
        pristine,
        vec![
            (3, Good, good_integer.boxed()),
            (1, Good, integer.prop_map(|(name, _, _)| (name.to_owned(), Value::Null, Good)).boxed()),
            (2, Bad, bad_integer.boxed()),
            (2, Good, (booleans(), any::<bool>()).prop_map(|(name, b)| (name.to_owned(), json!(b), Good)).boxed()),
            (1, Bad, (booleans(), bad_boolean).prop_map(|(name, v)| (name.to_owned(), v, Bad)).boxed()),
            (2, Bad, unknown.boxed()),
        ],
    )
}

/// JSON equality, floats within a few units in the last place: an option's number comes back from
/// PostgreSQL as decimal text, which `serde_json` (without its `float_roundtrip` feature) does not
/// always read back to the same `f64`.
fn same_json(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) if x.is_f64() || y.is_f64() => {
            let (x, y) = (x.as_f64().unwrap_or(f64::NAN), y.as_f64().unwrap_or(f64::NAN));
            x == y || (x - y).abs() <= 1e-15 * x.abs().max(y.abs())
        }
        (Value::Array(x), Value::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same_json(x, y)),
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same_json(v, w)))
        }
        _ => a == b,
    }
}

/// Whether a value (or the key it is stored under) holds U+0000, which PostgreSQL's `jsonb` cannot
/// store.
fn holds_nul(key: &str, value: &Value) -> bool {
    key.contains('\0')
        || match value {
            Value::String(text) => text.contains('\0'),
            Value::Array(items) => items.iter().any(|item| holds_nul("", item)),
            Value::Object(members) => members.iter().any(|(key, member)| holds_nul(key, member)),
            _ => false,
        }
}

fn options_member(pristine: bool) -> BoxedStrategy<Member> {
    let object = prop::collection::vec(option_entry(pristine), 0..8).prop_map(|entries| {
        // A later entry replaces an earlier one of the same name, as in the map sent.
        let mut options = Map::new();
        let mut verdicts = BTreeMap::new();
        for (key, value, verdict) in entries {
            verdicts.insert(key.clone(), verdict);
            options.insert(key, value);
        }
        (Some(Value::Object(options)), verdicts.into_values().max().unwrap_or(Good))
    });
    member(
        pristine,
        vec![
            left_out(1, Good),
            with(1, Good, Just(Value::Null)),
            (8, Good, object.boxed()),
            with(1, Bad, values(vec![json!([]), json!("x"), json!(5), json!(true), json!([{"leaseTime": 5}])])),
        ],
    )
}

fn label_member(pristine: bool) -> BoxedStrategy<Member> {
    let label = prop_oneof![name(), Just("ns/with/slashes".to_owned())].prop_map(Value::String);
    member(
        pristine,
        vec![
            left_out(2, Good),
            with(1, Good, Just(Value::Null)),
            with(3, Good, label),
            with(
                1,
                Bad,
                values(vec![
                    json!(""),
                    json!("n".repeat(256)),
                    json!("bell\u{7}"),
                    json!("nul\u{0}"),
                    json!(5),
                    json!([]),
                    json!({}),
                ]),
            ),
        ],
    )
}

fn configure_body(pristine: bool) -> BoxedStrategy<(Value, Verdict)> {
    let queue = member(
        pristine,
        vec![
            with(
                12,
                Good,
                prop_oneof![1 => strings(&["fuzz-configured", "ünï-config"]), 6 => created_name().prop_map(Value::String)],
            ),
            with(1, Bad, bad_created_name()),
            left_out(1, Bad),
            with(1, Bad, Just(Value::Null)),
        ],
    );
    (queue, label_member(pristine), label_member(pristine), options_member(pristine))
        .prop_map(|(queue, namespace, task, options)| {
            Draft(vec![("queue", queue), ("namespace", namespace), ("task", task), ("options", options)]).built()
        })
        .boxed()
}

#[test]
fn fuzzed_configure_bodies() {
    let fuzz = Fuzz::start(|config| config.encryption.key = Some(KEY.into()));
    fuzz.run(case(configure_body), |case| {
        fuzz.block_on(async {
            let sent = case.send(&Refs::new(), Good);
            let reply = fuzz.exchange("/api/v1/configure", &sent).await?;
            if !reply.status.is_success() {
                return Ok(());
            }
            prop_assert_eq!(reply.status, StatusCode::OK, "{}", reply.shown());
            let answer = reply.json.clone().unwrap_or_default();
            let shown = || format!("{}\n  → {}", sent.shown(), reply.shown());
            if let Err(e) = serde_json::from_str::<Value>(&reply.text) {
                let at = e.column().saturating_sub(200);
                let around: String = reply.text.chars().skip(at).take(400).collect();
                return Err(fail(format!("the answer is no JSON ({e}): ...{around}...")));
            }
            prop_assert_eq!(&answer["configured"], &json!(true), "{}", shown());
            // What the broker read: the last of repeated keys wins, as in any JSON object reader.
            let Ok(read) = serde_json::from_str::<Value>(accepted_text(&sent.bytes)?) else { return Ok(()) };
            let queue = read["queue"]
                .as_str()
                .ok_or_else(|| fail(format!("accepted a queue that is no string: {}", shown())))?;
            prop_assert_eq!(answer["queue"].as_str(), Some(queue), "{}", shown());
            for label in ["namespace", "task"] {
                if let Some(value) = read[label].as_str() {
                    prop_assert_eq!(answer[label].as_str(), Some(value), "{} not echoed: {}", label, shown());
                }
            }
            let echoed =
                answer["options"].as_object().ok_or_else(|| fail(format!("no options echoed: {}", shown())))?;
            if let Some(options) = read["options"].as_object() {
                for (key, value) in options.iter().filter(|(_, v)| !v.is_null()) {
                    let same = echoed.get(key).is_some_and(|echo| same_json(echo, value));
                    prop_assert!(same, "option {key:?} echoed as {:?}: {}", echoed.get(key), shown());
                }
            }
            for (name, _, _) in INTEGER_OPTIONS {
                prop_assert!(echoed.get(*name).is_some_and(Value::is_i64), "{name} not echoed: {}", shown());
            }
            for name in BOOLEAN_OPTIONS {
                prop_assert!(echoed.get(*name).is_some_and(Value::is_boolean), "{name} not echoed: {}", shown());
            }
            let count = INTEGER_OPTIONS.len() + BOOLEAN_OPTIONS.len();
            prop_assert_eq!(echoed.len(), count, "echoed more than the options: {}", shown());
            if addressable(queue) {
                let stored = fuzz.get(&format!("/api/v1/resources/queues/{}", segment(queue))).await?;
                let stored = stored.json.unwrap_or_default();
                prop_assert_eq!(&stored["options"], &answer["options"], "read back otherwise: {}", shown());
                prop_assert_eq!(&stored["namespace"], &answer["namespace"], "{}", shown());
                prop_assert_eq!(&stored["task"], &answer["task"], "{}", shown());
            }
            Ok(())
        })
    });
}

// ---------------------------------------------------------------------------------------------
// Seek, per queue and per partition.

#[derive(Debug, Clone)]
struct SeekCase {
    group: (String, Verdict),
    queue: (String, Verdict),
    /// The partition route's partition id (a reference, or a text), and what it deserves.
    partition: Option<(Value, Verdict)>,
    case: Case,
}

fn seek_body(by_partition: bool, pristine: bool) -> BoxedStrategy<(Value, Verdict)> {
    let ts = || prop_oneof![3 => good_timestamp().prop_map(Value::String), 1 => naive_timestamp()];
    let not_end = values(vec![json!(false), Value::Null]);
    // `toEnd` is a boolean: any other type is refused, beside a timestamp too.
    let mistyped_end = values(vec![json!(0), json!("yes"), json!("true"), json!([])]);
    // An empty body (or object) is `toEnd` on the partition route only.
    let nothing = if by_partition { Good } else { Bad };
    let bad_end = values(vec![json!(false), json!("true"), json!(1), Value::Null, json!([])]);
    let bad_timestamp = prop_oneof![strings(BAD_TIMESTAMPS), values(vec![json!(5), Value::Null, json!([])])];
    let not_objects =
        values(vec![json!([]), json!("toEnd"), json!(5), Value::Null, json!(true), json!([{"toEnd": true}])]);
    choose(
        pristine,
        vec![
            (3, Good, Just((json!({"toEnd": true}), Good)).boxed()),
            (1, Good, Just((json!({"toEnd": true, "timestamp": null}), Good)).boxed()),
            (3, Good, ts().prop_map(|t| (json!({"timestamp": t}), Good)).boxed()),
            (1, Good, (not_end, ts()).prop_map(|(e, t)| (json!({"toEnd": e, "timestamp": t}), Good)).boxed()),
            (1, Stray, strings(STRAY_TIMESTAMPS).prop_map(|t| (json!({"timestamp": t}), Stray)).boxed()),
            (2, nothing, values(vec![json!(NO_BODY), json!({})]).prop_map(move |b| (b, nothing)).boxed()),
            (1, Bad, ts().prop_map(|t| (json!({"toEnd": true, "timestamp": t}), Bad)).boxed()),
            (1, Bad, bad_end.prop_map(|e| (json!({"toEnd": e}), Bad)).boxed()),
            (1, Bad, (mistyped_end, ts()).prop_map(|(e, t)| (json!({"toEnd": e, "timestamp": t}), Bad)).boxed()),
            (1, Bad, bad_timestamp.prop_map(|t| (json!({"timestamp": t}), Bad)).boxed()),
            (1, Bad, not_objects.prop_map(|b| (b, Bad)).boxed()),
        ],
    )
}

fn seek_case() -> BoxedStrategy<SeekCase> {
    let group = prop_oneof![
        4 => Just(("seek-g".to_owned(), Good)),
        1 => Just(("__QUEUE_MODE__".to_owned(), Good)),
        2 => path_name().prop_map(|g| (g, Good)),
        1 => prop::sample::select(vec!["g".repeat(256), "bell\u{7}".to_owned(), "nul\u{0}".to_owned()])
            .prop_map(|g| (g, Bad)),
    ];
    let queue = prop_oneof![
        6 => Just(("seek-q".to_owned(), Good)),
        1 => Just(("seek-absent".to_owned(), Stray)),
        1 => Just(("seek-other".to_owned(), Stray)),
        1 => prop::sample::select(vec!["q".repeat(256), "nul\u{0}".to_owned()]).prop_map(|q| (q, Bad)),
    ];
    any::<bool>()
        .prop_flat_map(move |by_partition| {
            let partition = if by_partition {
                prop_oneof![
                    6 => values(vec![reference("seek-p1"), reference("seek-p2")]).prop_map(|p| Some((p, Good))),
                    1 => values(vec![reference("seek-other-p"), json!("987654321"), json!("+1")])
                        .prop_map(|p| Some((p, Stray))),
                    1 => strings(&["0", "-1", "abc", "1.5", "99999999999999999999", " 1", "1 "])
                        .prop_map(|p| Some((p, Bad))),
                ]
                .boxed()
            } else {
                Just(None).boxed()
            };
            (group.clone(), queue.clone(), partition, case(move |pristine| seek_body(by_partition, pristine)))
        })
        .prop_map(|(group, queue, partition, case)| SeekCase { group, queue, partition, case })
        .boxed()
}

#[test]
fn fuzzed_seek_bodies() {
    let fuzz = Fuzz::start(|_| {});
    let refs = fuzz.block_on(async {
        let mut refs = Refs::new();
        for (queue, partition, n) in [("seek-q", "p1", 3), ("seek-q", "p2", 3), ("seek-other", "p", 1)] {
            let items: Vec<Value> =
                (0..n).map(|i| json!({"queue": queue, "partition": partition, "payload": i})).collect();
            let pushed = fuzz.app.push(Value::Array(items)).await;
            refs.insert(format!("{queue}-{partition}").replace("seek-q-", "seek-"), pushed[0]["partition_id"].clone());
        }
        // The group registers on the queue and leases some of it.
        let popped = fuzz.app.pop("queue/seek-q", "consumerGroup=seek-g&batch=2").await;
        assert_eq!(popped.status, StatusCode::OK, "{popped:?}");
        refs
    });
    fuzz.run(seek_case(), |seek| {
        fuzz.block_on(async {
            let partition = seek.partition.as_ref().map(|(p, verdict)| {
                let mut p = p.clone();
                resolve(&mut p, &refs);
                (p.as_str().map(str::to_owned).unwrap_or_else(|| p.to_string()), *verdict)
            });
            let path_verdict = seek.group.1.max(seek.queue.1).max(partition.as_ref().map_or(Good, |(_, v)| *v));
            let mut path =
                format!("/api/v1/consumer-groups/{}/queues/{}", segment(&seek.group.0), segment(&seek.queue.0));
            if let Some((id, _)) = &partition {
                path.push_str(&format!("/partitions/{}", segment(id)));
            }
            path.push_str("/seek");
            let sent = seek.case.send(&refs, path_verdict);
            let reply = fuzz.exchange(&path, &sent).await?;
            if !reply.status.is_success() {
                return Ok(());
            }
            let answer = reply.json.clone().unwrap_or_default();
            let shown = || format!("{path} {}\n  → {}", sent.shown(), reply.shown());
            prop_assert_eq!(&answer["success"], &json!(true), "{}", shown());
            let moved = answer["partitions"].as_array().ok_or_else(|| fail(format!("no partitions: {}", shown())))?;
            prop_assert_eq!(answer["partitionsUpdated"].as_u64(), Some(moved.len() as u64), "{}", shown());
            let to_end = answer["seekToEnd"].as_bool().ok_or_else(|| fail(format!("no seekToEnd: {}", shown())))?;
            prop_assert_eq!(to_end, answer["targetTimestamp"].is_null(), "{}", shown());
            for partition in moved {
                let id: i64 = partition["partitionId"].as_str().and_then(|p| p.parse().ok()).unwrap_or_default();
                let committed = partition["committed"].as_i64();
                let sql = "SELECT committed FROM queen.log_consumers WHERE partition_id = $1 AND consumer_group = $2";
                prop_assert_eq!(fuzz.number(sql, &[&id, &seek.group.0]).await, committed, "{}", shown());
                let last = fuzz.number("SELECT last_offset FROM queen.partitions WHERE id = $1", &[&id]).await;
                prop_assert!(committed.is_some_and(|c| c >= 0 && Some(c) <= last), "{}", shown());
                if to_end {
                    prop_assert_eq!(committed, last, "not at the end: {}", shown());
                }
            }
            if sent.expected == Good {
                let wanted = if partition.is_some() { 1 } else { 2 };
                prop_assert_eq!(moved.len(), wanted, "{}", shown());
                let asked_end = sent.value.get("toEnd") == Some(&json!(true))
                    || sent.value.as_str() == Some(NO_BODY)
                    || sent.value == json!({});
                prop_assert_eq!(to_end, asked_end, "{}", shown());
                if let Some(at) = sent.value.get("timestamp").and_then(Value::as_str)
                    && !asked_end
                {
                    let year = at.get(..4).and_then(|y| y.parse::<u32>().ok()).unwrap_or(2026);
                    for partition in moved {
                        let committed = partition["committed"].as_i64();
                        if year < 2000 {
                            prop_assert_eq!(committed, Some(0), "a seek to {} is not at the start: {}", at, shown());
                        } else if year > 3000 {
                            prop_assert_eq!(committed, Some(3), "a seek to {} is not at the end: {}", at, shown());
                        }
                    }
                }
            }
            Ok(())
        })
    });
}

// ---------------------------------------------------------------------------------------------
// Subscription update of a consumer group.

#[derive(Debug, Clone)]
struct SubscriptionCase {
    group: (String, Verdict),
    case: Case,
}

fn subscription_case() -> BoxedStrategy<SubscriptionCase> {
    let group = prop_oneof![
        4 => Just(("sub-g".to_owned(), Good)),
        2 => Just(("sub-g2".to_owned(), Good)),
        1 => path_name().prop_map(|g| (g, Stray)),
        1 => prop::sample::select(vec!["g".repeat(256), "bell\u{7}".to_owned()]).prop_map(|g| (g, Bad)),
    ];
    let body = |pristine| {
        let timestamp = timestamp_member(pristine).prop_map(|t| Draft(vec![("subscriptionTimestamp", t)]).built());
        let not_objects = values(vec![json!(NO_BODY), json!([]), json!("2026-07-29T14:00:00Z")]);
        choose(pristine, vec![(12, Good, timestamp.boxed()), (1, Bad, not_objects.prop_map(|b| (b, Bad)).boxed())])
    };
    (group, case(body)).prop_map(|(group, case)| SubscriptionCase { group, case }).boxed()
}

/// Microseconds since the epoch of an RFC 3339 timestamp, or of one the broker answers for an
/// instant past year 9999 (`+10000-01-01T...`, which RFC 3339 cannot spell).
fn micros(at: &str) -> Option<i64> {
    let parsed = DateTime::parse_from_rfc3339(at).map(|at| at.with_timezone(&Utc));
    parsed.or_else(|_| at.parse::<DateTime<Utc>>()).ok().map(|at| at.timestamp_micros())
}

#[test]
fn fuzzed_subscription_bodies() {
    let fuzz = Fuzz::start(|_| {});
    let registered: BTreeMap<&str, BTreeSet<String>> = fuzz.block_on(async {
        for queue in ["sub-q", "sub-q2"] {
            fuzz.app.push_one(queue, "p", "m", json!(1)).await;
        }
        for (group, queue) in [("sub-g", "sub-q"), ("sub-g2", "sub-q"), ("sub-g2", "sub-q2")] {
            let popped = fuzz.app.pop(&format!("queue/{queue}"), &format!("consumerGroup={group}&autoAck=true")).await;
            assert_eq!(popped.status, StatusCode::OK, "{popped:?}");
        }
        BTreeMap::from([
            ("sub-g", ["sub-q".to_owned()].into()),
            ("sub-g2", ["sub-q".to_owned(), "sub-q2".to_owned()].into()),
        ])
    });
    fuzz.run(subscription_case(), |sub| {
        fuzz.block_on(async {
            let path = format!("/api/v1/consumer-groups/{}/subscription", segment(&sub.group.0));
            let sent = sub.case.send(&Refs::new(), sub.group.1);
            let reply = fuzz.exchange(&path, &sent).await?;
            if !reply.status.is_success() {
                return Ok(());
            }
            let answer = reply.json.clone().unwrap_or_default();
            let shown = || format!("{path} {}\n  → {}", sent.shown(), reply.shown());
            prop_assert_eq!(&answer["success"], &json!(true), "{}", shown());
            let queues: BTreeSet<String> =
                answer["queues"].as_array().into_iter().flatten().filter_map(Value::as_str).map(str::to_owned).collect();
            prop_assert_eq!(answer["rowsUpdated"].as_u64(), Some(queues.len() as u64), "{}", shown());
            prop_assert_eq!(Some(&queues), registered.get(sub.group.0.as_str()), "{}", shown());
            let new_timestamp = answer["newTimestamp"].as_str().and_then(micros);
            for queue in &queues {
                let sql = "SELECT (extract(epoch FROM subscription_from) * 1000000)::bigint FROM queen.consumer_groups_metadata
                            WHERE consumer_group = $1 AND queue_name = $2 AND subscription_mode = 'timestamp'";
                let stored = fuzz.number(sql, &[&sub.group.0, queue]).await;
                let agree = stored.zip(new_timestamp).is_some_and(|(s, n)| (s - n).abs() <= 1);
                prop_assert!(agree, "{queue}: stored {stored:?}, answered {new_timestamp:?}: {}", shown());
                if sent.expected == Good
                    && let Some(at) = sent.value["subscriptionTimestamp"].as_str()
                {
                    let sent_micros = time_micros(at).ok_or_else(|| fail(format!("{at} is good but unreadable")))?;
                    let close = stored.is_some_and(|s| (s - sent_micros).abs() <= 1);
                    prop_assert!(close, "{queue}: {at} stored as {stored:?}");
                }
            }
            Ok(())
        })
    });
}

// ---------------------------------------------------------------------------------------------
// Lease extension.

#[derive(Debug, Clone)]
struct LeaseCase {
    /// The path's lease id (a reference, or a text), and what it deserves.
    lease: (Value, Verdict),
    case: Case,
}

fn lease_case() -> BoxedStrategy<LeaseCase> {
    let lease = prop_oneof![
        6 => lease_form().prop_map(|l| (l, Good)),
        1 => uuid_text().prop_map(|l| (json!(l), Stray)),
        1 => strings(&[
            "not-a-lease",
            "0192f0c4-0000-7000-8000-00000000000",
            "nul\u{0}",
            "0192f0c4-0000-7000-8000-0000000000000",
        ])
        .prop_map(|l| (l, Bad)),
    ];
    let body = |pristine| {
        let bad_seconds = values(vec![
            json!(0),
            json!(-1),
            json!(604_801),
            json!(1.5),
            json!(60.0),
            json!("60"),
            json!(true),
            json!([]),
            raw("1e400"),
            json!(i64::MAX),
            raw("9223372036854775808"),
        ]);
        let seconds = member(
            pristine,
            vec![
                left_out(1, Good),
                with(1, Good, Just(Value::Null)),
                with(5, Good, prop_oneof![Just(1i64), Just(604_800), 1..=604_800i64].prop_map(Value::from)),
                with(2, Bad, bad_seconds),
            ],
        );
        let not_objects = values(vec![json!([]), json!("60"), json!(60), Value::Null]);
        choose(
            pristine,
            vec![
                (2, Good, Just((json!(NO_BODY), Good)).boxed()),
                (1, Good, Just((json!({}), Good)).boxed()),
                (5, Good, seconds.prop_map(|s| Draft(vec![("seconds", s)]).built()).boxed()),
                (1, Bad, not_objects.prop_map(|b| (b, Bad)).boxed()),
            ],
        )
    };
    (lease, case(body)).prop_map(|(lease, case)| LeaseCase { lease, case }).boxed()
}

#[test]
fn fuzzed_lease_extension_bodies() {
    const QUEUE: &str = "fuzz-leases";
    let fuzz = Fuzz::start(|_| {});
    fuzz.run(lease_case(), |case| {
        fuzz.block_on(async {
            let leased = fuzz.leased(QUEUE, None, 1).await?;
            let refs = leased.refs();
            let mut lease = case.lease.0.clone();
            resolve(&mut lease, &refs);
            let path = format!("/api/v1/lease/{}/extend", segment(lease.as_str().unwrap_or_default()));
            let sent = case.case.send(&refs, case.lease.1);
            let sql = "SELECT (extract(epoch FROM lease_expires_at) * 1000000)::bigint FROM queen.log_consumers
                        WHERE lease_id = $1";
            let before = fuzz.number(sql, &[&leased.lease]).await.unwrap_or_default();
            let started = Utc::now().timestamp_micros();
            let reply = fuzz.exchange(&path, &sent).await?;
            if !reply.status.is_success() {
                return Ok(());
            }
            let answer = reply.json.clone().unwrap_or_default();
            let shown = || format!("{path} {}\n  → {}", sent.shown(), reply.shown());
            prop_assert_eq!(&answer["success"], &json!(true), "{}", shown());
            prop_assert_eq!(answer["renewed"].as_u64(), Some(1), "{}", shown());
            let lease_id = leased.lease.to_string();
            prop_assert_eq!(answer["leaseId"].as_str(), Some(lease_id.as_str()), "{}", shown());
            let expires = answer["newExpiresAt"].as_str().and_then(micros);
            let stored = fuzz.number(sql, &[&leased.lease]).await;
            let agree = stored.zip(expires).is_some_and(|(s, e)| (s - e).abs() <= 1);
            prop_assert!(agree, "stored {stored:?}, answered {expires:?}: {}", shown());
            // An extension never shortens a lease: it runs until the later of its expiry and
            // `seconds` (the queue's lease time when none) from now.
            let expires = expires.unwrap_or_default();
            prop_assert!(expires >= before, "the lease was shortened: {}", shown());
            if sent.expected == Good {
                let seconds = sent.value.get("seconds").and_then(Value::as_i64).unwrap_or(300);
                let asked = started + seconds * 1_000_000;
                let slack = 30_000_000;
                prop_assert!(expires + slack >= asked, "not extended by {seconds} s: {}", shown());
                prop_assert!(expires <= before.max(asked + slack), "extended past {seconds} s: {}", shown());
            }
            Ok(())
        })
    });
}

// ---------------------------------------------------------------------------------------------
// Parts of the bodies of key/value, lock and timer operations, and of reads.

/// A member of an operation being built, by name; several for members built together.
type Named = Vec<(&'static str, Member)>;

fn named(name: &'static str, member: BoxedStrategy<Member>) -> BoxedStrategy<Named> {
    member.prop_map(move |member| vec![(name, member)]).boxed()
}

/// An operation: `op` is `kind`, then `members`, and now and then a member the operation does not
/// have (`fields`: those it has, `all`: the members of every operation of its family), of any
/// value, null included: refused.
fn operation(
    pristine: bool,
    kind: &'static str,
    fields: &'static [&'static str],
    all: &'static [&'static str],
    members: Vec<BoxedStrategy<Named>>,
) -> BoxedStrategy<Draft> {
    let foreign: Vec<&'static str> = all.iter().copied().filter(|name| !fields.contains(name)).collect();
    let foreign = if pristine || foreign.is_empty() {
        Just(None).boxed()
    } else {
        let value = prop_oneof![Just(Value::Null), json_value(Raw::Plain)];
        prop_oneof![
            8 => Just(None),
            1 => (prop::sample::select(foreign), value).prop_map(|(name, value)| Some((name, (Some(value), Bad)))),
        ]
        .boxed()
    };
    (type_member(kind, pristine), members, foreign)
        .prop_map(|(op, members, foreign)| {
            let mut draft = Draft(vec![("op", op)]);
            draft.0.extend(members.into_iter().flatten());
            draft.0.extend(foreign);
            draft
        })
        .boxed()
}

/// `n` operations `op(i)`, for batches at their size limit.
fn repeated(n: usize, op: impl Fn(usize) -> Value) -> Value {
    Value::Array((0..n).map(op).collect())
}

/// A good key/value namespace, key or prefix, lock name or owner, trace name or event type:
/// `prefix`, then at least one character, none a control character, `max` bytes in all at most.
fn label(pool: &'static [&'static str], prefix: String, max: usize) -> BoxedStrategy<Value> {
    let room = max - prefix.len();
    prop_oneof![
        3 => prop::sample::select(pool).prop_map(str::to_owned),
        2 => "[a-z0-9]{1,8}",
        2 => "\\PC{1,16}",
        1 => Just("k".repeat(room)),
        1 => Just("é".repeat(room / 2)),
    ]
    .prop_map(move |label| Value::String(format!("{prefix}{label}")))
    .boxed()
}

/// Texts no label of at most `max` bytes may be, and values that are no text.
fn bad_label(max: usize) -> BoxedStrategy<Value> {
    values(vec![
        json!(""),
        json!("k".repeat(max + 1)),
        json!("é".repeat(max / 2 + 1)),
        json!("bell\u{7}"),
        json!("nul\u{0}"),
        json!("next\u{85}line"),
        json!("tab\there"),
        json!(5),
        json!(true),
        json!([]),
        json!(["k"]),
        json!({}),
    ])
}

/// A label that must be given: `good` ones (and the ways `extra` says), or not.
fn required_label(
    pristine: bool,
    good: BoxedStrategy<Value>,
    max: usize,
    mut extra: Vec<Arm>,
) -> BoxedStrategy<Member> {
    extra.extend([
        with(12, Good, good),
        with(1, Bad, bad_label(max)),
        left_out(1, Bad),
        with(1, Bad, Just(Value::Null)),
    ]);
    member(pristine, extra)
}

fn optional_label(pristine: bool, good: BoxedStrategy<Value>, max: usize) -> BoxedStrategy<Member> {
    member(
        pristine,
        vec![left_out(4, Good), with(1, Good, Just(Value::Null)), with(4, Good, good), with(1, Bad, bad_label(max))],
    )
}

/// Integers from `min` to `max`: the bounds, any, and small ones.
fn integers(min: i64, max: i64) -> BoxedStrategy<Value> {
    let (low, high) = (min.max(-1000), max.min(1000));
    let small = if low <= high { low..=high } else { min..=max };
    prop_oneof![1 => Just(min), 1 => Just(max), 2 => min..=max, 3 => small].prop_map(Value::from).boxed()
}

/// Values that are no integer from `min` to `max`.
fn not_integers(min: i64, max: i64) -> Vec<Value> {
    let mut bad = vec![json!(1.5), json!(2.0), json!("1"), json!(true), json!([]), json!({}), raw("1e400")];
    bad.push(if min > i64::MIN { json!(min - 1) } else { raw("-9223372036854775809") });
    bad.push(if max < i64::MAX { json!(max + 1) } else { raw("9223372036854775808") });
    bad
}

/// An integer member from `min` to `max`, `good` picking among them; `optional`: it may be left
/// out (or null).
fn integer_member(
    pristine: bool,
    optional: bool,
    good: BoxedStrategy<Value>,
    min: i64,
    max: i64,
) -> BoxedStrategy<Member> {
    let absent = if optional { Good } else { Bad };
    member(
        pristine,
        vec![
            left_out(2, absent),
            with(1, absent, Just(Value::Null)),
            with(8, Good, good),
            with(2, Bad, values(not_integers(min, max))),
        ],
    )
}

/// A member that is true or false, `true` deserving `truth`; left out and null are false.
fn flag_member(pristine: bool, truth: Verdict) -> BoxedStrategy<Member> {
    member(
        pristine,
        vec![
            left_out(6, Good),
            with(1, Good, values(vec![Value::Null, json!(false)])),
            with(3, truth, Just(json!(true))),
            with(1, Bad, values(vec![json!(1), json!(0), json!("true"), json!([]), json!({})])),
        ],
    )
}

/// The longest lifetime a key or a lock may be given: ten years.
const MAX_TTL_SECONDS: i64 = 10 * 365 * 24 * 3600;

// ---------------------------------------------------------------------------------------------
// Key/value state: `POST /api/v1/kv`, and the transaction's `kv` rider.

/// The limits of `broker::kv`.
const KV_MAX_NAMESPACE_BYTES: usize = 128;
const KV_MAX_KEY_BYTES: usize = 1024;
const KV_MAX_VALUE_BYTES: usize = 64 * 1024;
const KV_MAX_OPERATIONS: usize = 256;
const KV_DEFAULT_PREFIX_LIMIT: i64 = 100;
const KV_MAX_PREFIX_LIMIT: i64 = 1000;
/// The namespace of the locks' permits: key/value operations may read and check it, not write it.
const LOCKS_NAMESPACE: &str = "queen-locks";

/// Namespaces and keys the cases share, so that they meet each other's keys.
const KV_NAMESPACES: &[&str] = &["fuzz", "ünï ns", "a/b:c", " spaced "];
const KV_KEYS: &[&str] = &["k", "counter", "ünï/キー", "with space", "a#0", "%00", "..", "'; DROP TABLE queen.kv; --"];

/// Every member of a key/value operation, and each operation's.
const KV_FIELDS: &[&str] = &[
    "op",
    "ns",
    "key",
    "keys",
    "prefix",
    "after",
    "limit",
    "keysOnly",
    "value",
    "ttlSeconds",
    "forever",
    "expect",
    "required",
    "delta",
    "min",
    "max",
];
const KV_GET_FIELDS: &[&str] = &["op", "ns", "key"];
const KV_GET_MANY_FIELDS: &[&str] = &["op", "ns", "keys"];
const KV_GET_PREFIX_FIELDS: &[&str] = &["op", "ns", "prefix", "after", "limit", "keysOnly"];
const KV_PUT_FIELDS: &[&str] = &["op", "ns", "key", "value", "ttlSeconds", "forever", "expect", "required"];
const KV_PUT_IF_ABSENT_FIELDS: &[&str] = &["op", "ns", "key", "value", "ttlSeconds", "forever", "required"];
const KV_DELETE_FIELDS: &[&str] = &["op", "ns", "key", "expect", "required"];
const KV_CHECK_FIELDS: &[&str] = &["op", "ns", "key", "expect", "required"];
const KV_INCR_FIELDS: &[&str] = &["op", "ns", "key", "delta", "min", "max", "ttlSeconds", "forever", "required"];

/// The deepest a message's data may nest: what a push carries it at (`{"items": [{"payload":
/// …}]}`, within the 127 levels a body may nest), which keeps a pop answer within 127 levels; a
/// timer's payload is held to it too.
const VALUE_MAX_DEPTH: usize = 124;

/// The deepest a key/value `value` may nest: a `getMany` or `getPrefix` answer carries it five
/// levels down, and must stay within the 127 levels JSON readers take.
const KV_VALUE_MAX_DEPTH: usize = 122;

/// Whether a key/value `value` is one the broker keeps: at most 64 KiB of JSON that PostgreSQL's
/// `jsonb` holds (no U+0000, no lone surrogate, no number past what a float holds).
fn storable(value: &Value) -> bool {
    let text = render(value);
    text.len() <= KV_MAX_VALUE_BYTES && serde_json::from_str::<Value>(&text).is_ok_and(|value| !holds_nul("", &value))
}

fn kv_value_member(pristine: bool) -> BoxedStrategy<Member> {
    let judged = json_value(Raw::Valid).prop_map(|value| {
        let verdict = if storable(&value) { Good } else { Bad };
        (Some(value), verdict)
    });
    let judged =
        if pristine { judged.prop_filter("storable", |(_, verdict)| *verdict == Good).boxed() } else { judged.boxed() };
    member(
        pristine,
        vec![
            (8, Good, judged),
            with(1, Good, Just(Value::Null)),
            with(1, Good, Just(nested(KV_VALUE_MAX_DEPTH))),
            with(1, Bad, Just(nested(KV_VALUE_MAX_DEPTH + 1))),
            with(1, Bad, Just(json!("x".repeat(KV_MAX_VALUE_BYTES)))),
            left_out(1, Bad),
        ],
    )
}

/// The members `ttlSeconds` and `forever`: exactly one of a lifetime and `forever: true`.
fn expiry_members(pristine: bool) -> BoxedStrategy<Named> {
    fn expiry(ttl: Option<Value>, forever: Option<Value>, verdict: Verdict) -> Named {
        vec![("ttlSeconds", (ttl, verdict)), ("forever", (forever, verdict))]
    }
    let ttl = || integers(1, MAX_TTL_SECONDS);
    let forever = || Just(Some(json!(true)));
    choose(
        pristine,
        vec![
            (6, Good, ttl().prop_map(|t| expiry(Some(t), None, Good)).boxed()),
            (3, Good, forever().prop_map(|f| expiry(None, f, Good)).boxed()),
            (1, Good, ttl().prop_map(|t| expiry(Some(t), Some(Value::Null), Good)).boxed()),
            (1, Good, forever().prop_map(|f| expiry(Some(Value::Null), f, Good)).boxed()),
            (1, Bad, ttl().prop_map(|t| expiry(Some(t), Some(json!(true)), Bad)).boxed()),
            (1, Bad, ttl().prop_map(|t| expiry(Some(t), Some(json!(false)), Bad)).boxed()),
            (1, Bad, Just(expiry(None, None, Bad)).boxed()),
            (1, Bad, values(not_integers(1, MAX_TTL_SECONDS)).prop_map(|t| expiry(Some(t), None, Bad)).boxed()),
            (1, Bad, values(vec![json!("true"), json!(1), json!([])]).prop_map(|f| expiry(None, Some(f), Bad)).boxed()),
        ],
    )
}

/// An increment's `min` and `max`: integers, `min` not above `max`.
fn bounds_members(pristine: bool) -> BoxedStrategy<Named> {
    let bound = || integer_member(pristine, true, integers(i64::MIN, i64::MAX), i64::MIN, i64::MAX);
    (bound(), bound())
        .prop_map(move |(mut min, mut max)| {
            let (low, high) = (min.0.as_ref().and_then(Value::as_i64), max.0.as_ref().and_then(Value::as_i64));
            if low.zip(high).is_some_and(|(low, high)| low > high) {
                if pristine {
                    std::mem::swap(&mut min.0, &mut max.0);
                } else {
                    min.1 = Bad;
                }
            }
            vec![("min", min), ("max", max)]
        })
        .boxed()
}

/// `getMany`'s keys, of operation `i`.
fn keys_member(i: usize, pristine: bool) -> BoxedStrategy<Member> {
    let keys = (1..4usize)
        .prop_flat_map(move |n| {
            (0..n).map(|j| label(KV_KEYS, format!("{i}.{j}:"), KV_MAX_KEY_BYTES)).collect::<Vec<_>>()
        })
        .prop_map(|keys| (Some(Value::Array(keys)), Good));
    let twice = format!("{i}.0:k");
    member(
        pristine,
        vec![
            (8, Good, keys.boxed()),
            with(
                1,
                Bad,
                values(vec![
                    json!([]),
                    json!([""]),
                    json!([twice, 5]),
                    json!([twice, twice]),
                    json!(["bell\u{7}"]),
                    json!([null]),
                    json!("k"),
                    json!({}),
                ]),
            ),
            left_out(1, Bad),
            with(1, Bad, Just(Value::Null)),
        ],
    )
}

/// The `i`th operation of a batch; its keys start with `i:`, so that no two operations of a batch
/// name one key (which refuses the batch). `rider`: in a transaction, where `getPrefix` is refused
/// and a lost `required` precondition rolls the bundle back in a 200.
fn kv_operation(i: usize, rider: bool, pristine: bool) -> BoxedStrategy<Draft> {
    let key = || {
        named(
            "key",
            required_label(pristine, label(KV_KEYS, format!("{i}:"), KV_MAX_KEY_BYTES), KV_MAX_KEY_BYTES, Vec::new()),
        )
    };
    let ns = |write: bool| {
        let locks = with(1, if write { Bad } else { Good }, Just(json!(LOCKS_NAMESPACE)));
        let good = label(KV_NAMESPACES, String::new(), KV_MAX_NAMESPACE_BYTES);
        named("ns", required_label(pristine, good, KV_MAX_NAMESPACE_BYTES, vec![locks]))
    };
    // Like any integer member, but null is refused rather than read as absent: an empty fence is
    // not an unconditional write.
    let version = |min: i64, optional: bool| {
        let absent = if optional { Good } else { Bad };
        let versions = vec![
            left_out(2, absent),
            with(1, Bad, Just(Value::Null)),
            with(8, Good, integers(min, i64::MAX)),
            with(2, Bad, values(not_integers(min, i64::MAX))),
        ];
        named("expect", member(pristine, versions))
    };
    let required = || named("required", flag_member(pristine, Good));
    let value = || named("value", kv_value_member(pristine));
    let expiry = || expiry_members(pristine);
    let op = |kind, fields, members| operation(pristine, kind, fields, KV_FIELDS, members);
    let any_label = || label(KV_KEYS, String::new(), KV_MAX_KEY_BYTES);
    let get_prefix = op(
        "getPrefix",
        KV_GET_PREFIX_FIELDS,
        vec![
            ns(false),
            named("prefix", required_label(pristine, any_label(), KV_MAX_KEY_BYTES, Vec::new())),
            named("after", optional_label(pristine, any_label(), KV_MAX_KEY_BYTES)),
            named("limit", integer_member(pristine, true, integers(i64::MIN, i64::MAX), i64::MIN, i64::MAX)),
            named("keysOnly", flag_member(pristine, Good)),
        ],
    )
    .prop_map(move |mut draft| {
        if rider && let Some(op) = draft.get_mut("op") {
            op.1 = Bad;
        }
        draft
    });
    let delta = named("delta", integer_member(pristine, true, integers(i64::MIN, i64::MAX), i64::MIN, i64::MAX));
    let writes = prop_oneof![
        4 => op("put", KV_PUT_FIELDS, vec![ns(true), key(), value(), expiry(), version(0, true), required()]),
        2 => op("putIfAbsent", KV_PUT_IF_ABSENT_FIELDS, vec![ns(true), key(), value(), expiry(), required()]),
        2 => op("delete", KV_DELETE_FIELDS, vec![ns(true), key(), version(1, true), required()]),
        2 => op("check", KV_CHECK_FIELDS, vec![ns(false), key(), version(0, false), required()]),
        2 => op("incr", KV_INCR_FIELDS, vec![ns(true), key(), delta, bounds_members(pristine), expiry(), required()]),
    ]
    .prop_map(move |mut draft| {
        // Standalone, a lost `required` precondition is a 409: when it may be lost, any answer
        // will do.
        let kind = draft.0[0].1.0.clone();
        let expect =
            draft.0.iter().any(|(name, (value, _))| *name == "expect" && value.as_ref().is_some_and(|v| !v.is_null()));
        let may_fail = kind != Some(json!("put")) || expect;
        if !rider
            && may_fail
            && let Some(required) = draft.get_mut("required")
            && required.0 == Some(json!(true))
        {
            required.1 = required.1.max(Stray);
        }
        draft
    });
    let mut kinds = vec![
        (3, op("get", KV_GET_FIELDS, vec![ns(false), key()])),
        (2, op("getMany", KV_GET_MANY_FIELDS, vec![ns(false), named("keys", keys_member(i, pristine))])),
        (10, writes.boxed()),
    ];
    if !(rider && pristine) {
        kinds.push((2, get_prefix.boxed()));
    }
    proptest::strategy::Union::new_weighted(kinds).boxed()
}

/// The operations of a batch: none (refused), or some, now and then two of them naming one key
/// (refused).
fn kv_operations(rider: bool, pristine: bool) -> BoxedStrategy<(Value, Verdict)> {
    let counts = if pristine { 1..5usize } else { 0..6 };
    let batch = counts
        .prop_flat_map(move |n| {
            let operations: Vec<_> = (0..n).map(|i| kv_operation(i, rider, pristine)).collect();
            (operations, if pristine { Just(false).boxed() } else { prop::bool::weighted(0.1).boxed() })
        })
        .prop_map(|(mut drafts, twin)| {
            let mut twinned = false;
            if twin && drafts.len() > 1 {
                let first: Vec<(&'static str, Member)> =
                    drafts[0].0.iter().filter(|(name, _)| matches!(*name, "ns" | "key")).cloned().collect();
                let last = drafts.len() - 1;
                if first.len() == 2 && drafts[last].get_mut("key").is_some() {
                    for (name, member) in first {
                        if let Some(slot) = drafts[last].get_mut(name) {
                            *slot = member;
                        }
                    }
                    twinned = true;
                }
            }
            let (value, verdict) = array_of(&drafts);
            (value, if drafts.is_empty() || twinned { Bad } else { verdict })
        });
    let get = |i: usize| json!({"op": "get", "ns": "fuzz", "key": format!("many-{i}")});
    choose(
        pristine,
        vec![
            (20, Good, batch.boxed()),
            (1, Good, Just((repeated(KV_MAX_OPERATIONS, get), Good)).boxed()),
            (1, Bad, Just((repeated(KV_MAX_OPERATIONS + 1, get), Bad)).boxed()),
            (
                1,
                Bad,
                values(vec![json!({}), json!("operations"), json!(5), json!([1]), json!([[]])])
                    .prop_map(|value| (value, Bad))
                    .boxed(),
            ),
        ],
    )
}

fn kv_body(pristine: bool) -> BoxedStrategy<(Value, Verdict)> {
    let operations = member(
        pristine,
        vec![
            (12, Good, kv_operations(false, pristine).prop_map(|(value, verdict)| (Some(value), verdict)).boxed()),
            left_out(1, Bad),
            with(1, Bad, Just(Value::Null)),
        ],
    );
    operations.prop_map(|operations| Draft(vec![("operations", operations)]).built()).boxed()
}

/// A key/value operation as the broker read it.
#[derive(Debug)]
struct KvRead {
    op: String,
    ns: String,
    key: String,
    keys: Vec<String>,
    prefix: String,
    after: Option<String>,
    limit: Option<i64>,
    keys_only: bool,
    /// A put's value, as sent.
    value: Option<String>,
    expect: Option<i64>,
    required: bool,
}

impl KvRead {
    /// Whether the operation has a precondition it may lose.
    fn may_fail(&self) -> bool {
        self.op != "put" || self.expect.is_some()
    }
}

fn kv_reads(operations: &RawValue) -> Result<Vec<KvRead>, TestCaseError> {
    raw_array(operations)?
        .into_iter()
        .map(|operation| {
            let members = members_of(operation.get())?;
            Ok(KvRead {
                op: string_of(&members, "op")?.unwrap_or_default(),
                ns: string_of(&members, "ns")?.unwrap_or_default(),
                key: string_of(&members, "key")?.unwrap_or_default(),
                keys: read_of(&members, "keys")?.unwrap_or_default(),
                prefix: string_of(&members, "prefix")?.unwrap_or_default(),
                after: string_of(&members, "after")?,
                limit: read_of(&members, "limit")?,
                keys_only: read_of(&members, "keysOnly")?.unwrap_or(false),
                value: members.get("value").map(|raw| raw.get().to_owned()),
                expect: read_of(&members, "expect")?,
                required: read_of(&members, "required")?.unwrap_or(false),
            })
        })
        .collect()
}

fn keys_of(rows: &Value) -> Vec<&str> {
    rows.as_array().into_iter().flatten().filter_map(|row| row["key"].as_str()).collect()
}

impl Fuzz {
    /// Checks the results of accepted key/value operations: each answers its operation, and each
    /// write that applied reads back as it answered (unless the key expires within the minute).
    async fn verify_kv(&self, operations: &[KvRead], results: &[Value]) -> Result<(), TestCaseError> {
        prop_assert_eq!(results.len(), operations.len(), "one result per operation: {:?}", results);
        let mut written = Vec::new();
        for (operation, result) in operations.iter().zip(results) {
            let shown = || format!("{operation:?} → {result}");
            match operation.op.as_str() {
                "get" => {
                    prop_assert_eq!(result["key"].as_str(), Some(operation.key.as_str()), "{}", shown());
                    let found = result["found"].as_bool().ok_or_else(|| fail(shown()))?;
                    prop_assert!(!found || result["version"].as_i64().is_some_and(|v| v > 0), "{}", shown());
                }
                "getMany" => {
                    let (rows, missing) = (keys_of(&result["rows"]), result["missing"].as_array());
                    let missing: Vec<&str> = missing.into_iter().flatten().filter_map(Value::as_str).collect();
                    let asked: BTreeSet<&str> = operation.keys.iter().map(String::as_str).collect();
                    prop_assert!(rows.iter().chain(&missing).all(|key| asked.contains(key)), "{}", shown());
                    if result["truncated"] == false {
                        prop_assert_eq!(rows.len() + missing.len(), asked.len(), "{}", shown());
                    }
                }
                "getPrefix" => {
                    let rows = keys_of(&result["rows"]);
                    let limit = operation.limit.unwrap_or(KV_DEFAULT_PREFIX_LIMIT).clamp(1, KV_MAX_PREFIX_LIMIT);
                    prop_assert!(rows.len() as i64 <= limit, "{}", shown());
                    prop_assert!(rows.iter().all(|key| key.starts_with(&operation.prefix)), "{}", shown());
                    prop_assert!(rows.windows(2).all(|pair| pair[0] < pair[1]), "not in key order: {}", shown());
                    let after = operation.after.as_deref().unwrap_or_default();
                    prop_assert!(rows.iter().all(|key| *key > after), "{}", shown());
                    let values = result["rows"].as_array().into_iter().flatten().any(|row| row.get("value").is_some());
                    prop_assert!(!(operation.keys_only && values), "values of keys only: {}", shown());
                    if result["truncated"] == true {
                        prop_assert_eq!(result["nextAfter"].as_str(), rows.last().copied(), "{}", shown());
                    }
                }
                _ => {
                    prop_assert_eq!(result["key"].as_str(), Some(operation.key.as_str()), "{}", shown());
                    let applied = result["applied"].as_bool().ok_or_else(|| fail(shown()))?;
                    if !applied {
                        let reason = result["reason"].as_str().unwrap_or_default();
                        prop_assert!(["exists", "absent", "version", "limit", "type"].contains(&reason), "{}", shown());
                        prop_assert!(!operation.required, "a required operation lost: {}", shown());
                        continue;
                    }
                    if operation.op == "put"
                        && let Some(sent) = &operation.value
                    {
                        let sent: Value = serde_json::from_str(sent).map_err(|e| fail(format!("{e}: {}", shown())))?;
                        prop_assert!(same_json(&result["value"], &sent), "not the value put: {}", shown());
                    }
                    let lasting = result["expiresAt"]
                        .as_str()
                        .and_then(micros)
                        .is_none_or(|at| at > Utc::now().timestamp_micros() + 60_000_000);
                    if operation.op != "check" && lasting {
                        written.push((operation, result));
                    }
                }
            }
        }
        if written.is_empty() {
            return Ok(());
        }
        let gets: Vec<Value> = written.iter().map(|(op, _)| json!({"op": "get", "ns": op.ns, "key": op.key})).collect();
        let answer = self.app.post("/api/v1/kv", &json!({ "operations": gets })).await;
        let read = answer.body["results"].as_array().ok_or_else(|| fail(format!("read back: {answer:?}")))?;
        for ((operation, result), read) in written.iter().zip(read) {
            let shown = || format!("{operation:?} → {result}, read back as {read}");
            if operation.op == "delete" {
                prop_assert_eq!(&read["found"], &json!(false), "a deleted key: {}", shown());
            } else {
                prop_assert_eq!(&read["found"], &json!(true), "{}", shown());
                prop_assert_eq!(&read["version"], &result["version"], "{}", shown());
                prop_assert!(same_json(&read["value"], &result["value"]), "{}", shown());
            }
        }
        Ok(())
    }
}

#[test]
fn fuzzed_kv_bodies() {
    let fuzz = Fuzz::start(|_| {});
    fuzz.run(case(kv_body), |case| {
        fuzz.block_on(async {
            let sent = case.send(&Refs::new(), Good);
            let reply = fuzz.exchange("/api/v1/kv", &sent).await?;
            let operations = || {
                let body = members_of(accepted_text(&sent.bytes)?)?;
                kv_reads(present(&body, "operations").ok_or_else(|| fail("accepted a batch without operations"))?)
            };
            if reply.status == StatusCode::CONFLICT {
                // A lost `required` precondition: where, and nothing written (checked above).
                let answer = reply.members()?;
                let failed: Option<usize> = read_of(&answer, "failedIndex")?;
                let operations = operations()?;
                let operation = failed.and_then(|i| operations.get(i));
                prop_assert!(
                    operation.is_some_and(|op| op.required && op.may_fail()),
                    "failedIndex is no required operation that may fail: {}",
                    reply.shown()
                );
                let key: Option<String> = read_of(&answer, "key")?;
                prop_assert_eq!(key.as_deref(), operation.map(|op| op.key.as_str()), "{}", reply.shown());
            }
            if !reply.status.is_success() {
                return Ok(());
            }
            prop_assert_eq!(reply.status, StatusCode::OK, "{}", reply.shown());
            fuzz.verify_kv(&operations()?, &reply.results()?).await
        })
    });
}

// ---------------------------------------------------------------------------------------------
// Locks: operations on names, one of them held for the case.

const LOCK_NAMES: &[&str] = &["fuzz-lock", "ünï lock", "a/b", "semaphore"];
const LOCK_MAX_BYTES: usize = 256;
const LOCK_MAX_LIMIT: i64 = 1024;
const LOCK_MAX_OPERATIONS: usize = 256;
const LOCK_FIELDS: &[&str] = &["op", "name", "ttlSeconds", "owner", "limit", "token", "slot"];

fn lock_operation(pristine: bool) -> BoxedStrategy<Draft> {
    let name = || {
        let good = prop_oneof![
            2 => Just(reference("held")),
            3 => label(LOCK_NAMES, String::new(), LOCK_MAX_BYTES)
                .prop_filter("no '#'", |name| !name.as_str().is_some_and(|name| name.contains('#'))),
        ];
        let slotted = with(1, Bad, strings(&["a#b", "#", "held#0"]));
        named("name", required_label(pristine, good.boxed(), LOCK_MAX_BYTES, vec![slotted]))
    };
    let ttl = || {
        let good = prop_oneof![3 => integers(60, 3600), 1 => integers(1, MAX_TTL_SECONDS)];
        named("ttlSeconds", integer_member(pristine, false, good.boxed(), 1, MAX_TTL_SECONDS))
    };
    let owner = || {
        let good = prop_oneof![1 => Just(reference("owner")), 1 => label(LOCK_NAMES, String::new(), LOCK_MAX_BYTES)];
        named("owner", optional_label(pristine, good.boxed(), LOCK_MAX_BYTES))
    };
    let token = || {
        let good = prop_oneof![3 => Just(reference("token")), 1 => integers(1, i64::MAX)];
        named("token", integer_member(pristine, false, good.boxed(), 1, i64::MAX))
    };
    let slot = || {
        let good = prop_oneof![2 => Just(reference("slot")), 1 => integers(0, LOCK_MAX_LIMIT - 1)];
        named("slot", integer_member(pristine, true, good.boxed(), 0, LOCK_MAX_LIMIT - 1))
    };
    let limit = named("limit", integer_member(pristine, true, integers(1, LOCK_MAX_LIMIT), 1, LOCK_MAX_LIMIT));
    let op = |kind, fields, members| operation(pristine, kind, fields, LOCK_FIELDS, members);
    prop_oneof![
        3 => op("acquire", &["op", "name", "ttlSeconds", "owner", "limit"], vec![name(), ttl(), owner(), limit]),
        2 => op(
            "renew",
            &["op", "name", "token", "ttlSeconds", "slot", "owner"],
            vec![name(), token(), ttl(), slot(), owner()],
        ),
        2 => op("release", &["op", "name", "token", "slot"], vec![name(), token(), slot()]),
        1 => op("get", &["op", "name"], vec![name()]),
    ]
    .boxed()
}

fn lock_body(pristine: bool) -> BoxedStrategy<(Value, Verdict)> {
    let counts = if pristine { 1..5usize } else { 0..6 };
    let batch = prop::collection::vec(lock_operation(pristine), counts).prop_map(|drafts| {
        let (value, verdict) = array_of(&drafts);
        (Some(value), if drafts.is_empty() { Bad } else { verdict })
    });
    let get = |i: usize| json!({"op": "get", "name": format!("many-{i}")});
    let operations = member(
        pristine,
        vec![
            (20, Good, batch.boxed()),
            with(1, Good, Just(repeated(LOCK_MAX_OPERATIONS, get))),
            with(1, Bad, Just(repeated(LOCK_MAX_OPERATIONS + 1, get))),
            with(1, Bad, values(vec![json!({}), json!("operations"), json!(5), json!([1]), json!([[]])])),
            left_out(1, Bad),
            with(1, Bad, Just(Value::Null)),
        ],
    );
    operations.prop_map(|operations| Draft(vec![("operations", operations)]).built()).boxed()
}

/// A lock operation as the broker read it.
#[derive(Debug)]
struct LockRead {
    op: String,
    name: String,
    ttl_seconds: i64,
    owner: Option<String>,
    limit: i64,
    token: i64,
    slot: i64,
}

fn lock_reads(operations: &RawValue) -> Result<Vec<LockRead>, TestCaseError> {
    raw_array(operations)?
        .into_iter()
        .map(|operation| {
            let members = members_of(operation.get())?;
            Ok(LockRead {
                op: string_of(&members, "op")?.unwrap_or_default(),
                name: string_of(&members, "name")?.unwrap_or_default(),
                ttl_seconds: read_of(&members, "ttlSeconds")?.unwrap_or_default(),
                owner: string_of(&members, "owner")?,
                limit: read_of(&members, "limit")?.unwrap_or(1),
                token: read_of(&members, "token")?.unwrap_or_default(),
                slot: read_of(&members, "slot")?.unwrap_or(0),
            })
        })
        .collect()
}

/// The guard of a permit: a required check of its row at its token.
fn guard(name: &str, slot: u64, token: i64) -> Value {
    json!({"op": "check", "ns": LOCKS_NAMESPACE, "key": format!("{name}#{slot}"), "expect": token, "required": true})
}

impl Fuzz {
    /// Checks the results of accepted lock operations: each answers its operation, and the
    /// permits they took, renewed and released are as they say (unless they lapse within the
    /// minute).
    async fn verify_locks(&self, operations: &[LockRead], results: &[Value]) -> Result<(), TestCaseError> {
        prop_assert_eq!(results.len(), operations.len(), "one result per operation: {:?}", results);
        // Each permit the operations changed: its token, if held (and for long), or none.
        let mut permits: BTreeMap<(&str, u64), Option<Option<i64>>> = BTreeMap::new();
        for (operation, result) in operations.iter().zip(results) {
            let shown = || format!("{operation:?} → {result}");
            let lasting = operation.ttl_seconds >= 60;
            match operation.op.as_str() {
                "acquire" => match result["acquired"].as_bool() {
                    Some(true) => {
                        let (slot, token) = (result["slot"].as_u64().unwrap_or(u64::MAX), result["token"].as_i64());
                        let token = token.filter(|token| *token > 0).ok_or_else(|| fail(shown()))?;
                        if let Some(owner) = &operation.owner {
                            prop_assert_eq!(result["owner"].as_str(), Some(owner.as_str()), "{}", shown());
                        }
                        prop_assert_eq!(&result["guard"], &guard(&operation.name, slot, token), "{}", shown());
                        let permit = (&operation.name[..], slot);
                        if result["already"] == true {
                            // The owner's permit, as it was: its lifetime known if this call gave it.
                            let known = permits.get(&permit).copied().flatten().flatten();
                            prop_assert!(known.is_none_or(|known| known == token), "{}", shown());
                            permits.insert(permit, Some(known));
                        } else {
                            prop_assert!(slot < operation.limit as u64, "{}", shown());
                            permits.insert(permit, Some(lasting.then_some(token)));
                        }
                    }
                    Some(false) => {
                        prop_assert_eq!(result["reason"].as_str(), Some("held"), "{}", shown());
                        prop_assert!(result["holders"].as_array().is_some_and(|h| !h.is_empty()), "{}", shown());
                    }
                    None => return Err(fail(format!("no verdict: {}", shown()))),
                },
                "renew" => match result["renewed"].as_bool() {
                    Some(true) => {
                        let token = result["token"].as_i64().filter(|token| *token > operation.token);
                        let token = token.ok_or_else(|| fail(format!("the token did not rise: {}", shown())))?;
                        let slot = operation.slot as u64;
                        prop_assert_eq!(result["slot"].as_u64(), Some(slot), "{}", shown());
                        prop_assert_eq!(&result["guard"], &guard(&operation.name, slot, token), "{}", shown());
                        permits.insert((&operation.name, slot), Some(lasting.then_some(token)));
                    }
                    Some(false) => prop_assert_eq!(result["reason"].as_str(), Some("lost"), "{}", shown()),
                    None => return Err(fail(format!("no verdict: {}", shown()))),
                },
                "release" => match result["released"].as_bool() {
                    Some(true) => {
                        permits.insert((&operation.name, operation.slot as u64), None);
                    }
                    Some(false) => prop_assert_eq!(result["reason"].as_str(), Some("lost"), "{}", shown()),
                    None => return Err(fail(format!("no verdict: {}", shown()))),
                },
                _ => {
                    let holders = result["holders"].as_array().ok_or_else(|| fail(shown()))?;
                    prop_assert_eq!(result["held"].as_bool(), Some(!holders.is_empty()), "{}", shown());
                }
            }
        }
        let names: BTreeSet<&str> = permits.keys().map(|(name, _)| *name).collect();
        if names.is_empty() {
            return Ok(());
        }
        let gets: Vec<Value> = names.iter().map(|name| json!({"op": "get", "name": name})).collect();
        let answer = self.app.post("/api/v1/locks", &json!({ "operations": gets })).await;
        let states = answer.body["results"].as_array().ok_or_else(|| fail(format!("read back: {answer:?}")))?;
        let holders: BTreeMap<&str, &Value> = names.iter().copied().zip(states.iter().map(|s| &s["holders"])).collect();
        for ((name, slot), permit) in permits {
            let at_slot = holders[name].as_array().into_iter().flatten().find(|h| h["slot"].as_u64() == Some(slot));
            let shown = || format!("{name:?} slot {slot}: {:?}", holders[name]);
            match permit {
                Some(Some(token)) => {
                    prop_assert_eq!(at_slot.and_then(|h| h["token"].as_i64()), Some(token), "not held: {}", shown());
                }
                Some(None) => {}
                None => prop_assert!(at_slot.is_none(), "still held after its release: {}", shown()),
            }
        }
        Ok(())
    }
}

#[test]
fn fuzzed_lock_bodies() {
    let fuzz = Fuzz::start(|_| {});
    fuzz.run(case(lock_body), |case| {
        fuzz.block_on(async {
            // A lock of the case's own, held, for operations that name it and its permit.
            let held = format!("held-{}", fuzz.next());
            let acquire = json!({"op": "acquire", "name": held, "ttlSeconds": 3600, "owner": "fuzz-owner"});
            let acquired = fuzz.app.post("/api/v1/locks", &json!({ "operations": [acquire] })).await;
            let permit = &acquired.body["results"][0];
            prop_assert_eq!(&permit["acquired"], &json!(true), "{:?}", acquired);
            let refs = Refs::from([
                ("held".to_owned(), json!(held)),
                ("token".to_owned(), permit["token"].clone()),
                ("slot".to_owned(), permit["slot"].clone()),
                ("owner".to_owned(), json!("fuzz-owner")),
            ]);
            let sent = case.send(&refs, Good);
            let reply = fuzz.exchange("/api/v1/locks", &sent).await?;
            if !reply.status.is_success() {
                return Ok(());
            }
            prop_assert_eq!(reply.status, StatusCode::OK, "{}", reply.shown());
            let body = members_of(accepted_text(&sent.bytes)?)?;
            let operations = present(&body, "operations").ok_or_else(|| fail("accepted no operations"))?;
            fuzz.verify_locks(&lock_reads(operations)?, &reply.results()?).await
        })
    });
}

// ---------------------------------------------------------------------------------------------
// Timers: `POST /api/v1/timers`, and the transaction's `timers` rider.

/// Queues timers deliver to: none a push of the transaction test names, whose pops must find
/// only what it pushed.
const TIMER_QUEUES: &[&str] = &["fuzz-timers", "ünï timers", "timers a+b"];
const TIMER_KEYS: &[&str] = &["t1", "t2", "a/b", "ünï/キー/1", "with space", "100%", "a.b/..c/..."];
/// The longest delay a timer may be given: ten years.
const MAX_DELAY_MS: i64 = 10 * 365 * 24 * 3600 * 1000;
/// Timers due sooner than this are due within the case (the cases delay them by at most a few
/// hundred milliseconds), and are waited for; the others are not due before the test ends.
const DUE_WITHIN_MS: i64 = 3_600_000;
/// The group the delivered timers are popped back by.
const TIMER_GROUP: &str = "fuzz-timers";

const TIMER_FIELDS: &[&str] = &["op", "queue", "timerKey", "payload", "payloadZstd", "delayMs", "txn", "partition"];
const CANCEL_FIELDS: &[&str] = &["op", "queue", "timerKey", "txn"];
/// Every member of a timer operation, those the broker sets itself (refused) and one no
/// operation has.
const TIMER_NAMES: &[&str] = &[
    "op",
    "queue",
    "timerKey",
    "payload",
    "payloadZstd",
    "delayMs",
    "txn",
    "partition",
    "producerSub",
    "producer_sub",
    "messageId",
    "tenant",
    "tenantId",
    "deliverAt",
    "delaySeconds",
    "attempts",
    "claimToken",
    "claimedUntil",
    "_private",
    "priority",
];

fn base64(bytes: &[u8]) -> Value {
    Value::String(BASE64.encode(bytes))
}

fn zstd_frame(text: &str) -> Vec<u8> {
    zstd::bulk::compress(text.as_bytes(), 1).expect("zstd compresses")
}

/// `payload` (base64 of the message's JSON, or with `payloadZstd: true` of a zstd frame of it)
/// and `payloadZstd`. A payload nests no deeper than a push's may: pops answer it at that depth.
fn payload_members(pristine: bool) -> BoxedStrategy<Named> {
    fn payload(payload: Option<Value>, zstd: Option<Value>, verdict: Verdict) -> Named {
        vec![("payload", (payload, verdict)), ("payloadZstd", (zstd, verdict))]
    }
    let json = || {
        prop_oneof![
            8 => json_value(Raw::Valid).prop_map(|value| render(&value)),
            1 => Just(render(&nested(VALUE_MAX_DEPTH))),
        ]
    };
    let plain = prop_oneof![Just(None), Just(Some(Value::Null)), Just(Some(json!(false)))];
    let unpadded = json().prop_map(|text| base64::engine::general_purpose::STANDARD_NO_PAD.encode(text));
    choose(
        pristine,
        vec![
            (
                8,
                Good,
                (json(), plain).prop_map(|(text, zstd)| payload(Some(base64(text.as_bytes())), zstd, Good)).boxed(),
            ),
            (
                3,
                Good,
                json().prop_map(|text| payload(Some(base64(&zstd_frame(&text))), Some(json!(true)), Good)).boxed(),
            ),
            // Deeper than a push may nest: once delivered, every pop of its partition would answer
            // JSON past what `serde_json` (127 levels) or Python's `json` (20,000: RecursionError)
            // reads. Found by this fuzzer: it was accepted and delivered.
            (
                1,
                Bad,
                values(vec![nested(VALUE_MAX_DEPTH + 1), nested(VALUE_MAX_DEPTH + 4), nested(20_000)])
                    .prop_map(|value| payload(Some(base64(render(&value).as_bytes())), None, Bad))
                    .boxed(),
            ),
            (
                1,
                Bad,
                unpadded
                    .prop_filter("padding missing", |text| text.len() % 4 != 0)
                    .prop_map(|text| payload(Some(json!(text)), None, Bad))
                    .boxed(),
            ),
            (1, Bad, json().prop_map(|text| payload(Some(base64(&zstd_frame(&text))), None, Bad)).boxed()),
            (1, Bad, json().prop_map(|text| payload(Some(base64(text.as_bytes())), Some(json!(true)), Bad)).boxed()),
            (
                1,
                Bad,
                values(vec![json!("%%%"), base64(b"not json"), base64(b""), json!(5), json!([]), Value::Null])
                    .prop_map(|text| payload(Some(text), None, Bad))
                    .boxed(),
            ),
            (1, Bad, Just(payload(None, None, Bad)).boxed()),
            (
                1,
                Bad,
                (json(), values(vec![json!("true"), json!(1), json!([])]))
                    .prop_map(|(text, zstd)| payload(Some(base64(text.as_bytes())), Some(zstd), Bad))
                    .boxed(),
            ),
        ],
    )
}

/// A timer key: 1 to 255 bytes without control characters, `/` anywhere but first or twice in
/// a row (the peek route's path carries it).
fn timer_key_member(pristine: bool) -> BoxedStrategy<Member> {
    let good = prop_oneof![
        3 => prop::sample::select(TIMER_KEYS).prop_map(str::to_owned),
        3 => "[a-z0-9]{1,8}(/[a-z0-9é]{1,8}){0,2}",
        1 => "\\PC{1,12}".prop_filter("routable", |key| {
            !key.starts_with('/') && !key.contains("//") && !key.split('/').any(|segment| segment == "." || segment == "..")
        }),
        1 => Just("k".repeat(255)),
        1 => Just(format!("{}/x", "é".repeat(126))),
    ];
    let bad = values(vec![
        json!(""),
        json!("/a"),
        json!("a//b"),
        json!("a/../b"),
        json!("."),
        json!("k".repeat(256)),
        json!("bell\u{7}"),
        json!("nul\u{0}"),
        json!(5),
        json!([]),
        json!({}),
    ]);
    member(
        pristine,
        vec![
            with(12, Good, good.prop_map(Value::String)),
            with(1, Bad, bad),
            left_out(1, Bad),
            with(1, Bad, Just(Value::Null)),
        ],
    )
}

/// A good queue of timers: one of [`TIMER_QUEUES`] mostly, or any name marked as a timers' one.
fn timer_queue() -> BoxedStrategy<Value> {
    let marked = created_name().prop_map(|name| {
        let mut marked = format!("⏲{name}");
        while marked.len() > 255 {
            marked.pop();
        }
        Value::String(marked)
    });
    prop_oneof![3 => strings(TIMER_QUEUES), 1 => marked].boxed()
}

fn timer_operation(pristine: bool) -> BoxedStrategy<Draft> {
    let queue = || named("queue", required_name_member(timer_queue(), bad_created_name(), pristine));
    let key = || named("timerKey", timer_key_member(pristine));
    let txn = || named("txn", transaction_id_member(pristine));
    // Due at once (or within 200 ms, waited for), or not before the test ends.
    let delay =
        prop_oneof![2 => integers(i64::MIN, 0), 1 => integers(1, 200), 4 => integers(2 * DUE_WITHIN_MS, MAX_DELAY_MS)]
            .boxed();
    let schedule = |kind: &'static str| {
        let members = vec![
            queue(),
            key(),
            payload_members(pristine),
            named("delayMs", integer_member(pristine, false, delay.clone(), i64::MIN, MAX_DELAY_MS)),
            txn(),
            named("partition", optional_name_member(PUSH_PARTITIONS, bad_created_name(), pristine)),
        ];
        operation(pristine, kind, TIMER_FIELDS, TIMER_NAMES, members)
    };
    prop_oneof![
        4 => schedule("schedule"),
        2 => schedule("reschedule"),
        2 => operation(pristine, "cancel", CANCEL_FIELDS, TIMER_NAMES, vec![queue(), key(), txn()]),
    ]
    .boxed()
}

/// The operations of a batch (or of the rider): none or more than `push.max_items` are refused.
fn timer_operations(pristine: bool) -> BoxedStrategy<(Value, Verdict)> {
    let counts = if pristine { 1..5usize } else { 0..6 };
    let batch = prop::collection::vec(timer_operation(pristine), counts).prop_map(|drafts| {
        let (value, verdict) = array_of(&drafts);
        (value, if drafts.is_empty() { Bad } else { verdict })
    });
    let cancel = |i: usize| json!({"op": "cancel", "queue": "fuzz-timers", "timerKey": format!("many-{i}")});
    choose(
        pristine,
        vec![
            (20, Good, batch.boxed()),
            (1, Good, Just((repeated(MAX_ITEMS, cancel), Good)).boxed()),
            (1, Bad, Just((repeated(MAX_ITEMS + 1, cancel), Bad)).boxed()),
            (
                1,
                Bad,
                values(vec![json!({}), json!("operations"), json!(5), json!([1]), json!([[]])])
                    .prop_map(|value| (value, Bad))
                    .boxed(),
            ),
        ],
    )
}

fn timer_body(pristine: bool) -> BoxedStrategy<(Value, Verdict)> {
    let operations = member(
        pristine,
        vec![
            (12, Good, timer_operations(pristine).prop_map(|(value, verdict)| (Some(value), verdict)).boxed()),
            left_out(1, Bad),
            with(1, Bad, Just(Value::Null)),
        ],
    );
    operations.prop_map(|operations| Draft(vec![("operations", operations)]).built()).boxed()
}

/// A timer operation as the broker read it.
#[derive(Debug)]
struct TimerRead {
    op: String,
    queue: String,
    key: String,
    txn: Option<String>,
    partition: String,
    /// The message's JSON, decoded (and decompressed).
    payload: Vec<u8>,
    delay_ms: i64,
}

fn timer_reads(operations: &RawValue) -> Result<Vec<TimerRead>, TestCaseError> {
    raw_array(operations)?
        .into_iter()
        .map(|operation| {
            let members = members_of(operation.get())?;
            let encoded = string_of(&members, "payload")?.unwrap_or_default();
            let bytes =
                BASE64.decode(&encoded).map_err(|e| fail(format!("accepted a payload that is no base64: {e}")))?;
            let payload = if read_of(&members, "payloadZstd")?.unwrap_or(false) {
                zstd::stream::decode_all(&bytes[..]).map_err(|e| fail(format!("accepted no zstd frame: {e}")))?
            } else {
                bytes
            };
            Ok(TimerRead {
                op: string_of(&members, "op")?.unwrap_or_default(),
                queue: string_of(&members, "queue")?.unwrap_or_default(),
                key: string_of(&members, "timerKey")?.unwrap_or_default(),
                txn: string_of(&members, "txn")?,
                partition: string_of(&members, "partition")?.unwrap_or_else(|| "Default".into()),
                payload,
                delay_ms: read_of(&members, "delayMs")?.unwrap_or_default(),
            })
        })
        .collect()
}

/// The messages due timers delivered to a partition: their id, txn and payload.
type Delivered<'a> = Vec<(&'a str, &'a str, &'a [u8])>;

/// A pending timer, as peeked at.
#[derive(Debug)]
struct Peeked {
    txn: String,
    partition: String,
    payload: Vec<u8>,
    deliver_at: Option<i64>,
    attempts: i64,
}

impl Fuzz {
    /// The pending timer of a key: through the peek route, or (for a queue or key no URL path
    /// carries) from its row.
    async fn peek_timer(&self, queue: &str, key: &str) -> Result<Option<Peeked>, TestCaseError> {
        if addressable(queue) && addressable(key) {
            let reply = self.get(&format!("/api/v1/timers/{}/{}", segment(queue), segment(key))).await?;
            prop_assert_eq!(reply.status, StatusCode::OK, "peek {:?}/{:?}: {}", queue, key, reply.shown());
            let peeked = reply.json.unwrap_or_default();
            if peeked["found"] == false {
                return Ok(None);
            }
            let text = |field: &str| peeked[field].as_str().unwrap_or_default().to_owned();
            return Ok(Some(Peeked {
                txn: text("txn"),
                partition: text("partition"),
                payload: BASE64.decode(text("payload")).map_err(|e| fail(format!("peeked {peeked}: {e}")))?,
                deliver_at: micros(&text("deliverAt")),
                attempts: peeked["attempts"].as_i64().unwrap_or(-1),
            }));
        }
        let sql = "SELECT txn, partition, payload, (extract(epoch FROM deliver_at) * 1000000)::bigint, attempts::bigint
                     FROM queen.timers WHERE queue = $1 AND timer_key = $2";
        let row = self.db.query_opt(sql, &[&queue, &key]).await.map_err(|e| fail(e.to_string()))?;
        Ok(row.map(|row| Peeked {
            txn: row.get(0),
            partition: row.get(1),
            payload: row.get(2),
            deliver_at: row.get(3),
            attempts: row.get(4),
        }))
    }

    /// Waits until no timer is due within [`DUE_WITHIN_MS`]: the due ones delivered, so that no
    /// delivery writes while a later case is checked.
    async fn await_due_timers(&self) -> Result<(), TestCaseError> {
        let due = "FROM queen.timers WHERE fire_at < now() + interval '1 millisecond' * $1::bigint";
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while self.number(&format!("SELECT count(*) {due}"), &[&DUE_WITHIN_MS]).await != Some(0) {
            if std::time::Instant::now() > deadline {
                let sql = format!("SELECT queue, timer_key, attempts, last_error {due}");
                let rows = self.db.query(&sql, &[&DUE_WITHIN_MS]).await.map_err(|e| fail(e.to_string()))?;
                let rows: Vec<(String, String, i32, Option<String>)> =
                    rows.iter().map(|row| (row.get(0), row.get(1), row.get(2), row.get(3))).collect();
                return Err(fail(format!("due timers not delivered within 10 s: {rows:?}")));
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        Ok(())
    }

    /// Checks the results of accepted timer operations (`first_index`: the flat index of the
    /// first, in a transaction's results): each answers its operation; the timer each key is left
    /// with peeks back as scheduled, or, due, is delivered and pops back with its payload; a
    /// cancelled one is gone.
    async fn verify_timers(
        &self,
        operations: &[TimerRead],
        results: &[Value],
        first_index: Option<usize>,
    ) -> Result<(), TestCaseError> {
        prop_assert_eq!(results.len(), operations.len(), "one result per operation: {:?}", results);
        let asked_at = Utc::now().timestamp_micros();
        // What each key comes to: the operation whose timer is pending, none, or (`None`) not
        // known (a cancel of another txn's timer, or one found being delivered).
        let mut left: BTreeMap<(&str, &str), Option<Option<usize>>> = BTreeMap::new();
        for (i, (operation, result)) in operations.iter().zip(results).enumerate() {
            let shown = || format!("{operation:?} → {result}");
            prop_assert_eq!(result["queue"].as_str(), Some(operation.queue.as_str()), "{}", shown());
            prop_assert_eq!(result["timerKey"].as_str(), Some(operation.key.as_str()), "{}", shown());
            prop_assert_eq!(result["index"].as_u64(), first_index.map(|first| (first + i) as u64), "{}", shown());
            let status = result["status"].as_str().unwrap_or_default();
            let ok = matches!(status, "scheduled" | "rescheduled" | "cancelled");
            prop_assert_eq!(result["ok"].as_bool(), Some(ok), "{}", shown());
            let state = left.entry((&operation.queue, &operation.key)).or_insert(None);
            match (operation.op.as_str(), status) {
                ("schedule" | "reschedule", "scheduled" | "rescheduled") => {
                    if let Some(txn) = &operation.txn {
                        prop_assert_eq!(result["txn"].as_str(), Some(txn.as_str()), "{}", shown());
                    }
                    prop_assert!(
                        result["messageId"].as_str().is_some_and(|id| Uuid::parse_str(id).is_ok()),
                        "{}",
                        shown()
                    );
                    let due = asked_at.saturating_add(operation.delay_ms.max(0).saturating_mul(1000));
                    let deliver_at = result["deliverAt"].as_str().and_then(micros);
                    prop_assert!(
                        deliver_at.is_some_and(|at| (at - due).abs() < 60_000_000),
                        "not due when asked: {}",
                        shown()
                    );
                    *state = Some(Some(i));
                }
                ("cancel", "cancelled") => {
                    if let Some(txn) = &operation.txn {
                        prop_assert_eq!(result["txn"].as_str(), Some(txn.as_str()), "{}", shown());
                    }
                    *state = Some(None);
                }
                ("cancel", "absent") => {
                    prop_assert_eq!(result["txn"].as_str(), operation.txn.as_deref(), "{}", shown());
                    if operation.txn.is_none() {
                        prop_assert!(!matches!(state, Some(Some(_))), "a pending timer was absent: {}", shown());
                        *state = Some(None);
                    }
                }
                (_, "too_late") => *state = None,
                _ => return Err(fail(format!("an unexpected status: {}", shown()))),
            }
        }
        self.await_due_timers().await?;
        let mut delivered: BTreeMap<(&str, &str), Delivered<'_>> = BTreeMap::new();
        for ((queue, key), state) in left {
            let Some(pending) = state else { continue };
            let peeked = self.peek_timer(queue, key).await?;
            let shown = format!("{queue:?}/{key:?}: {pending:?} of {operations:?}, peeked {peeked:?}");
            let Some(i) = pending else {
                prop_assert!(peeked.is_none(), "a cancelled timer is pending: {}", shown);
                continue;
            };
            let (operation, result) = (&operations[i], &results[i]);
            let txn = result["txn"].as_str().unwrap_or_default();
            if operation.delay_ms < DUE_WITHIN_MS {
                prop_assert!(peeked.is_none(), "a due timer was not delivered: {}", shown);
                let id = result["messageId"].as_str().unwrap_or_default();
                delivered.entry((&operation.queue, &operation.partition)).or_default().push((
                    id,
                    txn,
                    &operation.payload,
                ));
                continue;
            }
            let peeked = peeked.ok_or_else(|| fail(format!("a scheduled timer is not pending: {shown}")))?;
            prop_assert_eq!(peeked.txn.as_str(), txn, "{}", shown);
            prop_assert_eq!(&peeked.partition, &operation.partition, "{}", shown);
            prop_assert_eq!(&peeked.payload, &operation.payload, "{}", shown);
            prop_assert_eq!(peeked.deliver_at, result["deliverAt"].as_str().and_then(micros), "{}", shown);
            prop_assert_eq!(peeked.attempts, 0, "{}", shown);
        }
        for ((queue, partition), messages) in delivered {
            let popped = if addressable(queue) && addressable(partition) {
                self.consume(queue, partition, TIMER_GROUP).await?
            } else {
                Popped::default()
            };
            for (id, txn, payload) in messages {
                let shown = || format!("{queue:?}/{partition:?} {id} {txn:?}: {popped:?}");
                match popped.messages.iter().find(|m| m.id == id) {
                    Some(message) => {
                        prop_assert_eq!(&message.transaction_id, txn, "{}", shown());
                        prop_assert_eq!(message.data.get().as_bytes(), payload, "delivered otherwise: {}", shown());
                    }
                    // A duplicate of a message stored before (under its txn), or one no path pops.
                    None => {
                        let sql = "SELECT count(*) FROM queen.log_message_ids m
                                     JOIN queen.partitions p ON p.id = m.partition_id
                                     JOIN queen.queues q ON q.id = p.queue_id
                                    WHERE q.name = $1 AND p.name = $2 AND m.transaction_id = $3";
                        let stored = self.number(sql, &[&queue, &partition, &txn]).await;
                        prop_assert_eq!(stored, Some(1), "not delivered: {}", shown());
                    }
                }
            }
        }
        Ok(())
    }
}

#[test]
fn fuzzed_timer_bodies() {
    let fuzz = Fuzz::start(|_| {});
    fuzz.run(case(timer_body), |case| {
        fuzz.block_on(async {
            let sent = case.send(&Refs::new(), Good);
            let reply = fuzz.exchange("/api/v1/timers", &sent).await?;
            if !reply.status.is_success() {
                return Ok(());
            }
            prop_assert_eq!(reply.status, StatusCode::OK, "{}", reply.shown());
            let body = members_of(accepted_text(&sent.bytes)?)?;
            let operations = present(&body, "operations").ok_or_else(|| fail("accepted no operations"))?;
            fuzz.verify_timers(&timer_reads(operations)?, &reply.results()?, None).await
        })
    });
}

// ---------------------------------------------------------------------------------------------
// Trace events, on messages pushed for the test.

/// The messages events are recorded on.
const TRACE_MESSAGES: usize = 3;
const TRACE_LABELS: &[&str] = &["tenant-acme", "order-1", "ünï 追跡", "info", "error", "a/b"];
/// The longest trace name or event type, in bytes, and the most names an event carries.
const TRACE_MAX_BYTES: usize = 255;
const TRACE_MAX_NAMES: usize = 32;
const TRACE_MAX_DATA_BYTES: usize = 64 * 1024;
const TRACE_MAX_BODY_BYTES: usize = 256 * 1024;

fn trace_body(message: usize, pristine: bool) -> BoxedStrategy<(Value, Verdict)> {
    let group = member(
        pristine,
        vec![
            left_out(3, Good),
            with(2, Good, values(vec![Value::Null, json!(""), json!("__QUEUE_MODE__")])),
            with(3, Good, name().prop_map(Value::String)),
            with(1, Bad, bad_group()),
        ],
    );
    let names = prop::collection::vec(label(TRACE_LABELS, String::new(), TRACE_MAX_BYTES), 0..=TRACE_MAX_NAMES);
    let too_many = prop::collection::vec(label(TRACE_LABELS, String::new(), TRACE_MAX_BYTES), TRACE_MAX_NAMES + 1..=40);
    let names = member(
        pristine,
        vec![
            left_out(3, Good),
            with(1, Good, Just(Value::Null)),
            with(5, Good, names.prop_map(Value::Array)),
            with(1, Bad, too_many.prop_map(Value::Array)),
            with(
                1,
                Bad,
                values(vec![
                    json!([""]),
                    json!(["ok", 5]),
                    json!(["bell\u{7}"]),
                    json!(["x".repeat(TRACE_MAX_BYTES + 1)]),
                    json!([null]),
                    json!("name"),
                    json!({}),
                    json!(5),
                ]),
            ),
        ],
    );
    let event_type = optional_label(pristine, label(TRACE_LABELS, String::new(), TRACE_MAX_BYTES), TRACE_MAX_BYTES);
    // Any object of at most 64 KiB of JSON.
    let object = prop::collection::btree_map(key(), json_value(Raw::Valid), 0..5).prop_map(|members| {
        let object = Value::Object(members.into_iter().collect());
        let verdict = if render(&object).len() <= TRACE_MAX_DATA_BYTES { Good } else { Bad };
        (Some(object), verdict)
    });
    let object =
        if pristine { object.prop_filter("small", |(_, verdict)| *verdict == Good).boxed() } else { object.boxed() };
    // Read back three levels down (`{"traces": [{"data": …}]}`), `data` nests at most 124 levels.
    let data = member(
        pristine,
        vec![
            (8, Good, object),
            with(1, Good, Just(json!({ "deep": nested(123) }))),
            with(1, Bad, Just(json!({ "deep": nested(124) }))),
            with(1, Bad, Just(json!({ "big": "x".repeat(TRACE_MAX_DATA_BYTES) }))),
            with(1, Bad, values(vec![json!([]), json!("data"), json!(5), json!(true), json!([{"step": 1}])])),
            left_out(1, Bad),
            with(1, Bad, Just(Value::Null)),
        ],
    );
    (partition_member(pristine), transaction_member(message, pristine), group, names, event_type, data)
        .prop_map(|(partition, transaction, group, names, event_type, data)| {
            Draft(vec![
                ("partitionId", partition),
                ("transactionId", transaction),
                ("consumerGroup", group),
                ("traceNames", names),
                ("eventType", event_type),
                ("data", data),
            ])
            .built()
        })
        .boxed()
}

fn trace_case() -> BoxedStrategy<Case> {
    (0..TRACE_MESSAGES).prop_flat_map(|message| case(move |pristine| trace_body(message, pristine))).boxed()
}

/// A page of a message's trace events, their data as sent.
#[derive(Debug, Deserialize)]
struct MessageTraces {
    traces: Vec<TraceEvent>,
    total: i64,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct TraceEvent {
    id: i64,
    consumer_group: String,
    event_type: String,
    trace_names: Vec<String>,
    data: Box<RawValue>,
}

impl Fuzz {
    async fn traces(&self, path: &str) -> Result<MessageTraces, TestCaseError> {
        let reply = self.get(path).await?;
        prop_assert_eq!(reply.status, StatusCode::OK, "{}: {}", path, reply.shown());
        serde_json::from_str(&reply.text).map_err(|e| fail(format!("{path} ({e}): {}", reply.shown())))
    }
}

#[test]
fn fuzzed_trace_bodies() {
    let fuzz = Fuzz::start(|_| {});
    let leased = fuzz.block_on(fuzz.leased("fuzz-traces", None, TRACE_MESSAGES)).expect("the messages traced");
    let refs = leased.refs();
    fuzz.run(trace_case(), |case| {
        fuzz.block_on(async {
            let mut sent = case.send(&refs, Good);
            // A body past the route's limit is refused before it is read.
            let too_large = sent.bytes.len() > TRACE_MAX_BODY_BYTES;
            if too_large {
                sent.expected = Stray;
            }
            let reply = fuzz.exchange("/api/v1/traces", &sent).await?;
            if too_large {
                prop_assert_eq!(reply.status, StatusCode::PAYLOAD_TOO_LARGE, "{}", reply.shown());
            }
            if !reply.status.is_success() {
                return Ok(());
            }
            prop_assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.shown());
            let shown = || format!("{}\n  → {}", sent.shown(), reply.shown());
            let body = members_of(accepted_text(&sent.bytes)?)?;
            // What the broker read: the partition id as text or number, the group as queue mode
            // when none, the names once each.
            let partition = present(&body, "partitionId").map(RawValue::get).unwrap_or_default();
            let partition = serde_json::from_str::<String>(partition).unwrap_or_else(|_| partition.to_owned());
            let partition: i64 = partition.parse().map_err(|_| fail(format!("accepted partitionId {partition}")))?;
            let transaction_id = string_of(&body, "transactionId")?.unwrap_or_default();
            let group = string_of(&body, "consumerGroup")?.filter(|g| !g.is_empty());
            let event_type = string_of(&body, "eventType")?.unwrap_or_else(|| "info".into());
            let mut names: Vec<String> = Vec::new();
            for name in read_of::<Vec<String>>(&body, "traceNames")?.unwrap_or_default() {
                if !names.contains(&name) {
                    names.push(name);
                }
            }
            let data = present(&body, "data").map(RawValue::get).unwrap_or_default();
            let answer = reply.json.clone().unwrap_or_default();
            prop_assert_eq!(&answer["success"], &json!(true), "{}", shown());
            prop_assert_eq!(&answer["partitionId"], &json!(partition.to_string()), "{}", shown());
            prop_assert_eq!(answer["transactionId"].as_str(), Some(transaction_id.as_str()), "{}", shown());
            let id = answer["id"].as_i64().ok_or_else(|| fail(shown()))?;
            // Read back: the message's newest event, the last of its events (oldest first).
            let path = format!("/api/v1/traces/{partition}/{}", segment(&transaction_id));
            let total = fuzz.traces(&format!("{path}?limit=1")).await?.total;
            let newest = fuzz.traces(&format!("{path}?limit=1&offset={}", total - 1)).await?;
            let event = newest.traces.first().ok_or_else(|| fail(format!("no events: {}", shown())))?;
            let read = || format!("read back as {event:?}: {}", shown());
            prop_assert_eq!(event.id, id, "{}", read());
            prop_assert_eq!(&event.event_type, &event_type, "{}", read());
            prop_assert_eq!(&event.trace_names, &names, "{}", read());
            prop_assert_eq!(event.consumer_group.as_str(), group.as_deref().unwrap_or("__QUEUE_MODE__"), "{}", read());
            prop_assert_eq!(event.data.get(), data, "{}", read());
            Ok(())
        })
    });
}

// ---------------------------------------------------------------------------------------------
// Reads by offset: fetch and changed partitions, of records written for the test.

const READ_QUEUES: &[&str] = &["fuzz-reads", "ünï reads"];
const READ_PARTITIONS: &[&str] = &["p1", "ünï 分区", "Default"];
/// Payloads as pushed, byte for byte, which fetches answer byte for byte.
const READ_PAYLOADS: &[&str] =
    &[r#"{"a": [1, 2.50]}"#, r#""é🦀""#, "1e400", "null", r#""\ud800""#, "[ ]", r#"{"i":1,"i":2}"#];
/// The payload bytes a fetch answers at most, for an entry and for a call.
const MAX_FETCH_BYTES: i64 = 8 * 1024 * 1024;
const MAX_FETCH_ENTRIES: usize = 1024;
const MAX_CHANGED_ENTRIES: usize = 100;
const MAX_CHANGED_PAGE: i64 = 1000;

/// A partition's records from offset 1: transaction id and payload text.
type Records = Vec<(String, String)>;

/// What the reads find: partitions by (queue, partition), each with its id and its records, all
/// written after `started`.
struct Written {
    started: DateTime<Utc>,
    partitions: BTreeMap<(String, String), (i64, Records)>,
}

impl Written {
    /// The partitions of a queue, in creation order: name, id, records.
    fn of(&self, queue: &str) -> Vec<(&str, i64, usize)> {
        let mut partitions: Vec<(&str, i64, usize)> = self
            .partitions
            .iter()
            .filter(|((q, _), _)| q == queue)
            .map(|((_, partition), (id, records))| (partition.as_str(), *id, records.len()))
            .collect();
        partitions.sort_by_key(|(_, id, _)| *id);
        partitions
    }
}

async fn write_for_reads(fuzz: &Fuzz) -> Written {
    let started = Utc::now();
    let mut partitions = BTreeMap::new();
    let mut payloads = READ_PAYLOADS.iter().cycle();
    for (queue, partition, n) in
        [("fuzz-reads", "p1", 3), ("fuzz-reads", "ünï 分区", 2), ("fuzz-reads", "Default", 1), ("ünï reads", "p1", 2)]
    {
        let records: Records =
            (0..n).map(|i| (format!("{partition}-{i}"), payloads.next().copied().unwrap_or("1").to_owned())).collect();
        let items: Vec<String> = records
            .iter()
            .map(|(txn, payload)| {
                format!(
                    r#"{{"queue":{},"partition":{},"transactionId":{},"payload":{payload}}}"#,
                    json!(queue),
                    json!(partition),
                    json!(txn)
                )
            })
            .collect();
        let pushed = fuzz.app.post_raw("/api/v1/push", format!(r#"{{"items":[{}]}}"#, items.join(","))).await;
        assert_eq!(pushed.status, StatusCode::CREATED, "{pushed:?}");
        let id = pushed.body[0]["partition_id"].as_str().and_then(|id| id.parse().ok()).expect("a partition id");
        partitions.insert((queue.to_owned(), partition.to_owned()), (id, records));
    }
    Written { started, partitions }
}

/// A body's `entries`: some of `entry`, none (refused), or past `max` (refused); `filler` is a
/// good entry, for entries at the limit.
fn entries_member(
    pristine: bool,
    entry: fn(bool) -> BoxedStrategy<Draft>,
    max: usize,
    filler: Value,
) -> BoxedStrategy<Member> {
    let counts = if pristine { 1..5usize } else { 0..6 };
    let some = prop::collection::vec(entry(pristine), counts).prop_map(|drafts| {
        let (value, verdict) = array_of(&drafts);
        (Some(value), if drafts.is_empty() { Bad } else { verdict })
    });
    let limit = filler.clone();
    member(
        pristine,
        vec![
            (20, Good, some.boxed()),
            with(1, Good, Just(repeated(max, move |_| limit.clone()))),
            with(1, Bad, Just(repeated(max + 1, move |_| filler.clone()))),
            with(1, Bad, values(vec![json!({}), json!("entries"), json!(5), json!([1]), json!([[]])])),
            left_out(1, Bad),
            with(1, Bad, Just(Value::Null)),
        ],
    )
}

fn byte_budget_member(pristine: bool) -> BoxedStrategy<Member> {
    let good = prop_oneof![
        2 => values(vec![json!(1), json!(10), json!(1 << 20), json!(MAX_FETCH_BYTES), json!(i64::MAX)]),
        1 => integers(1, i64::MAX),
    ];
    integer_member(pristine, true, good.boxed(), 1, i64::MAX)
}

fn fetch_entry(pristine: bool) -> BoxedStrategy<Draft> {
    let offset = integer_member(
        pristine,
        false,
        prop_oneof![4 => integers(0, 4), 1 => integers(0, i64::MAX)].boxed(),
        0,
        i64::MAX,
    );
    (
        required_name_member(pooled_name(READ_QUEUES), bad_name(), pristine),
        required_name_member(pooled_name(READ_PARTITIONS), bad_name(), pristine),
        offset,
        byte_budget_member(pristine),
    )
        .prop_map(|(queue, partition, offset, bytes)| {
            Draft(vec![("queue", queue), ("partition", partition), ("offset", offset), ("maxBytes", bytes)])
        })
        .boxed()
}

fn fetch_body(pristine: bool) -> BoxedStrategy<(Value, Verdict)> {
    let filler = json!({"queue": "fuzz-reads", "partition": "p1", "offset": 1});
    (entries_member(pristine, fetch_entry, MAX_FETCH_ENTRIES, filler), byte_budget_member(pristine))
        .prop_map(|(entries, bytes)| Draft(vec![("entries", entries), ("maxBytes", bytes)]).built())
        .boxed()
}

#[derive(Debug, Deserialize)]
struct Fetched<'a> {
    #[serde(borrow)]
    entries: Vec<FetchedEntry<'a>>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct FetchedEntry<'a> {
    high_watermark: i64,
    log_start_offset: i64,
    error: Option<String>,
    #[serde(borrow)]
    records: Vec<FetchedRecord<'a>>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct FetchedRecord<'a> {
    offset: i64,
    transaction_id: String,
    #[serde(borrow)]
    payload: &'a RawValue,
    ts: String,
}

/// Checks an accepted fetch: an entry per entry asked, in order; an unknown partition's entry says
/// so; a known one's records are the partition's from the offset asked, as pushed, all of them
/// when the budgets hold them, or its error says the offset is out of range.
fn verify_fetched(written: &Written, sent: &Sent, reply: &Reply) -> Result<(), TestCaseError> {
    let body = members_of(accepted_text(&sent.bytes)?)?;
    let call_bytes = read_of::<i64>(&body, "maxBytes")?.unwrap_or(MAX_FETCH_BYTES).min(MAX_FETCH_BYTES);
    let asked = raw_array(present(&body, "entries").ok_or_else(|| fail("accepted no entries"))?)?;
    let answer: Fetched<'_> =
        serde_json::from_str(&reply.text).map_err(|e| fail(format!("the answer ({e}): {}", reply.shown())))?;
    prop_assert_eq!(answer.entries.len(), asked.len(), "an entry per entry asked: {}", reply.shown());
    for (entry, got) in asked.iter().zip(&answer.entries) {
        let entry = members_of(entry.get())?;
        let place =
            (string_of(&entry, "queue")?.unwrap_or_default(), string_of(&entry, "partition")?.unwrap_or_default());
        let offset: i64 = read_of(&entry, "offset")?.unwrap_or_default();
        let entry_bytes = read_of::<i64>(&entry, "maxBytes")?.unwrap_or(call_bytes).min(call_bytes);
        let shown = || format!("{place:?} from {offset}: {got:?}\n  {}", sent.shown());
        let Some((_, records)) = written.partitions.get(&place) else {
            prop_assert_eq!(got.error.as_deref(), Some("UNKNOWN_TOPIC_OR_PARTITION"), "{}", shown());
            prop_assert!(got.records.is_empty() && got.high_watermark == 0 && got.log_start_offset == 0, "{}", shown());
            continue;
        };
        let high_watermark = records.len() as i64 + 1;
        prop_assert_eq!((got.high_watermark, got.log_start_offset), (high_watermark, 1), "{}", shown());
        if got.error.is_some() {
            prop_assert_eq!(got.error.as_deref(), Some("OFFSET_OUT_OF_RANGE"), "{}", shown());
            prop_assert!(offset < 1 || offset > high_watermark, "{}", shown());
            prop_assert!(got.records.is_empty(), "{}", shown());
            continue;
        }
        prop_assert!((1..=high_watermark).contains(&offset), "no error out of range: {}", shown());
        for (k, record) in got.records.iter().enumerate() {
            let at = offset + k as i64;
            let (txn, payload) = &records[(at - 1) as usize];
            prop_assert_eq!(record.offset, at, "{}", shown());
            prop_assert_eq!(&record.transaction_id, txn, "{}", shown());
            prop_assert_eq!(record.payload.get(), payload.as_str(), "not as pushed: {}", shown());
            prop_assert!(micros(&record.ts).is_some(), "{}", shown());
        }
        // The records written are far fewer bytes than a mebibyte, however many entries ask.
        if entry_bytes >= 1 << 20 {
            prop_assert_eq!(got.records.len() as i64, high_watermark - offset, "not all read: {}", shown());
        }
    }
    Ok(())
}

#[test]
fn fuzzed_fetch_bodies() {
    let fuzz = Fuzz::start(|_| {});
    let written = fuzz.block_on(write_for_reads(&fuzz));
    fuzz.run(case(fetch_body), |case| {
        fuzz.block_on(async {
            let sent = case.send(&Refs::new(), Good);
            let reply = fuzz.exchange("/api/v1/fetch", &sent).await?;
            if !reply.status.is_success() {
                return Ok(());
            }
            prop_assert_eq!(reply.status, StatusCode::OK, "{}", reply.shown());
            verify_fetched(&written, &sent, &reply)
        })
    });
}

/// Timestamps without an offset (UTC), with `T` or a space, or a date alone (its midnight, UTC).
fn naive_timestamp() -> BoxedStrategy<Value> {
    (good_timestamp(), 0u8..4)
        .prop_map(|(at, form)| {
            let cut = if at.ends_with('Z') { at.len() - 1 } else { at.len() - 6 };
            let naive = &at[..cut];
            Value::String(match form {
                0 => naive[..10].to_owned(),
                1 => naive.replacen('T', " ", 1),
                _ => naive.to_owned(),
            })
        })
        .boxed()
}

/// A time as the broker reads it: RFC 3339, without an offset (UTC), or a date alone.
fn time_micros(at: &str) -> Option<i64> {
    micros(at)
        .or_else(|| {
            ["%Y-%m-%dT%H:%M:%S%.f", "%Y-%m-%d %H:%M:%S%.f"].iter().find_map(|format| {
                chrono::NaiveDateTime::parse_from_str(at, format).ok().map(|at| at.and_utc().timestamp_micros())
            })
        })
        .or_else(|| {
            chrono::NaiveDate::parse_from_str(at, "%Y-%m-%d")
                .ok()
                .map(|day| day.and_time(chrono::NaiveTime::MIN).and_utc().timestamp_micros())
        })
}

fn changed_entry(pristine: bool) -> BoxedStrategy<Draft> {
    let since = member(
        pristine,
        vec![
            left_out(4, Good),
            with(1, Good, Just(Value::Null)),
            with(4, Good, good_timestamp().prop_map(Value::String)),
            with(2, Good, naive_timestamp()),
            with(1, Stray, strings(STRAY_TIMESTAMPS)),
            with(2, Bad, strings(BAD_TIMESTAMPS)),
            with(1, Bad, values(vec![json!(1_700_000_000), json!(true), json!([])])),
        ],
    );
    let after = member(
        pristine,
        vec![
            left_out(4, Good),
            with(1, Good, values(vec![Value::Null, json!("")])),
            with(2, Good, prop_oneof![3 => 1..50i64, 1 => 1..=i64::MAX].prop_map(|id| json!(id.to_string()))),
            with(1, Bad, strings(&["0", "-1", "abc", "1.5", " 1", "9223372036854775808"])),
            with(1, Bad, values(vec![json!(5), json!(true), json!([])])),
        ],
    );
    let limit = integer_member(pristine, true, integers(1, MAX_CHANGED_PAGE), 1, MAX_CHANGED_PAGE);
    (required_name_member(pooled_name(READ_QUEUES), bad_name(), pristine), since, after, limit)
        .prop_map(|(queue, since, after, limit)| {
            Draft(vec![("queue", queue), ("since", since), ("after", after), ("limit", limit)])
        })
        .boxed()
}

fn changed_body(pristine: bool) -> BoxedStrategy<(Value, Verdict)> {
    let filler = json!({"queue": "fuzz-reads"});
    entries_member(pristine, changed_entry, MAX_CHANGED_ENTRIES, filler)
        .prop_map(|entries| Draft(vec![("entries", entries)]).built())
        .boxed()
}

/// Checks an accepted changed-partitions call: an entry per entry asked, in order; an unknown
/// queue's says so; a known one's lists partitions of that queue, in creation order, after the
/// cursor, written since the time asked, and all of them (a page at a time) when the time is
/// before they were written.
fn verify_changed(written: &Written, sent: &Sent, reply: &Reply) -> Result<(), TestCaseError> {
    let body = members_of(accepted_text(&sent.bytes)?)?;
    let asked = raw_array(present(&body, "entries").ok_or_else(|| fail("accepted no entries"))?)?;
    let answer = reply.json.clone().unwrap_or_default();
    prop_assert!(answer["safeTime"].as_str().and_then(micros).is_some(), "{}", reply.shown());
    let entries = answer["entries"].as_array().ok_or_else(|| fail(format!("no entries: {}", reply.shown())))?;
    prop_assert_eq!(entries.len(), asked.len(), "an entry per entry asked: {}", reply.shown());
    let started = written.started.timestamp_micros() - 1_000_000;
    for (entry, got) in asked.iter().zip(entries) {
        let entry = members_of(entry.get())?;
        let queue = string_of(&entry, "queue")?.unwrap_or_default();
        let since = string_of(&entry, "since")?;
        let since = since.as_deref().map(|at| time_micros(at).ok_or_else(|| fail(format!("accepted since {at:?}"))));
        let since = since.transpose()?;
        let after: i64 = string_of(&entry, "after")?
            .filter(|a| !a.is_empty())
            .map_or(Ok(0), |a| a.parse())
            .map_err(|_| fail("accepted an after that is no id"))?;
        let limit: i64 = read_of(&entry, "limit")?.unwrap_or(MAX_CHANGED_PAGE);
        let shown = || format!("{queue:?} since {since:?} after {after} limit {limit}: {got}\n  {}", sent.shown());
        let known = written.of(&queue);
        if known.is_empty() {
            prop_assert_eq!(&got["error"], &json!("UNKNOWN_TOPIC_OR_PARTITION"), "{}", shown());
            prop_assert!(got["partitions"] == json!([]) && got["next"] == "", "{}", shown());
            continue;
        }
        prop_assert!(got.get("error").is_none(), "{}", shown());
        let listed = got["partitions"].as_array().ok_or_else(|| fail(shown()))?;
        let mut ids = Vec::new();
        for partition in listed {
            let id: i64 = partition["id"].as_str().and_then(|id| id.parse().ok()).unwrap_or_default();
            let mine = known.iter().find(|(_, known, _)| *known == id);
            let (name, _, records) = mine.ok_or_else(|| fail(format!("not a partition of the queue: {}", shown())))?;
            prop_assert_eq!(partition["name"].as_str(), Some(*name), "{}", shown());
            prop_assert_eq!(partition["lastOffset"].as_i64(), Some(*records as i64), "{}", shown());
            prop_assert_eq!(partition["logStart"].as_i64(), Some(1), "{}", shown());
            let last_write = partition["lastWriteAt"].as_str().and_then(micros);
            prop_assert!(
                last_write.zip(since).is_none_or(|(at, since)| at >= since),
                "written before since: {}",
                shown()
            );
            prop_assert!(id > after, "not after the cursor: {}", shown());
            ids.push(id);
        }
        prop_assert!(ids.windows(2).all(|pair| pair[0] < pair[1]), "not in creation order: {}", shown());
        prop_assert!(ids.len() as i64 <= limit, "{}", shown());
        let next = got["next"].as_str().ok_or_else(|| fail(shown()))?;
        if since.is_none_or(|since| since < started) {
            let eligible: Vec<i64> = known.iter().map(|(_, id, _)| *id).filter(|id| *id > after).collect();
            let page: Vec<i64> = eligible.iter().copied().take(limit as usize).collect();
            prop_assert_eq!(&ids, &page, "not the partitions written: {}", shown());
            let more = eligible.len() > page.len();
            prop_assert_eq!(
                next,
                if more { ids.last().map(i64::to_string).unwrap_or_default() } else { String::new() },
                "{}",
                shown()
            );
        } else if since.is_some_and(|since| since > Utc::now().timestamp_micros() + 3_600_000_000) {
            prop_assert!(ids.is_empty(), "written in the future: {}", shown());
        }
    }
    Ok(())
}

#[test]
fn fuzzed_changed_partitions_bodies() {
    let fuzz = Fuzz::start(|_| {});
    let written = fuzz.block_on(write_for_reads(&fuzz));
    fuzz.run(case(changed_body), |case| {
        fuzz.block_on(async {
            let sent = case.send(&Refs::new(), Good);
            let reply = fuzz.exchange("/api/v1/partitions/changed", &sent).await?;
            if !reply.status.is_success() {
                return Ok(());
            }
            prop_assert_eq!(reply.status, StatusCode::OK, "{}", reply.shown());
            verify_changed(&written, &sent, &reply)
        })
    });
}

/// Found by the push fuzzing: a payload nested past what JSON readers take (100,000 levels) was
/// accepted, and every pop of its partition answered with JSON that `serde_json` and Python's
/// `json` cannot read. Bodies may nest 127 levels, what `serde_json` reads, and no more.
#[test]
fn fuzzed_bodies_nested_past_the_limit_are_refused() {
    let fuzz = Fuzz::start(|_| {});
    fuzz.block_on(async {
        // Levels: the body, `items`, the item, then the payload's.
        let push = |levels: usize| {
            let payload = format!("{}1{}", "[".repeat(levels - 3), "]".repeat(levels - 3));
            format!(r#"{{"items":[{{"queue":"deep","transactionId":"t{levels}","payload":{payload}}}]}}"#)
        };
        let deepest = fuzz.app.post_raw("/api/v1/push", push(127)).await;
        assert_eq!(deepest.status, StatusCode::CREATED, "{deepest:?}");
        let popped = fuzz.app.pop("queue/deep", "batch=10").await;
        assert_eq!(popped.transaction_ids(), ["t127"], "the answer reads back: {popped:?}");
        for levels in [128, 100_000] {
            let refused = fuzz.app.post_raw("/api/v1/push", push(levels)).await;
            assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{refused:?}");
            assert!(refused.body["error"].as_str().is_some_and(|e| e.contains("127 levels")), "{refused:?}");
        }
        // Every body is held to the depth, a configure's too: the body, `options`, then the value's.
        let configure = |levels: usize| {
            let option = format!("{}1{}", "[".repeat(levels - 2), "]".repeat(levels - 2));
            format!(r#"{{"queue":"deep-options","options":{{"nested":{option}}}}}"#)
        };
        let refused = fuzz.app.post_raw("/api/v1/configure", configure(128)).await;
        assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{refused:?}");
        assert!(refused.body["error"].as_str().is_some_and(|e| e.contains("127 levels")), "{refused:?}");
        let unknown = fuzz.app.post_raw("/api/v1/configure", configure(127)).await;
        assert!(unknown.body["error"].as_str().is_some_and(|e| e.starts_with("options.nested is not")), "{unknown:?}");
        assert_eq!(fuzz.app.count("SELECT count(*) FROM queen.queues WHERE name = 'deep-options'").await, 0);
        assert_eq!(fuzz.app.count("SELECT count(*) FROM queen.log_message_ids").await, 1, "only the first push");
    });
}

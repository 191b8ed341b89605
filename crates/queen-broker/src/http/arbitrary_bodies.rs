//! Random JSON objects for the property tests that read a body two ways (`http::push`,
//! `http::ack`): each member a route reads, usually there and usually right, and now and then a
//! value of another type, a member the route does not read, one given twice, or a name written
//! with an escape.

use proptest::prelude::*;

/// A member a route reads: how often it is there, and the values it takes.
pub struct Member {
    pub name: &'static str,
    pub present: f64,
    pub right: Vec<String>,
}

impl Member {
    pub fn new(name: &'static str, present: f64, right: &[&str]) -> Self {
        Member { name, present, right: right.iter().map(|value| (*value).to_owned()).collect() }
    }
}

/// An object of `members`, a fifth of their values drawn from `wrong` instead, and in about one
/// object of seven one more member named from `odd` with a value from `wrong`.
pub fn object(members: Vec<Member>, wrong: &[&str], odd: &[&str]) -> impl Strategy<Value = String> + use<> {
    let wrong: Vec<String> = wrong.iter().map(|value| (*value).to_owned()).collect();
    let odd: Vec<String> = odd.iter().map(|name| (*name).to_owned()).collect();
    let known: Vec<_> = members
        .into_iter()
        .map(|Member { name, present, right }| {
            let value = prop_oneof![4 => prop::sample::select(right), 1 => prop::sample::select(wrong.clone())];
            prop::option::weighted(present, value).prop_map(move |value| value.map(|value| (name.to_owned(), value)))
        })
        .collect();
    let extra = prop::option::weighted(0.15, (prop::sample::select(odd), prop::sample::select(wrong)));
    (known, extra).prop_map(|(known, extra)| {
        let members: Vec<String> =
            known.into_iter().flatten().chain(extra).map(|(name, value)| format!(r#""{name}":{value}"#)).collect();
        format!("{{{}}}", members.join(","))
    })
}

//! Several rounds of each scenario per build (`suite --rounds`), one run standing for them.
//!
//! On this shared machine, one run of a scenario can differ from the next by a third: an A/A run
//! (one build compared with itself) gave sustain-10 1.33. A ratio of two single runs says little
//! there; the median of a few rounds, alternating which build goes first, says more, and the
//! report lists every round so the spread shows.

use serde::Serialize;

use crate::report::headline;
use crate::scenarios::{ScenarioName, ScenarioReport};

/// The headline figure of every round of one scenario, in the order the rounds ran.
#[derive(Debug, Clone, Serialize)]
pub struct Rounds {
    pub scenario: ScenarioName,
    /// Build A's rounds.
    pub a: Vec<Option<f64>>,
    /// Build B's rounds, with `--compare-bin`.
    pub b: Vec<Option<f64>>,
}

impl Rounds {
    pub fn new(scenario: ScenarioName, a: &[ScenarioReport], b: &[ScenarioReport]) -> Self {
        let headlines = |runs: &[ScenarioReport]| runs.iter().map(|run| headline(run).1).collect();
        Self { scenario, a: headlines(a), b: headlines(b) }
    }
}

/// Which of the runs stands for them: the first that did not pass, so that a failure is never
/// hidden behind a median; otherwise the median by headline (of an even count, the lower of the
/// two in the middle). `None` for no runs.
pub fn representative(runs: &[ScenarioReport]) -> Option<usize> {
    if let Some(failed) = runs.iter().position(|run| !run.passed()) {
        return Some(failed);
    }
    let mut order: Vec<usize> = (0..runs.len()).collect();
    // A run without a headline sorts below every figure.
    order
        .sort_by(|&x, &y| headline(&runs[x]).1.partial_cmp(&headline(&runs[y]).1).unwrap_or(std::cmp::Ordering::Equal));
    order.get(runs.len().saturating_sub(1) / 2).copied()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::tests::{scenario_report, verified};

    fn pushing(rates: &[f64]) -> Vec<ScenarioReport> {
        rates.iter().map(|&rate| verified(scenario_report(ScenarioName::PushB1, rate, 20))).collect()
    }

    #[test]
    fn the_median_round_stands_for_the_rounds() {
        assert_eq!(representative(&pushing(&[300.0, 100.0, 200.0])), Some(2));
        assert_eq!(representative(&pushing(&[300.0, 100.0, 200.0, 400.0])), Some(2), "the lower middle");
        assert_eq!(representative(&pushing(&[100.0])), Some(0));
        assert_eq!(representative(&[]), None);
    }

    #[test]
    fn a_round_that_failed_stands_for_the_rounds() {
        let mut runs = pushing(&[300.0, 100.0, 200.0]);
        runs[0].failure = Some("the broker exited".into());
        assert_eq!(representative(&runs), Some(0));
        let mut unverified = pushing(&[300.0, 100.0, 200.0]);
        unverified[2].verification.clear();
        assert_eq!(representative(&unverified), Some(2));
    }

    #[test]
    fn every_round_is_listed_in_the_order_it_ran() {
        let rounds = Rounds::new(ScenarioName::PushB1, &pushing(&[300.0, 100.0]), &pushing(&[250.0]));
        assert_eq!(rounds.a, [Some(300.0), Some(100.0)]);
        assert_eq!(rounds.b, [Some(250.0)]);
    }
}

//! The `queue` label of per-queue series, with a cap on how many queues get series of their own:
//! any push can create a queue, and every label value is a series Prometheus keeps.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use prometheus::IntCounterVec;

/// The label value of the queues counted together, past the cap. A queue of that very name is
/// counted there too.
pub const OTHER_QUEUES: &str = "_other";

/// Which queues have series of their own: the first `max` this broker counted, for as long as
/// they exist. The others are counted under [`OTHER_QUEUES`]; a deleted queue gives its place up
/// to the next new queue.
#[derive(Debug)]
pub struct QueueLabels {
    max: usize,
    named: RwLock<HashSet<String>>,
}

impl QueueLabels {
    pub fn new(max: usize) -> Self {
        Self { max, named: RwLock::new(HashSet::new()) }
    }

    /// The label value to count the queue under, giving it series of its own if there is room.
    pub fn label<'a>(&self, queue: &'a str) -> &'a str {
        if queue == OTHER_QUEUES {
            return OTHER_QUEUES;
        }
        if self.named.read().unwrap_or_else(|p| p.into_inner()).contains(queue) {
            return queue;
        }
        let mut named = self.named.write().unwrap_or_else(|p| p.into_inner());
        if named.contains(queue) || named.len() < self.max {
            named.insert(queue.to_owned());
            return queue;
        }
        OTHER_QUEUES
    }

    /// Gives up the queue's place; whether it had one (and so series of its own).
    pub fn release(&self, queue: &str) -> bool {
        self.named.write().unwrap_or_else(|p| p.into_inner()).remove(queue)
    }
}

/// A counter per queue, labelled through [`QueueLabels`], with the total over every queue (those
/// whose series were removed included).
pub struct QueueCounter {
    series: IntCounterVec,
    labels: Arc<QueueLabels>,
    total: AtomicU64,
}

impl QueueCounter {
    pub fn new(series: IntCounterVec, labels: Arc<QueueLabels>) -> Self {
        Self { series, labels, total: AtomicU64::new(0) }
    }

    pub fn inc_by(&self, queue: &str, n: u64) {
        self.series.with_label_values(&[self.labels.label(queue)]).inc_by(n);
        self.total.fetch_add(n, Ordering::Relaxed);
    }

    pub fn inc(&self, queue: &str) {
        self.inc_by(queue, 1);
    }

    /// Counted since the broker started, over every queue.
    pub fn total(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }

    /// Removes the queue's series (after its place was released).
    pub(super) fn remove(&self, queue: &str) {
        // Absent when nothing was counted for it.
        let _ = self.series.remove_label_values(&[queue]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queues_past_the_cap_share_one_label_until_a_place_is_released() {
        let labels = QueueLabels::new(2);
        assert_eq!(labels.label("a"), "a");
        assert_eq!(labels.label("b"), "b");
        assert_eq!(labels.label("c"), OTHER_QUEUES);
        assert_eq!(labels.label("a"), "a", "a queue keeps its place");
        assert!(labels.release("a"));
        assert!(!labels.release("c"), "c never had a place");
        assert_eq!(labels.label("c"), "c");
        assert_eq!(labels.label("a"), OTHER_QUEUES);
    }

    #[test]
    fn a_queue_named_like_the_aggregate_takes_no_place() {
        let labels = QueueLabels::new(1);
        assert_eq!(labels.label(OTHER_QUEUES), OTHER_QUEUES);
        assert_eq!(labels.label("a"), "a");
        assert!(!labels.release(OTHER_QUEUES));
    }
}

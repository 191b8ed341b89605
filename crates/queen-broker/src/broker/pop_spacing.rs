//! Spacing a consumer group's long-poll pops while its stream is dense (`pop.dense_interval_ms`).
//!
//! A pop-and-ack cycle costs PostgreSQL a fixed part, and a part for every partition it serves
//! (the claim and the ack each lock and update the group's cursor there), whatever the number of
//! messages. A group that pops again the moment it has acked keeps PostgreSQL busy with cycles
//! of a few messages each, and under fan-out those cycles take the CPU the producers need. So
//! while a group's stream is dense, this broker starts the group's long-poll pops on a queue at
//! most once per interval (or once per batch's worth of the stream, when that comes sooner),
//! staggered across its consumers, and each pop carries what arrived meanwhile. The stream is
//! dense when what the group was delivered over about the last second, spread over one slot,
//! fills at least a tenth of the pop's batch, and the group's last pop took everything it could,
//! short of its batch: a light stream is never held, and neither is a backlog (a pop that filled
//! its batch or left partitions it could have served).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use moka::sync::Cache;
use tokio::time::Instant;

/// Groups idle this long are forgotten.
const IDLE: Duration = Duration::from_secs(10);
const CAPACITY: u64 = 100_000;
const SECOND: Duration = Duration::from_secs(1);

/// A queue's name and a consumer group's.
pub type GroupKey = (Arc<str>, Arc<str>);

pub struct PopSpacing {
    /// Zero turns spacing off.
    interval: Duration,
    groups: Cache<GroupKey, Arc<Mutex<GroupPace>>>,
}

impl PopSpacing {
    pub fn new(interval: Duration) -> Self {
        Self { interval, groups: Cache::builder().max_capacity(CAPACITY).time_to_idle(IDLE).build() }
    }

    /// When a long-poll pop of the group may start: `None` at once, or the time of the slot it
    /// takes among the group's spaced pops.
    pub fn start_at(&self, group: &GroupKey) -> Option<Instant> {
        if self.interval.is_zero() {
            return None;
        }
        let pace = self.groups.get(group)?;
        pace.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take_slot(Instant::now())
    }

    /// A long-poll pop of the group with `batch` delivered `messages`; `full`: it took its whole
    /// batch, or left partitions it could have served.
    pub fn delivered(&self, group: &GroupKey, messages: u32, batch: u32, full: bool) {
        if self.interval.is_zero() {
            return;
        }
        let now = Instant::now();
        let pace = self.groups.get_with_by_ref(group, || Arc::new(Mutex::new(GroupPace::new(now))));
        let mut pace = pace.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        pace.delivered(now, messages, batch, full, self.interval);
    }
}

/// One group's recent deliveries on one queue, and its next slot while they are dense.
#[derive(Debug)]
struct GroupPace {
    dense: bool,
    /// Between two slots: the interval, or less when a batch arrives sooner.
    gap: Duration,
    next_slot: Instant,
    /// Messages delivered in the second that began at `second_began`, and in the one before.
    second_began: Instant,
    this_second: u32,
    last_second: u32,
}

impl GroupPace {
    fn new(now: Instant) -> Self {
        Self { dense: false, gap: Duration::ZERO, next_slot: now, second_began: now, this_second: 0, last_second: 0 }
    }

    fn take_slot(&mut self, now: Instant) -> Option<Instant> {
        if !self.dense {
            return None;
        }
        let slot = self.next_slot.max(now);
        self.next_slot = slot + self.gap;
        (slot > now).then_some(slot)
    }

    fn delivered(&mut self, now: Instant, messages: u32, batch: u32, full: bool, interval: Duration) {
        let mut into = now.saturating_duration_since(self.second_began);
        if into >= 2 * SECOND {
            (self.second_began, self.last_second, self.this_second) = (now, 0, 0);
            into = Duration::ZERO;
        } else if into >= SECOND {
            (self.second_began, self.last_second, self.this_second) = (self.second_began + SECOND, self.this_second, 0);
            into -= SECOND;
        }
        self.this_second = self.this_second.saturating_add(messages);
        // About the last second: this one so far, and the part of the one before it still inside.
        let per_second = f64::from(self.last_second) * (1.0 - into.as_secs_f64()) + f64::from(self.this_second);
        // A slot is never longer than a batch takes to arrive, so that spacing never leaves the
        // group fewer pops than the stream needs.
        self.gap = interval.min(Duration::from_secs_f64(f64::from(batch) / per_second.max(1.0)));
        self.dense = !full && per_second * self.gap.as_secs_f64() >= f64::from((batch / 10).max(2));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const INTERVAL: Duration = Duration::from_millis(100);

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// `pops` pops of `each` messages, one every `every` ms from `from` ms; the time of the last.
    fn stream(pace: &mut GroupPace, t0: Instant, from: u64, pops: u64, every: u64, each: u32, batch: u32) -> Instant {
        for i in 0..pops {
            pace.delivered(t0 + ms(from + i * every), each, batch, each >= batch, INTERVAL);
        }
        t0 + ms(from + (pops - 1) * every)
    }

    #[test]
    fn a_dense_stream_spaces_the_groups_pops_one_interval_apart() {
        let t0 = Instant::now();
        let mut pace = GroupPace::new(t0);
        // 2,000 messages a second, 200 an interval: past a tenth of a batch of 1,000.
        let last = stream(&mut pace, t0, 50, 20, 50, 100, 1_000);
        let now = last + ms(1);
        assert_eq!(pace.take_slot(now), None, "the first pop goes at once");
        assert_eq!(pace.take_slot(now), Some(now + INTERVAL), "the next one interval later");
        assert_eq!(pace.take_slot(now + ms(20)), Some(now + 2 * INTERVAL), "and the next");
        assert_eq!(pace.take_slot(now + ms(500)), None, "a pop after the slots goes at once");
    }

    #[test]
    fn a_slot_is_never_longer_than_a_batch_takes_to_arrive() {
        let t0 = Instant::now();
        let mut pace = GroupPace::new(t0);
        // 2,000 messages a second fill a batch of 100 in 50 ms: slots 50 ms apart, not 100.
        let last = stream(&mut pace, t0, 25, 40, 25, 50, 100);
        let now = last + ms(1);
        assert_eq!(pace.take_slot(now), None);
        let gap = pace.take_slot(now).expect("a slot") - now;
        assert!(gap > ms(49) && gap <= ms(50), "{gap:?}");
    }

    #[test]
    fn a_light_stream_is_never_held() {
        let t0 = Instant::now();
        let mut pace = GroupPace::new(t0);
        for i in 1..=100 {
            // 50 messages a second: 5 an interval, short of a tenth of 100.
            pace.delivered(t0 + ms(20 * i), 1, 100, false, INTERVAL);
            assert_eq!(pace.take_slot(t0 + ms(20 * i + 1)), None);
            assert_eq!(pace.take_slot(t0 + ms(20 * i + 1)), None);
        }
    }

    #[test]
    fn a_pop_that_left_work_lifts_the_spacing_until_one_takes_everything_short_of_its_batch() {
        let t0 = Instant::now();
        let mut pace = GroupPace::new(t0);
        let last = stream(&mut pace, t0, 50, 20, 50, 100, 1_000);
        assert!(pace.dense);
        pace.delivered(last + ms(10), 1_000, 1_000, true, INTERVAL);
        let now = last + ms(11);
        assert_eq!(pace.take_slot(now), None, "a backlog is popped as fast as the group can");
        assert_eq!(pace.take_slot(now), None);
        pace.delivered(last + ms(20), 400, 1_000, false, INTERVAL);
        assert!(pace.dense);
        // Short of its batch, but with partitions left it could have served: work is waiting.
        pace.delivered(last + ms(30), 400, 1_000, true, INTERVAL);
        assert_eq!(pace.take_slot(last + ms(31)), None);
    }

    #[test]
    fn what_was_delivered_seconds_ago_does_not_count() {
        let t0 = Instant::now();
        let mut pace = GroupPace::new(t0);
        let last = stream(&mut pace, t0, 50, 20, 50, 100, 1_000);
        assert!(pace.dense);
        pace.delivered(last + ms(2_000), 5, 1_000, false, INTERVAL);
        assert!(!pace.dense);
        assert_eq!(pace.take_slot(last + ms(2_001)), None);
    }
}

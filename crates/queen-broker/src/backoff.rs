//! The wait between attempts at something that fails while PostgreSQL is away (reconnecting the
//! LISTEN connection, re-reading the maintenance switches, replaying the push journal): from
//! 100 ms, doubling, up to 5 s.

use std::time::Duration;

const FIRST: Duration = Duration::from_millis(100);
const LAST: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, Copy)]
pub struct Backoff {
    next: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self { next: FIRST }
    }
}

impl Backoff {
    /// Sleeps for the current wait, and doubles the next one (up to its bound).
    pub async fn wait(&mut self) {
        tokio::time::sleep(self.advance()).await;
    }

    /// The current wait; the next one doubles (up to its bound).
    fn advance(&mut self) -> Duration {
        let wait = self.next;
        self.next = (self.next * 2).min(LAST);
        wait
    }

    /// Starts again from the shortest wait (the thing worked).
    pub fn reset(&mut self) {
        self.next = FIRST;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_double_up_to_five_seconds_and_start_over_when_reset() {
        let mut backoff = Backoff::default();
        let waits: Vec<u128> = (0..8).map(|_| backoff.advance().as_millis()).collect();
        assert_eq!(waits, [100, 200, 400, 800, 1600, 3200, 5000, 5000]);
        backoff.reset();
        assert_eq!(backoff.advance(), Duration::from_millis(100));
    }
}

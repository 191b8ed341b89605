//! The queue behind a fusing actor: requests that arrive while one write is in flight wait, and
//! go out together as the next write. Each request gets back exactly its own results.
//!
//! Each request carries its place in the actor's bound (taken by the sender before it sent), and
//! gives it back when it is answered: the bound counts what the actor holds, whether the requester
//! is still waiting or went away.

use std::collections::VecDeque;

use tokio::sync::oneshot;

use crate::pressure::Held;

/// One request: its items, where its results go, and its place in the actor's bound.
pub struct Pending<I, O, E> {
    pub items: Vec<I>,
    pub reply: Reply<O, E>,
    pub place: Held,
}

/// Requests taken together for one write: their items, and how to answer each.
pub struct Batch<I, O, E> {
    pub items: Vec<I>,
    pub replies: Replies<O, E>,
}

/// Where one request's results go.
type Reply<O, E> = oneshot::Sender<Result<Vec<O>, E>>;

/// Where the results of a batch go: each request's item count, reply channel and place, given
/// back once answered.
pub struct Replies<O, E>(Vec<(usize, Reply<O, E>, Held)>);

impl<O, E> Replies<O, E> {
    /// How many requests the batch answers.
    pub fn len(&self) -> usize {
        self.0.len()
    }
}

impl<O, E: Clone> Replies<O, E> {
    /// Answers every request of the batch from the results of the whole, which must be aligned
    /// with `items`.
    pub fn answer(self, result: Result<Vec<O>, E>) {
        match result {
            Ok(mut outputs) => {
                // Split from the back so each request takes its own tail off the vector.
                let mut end = outputs.len();
                for (len, reply, _place) in self.0.into_iter().rev() {
                    let start = end.saturating_sub(len);
                    let own = outputs.split_off(start);
                    end = start;
                    // A requester that went away (client disconnected) needs no answer.
                    let _ = reply.send(Ok(own));
                }
            }
            Err(error) => {
                for (_, reply, _place) in self.0 {
                    let _ = reply.send(Err(error.clone()));
                }
            }
        }
    }

    /// Answers each request from its own items' results, aligned with `items`: a request whose
    /// items all succeeded gets their outputs, any other the first of its items' errors.
    pub fn answer_each(self, results: Vec<Result<O, E>>) {
        let mut results = results.into_iter();
        for (len, reply, _place) in self.0 {
            let own: Vec<Result<O, E>> = results.by_ref().take(len).collect();
            // A requester that went away (client disconnected) needs no answer.
            let _ = reply.send(own.into_iter().collect());
        }
    }
}

/// Pending requests and whether a write is in flight.
pub struct FusionQueue<I, O, E> {
    pending: VecDeque<Pending<I, O, E>>,
    in_flight: bool,
}

impl<I, O, E> Default for FusionQueue<I, O, E> {
    fn default() -> Self {
        Self { pending: VecDeque::new(), in_flight: false }
    }
}

impl<I, O, E> FusionQueue<I, O, E> {
    pub fn push(&mut self, pending: Pending<I, O, E>) {
        self.pending.push_back(pending);
    }

    pub fn is_idle(&self) -> bool {
        !self.in_flight && self.pending.is_empty()
    }

    /// Takes the next batch when no write is in flight: whole requests, oldest first, while
    /// `fits(items so far, next request)` holds; the first request is always taken. Marks the
    /// queue in flight until [`FusionQueue::done`].
    pub fn next_batch(&mut self, fits: impl Fn(&[I], &[I]) -> bool) -> Option<Batch<I, O, E>> {
        if self.in_flight || self.pending.is_empty() {
            return None;
        }
        let mut items = Vec::new();
        let mut replies = Vec::new();
        while let Some(next) = self.pending.front() {
            if !replies.is_empty() && !fits(&items, &next.items) {
                break;
            }
            let Some(Pending { items: mut own, reply, place }) = self.pending.pop_front() else { break };
            replies.push((own.len(), reply, place));
            items.append(&mut own);
        }
        self.in_flight = true;
        Some(Batch { items, replies: Replies(replies) })
    }

    pub fn done(&mut self) {
        self.in_flight = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::sync::Arc;

    use crate::metrics::Metrics;
    use crate::pressure::{Bound, Limited};

    type Answer = oneshot::Receiver<Result<Vec<u32>, String>>;

    fn bound() -> Arc<Bound> {
        Bound::new(Limited::PartitionWriter, 10, &Metrics::new(10))
    }

    fn request(bound: &Arc<Bound>, items: Vec<u32>) -> (Pending<u32, u32, String>, Answer) {
        let (reply, rx) = oneshot::channel();
        (Pending { items, reply, place: bound.hold(1).expect("room") }, rx)
    }

    #[test]
    fn queued_requests_go_out_together_and_get_their_own_results() {
        let mut queue = FusionQueue::default();
        let bound = bound();
        let (a, mut rx_a) = request(&bound, vec![1, 2]);
        let (b, mut rx_b) = request(&bound, vec![3]);
        let (c, mut rx_c) = request(&bound, vec![4, 5, 6]);
        queue.push(a);
        queue.push(b);
        queue.push(c);
        let batch = queue.next_batch(|so_far, next| so_far.len() + next.len() <= 3).unwrap();
        assert_eq!(batch.items, vec![1, 2, 3]);
        assert!(queue.next_batch(|_, _| true).is_none(), "one write at a time");
        batch.replies.answer(Ok(vec![10, 20, 30]));
        assert_eq!(rx_a.try_recv().unwrap(), Ok(vec![10, 20]));
        assert_eq!(rx_b.try_recv().unwrap(), Ok(vec![30]));
        assert_eq!(bound.held(), 1, "answered requests gave their places back");
        queue.done();
        let batch = queue.next_batch(|_, _| true).unwrap();
        assert_eq!(batch.items, vec![4, 5, 6]);
        batch.replies.answer(Err("down".into()));
        assert_eq!(rx_c.try_recv().unwrap(), Err("down".into()));
        assert_eq!(bound.held(), 0);
    }

    #[test]
    fn each_request_gets_its_own_items_results_and_only_a_failed_items_request_the_error() {
        let mut queue = FusionQueue::default();
        let bound = bound();
        let (a, mut rx_a) = request(&bound, vec![1, 2]);
        let (b, mut rx_b) = request(&bound, vec![3, 4]);
        let (c, mut rx_c) = request(&bound, vec![5]);
        queue.push(a);
        queue.push(b);
        queue.push(c);
        let batch = queue.next_batch(|_, _| true).unwrap();
        batch.replies.answer_each(vec![Ok(10), Err("first".into()), Err("second".into()), Ok(40), Ok(50)]);
        assert_eq!(rx_a.try_recv().unwrap(), Err("first".into()));
        assert_eq!(rx_b.try_recv().unwrap(), Err("second".into()), "its own error, not the batch's first");
        assert_eq!(rx_c.try_recv().unwrap(), Ok(vec![50]), "after a request whose error came before its last item");
        assert_eq!(bound.held(), 0);
    }

    #[test]
    fn an_oversized_request_still_goes_alone() {
        let mut queue = FusionQueue::default();
        let (a, _rx) = request(&bound(), vec![1, 2, 3, 4]);
        queue.push(a);
        let batch = queue.next_batch(|so_far, next| so_far.len() + next.len() <= 2).unwrap();
        assert_eq!(batch.items.len(), 4);
    }
}

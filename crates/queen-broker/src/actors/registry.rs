//! Actors made on demand, one per key, and forgotten when they stop.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex};

use actix::prelude::*;

/// The live actor for each key. Lookups hold the lock only to clone an address.
pub struct Registry<K, A: Actor> {
    actors: Arc<Mutex<HashMap<K, Addr<A>>>>,
}

impl<K, A: Actor> Clone for Registry<K, A> {
    fn clone(&self) -> Self {
        Self { actors: Arc::clone(&self.actors) }
    }
}

impl<K, A: Actor> Default for Registry<K, A> {
    fn default() -> Self {
        Self { actors: Arc::new(Mutex::new(HashMap::new())) }
    }
}

impl<K: Eq + Hash + Clone, A: Actor> Registry<K, A> {
    /// The actor for `key`, started with `start` if there is none or the one recorded stopped.
    pub fn get_or_start(&self, key: &K, start: impl FnOnce() -> Addr<A>) -> Addr<A> {
        let mut actors = self.actors.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(addr) = actors.get(key).filter(|addr| addr.connected()) {
            return addr.clone();
        }
        let addr = start();
        actors.insert(key.clone(), addr.clone());
        addr
    }

    /// Sends `message` to the actor for `key` without waiting for room: an actor that stopped
    /// (for idleness) between lookup and send is replaced once; a full mailbox is the caller's
    /// to report.
    pub fn try_send<M>(&self, key: &K, start: impl Fn() -> Addr<A>, message: M) -> Result<(), SendError<M>>
    where
        A: Handler<M>,
        A::Context: actix::dev::ToEnvelope<A, M>,
        M: Message + Send + 'static,
        M::Result: Send,
    {
        let mut message = message;
        for attempt in 0..2 {
            let addr = self.get_or_start(key, &start);
            match addr.try_send(message) {
                Err(SendError::Closed(returned)) if attempt == 0 => {
                    self.remove(key, &addr);
                    message = returned;
                }
                result => return result,
            }
        }
        unreachable!("the loop returns on its second pass")
    }

    /// Forgets `addr` for `key`, unless another actor has replaced it since.
    pub fn remove(&self, key: &K, addr: &Addr<A>) {
        let mut actors = self.actors.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if actors.get(key) == Some(addr) {
            actors.remove(key);
        }
    }
}

//! Actors made on demand, one per key, and forgotten when they stop; each with a bound on the
//! requests it holds.
//!
//! The bound is counted here, by the senders, not by the actor's mailbox: actix gives every
//! sender a slot of its own on top of a mailbox's capacity, and a fusing actor empties its mailbox
//! into its own queue at once, so a mailbox capacity never refuses anything.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex};

use actix::prelude::*;

use crate::pressure::{Bound, Held, Refused};

/// The live actor for each key, with its bound. Lookups hold the lock only to clone an address.
pub struct Registry<K, A: Actor> {
    actors: Arc<Mutex<HashMap<K, Entry<A>>>>,
    /// What every actor's bound is like.
    bound: Arc<Bound>,
}

struct Entry<A: Actor> {
    addr: Addr<A>,
    load: Arc<Bound>,
}

impl<K, A: Actor> Clone for Registry<K, A> {
    fn clone(&self) -> Self {
        Self { actors: Arc::clone(&self.actors), bound: Arc::clone(&self.bound) }
    }
}

impl<K: Eq + Hash + Clone, A: Actor> Registry<K, A> {
    /// A registry whose actors each hold at most as much as `bound` allows.
    pub fn new(bound: Arc<Bound>) -> Self {
        Self { actors: Arc::new(Mutex::new(HashMap::new())), bound }
    }

    /// The entry for `key`, its actor started with `start` if there is none or the one recorded
    /// stopped (a restarted actor keeps the entry's bound).
    fn with_entry<R>(&self, key: &K, start: impl Fn() -> Addr<A>, then: impl FnOnce(&mut Entry<A>) -> R) -> R {
        let mut actors = self.actors.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let entry = actors.entry(key.clone()).or_insert_with(|| Entry { addr: start(), load: self.bound.sibling() });
        if !entry.addr.connected() {
            entry.addr = start();
        }
        then(entry)
    }

    /// Takes a place for one request with the actor for `key`; refused when the actor holds its
    /// limit. The place goes with the request, and is given back when the actor answers it.
    pub fn hold(&self, key: &K, start: impl Fn() -> Addr<A>) -> Result<Held, Refused> {
        self.with_entry(key, start, |entry| entry.load.hold(1))
    }

    /// Sends `message` (whose place is held) to the actor for `key`: an actor that stopped (for
    /// idleness) between lookup and send is replaced once. The message comes back if no actor
    /// could take it.
    pub fn send<M>(&self, key: &K, start: impl Fn() -> Addr<A>, message: M) -> Result<(), M>
    where
        A: Handler<M>,
        A::Context: actix::dev::ToEnvelope<A, M>,
        M: Message + Send + 'static,
        M::Result: Send,
    {
        let mut message = message;
        let mut addr = self.with_entry(key, &start, |entry| entry.addr.clone());
        for attempt in 0..2 {
            // A fresh address always has a slot: this fails only for a stopped actor.
            match addr.try_send(message) {
                Ok(()) => return Ok(()),
                Err(failed) => message = failed.into_inner(),
            }
            if attempt == 0 {
                addr = self.with_entry(key, &start, |entry| {
                    if entry.addr == addr {
                        entry.addr = start();
                    }
                    entry.addr.clone()
                });
            }
        }
        Err(message)
    }

    /// Whether no actor holds any request.
    pub fn is_idle(&self) -> bool {
        let actors = self.actors.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        actors.values().all(|entry| entry.load.held() == 0)
    }

    /// Forgets `addr` for `key` when no request holds a place with it, and says whether the actor
    /// may stop: a sender takes its place under this lock before it sends, so while this holds
    /// no message is on its way to the actor, and a later sender starts a new one.
    pub fn release_if_unused(&self, key: &K, addr: &Addr<A>) -> bool {
        let mut actors = self.actors.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        match actors.get(key) {
            Some(entry) if entry.addr == *addr => {
                let unused = entry.load.held() == 0;
                if unused {
                    actors.remove(key);
                }
                unused
            }
            // Replaced (it was found stopped) or forgotten: no sender can reach it.
            _ => true,
        }
    }

    /// Forgets `addr` for `key`, unless another actor has replaced it since.
    pub fn remove(&self, key: &K, addr: &Addr<A>) {
        let mut actors = self.actors.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if actors.get(key).is_some_and(|entry| entry.addr == *addr) {
            actors.remove(key);
        }
    }
}

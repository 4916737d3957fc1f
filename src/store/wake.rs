//! Wake-ups for waiters: a writer waiting for an in-flight write on its key,
//! an acquirer waiting for a lock.
//!
//! Why a broadcast of names and not a map of per-key `Notify`s: waiters are
//! few and short-lived, a map would need its own clean-up, and a missed or
//! lagged message only costs a waiter one extra read. Waiters always re-read
//! the database after a wake-up, so this is a latency hint, never a source of
//! truth; replicas in other processes reach a waiter through the bounded
//! re-check interval (or, on PostgreSQL, LISTEN/NOTIFY feeding `notify`).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::broadcast;

/// Which table a wake-up is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Topic {
    Version,
    Lock,
}

#[derive(Debug, Clone)]
pub struct Wakeups {
    tx: broadcast::Sender<(Topic, Arc<str>)>,
}

impl Default for Wakeups {
    fn default() -> Self {
        Self::new()
    }
}

impl Wakeups {
    pub fn new() -> Self {
        let (tx, _) = broadcast::channel(1024);
        Self { tx }
    }

    /// Something about `name` changed in `topic`.
    pub fn notify(&self, topic: Topic, name: &str) {
        // Nobody waits (the usual case): no message to allocate. A waiter
        // subscribes before it reads the state it waits on, so one whose
        // read saw the old state is counted here already.
        if self.tx.receiver_count() == 0 {
            return;
        }
        let _ = self.tx.send((topic, Arc::from(name)));
    }

    /// Subscribe before reading the state you will wait on, so a change in
    /// between is not missed.
    pub fn subscribe(&self, topic: Topic, name: &str) -> Waiter {
        Waiter {
            rx: self.tx.subscribe(),
            topic,
            name: name.to_string(),
        }
    }
}

pub struct Waiter {
    rx: broadcast::Receiver<(Topic, Arc<str>)>,
    topic: Topic,
    name: String,
}

impl Waiter {
    /// Returns when `name` may have changed, or after `at_most`.
    pub async fn changed(&mut self, at_most: Duration) {
        let wait = async {
            loop {
                match self.rx.recv().await {
                    Ok((topic, name)) if topic == self.topic && *name == *self.name => return,
                    Ok(_) => continue,
                    // Lagged: something may have been missed; re-check.
                    Err(broadcast::error::RecvError::Lagged(_)) => return,
                    Err(broadcast::error::RecvError::Closed) => {
                        std::future::pending::<()>().await;
                    }
                }
            }
        };
        let _ = tokio::time::timeout(at_most, wait).await;
    }
}

//! A worker runs a repeated invocation id once. A controller that lost its connection to a
//! worker, or a controller that took over another's async invocation, sends the same id again:
//! while the first run is going the repeat waits for its answer, and after it ends the repeat
//! gets the same answer, for `ttl` and within a bound in bytes. Ids are only honoured from the
//! cluster's own peers (the HTTP edge checks), and keyed by function as well (`function/id`).
//! Over the bound in bytes, the oldest answers of the namespace holding the most go first, so
//! that one tenant's large answers cannot push out another's (issue 31 item 5).

use bytes::Bytes;
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// An answer as it went out: status and body.
pub type Kept = Arc<(u16, Bytes)>;

enum Entry {
    Running(watch::Receiver<Option<Kept>>),
    Done(Kept),
}

#[derive(Default)]
struct Inner {
    entries: HashMap<String, Entry>,
    /// Finished ids per namespace, oldest first, and the bytes they hold.
    done: HashMap<String, (VecDeque<(Instant, String)>, usize)>,
    bytes: usize,
}

/// The namespace of a `function/id` key.
fn namespace_of_key(key: &str) -> &str {
    let function = key.split_once('/').map_or(key, |(f, _)| f);
    hearth_api::namespace::namespace_of(function)
}

/// The de-duplication table.
pub struct Dedup {
    inner: Mutex<Inner>,
    ttl: Duration,
    max_bytes: usize,
}

impl Dedup {
    pub fn new(ttl: Duration, max_bytes: usize) -> Self {
        Dedup {
            inner: Mutex::new(Inner::default()),
            ttl,
            max_bytes,
        }
    }

    /// The answer of `key`'s one run: `run` is started (on a task of its own, so that a caller
    /// that goes away does not cancel it) only when no run of `key` is going or remembered.
    pub async fn run_once<F>(&self, key: String, run: F) -> Kept
    where
        F: Future<Output = (u16, Bytes)> + Send + 'static,
    {
        let mut rx = {
            let mut inner = self.inner.lock();
            self.expire(&mut inner, Instant::now());
            match inner.entries.get(&key) {
                Some(Entry::Done(kept)) => return Arc::clone(kept),
                Some(Entry::Running(rx)) => rx.clone(),
                None => {
                    let (tx, rx) = watch::channel(None);
                    inner
                        .entries
                        .insert(key.clone(), Entry::Running(rx.clone()));
                    tokio::spawn(async move {
                        let answer = run.await;
                        let _ = tx.send(Some(Arc::new(answer)));
                    });
                    rx
                }
            }
        };
        let kept = loop {
            if let Some(kept) = rx.borrow_and_update().clone() {
                break Some(kept);
            }
            if rx.changed().await.is_err() {
                break rx.borrow().clone();
            }
        };
        let mut inner = self.inner.lock();
        match kept {
            Some(kept) => {
                if matches!(inner.entries.get(&key), Some(Entry::Running(_))) {
                    let bytes = kept.1.len() + key.len();
                    inner.bytes += bytes;
                    inner
                        .entries
                        .insert(key.clone(), Entry::Done(Arc::clone(&kept)));
                    let ns = namespace_of_key(&key).to_string();
                    let queue = inner.done.entry(ns).or_default();
                    queue.0.push_back((Instant::now(), key));
                    queue.1 += bytes;
                    while inner.bytes > self.max_bytes {
                        // The largest holder gives way.
                        let largest = inner
                            .done
                            .iter()
                            .max_by_key(|(_, (_, b))| *b)
                            .map(|(ns, _)| ns.clone());
                        let Some(old) = largest
                            .and_then(|ns| inner.done.get_mut(&ns))
                            .and_then(|(q, _)| q.pop_front())
                            .map(|(_, k)| k)
                        else {
                            break;
                        };
                        Self::forget(&mut inner, &old);
                    }
                }
                kept
            }
            None => {
                // The run's task died without an answer (a panic): forget it, answer 500.
                inner.entries.remove(&key);
                Arc::new((
                    500,
                    Bytes::from_static(
                        br#"{"error":{"code":"internal","message":"the invocation ended without an answer"}}"#,
                    ),
                ))
            }
        }
    }

    /// Forgets a finished key already taken off its namespace's queue.
    fn forget(inner: &mut Inner, key: &str) {
        if let Some(Entry::Done(kept)) = inner.entries.get(key) {
            let bytes = kept.1.len() + key.len();
            inner.bytes = inner.bytes.saturating_sub(bytes);
            inner.entries.remove(key);
            let ns = namespace_of_key(key);
            if let Some((queue, held)) = inner.done.get_mut(ns) {
                *held = held.saturating_sub(bytes);
                if queue.is_empty() {
                    inner.done.remove(ns);
                }
            }
        }
    }

    fn expire(&self, inner: &mut Inner, now: Instant) {
        let mut gone = Vec::new();
        for (queue, _) in inner.done.values_mut() {
            while let Some((t, _)) = queue.front() {
                if now.saturating_duration_since(*t) < self.ttl {
                    break;
                }
                if let Some((_, key)) = queue.pop_front() {
                    gone.push(key);
                }
            }
        }
        for key in gone {
            Self::forget(inner, &key);
        }
    }

    /// Ids remembered (running or done).
    pub fn len(&self) -> usize {
        self.inner.lock().entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test]
    async fn a_repeated_id_runs_once_and_gets_the_same_answer() {
        let d = Arc::new(Dedup::new(Duration::from_secs(60), 1 << 20));
        let runs = Arc::new(AtomicUsize::new(0));
        let (go_tx, go_rx) = watch::channel(false);
        let run = |n: Arc<AtomicUsize>, mut go: watch::Receiver<bool>| async move {
            n.fetch_add(1, Ordering::SeqCst);
            let _ = go.wait_for(|v| *v).await;
            (200, Bytes::from_static(b"{\"result\":1}"))
        };
        let a = tokio::spawn({
            let (d, n, g) = (Arc::clone(&d), Arc::clone(&runs), go_rx.clone());
            async move { d.run_once("f/1".into(), run(n, g)).await }
        });
        let b = tokio::spawn({
            let (d, n, g) = (Arc::clone(&d), Arc::clone(&runs), go_rx.clone());
            async move { d.run_once("f/1".into(), run(n, g)).await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        go_tx.send(true).unwrap();
        let (a, b) = (a.await.unwrap(), b.await.unwrap());
        assert_eq!(a, b);
        assert_eq!(runs.load(Ordering::SeqCst), 1, "ran once while running");
        let c = d
            .run_once("f/1".into(), run(Arc::clone(&runs), go_rx.clone()))
            .await;
        assert_eq!(c.1, Bytes::from_static(b"{\"result\":1}"));
        assert_eq!(runs.load(Ordering::SeqCst), 1, "ran once after it ended");
        d.run_once("f/2".into(), run(Arc::clone(&runs), go_rx))
            .await;
        assert_eq!(runs.load(Ordering::SeqCst), 2, "another id runs");
    }

    #[tokio::test]
    async fn one_namespaces_large_answers_do_not_push_out_anothers() {
        let d = Dedup::new(Duration::from_secs(60), 1000);
        d.run_once("team-b.f/1".into(), async {
            (200, Bytes::from(vec![b'b'; 100]))
        })
        .await;
        for i in 0..10 {
            d.run_once(format!("team-a.f/{i}"), async {
                (200, Bytes::from(vec![b'a'; 300]))
            })
            .await;
        }
        let inner = d.inner.lock();
        assert!(inner.bytes <= 1000, "{}", inner.bytes);
        assert!(
            matches!(inner.entries.get("team-b.f/1"), Some(Entry::Done(_))),
            "B's answer was pushed out by A's"
        );
        assert!(matches!(
            inner.entries.get("team-a.f/9"),
            Some(Entry::Done(_))
        ));
        assert!(!inner.entries.contains_key("team-a.f/0"));
        let held: usize = inner.done.values().map(|(_, b)| *b).sum();
        assert_eq!(held, inner.bytes);
    }

    #[tokio::test]
    async fn remembered_answers_are_bounded_in_time_and_bytes() {
        let d = Dedup::new(Duration::from_millis(50), 100);
        for i in 0..5 {
            d.run_once(format!("k{i}"), async {
                (200, Bytes::from(vec![b'x'; 40]))
            })
            .await;
        }
        assert!(d.len() <= 2, "{}", d.len());
        tokio::time::sleep(Duration::from_millis(60)).await;
        d.run_once("other".into(), async { (200, Bytes::new()) })
            .await;
        assert_eq!(d.len(), 1);
    }
}

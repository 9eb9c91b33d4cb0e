//! The embedded async store: one SQLite database (`async.db`, 0600) in the data directory.
//!
//! A record is committed (WAL, `synchronous = NORMAL`) before the caller answers 202: it
//! survives the process being killed at any instant; a power loss may lose the last commits
//! (docs/operations.md). Only one process uses a data directory, so what it did not claim in
//! this life is an orphan: at start every unfinished record is one.
//!
//! Bounds: at most `max_records` records (a new one over it is refused with
//! [`StoreError::Full`]), and at most `max_bytes` of finished answers: finishing one first drops
//! the oldest finished records until it fits.

use super::{AsyncStore, Created, DeadLetterFilter, StoreError, StoredInvocation};
use async_trait::async_trait;
use hearth_api::AsyncState;
use parking_lot::Mutex;
use rusqlite::{params, Connection, OptionalExtension};
use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;

/// Async invocation records in SQLite.
pub struct SqliteAsyncStore {
    inner: Arc<Inner>,
}

struct Inner {
    /// The database and how many records it holds (kept here: counting rows per accept would
    /// cost time in proportion to the records kept).
    db: Mutex<(Connection, usize)>,
    /// Ids this process created or took over: everything else unfinished is an orphan.
    claimed: Mutex<HashSet<String>>,
    max_records: usize,
    max_bytes: usize,
}

const DB_FILES: [&str; 3] = ["async.db", "async.db-wal", "async.db-shm"];

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        StoreError::Unavailable(format!("sqlite: {e}"))
    }
}

fn corrupt(e: serde_json::Error) -> StoreError {
    StoreError::Corrupt {
        what: "async invocation record",
        why: e.to_string(),
    }
}

impl SqliteAsyncStore {
    /// Opens (or creates) `async.db` under `data_dir`.
    pub fn open(data_dir: &Path, max_records: usize, max_bytes: usize) -> Result<Self, StoreError> {
        let io = |e: std::io::Error| StoreError::Unavailable(format!("async.db: {e}"));
        let path = data_dir.join(DB_FILES[0]);
        {
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .mode(0o600)
                .open(&path)
                .map_err(io)?;
        }
        let db = Connection::open(&path)?;
        db.execute_batch(
            "PRAGMA journal_mode=WAL;
             PRAGMA synchronous=NORMAL;
             CREATE TABLE IF NOT EXISTS invocations (
                 id TEXT PRIMARY KEY,
                 function TEXT NOT NULL,
                 idem TEXT,
                 state TEXT NOT NULL,
                 finished_ms INTEGER,
                 bytes INTEGER NOT NULL DEFAULT 0,
                 record TEXT NOT NULL
             );
             CREATE UNIQUE INDEX IF NOT EXISTS invocations_idem
                 ON invocations(function, idem) WHERE idem IS NOT NULL;
             CREATE INDEX IF NOT EXISTS invocations_finished
                 ON invocations(finished_ms) WHERE finished_ms IS NOT NULL;",
        )?;
        for f in DB_FILES {
            match crate::intake::set_mode(&data_dir.join(f), 0o600) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io(e)),
                _ => {}
            }
        }
        let count: i64 = db.query_row("SELECT COUNT(*) FROM invocations", [], |r| r.get(0))?;
        Ok(SqliteAsyncStore {
            inner: Arc::new(Inner {
                db: Mutex::new((db, count.max(0) as usize)),
                claimed: Mutex::new(HashSet::new()),
                max_records: max_records.max(1),
                max_bytes: max_bytes.max(1),
            }),
        })
    }

    /// Runs `f` on a blocking thread (SQLite does file I/O).
    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Inner) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let inner = Arc::clone(&self.inner);
        tokio::task::spawn_blocking(move || f(&inner))
            .await
            .map_err(|e| StoreError::Unavailable(format!("the store task failed: {e}")))?
    }
}

fn state_str(s: AsyncState) -> &'static str {
    match s {
        AsyncState::Running => "running",
        AsyncState::Succeeded => "succeeded",
        AsyncState::Failed => "failed",
    }
}

fn read(record: &str) -> Result<StoredInvocation, StoreError> {
    serde_json::from_str(record).map_err(corrupt)
}

impl Inner {
    fn get(&self, db: &Connection, id: &str) -> Result<Option<StoredInvocation>, StoreError> {
        let rec: Option<String> = db
            .query_row(
                "SELECT record FROM invocations WHERE id = ?1",
                params![id],
                |r| r.get(0),
            )
            .optional()?;
        rec.as_deref().map(read).transpose()
    }

    /// Drops the oldest finished records until the answers held fit under the bound; how many
    /// went.
    fn make_room(&self, db: &Connection) -> Result<usize, StoreError> {
        let total: i64 = db.query_row(
            "SELECT COALESCE(SUM(bytes), 0) FROM invocations WHERE finished_ms IS NOT NULL",
            [],
            |r| r.get(0),
        )?;
        let mut over = total - self.max_bytes as i64;
        if over <= 0 {
            return Ok(0);
        }
        let mut stmt = db.prepare(
            "SELECT id, bytes FROM invocations WHERE finished_ms IS NOT NULL
             ORDER BY finished_ms, id",
        )?;
        let mut victims = Vec::new();
        let mut rows = stmt.query([])?;
        while let Some(row) = rows.next()? {
            if over <= 0 {
                break;
            }
            let (id, bytes): (String, i64) = (row.get(0)?, row.get(1)?);
            over -= bytes;
            victims.push(id);
        }
        drop(rows);
        let dropped = victims.len();
        for id in victims {
            db.execute("DELETE FROM invocations WHERE id = ?1", params![id])?;
            tracing::debug!(id = %id, "async result dropped early to stay under async_max_bytes");
        }
        Ok(dropped)
    }
}

#[async_trait]
impl AsyncStore for SqliteAsyncStore {
    async fn create(&self, inv: &StoredInvocation) -> Result<Created, StoreError> {
        let inv = inv.clone();
        self.blocking(move |s| {
            let json = serde_json::to_string(&inv).map_err(corrupt)?;
            let mut guard = s.db.lock();
            let (db, count) = &mut *guard;
            let tx = db.transaction()?;
            if let Some(key) = &inv.idempotency_key {
                let first: Option<String> = tx
                    .query_row(
                        "SELECT record FROM invocations WHERE function = ?1 AND idem = ?2",
                        params![inv.function, key],
                        |r| r.get(0),
                    )
                    .optional()?;
                if let Some(first) = first {
                    return Ok(Created::Existing(Box::new(read(&first)?)));
                }
            }
            if *count >= s.max_records {
                return Err(StoreError::Full(s.max_records));
            }
            tx.execute(
                "INSERT INTO invocations (id, function, idem, state, record) VALUES (?1, ?2, ?3, ?4, ?5)",
                params![inv.id, inv.function, inv.idempotency_key, state_str(inv.state), json],
            )?;
            tx.commit()?;
            *count += 1;
            s.claimed.lock().insert(inv.id.clone());
            Ok(Created::New)
        })
        .await
    }

    async fn get(&self, id: &str) -> Result<Option<StoredInvocation>, StoreError> {
        let id = id.to_string();
        self.blocking(move |s| {
            let db = s.db.lock();
            s.get(&db.0, &id)
        })
        .await
    }

    async fn update(&self, inv: &StoredInvocation) -> Result<(), StoreError> {
        let inv = inv.clone();
        self.blocking(move |s| {
            let json = serde_json::to_string(&inv).map_err(corrupt)?;
            s.db.lock().0.execute(
                "UPDATE invocations SET record = ?2 WHERE id = ?1 AND state = 'running'",
                params![inv.id, json],
            )?;
            Ok(())
        })
        .await
    }

    async fn finish(&self, inv: &StoredInvocation) -> Result<bool, StoreError> {
        let inv = inv.clone();
        self.blocking(move |s| {
            let json = serde_json::to_string(&inv).map_err(corrupt)?;
            let bytes = json.len();
            let mut guard = s.db.lock();
            let (db, count) = &mut *guard;
            let written = db.execute(
                "UPDATE invocations SET record = ?2, state = ?3, finished_ms = ?4, bytes = ?5
                 WHERE id = ?1 AND state = 'running'",
                params![
                    inv.id,
                    json,
                    state_str(inv.state),
                    inv.finished_unix_ms.unwrap_or_else(super::unix_ms) as i64,
                    bytes as i64
                ],
            )?;
            s.claimed.lock().remove(&inv.id);
            if written == 1 {
                *count -= s.make_room(db)?.min(*count);
            }
            Ok(written == 1)
        })
        .await
    }

    async fn take_orphans(&self, limit: usize) -> Result<Vec<StoredInvocation>, StoreError> {
        self.blocking(move |s| {
            let db = s.db.lock();
            let mut stmt = db.0.prepare(
                "SELECT id, record FROM invocations WHERE state = 'running' ORDER BY rowid",
            )?;
            let mut rows = stmt.query([])?;
            let mut claimed = s.claimed.lock();
            let mut out = Vec::new();
            while let Some(row) = rows.next()? {
                if out.len() >= limit {
                    break;
                }
                let id: String = row.get(0)?;
                if claimed.contains(&id) {
                    continue;
                }
                let rec: String = row.get(1)?;
                match read(&rec) {
                    Ok(inv) => {
                        claimed.insert(id);
                        out.push(inv);
                    }
                    Err(e) => {
                        tracing::warn!(id = %id, error = %e, "skipping an unreadable async record")
                    }
                }
            }
            Ok(out)
        })
        .await
    }

    async fn dead_letters(
        &self,
        filter: &DeadLetterFilter,
        limit: usize,
    ) -> Result<Vec<StoredInvocation>, StoreError> {
        // Read on a blocking thread, filtered here (the filter is not 'static).
        let all = self
            .blocking(move |s| {
                let db = s.db.lock();
                let mut stmt = db.0.prepare(
                    "SELECT function, record FROM invocations WHERE state = 'failed'
                     ORDER BY finished_ms DESC LIMIT 10000",
                )?;
                let rows =
                    stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))?;
                rows.collect::<Result<Vec<_>, _>>()
                    .map_err(StoreError::from)
            })
            .await?;
        let mut out = Vec::new();
        for (function, record) in all {
            if out.len() >= limit {
                break;
            }
            if filter.accepts(&function) {
                out.push(read(&record)?);
            }
        }
        Ok(out)
    }

    async fn expire(&self, before_unix_ms: u64) -> Result<usize, StoreError> {
        self.blocking(move |s| {
            let mut guard = s.db.lock();
            let (db, count) = &mut *guard;
            let n = db.execute(
                "DELETE FROM invocations WHERE finished_ms IS NOT NULL AND finished_ms < ?1",
                params![before_unix_ms as i64],
            )?;
            *count -= n.min(*count);
            Ok(n)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inv(id: &str, idem: Option<&str>) -> StoredInvocation {
        StoredInvocation {
            id: id.into(),
            function: "f".into(),
            owner: "k".into(),
            args: br#"{"n":1}"#.to_vec(),
            submitted_unix_ms: 1,
            attempts: 0,
            max_attempts: 3,
            state: AsyncState::Running,
            failures: vec![],
            idempotency_key: idem.map(String::from),
            http_status: None,
            answer: None,
            finished_unix_ms: None,
        }
    }

    fn done(mut i: StoredInvocation, answer_bytes: usize, at: u64) -> StoredInvocation {
        i.state = AsyncState::Succeeded;
        i.http_status = Some(200);
        i.answer = Some("x".repeat(answer_bytes));
        i.finished_unix_ms = Some(at);
        i
    }

    #[tokio::test]
    async fn records_survive_reopening_and_are_orphans_of_the_next_life() {
        let dir = tempfile::tempdir().unwrap();
        {
            let s = SqliteAsyncStore::open(dir.path(), 100, 1 << 20).unwrap();
            assert_eq!(s.create(&inv("a", None)).await.unwrap(), Created::New);
            assert_eq!(s.create(&inv("b", None)).await.unwrap(), Created::New);
            // Its own records are not orphans in this life.
            assert!(s.take_orphans(10).await.unwrap().is_empty());
            assert!(s.finish(&done(inv("b", None), 10, 5)).await.unwrap());
            assert!(
                !s.finish(&done(inv("b", None), 10, 6)).await.unwrap(),
                "one result"
            );
        }
        let s = SqliteAsyncStore::open(dir.path(), 100, 1 << 20).unwrap();
        let orphans = s.take_orphans(10).await.unwrap();
        assert_eq!(orphans.len(), 1);
        assert_eq!(orphans[0].id, "a");
        assert_eq!(orphans[0].args, br#"{"n":1}"#);
        assert!(s.take_orphans(10).await.unwrap().is_empty(), "taken once");
        assert_eq!(
            s.get("b").await.unwrap().unwrap().state,
            AsyncState::Succeeded
        );
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(dir.path().join("async.db"))
                .unwrap()
                .permissions(),
        );
        assert_eq!(mode & 0o777, 0o600);
    }

    #[tokio::test]
    async fn idempotency_keys_are_per_function() {
        let dir = tempfile::tempdir().unwrap();
        let s = SqliteAsyncStore::open(dir.path(), 100, 1 << 20).unwrap();
        assert_eq!(s.create(&inv("a", Some("k1"))).await.unwrap(), Created::New);
        match s.create(&inv("b", Some("k1"))).await.unwrap() {
            Created::Existing(first) => assert_eq!(first.id, "a"),
            other => panic!("{other:?}"),
        }
        assert!(s.get("b").await.unwrap().is_none());
        let mut g = inv("c", Some("k1"));
        g.function = "g".into();
        assert_eq!(s.create(&g).await.unwrap(), Created::New);
    }

    #[tokio::test]
    async fn bounds_on_records_and_answer_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let s = SqliteAsyncStore::open(dir.path(), 4, 3000).unwrap();
        for i in 0..4 {
            s.create(&inv(&format!("r{i}"), None)).await.unwrap();
        }
        assert!(matches!(
            s.create(&inv("r4", None)).await,
            Err(StoreError::Full(4))
        ));
        // Finishing beyond the byte bound drops the oldest finished record, never a running one.
        for i in 0..3 {
            assert!(s
                .finish(&done(inv(&format!("r{i}"), None), 1000, 10 + i))
                .await
                .unwrap());
        }
        assert!(
            s.get("r0").await.unwrap().is_none(),
            "oldest finished dropped"
        );
        assert!(s.get("r2").await.unwrap().is_some());
        assert_eq!(
            s.get("r3").await.unwrap().unwrap().state,
            AsyncState::Running
        );
        assert_eq!(s.expire(12).await.unwrap(), 1);
        assert!(s.get("r1").await.unwrap().is_none());
        assert!(s.get("r2").await.unwrap().is_some());
        // Room made by dropping and expiring counts: two records are left, so two more fit.
        s.create(&inv("r5", None)).await.unwrap();
        s.create(&inv("r6", None)).await.unwrap();
        assert!(matches!(
            s.create(&inv("r7", None)).await,
            Err(StoreError::Full(4))
        ));
        // The count survives reopening.
        drop(s);
        let s = SqliteAsyncStore::open(dir.path(), 4, 3000).unwrap();
        assert!(matches!(
            s.create(&inv("r8", None)).await,
            Err(StoreError::Full(4))
        ));
    }

    #[tokio::test]
    async fn dead_letters_lists_failed_ones_newest_first() {
        let dir = tempfile::tempdir().unwrap();
        let s = SqliteAsyncStore::open(dir.path(), 100, 1 << 20).unwrap();
        for (i, f) in ["f", "g", "f"].iter().enumerate() {
            let mut r = inv(&format!("d{i}"), None);
            r.function = f.to_string();
            s.create(&r).await.unwrap();
            r.state = AsyncState::Failed;
            r.note_failure("handler_error: boom");
            r.finished_unix_ms = Some(100 + i as u64);
            s.finish(&r).await.unwrap();
        }
        s.create(&inv("ok", None)).await.unwrap();
        s.finish(&done(inv("ok", None), 1, 200)).await.unwrap();
        let dl = s
            .dead_letters(
                &DeadLetterFilter {
                    namespace: None,
                    function: Some("f".into()),
                },
                10,
            )
            .await
            .unwrap();
        let ids: Vec<&str> = dl.iter().map(|r| r.id.as_str()).collect();
        assert_eq!(ids, ["d2", "d0"]);
        assert_eq!(dl[0].failures, ["handler_error: boom"]);
    }
}

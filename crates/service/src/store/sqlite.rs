//! The embedded async store: one SQLite database (`async.db`, 0600) in the data directory.
//!
//! A record is committed (WAL, `synchronous = NORMAL`) before the caller answers 202: it
//! survives the process being killed at any instant; a power loss may lose the last commits
//! (docs/operations.md). Only one process uses a data directory, so what it did not claim in
//! this life is an orphan: at start every unfinished record is one.
//!
//! Bounds ([`AsyncLimits`]), so that one tenant cannot take the store from another (issue 31
//! item 5):
//! * at most `max_records` records in all and `max_records_per_namespace` per namespace: a new
//!   one over either is refused ([`StoreError::Full`], [`StoreError::NamespaceFull`]);
//! * at most `max_bytes_per_namespace` of finished answers per namespace: finishing one first
//!   drops that namespace's own oldest finished records until it fits;
//! * at most `max_bytes` of finished answers in all: over it, the oldest finished records of the
//!   namespace holding the most bytes go, never those of a namespace holding less.

use super::{AsyncStore, Created, DeadLetterFilter, StoreError, StoredInvocation};
use async_trait::async_trait;
use hearth_api::namespace::namespace_of;
use hearth_api::AsyncState;
use parking_lot::Mutex;
use rusqlite::{params, Connection, OptionalExtension};
use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;

/// How much the store keeps, in all and per namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AsyncLimits {
    pub max_records: usize,
    pub max_bytes: usize,
    pub max_records_per_namespace: usize,
    pub max_bytes_per_namespace: usize,
}

impl AsyncLimits {
    /// Global bounds only (each namespace may use all of them).
    pub fn global(max_records: usize, max_bytes: usize) -> Self {
        AsyncLimits {
            max_records,
            max_bytes,
            max_records_per_namespace: max_records,
            max_bytes_per_namespace: max_bytes,
        }
    }
}

/// Async invocation records in SQLite.
pub struct SqliteAsyncStore {
    inner: Arc<Inner>,
}

/// What one namespace holds.
#[derive(Debug, Default, Clone, Copy)]
struct Held {
    records: usize,
    /// Bytes of finished records.
    bytes: usize,
}

/// The database and what it holds, in all and per namespace (kept here: counting rows per
/// accept would cost time in proportion to the records kept).
struct Db {
    conn: Connection,
    records: usize,
    bytes: usize,
    per_ns: HashMap<String, Held>,
}

impl Db {
    fn held(&mut self, ns: &str) -> &mut Held {
        self.per_ns.entry(ns.to_string()).or_default()
    }

    /// Accounts for records that went (dropped or expired).
    fn forget(&mut self, ns: &str, records: usize, bytes: usize) {
        self.records = self.records.saturating_sub(records);
        self.bytes = self.bytes.saturating_sub(bytes);
        let h = self.held(ns);
        h.records = h.records.saturating_sub(records);
        h.bytes = h.bytes.saturating_sub(bytes);
        if h.records == 0 {
            self.per_ns.remove(ns);
        }
    }
}

struct Inner {
    db: Mutex<Db>,
    /// Ids this process created or took over: everything else unfinished is an orphan.
    claimed: Mutex<HashSet<String>>,
    limits: AsyncLimits,
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
    /// Opens (or creates) `async.db` under `data_dir` with global bounds only.
    pub fn open(data_dir: &Path, max_records: usize, max_bytes: usize) -> Result<Self, StoreError> {
        Self::open_with(data_dir, AsyncLimits::global(max_records, max_bytes))
    }

    /// Opens (or creates) `async.db` under `data_dir`.
    pub fn open_with(data_dir: &Path, limits: AsyncLimits) -> Result<Self, StoreError> {
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
        add_namespace_column(&db)?;
        for f in DB_FILES {
            match crate::intake::set_mode(&data_dir.join(f), 0o600) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io(e)),
                _ => {}
            }
        }
        let mut held = Db {
            conn: db,
            records: 0,
            bytes: 0,
            per_ns: HashMap::new(),
        };
        {
            let mut stmt = held.conn.prepare(
                "SELECT ns, COUNT(*),
                        COALESCE(SUM(CASE WHEN finished_ms IS NOT NULL THEN bytes END), 0)
                 FROM invocations GROUP BY ns",
            )?;
            let rows = stmt.query_map([], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, i64>(1)?,
                    r.get::<_, i64>(2)?,
                ))
            })?;
            for row in rows {
                let (ns, records, bytes) = row?;
                let h = Held {
                    records: records.max(0) as usize,
                    bytes: bytes.max(0) as usize,
                };
                held.records += h.records;
                held.bytes += h.bytes;
                held.per_ns.insert(ns, h);
            }
        }
        Ok(SqliteAsyncStore {
            inner: Arc::new(Inner {
                db: Mutex::new(held),
                claimed: Mutex::new(HashSet::new()),
                limits: AsyncLimits {
                    max_records: limits.max_records.max(1),
                    max_bytes: limits.max_bytes.max(1),
                    max_records_per_namespace: limits.max_records_per_namespace.max(1),
                    max_bytes_per_namespace: limits.max_bytes_per_namespace.max(1),
                },
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

/// Databases from before per-namespace bounds get an `ns` column, filled from each record's
/// function key, and an index to find a namespace's oldest finished records.
fn add_namespace_column(db: &Connection) -> Result<(), StoreError> {
    if db.prepare("SELECT ns FROM invocations LIMIT 0").is_err() {
        db.execute_batch("ALTER TABLE invocations ADD COLUMN ns TEXT NOT NULL DEFAULT ''")?;
        let functions: Vec<String> = {
            let mut stmt = db.prepare("SELECT DISTINCT function FROM invocations")?;
            let rows = stmt.query_map([], |r| r.get(0))?;
            rows.collect::<Result<_, _>>()?
        };
        for f in functions {
            db.execute(
                "UPDATE invocations SET ns = ?1 WHERE function = ?2",
                params![namespace_of(&f), f],
            )?;
        }
    }
    db.execute_batch(
        "CREATE INDEX IF NOT EXISTS invocations_ns_finished
             ON invocations(ns, finished_ms, bytes) WHERE finished_ms IS NOT NULL;",
    )?;
    Ok(())
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

    /// Keeps finished answers under both byte bounds after `ns` finished one: first that
    /// namespace's own oldest go until it fits its share, then, while the store is over its
    /// global bound, the oldest of whichever namespace holds the most. How many went.
    fn make_room(&self, db: &mut Db, ns: &str) -> Result<usize, StoreError> {
        let mut dropped = 0;
        let over = db.held(ns).bytes as i64 - self.limits.max_bytes_per_namespace as i64;
        dropped += drop_oldest(db, ns, over, "async_max_bytes_per_namespace")?;
        while db.bytes > self.limits.max_bytes {
            let over = (db.bytes - self.limits.max_bytes) as i64;
            let Some(largest) = db
                .per_ns
                .iter()
                .filter(|(_, h)| h.bytes > 0)
                .max_by_key(|(_, h)| h.bytes)
                .map(|(n, _)| n.clone())
            else {
                break;
            };
            // At most down to the next largest holder, so that eviction stays fair.
            let next = db
                .per_ns
                .iter()
                .filter(|(n, _)| **n != largest)
                .map(|(_, h)| h.bytes)
                .max()
                .unwrap_or(0);
            let share = (db.held(&largest).bytes - next).max(1) as i64;
            let n = drop_oldest(db, &largest, over.min(share), "async_max_bytes")?;
            if n == 0 {
                break;
            }
            dropped += n;
        }
        Ok(dropped)
    }
}

/// Drops `ns`'s oldest finished records until at least `over` bytes went; how many went.
fn drop_oldest(db: &mut Db, ns: &str, mut over: i64, bound: &str) -> Result<usize, StoreError> {
    if over <= 0 {
        return Ok(0);
    }
    let mut victims = Vec::new();
    {
        let mut stmt = db.conn.prepare(
            "SELECT id, bytes FROM invocations WHERE ns = ?1 AND finished_ms IS NOT NULL
             ORDER BY finished_ms, id",
        )?;
        let mut rows = stmt.query(params![ns])?;
        while let Some(row) = rows.next()? {
            if over <= 0 {
                break;
            }
            let (id, bytes): (String, i64) = (row.get(0)?, row.get(1)?);
            over -= bytes;
            victims.push((id, bytes.max(0) as usize));
        }
    }
    let dropped = victims.len();
    for (id, bytes) in victims {
        db.conn
            .execute("DELETE FROM invocations WHERE id = ?1", params![id])?;
        db.forget(ns, 1, bytes);
        tracing::debug!(id = %id, namespace = %ns, bound, "async result dropped early to stay under a bound");
    }
    Ok(dropped)
}

#[async_trait]
impl AsyncStore for SqliteAsyncStore {
    async fn create(&self, inv: &StoredInvocation) -> Result<Created, StoreError> {
        let inv = inv.clone();
        self.blocking(move |s| {
            let json = serde_json::to_string(&inv).map_err(corrupt)?;
            let ns = namespace_of(&inv.function).to_string();
            let mut guard = s.db.lock();
            let db = &mut *guard;
            let tx = db.conn.transaction()?;
            let idem = inv.idempotency_scope();
            if let Some(key) = &idem {
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
            if db.records >= s.limits.max_records {
                return Err(StoreError::Full(s.limits.max_records));
            }
            let held = db.per_ns.get(&ns).map_or(0, |h| h.records);
            if held >= s.limits.max_records_per_namespace {
                return Err(StoreError::NamespaceFull {
                    namespace: ns,
                    what: "records",
                    setting: "async_max_records_per_namespace",
                    max: s.limits.max_records_per_namespace,
                });
            }
            tx.execute(
                "INSERT INTO invocations (id, function, idem, state, record, ns)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![inv.id, inv.function, idem, state_str(inv.state), json, ns],
            )?;
            tx.commit()?;
            db.records += 1;
            db.held(&ns).records += 1;
            s.claimed.lock().insert(inv.id.clone());
            Ok(Created::New)
        })
        .await
    }

    async fn get(&self, id: &str) -> Result<Option<StoredInvocation>, StoreError> {
        let id = id.to_string();
        self.blocking(move |s| {
            let db = s.db.lock();
            s.get(&db.conn, &id)
        })
        .await
    }

    async fn update(&self, inv: &StoredInvocation) -> Result<(), StoreError> {
        let inv = inv.clone();
        self.blocking(move |s| {
            let json = serde_json::to_string(&inv).map_err(corrupt)?;
            s.db.lock().conn.execute(
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
            let ns = namespace_of(&inv.function).to_string();
            let mut guard = s.db.lock();
            let db = &mut *guard;
            let written = db.conn.execute(
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
                db.bytes += bytes;
                db.held(&ns).bytes += bytes;
                s.make_room(db, &ns)?;
            }
            Ok(written == 1)
        })
        .await
    }

    async fn take_orphans(&self, limit: usize) -> Result<Vec<StoredInvocation>, StoreError> {
        self.blocking(move |s| {
            let db = s.db.lock();
            let mut stmt = db.conn.prepare(
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
                let mut stmt = db.conn.prepare(
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
            let db = &mut *guard;
            let tx = db.conn.transaction()?;
            let going: Vec<(String, i64, i64)> = {
                let mut stmt = tx.prepare(
                    "SELECT ns, COUNT(*), COALESCE(SUM(bytes), 0) FROM invocations
                     WHERE finished_ms IS NOT NULL AND finished_ms < ?1 GROUP BY ns",
                )?;
                let rows = stmt.query_map(params![before_unix_ms as i64], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?))
                })?;
                rows.collect::<Result<_, _>>()?
            };
            let n = tx.execute(
                "DELETE FROM invocations WHERE finished_ms IS NOT NULL AND finished_ms < ?1",
                params![before_unix_ms as i64],
            )?;
            tx.commit()?;
            for (ns, records, bytes) in going {
                db.forget(&ns, records.max(0) as usize, bytes.max(0) as usize);
            }
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
    async fn idempotency_keys_are_per_function_and_calling_key() {
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
        // Another calling key of the same function: a call of its own (issue 31 item 10).
        let mut other = inv("d", Some("k1"));
        other.owner = "k2".into();
        assert_eq!(s.create(&other).await.unwrap(), Created::New);
        // Owner and key cannot be shifted into each other.
        let (mut x, mut y) = (inv("e", Some("1:b")), inv("f", Some("b")));
        x.owner = "a".into();
        y.owner = "a:1".into();
        assert_eq!(s.create(&x).await.unwrap(), Created::New);
        assert_eq!(s.create(&y).await.unwrap(), Created::New);
    }

    fn in_ns(id: &str, ns: &str) -> StoredInvocation {
        let mut i = inv(id, None);
        i.function = format!("{ns}.f");
        i
    }

    #[tokio::test]
    async fn one_namespace_filling_its_share_neither_refuses_nor_evicts_another() {
        let dir = tempfile::tempdir().unwrap();
        let limits = AsyncLimits {
            max_records: 100,
            max_bytes: 5000,
            max_records_per_namespace: 5,
            max_bytes_per_namespace: 3000,
        };
        let s = SqliteAsyncStore::open_with(dir.path(), limits).unwrap();
        // B finishes one result first: the oldest in the store.
        s.create(&in_ns("b0", "team-b")).await.unwrap();
        assert!(s
            .finish(&done(in_ns("b0", "team-b"), 1000, 1))
            .await
            .unwrap());
        // A fills its record share: its next one is refused, naming its limit; B's is not.
        for i in 0..5 {
            s.create(&in_ns(&format!("a{i}"), "team-a")).await.unwrap();
        }
        match s.create(&in_ns("a5", "team-a")).await {
            Err(e @ StoreError::NamespaceFull { .. }) => {
                let m = e.to_string();
                assert!(
                    m.contains("team-a") && m.contains("async_max_records_per_namespace"),
                    "{m}"
                );
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            s.create(&in_ns("b1", "team-b")).await.unwrap(),
            Created::New
        );
        // A's large answers go over its byte share: its own oldest go, never B's older one.
        for i in 0..5 {
            assert!(s
                .finish(&done(in_ns(&format!("a{i}"), "team-a"), 1000, 10 + i))
                .await
                .unwrap());
        }
        assert!(
            s.get("b0").await.unwrap().is_some(),
            "B's result was evicted"
        );
        assert!(s.get("a0").await.unwrap().is_none(), "A's oldest stays");
        assert!(s.get("a4").await.unwrap().is_some());
        // Room A made counts for A again.
        assert_eq!(
            s.create(&in_ns("a6", "team-a")).await.unwrap(),
            Created::New
        );
        // Over the global bound, the namespace holding the most gives way, not the smaller one.
        for (i, ns) in ["team-c", "team-c"].iter().enumerate() {
            let id = format!("c{i}");
            s.create(&in_ns(&id, ns)).await.unwrap();
            assert!(s
                .finish(&done(in_ns(&id, ns), 1000, 20 + i as u64))
                .await
                .unwrap());
        }
        assert!(
            s.get("b0").await.unwrap().is_some(),
            "B's result was evicted"
        );
        assert!(s.inner.db.lock().bytes <= 5000);
        // The counts survive reopening.
        drop(s);
        let s = SqliteAsyncStore::open_with(dir.path(), limits).unwrap();
        assert!(s.get("b0").await.unwrap().is_some());
        let held = s.inner.db.lock().per_ns.get("team-b").copied().unwrap();
        assert_eq!(held.records, 2);
    }

    #[tokio::test]
    async fn a_database_from_before_namespaces_gets_them() {
        let dir = tempfile::tempdir().unwrap();
        {
            let db = Connection::open(dir.path().join("async.db")).unwrap();
            db.execute_batch(
                "CREATE TABLE invocations (id TEXT PRIMARY KEY, function TEXT NOT NULL,
                 idem TEXT, state TEXT NOT NULL, finished_ms INTEGER,
                 bytes INTEGER NOT NULL DEFAULT 0, record TEXT NOT NULL);",
            )
            .unwrap();
            let r = serde_json::to_string(&in_ns("old", "team-a")).unwrap();
            db.execute(
                "INSERT INTO invocations (id, function, state, record) VALUES ('old', 'team-a.f', 'running', ?1)",
                params![r],
            )
            .unwrap();
        }
        let s = SqliteAsyncStore::open(dir.path(), 10, 1 << 20).unwrap();
        assert_eq!(s.inner.db.lock().per_ns.get("team-a").unwrap().records, 1);
        assert_eq!(s.get("old").await.unwrap().unwrap().id, "old");
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

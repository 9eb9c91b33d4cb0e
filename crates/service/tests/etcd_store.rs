//! The etcd store against real etcd on loopback (skipped, with a message, without etcd).

use hearth_api::AsyncState;
use hearth_service::store::etcd::{EtcdStore, CODE_CHUNK_BYTES, MAX_CODE_BYTES, MAX_RECORD_BYTES};
use hearth_service::store::local_etcd::{etcd_for_tests, LocalEtcd};
use hearth_service::store::sqlite::AsyncLimits;
use hearth_service::store::{
    unix_ms, AsyncStore, Change, ClusterState, Created, DeadLetterFilter, MemberKind, MemberRecord,
    StoreError, StoreUrl, StoredInvocation,
};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

const PREFIX: &str = "/hearth";

macro_rules! need_etcd {
    () => {
        if !etcd_for_tests() {
            return;
        }
    };
}

async fn cluster(members: usize) -> LocalEtcd {
    let mut etcd = LocalEtcd::start(members).unwrap();
    etcd.wait_ready().await.unwrap();
    etcd
}

async fn store(etcd: &LocalEtcd) -> Arc<EtcdStore> {
    EtcdStore::connect(&etcd.http_endpoints(), PREFIX, 1000)
        .await
        .unwrap()
}

async fn raw(etcd: &LocalEtcd) -> etcd_client::Client {
    etcd_client::Client::connect(etcd.http_endpoints(), None)
        .await
        .unwrap()
}

fn new_id() -> String {
    format!("{:032x}", rand::random::<u128>())
}

fn inv(function: &str, idem: Option<&str>) -> StoredInvocation {
    StoredInvocation {
        id: new_id(),
        function: function.into(),
        owner: "key1".into(),
        args: br#"{"n":1}"#.to_vec(),
        submitted_unix_ms: unix_ms(),
        attempts: 0,
        max_attempts: 3,
        state: AsyncState::Running,
        failures: vec![],
        idempotency_key: idem.map(str::to_string),
        http_status: None,
        answer: None,
        finished_unix_ms: None,
    }
}

fn finished(mut i: StoredInvocation, state: AsyncState, answer: &str) -> StoredInvocation {
    i.state = state;
    i.http_status = Some(if state == AsyncState::Succeeded {
        200
    } else {
        500
    });
    i.answer = Some(answer.into());
    i.finished_unix_ms = Some(unix_ms());
    i
}

async fn next<T: std::fmt::Debug>(rx: &mut mpsc::Receiver<Change<T>>) -> Change<T> {
    tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("a change within 10 s")
        .expect("the watch is open")
}

/// Waits (bounded) until `check` holds; how long it took.
async fn eventually<F, Fut>(limit: Duration, what: &str, mut check: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let t = Instant::now();
    while !check().await {
        assert!(t.elapsed() < limit, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    t.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_are_created_updated_and_finished_exactly_once() {
    need_etcd!();
    let etcd = cluster(1).await;
    assert_eq!(
        StoreUrl::parse(&etcd.store_url()).unwrap(),
        StoreUrl::Etcd(etcd.http_endpoints())
    );
    let a = store(&etcd).await;
    let b = store(&etcd).await;

    let mut i = inv("default.f", None);
    assert_eq!(a.create(&i).await.unwrap(), Created::New);
    assert_eq!(b.get(&i.id).await.unwrap(), Some(i.clone()));
    assert_eq!(b.get("no-such-id").await.unwrap(), None);
    assert_eq!(b.get("../inv/x").await.unwrap(), None);

    i.attempts = 1;
    i.note_failure("worker w1 went away");
    a.update(&i).await.unwrap();
    assert_eq!(b.get(&i.id).await.unwrap(), Some(i.clone()));

    // Two controllers finish the same invocation at once: exactly one wins.
    let ok = finished(i.clone(), AsyncState::Succeeded, r#"{"from":"a"}"#);
    let failed = finished(i.clone(), AsyncState::Failed, r#"{"from":"b"}"#);
    let (ra, rb) = tokio::join!(a.finish(&ok), b.finish(&failed));
    let (ra, rb) = (ra.unwrap(), rb.unwrap());
    assert!(ra ^ rb, "exactly one finisher wins: a={ra} b={rb}");
    let winner = if ra { &ok } else { &failed };
    assert_eq!(a.get(&i.id).await.unwrap().as_ref(), Some(winner));

    // Final is final: neither a later finish nor an update changes it.
    assert!(!a.finish(&ok).await.unwrap());
    let mut late = i.clone();
    late.attempts = 9;
    b.update(&late).await.unwrap();
    assert_eq!(a.get(&i.id).await.unwrap().as_ref(), Some(winner));

    // Oversized records are refused before they are sent, and nothing is stored.
    let mut big = inv("default.f", None);
    big.args = vec![b'x'; MAX_RECORD_BYTES];
    match a.create(&big).await {
        Err(StoreError::TooLarge { what, bytes, max }) => {
            assert_eq!(what, "invocation record");
            assert!(bytes > max && max == MAX_RECORD_BYTES);
        }
        other => panic!("expected TooLarge, got {other:?}"),
    }
    assert_eq!(a.get(&big.id).await.unwrap(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotency_keys_are_scoped_to_the_function() {
    need_etcd!();
    let etcd = cluster(1).await;
    let a = store(&etcd).await;
    let b = store(&etcd).await;

    let first = inv("default.f", Some("k1"));
    assert_eq!(a.create(&first).await.unwrap(), Created::New);
    // The same key for the same function, from any controller: the first call's record.
    for s in [&a, &b] {
        match s.create(&inv("default.f", Some("k1"))).await.unwrap() {
            Created::Existing(rec) => assert_eq!(*rec, first),
            Created::New => panic!("a reused idempotency key created a second invocation"),
        }
    }
    // Another function may use the same key.
    let other = inv("default.g", Some("k1"));
    assert_eq!(b.create(&other).await.unwrap(), Created::New);
    assert!(b.get(&other.id).await.unwrap().is_some());

    // After the first one finished, the key still returns it (now final).
    let done = finished(first.clone(), AsyncState::Succeeded, "{}");
    assert!(a.finish(&done).await.unwrap());
    match b.create(&inv("default.f", Some("k1"))).await.unwrap() {
        Created::Existing(rec) => assert_eq!(*rec, done),
        Created::New => panic!("a finished invocation's key was forgotten"),
    }

    // Racing creates with one fresh key: one New, the other sees the winner.
    let x = inv("default.f", Some("race"));
    let y = inv("default.f", Some("race"));
    let (rx, ry) = tokio::join!(a.create(&x), b.create(&y));
    match (rx.unwrap(), ry.unwrap()) {
        (Created::New, Created::Existing(r)) => assert_eq!(r.id, x.id),
        (Created::Existing(r), Created::New) => assert_eq!(r.id, y.id),
        other => panic!("expected one New and one Existing: {other:?}"),
    }
}

/// Two controllers on one etcd, both bounded by `limits`.
async fn bounded(etcd: &LocalEtcd, limits: AsyncLimits) -> (Arc<EtcdStore>, Arc<EtcdStore>) {
    (
        store(etcd).await.with_async_limits(limits),
        store(etcd).await.with_async_limits(limits),
    )
}

/// A finished record with an answer of `answer_bytes` bytes, finished at `at` (ms).
fn done_at(i: &StoredInvocation, answer_bytes: usize, at: u64) -> StoredInvocation {
    let mut f = finished(i.clone(), AsyncState::Succeeded, &"x".repeat(answer_bytes));
    f.finished_unix_ms = Some(at);
    f
}

/// What a finished record counts against the byte bounds: its JSON, as the SQLite store counts.
fn record_bytes(i: &StoredInvocation) -> usize {
    serde_json::to_vec(i).unwrap().len()
}

/// Issue 31 item 5: one tenant filling its record share is refused (429 `namespace_limit`
/// upstream) on every controller, naming its namespace and setting; another tenant is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_at_its_record_share_is_refused_and_no_other() {
    need_etcd!();
    let etcd = cluster(1).await;
    let limits = AsyncLimits {
        max_records: 5,
        max_bytes: 1 << 20,
        max_records_per_namespace: 3,
        max_bytes_per_namespace: 1 << 20,
    };
    let (c1, c2) = bounded(&etcd, limits).await;
    let first = inv("team-a.f", Some("k"));
    assert_eq!(c1.create(&first).await.unwrap(), Created::New);
    assert_eq!(
        c2.create(&inv("team-a.f", None)).await.unwrap(),
        Created::New
    );
    let a3 = inv("team-a.f", None);
    assert_eq!(c1.create(&a3).await.unwrap(), Created::New);
    // Finished records count too (they hold etcd space until they expire).
    assert!(c1.finish(&done_at(&a3, 10, unix_ms())).await.unwrap());
    for c in [&c1, &c2] {
        match c.create(&inv("team-a.f", None)).await {
            Err(e @ StoreError::NamespaceFull { .. }) => {
                let m = e.to_string();
                assert!(
                    m.contains("\"team-a\"") && m.contains("async_max_records_per_namespace"),
                    "{m}"
                );
            }
            other => panic!("team-a over its record share: {other:?}"),
        }
    }
    // A repeat of a stored call still gets the first one.
    match c2.create(&inv("team-a.f", Some("k"))).await.unwrap() {
        Created::Existing(rec) => assert_eq!(rec.id, first.id),
        Created::New => panic!("a repeated idempotency key created a record over the bound"),
    }
    // Another namespace is not affected, until the shared bound.
    assert_eq!(
        c2.create(&inv("team-b.f", None)).await.unwrap(),
        Created::New
    );
    assert_eq!(
        c1.create(&inv("team-b.f", None)).await.unwrap(),
        Created::New
    );
    match c2.create(&inv("team-b.f", None)).await {
        Err(StoreError::Full(5)) => {}
        other => panic!("the store at its shared bound: {other:?}"),
    }
}

/// Issue 31 item 5: a namespace's large answers over its byte share drop its own oldest
/// results, never another namespace's; over the shared bound the namespace holding the most
/// gives way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_over_a_byte_bound_drop_the_oldest_of_the_right_namespace() {
    need_etcd!();
    let etcd = cluster(1).await;
    let probe = done_at(&inv("team-a.f", None), 1000, 1);
    let size = record_bytes(&probe);
    // Two answers fit a namespace's share, three do not; five fit the shared bound.
    let limits = AsyncLimits {
        max_records: 100,
        max_bytes: 5 * size + size / 2,
        max_records_per_namespace: 50,
        max_bytes_per_namespace: 2 * size + size / 2,
    };
    let (c1, c2) = bounded(&etcd, limits).await;
    let t0 = unix_ms() - 100_000;
    let b_old = inv("team-b.f", None);
    c1.create(&b_old).await.unwrap();
    assert!(c1.finish(&done_at(&b_old, 1000, t0)).await.unwrap());
    let a: Vec<StoredInvocation> = (0..4).map(|_| inv("team-a.f", Some(&new_id()))).collect();
    for (n, i) in a.iter().enumerate() {
        let c = if n % 2 == 0 { &c1 } else { &c2 };
        c.create(i).await.unwrap();
        assert!(c
            .finish(&done_at(i, 1000, t0 + 10 + n as u64))
            .await
            .unwrap());
    }
    // A kept its newest two; its two oldest went (and their idempotency keys with them);
    // B's older result stayed.
    for (n, i) in a.iter().enumerate() {
        let kept = c1.get(&i.id).await.unwrap().is_some();
        assert_eq!(kept, n >= 2, "team-a result {n}");
    }
    assert!(
        c2.get(&b_old.id).await.unwrap().is_some(),
        "team-b's result was dropped"
    );
    assert_eq!(
        c2.create(&inv("team-a.f", a[0].idempotency_key.as_deref()))
            .await
            .unwrap(),
        Created::New,
        "a dropped result's idempotency key stayed"
    );
}

/// Issue 31 item 5: over the shared byte bound, the oldest results of the namespace holding
/// the most go (down to the next largest), never those of a namespace holding less.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_the_shared_byte_bound_the_largest_namespace_gives_way() {
    need_etcd!();
    let etcd = cluster(1).await;
    let size = record_bytes(&done_at(&inv("team-a.f", None), 1000, 1));
    let limits = AsyncLimits {
        max_records: 100,
        max_bytes: 4 * size + size / 2,
        max_records_per_namespace: 50,
        max_bytes_per_namespace: 4 * size,
    };
    let (c1, c2) = bounded(&etcd, limits).await;
    let t0 = unix_ms() - 100_000;
    let b: Vec<StoredInvocation> = (0..3).map(|_| inv("team-b.f", None)).collect();
    for (n, i) in b.iter().enumerate() {
        c1.create(i).await.unwrap();
        assert!(c1.finish(&done_at(i, 1000, t0 + n as u64)).await.unwrap());
    }
    // A's answers are newer than all of B's, and A holds less: B's oldest goes.
    let a: Vec<StoredInvocation> = (0..2).map(|_| inv("team-a.f", None)).collect();
    for (n, i) in a.iter().enumerate() {
        c2.create(i).await.unwrap();
        assert!(c2
            .finish(&done_at(i, 1000, t0 + 10 + n as u64))
            .await
            .unwrap());
    }
    for i in &a {
        assert!(
            c1.get(&i.id).await.unwrap().is_some(),
            "team-a (holding less) lost a result"
        );
    }
    for (n, i) in b.iter().enumerate() {
        let kept = c2.get(&i.id).await.unwrap().is_some();
        assert_eq!(kept, n >= 1, "team-b result {n}");
    }
}

/// The byte counters stay exact while two controllers finish many records of one namespace
/// (and of others) at once: no finish is lost to a counter conflict, no bytes are lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn byte_counters_stay_exact_under_concurrent_finishes() {
    need_etcd!();
    let etcd = cluster(1).await;
    let limits = AsyncLimits {
        max_records: 1000,
        max_bytes: 1 << 30,
        max_records_per_namespace: 1000,
        max_bytes_per_namespace: 1 << 30,
    };
    let (c1, c2) = bounded(&etcd, limits).await;
    let mut tasks = Vec::new();
    let mut expected = std::collections::HashMap::<&str, usize>::new();
    for n in 0..60 {
        let ns = ["team-a", "team-a", "team-b"][n % 3];
        let c = if n % 2 == 0 { c1.clone() } else { c2.clone() };
        let i = inv(&format!("{ns}.f"), None);
        c.create(&i).await.unwrap();
        let f = done_at(&i, 100 + n, unix_ms());
        *expected.entry(ns).or_default() += record_bytes(&f);
        tasks.push(tokio::spawn(async move { c.finish(&f).await.unwrap() }));
    }
    for t in tasks {
        assert!(t.await.unwrap(), "a finish was lost");
    }
    let client = raw(&etcd).await;
    let sum = |prefix: String| {
        let mut kv = client.kv_client();
        async move {
            let got = kv
                .get(prefix, Some(etcd_client::GetOptions::new().with_prefix()))
                .await
                .unwrap();
            got.kvs()
                .iter()
                .map(|kv| kv.value_str().unwrap().parse::<usize>().unwrap())
                .sum::<usize>()
        }
    };
    assert_eq!(
        sum(format!("{PREFIX}/inv-bytes/team-a/")).await,
        expected["team-a"]
    );
    assert_eq!(
        sum(format!("{PREFIX}/inv-bytes/team-b/")).await,
        expected["team-b"]
    );
    assert_eq!(
        sum(format!("{PREFIX}/inv-total/")).await,
        expected["team-a"] + expected["team-b"]
    );
}

/// Issue 31 item 5: records that expire (by their retention lease, or by `expire`) free
/// their namespace's share, with their index keys and byte counters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_records_free_their_namespace_share() {
    need_etcd!();
    let etcd = cluster(1).await;
    let limits = AsyncLimits {
        max_records: 100,
        max_bytes: 1 << 20,
        max_records_per_namespace: 2,
        max_bytes_per_namespace: 1 << 20,
    };
    let s = store(&etcd)
        .await
        .with_retention(Duration::from_secs(1))
        .with_async_limits(limits);
    for _ in 0..2 {
        let i = inv("team-a.f", Some(&new_id()));
        s.create(&i).await.unwrap();
        assert!(s.finish(&done_at(&i, 100, unix_ms())).await.unwrap());
    }
    assert!(matches!(
        s.create(&inv("team-a.f", None)).await,
        Err(StoreError::NamespaceFull { .. })
    ));
    let waited = eventually(
        Duration::from_secs(15),
        "team-a's share is free again",
        || {
            let s = s.clone();
            async move { s.create(&inv("team-a.f", None)).await.is_ok() }
        },
    )
    .await;
    eprintln!("records with 1 s retention freed their share after {waited:?}");
    let client = raw(&etcd).await;
    let left = |prefix: String| {
        let mut kv = client.kv_client();
        async move {
            kv.get(
                prefix,
                Some(
                    etcd_client::GetOptions::new()
                        .with_prefix()
                        .with_count_only(),
                ),
            )
            .await
            .unwrap()
            .count()
        }
    };
    assert_eq!(left(format!("{PREFIX}/inv-ns/team-a/done/")).await, 0);
    assert_eq!(left(format!("{PREFIX}/inv-bytes/")).await, 0);
    assert_eq!(left(format!("{PREFIX}/inv-total/")).await, 0);

    // `expire` (for leases a leader change renewed) frees the share the same way.
    let long = store(&etcd).await.with_async_limits(limits);
    let old = inv("team-b.f", Some("old"));
    long.create(&old).await.unwrap();
    assert!(long.finish(&done_at(&old, 100, 1_000)).await.unwrap());
    long.create(&inv("team-b.f", None)).await.unwrap();
    assert!(long.create(&inv("team-b.f", None)).await.is_err());
    assert_eq!(long.expire(unix_ms()).await.unwrap(), 1);
    assert_eq!(
        long.create(&inv("team-b.f", None)).await.unwrap(),
        Created::New
    );
    assert_eq!(left(format!("{PREFIX}/inv-bytes/team-b/")).await, 0);
    assert_eq!(left(format!("{PREFIX}/inv-ns/team-b/done/")).await, 0);
}

/// Runs `f` with a store (session TTL 1 s) of its own, on a runtime of its own on a thread of
/// its own, so that a test can stop or block that runtime as a crash or a freeze would.
fn on_own_runtime<F, Fut>(endpoints: Vec<String>, f: F) -> std::thread::JoinHandle<()>
where
    F: FnOnce(Arc<EtcdStore>) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()>,
{
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let s = EtcdStore::connect(&endpoints, PREFIX, 1000).await.unwrap();
            f(s).await;
        });
    })
}

/// Connects a store on a runtime of its own, creates `invs`, and "crashes": the runtime stops
/// (so the keep-alive stops) and the store is leaked, so nothing is revoked.
fn crashed_store_with(endpoints: Vec<String>, invs: Vec<StoredInvocation>) {
    on_own_runtime(endpoints, |s| async move {
        for i in &invs {
            assert_eq!(s.create(i).await.unwrap(), Created::New);
        }
        std::mem::forget(s);
    })
    .join()
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orphans_are_taken_over_exactly_once() {
    need_etcd!();
    let etcd = cluster(1).await;
    let a = store(&etcd).await;
    let b = store(&etcd).await;
    let c = store(&etcd).await;

    let i1 = inv("default.f", None);
    let i2 = inv("default.f", Some("k"));
    a.create(&i1).await.unwrap();
    a.create(&i2).await.unwrap();
    // A holds them: not orphans.
    assert!(b.take_orphans(10).await.unwrap().is_empty());

    // A shuts down (its session lease is revoked): B takes both, once.
    a.close().await;
    drop(a);
    let taken: HashSet<String> = b
        .take_orphans(10)
        .await
        .unwrap()
        .into_iter()
        .map(|i| i.id)
        .collect();
    assert_eq!(taken, HashSet::from([i1.id.clone(), i2.id.clone()]));
    assert!(b.take_orphans(10).await.unwrap().is_empty());
    assert!(c.take_orphans(10).await.unwrap().is_empty());

    // The new holder finishes one; a finished invocation is never an orphan again.
    assert!(b
        .finish(&finished(i1.clone(), AsyncState::Succeeded, "{}"))
        .await
        .unwrap());

    // A controller that crashes (no revoke): its claims go when its session lease expires.
    let i3 = inv("default.f", None);
    let crashed_at = Instant::now();
    crashed_store_with(etcd.http_endpoints(), vec![i3.clone()]);
    assert!(c.take_orphans(10).await.unwrap().is_empty());
    let t = Instant::now();
    let got = loop {
        let got = c.take_orphans(10).await.unwrap();
        if !got.is_empty() {
            break got;
        }
        assert!(
            t.elapsed() < Duration::from_secs(6),
            "a crashed store's claim expires"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let waited = t.elapsed();
    assert_eq!(got.iter().map(|i| &i.id).collect::<Vec<_>>(), vec![&i3.id]);
    eprintln!(
        "crashed store's orphan taken after {waited:?} ({:?} after the crash)",
        crashed_at.elapsed()
    );
    assert!(b.take_orphans(10).await.unwrap().is_empty());
    // take_orphans respects its limit.
    let (i4, i5) = (inv("default.f", None), inv("default.f", None));
    crashed_store_with(etcd.http_endpoints(), vec![i4.clone(), i5.clone()]);
    let t = Instant::now();
    loop {
        let got = b.take_orphans(1).await.unwrap();
        assert!(got.len() <= 1, "take_orphans returned more than its limit");
        if got.len() == 1 {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(6),
            "crashed claims expire"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(b.take_orphans(10).await.unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_session_lease_is_replaced() {
    need_etcd!();
    let etcd = cluster(1).await;
    let a = store(&etcd).await;
    let b = store(&etcd).await;
    let i1 = inv("default.f", None);
    a.create(&i1).await.unwrap();
    // Someone (an operator, an etcd hiccup) revokes A's session lease.
    let mut raw = raw(&etcd).await;
    let claim = raw
        .get(format!("{PREFIX}/claims/{}", i1.id), None)
        .await
        .unwrap();
    let lease = claim.kvs()[0].lease();
    assert_ne!(lease, 0, "claims are attached to the session lease");
    raw.lease_revoke(lease).await.unwrap();
    // Its claims are gone (another controller may take the invocation over) ...
    let taken = b.take_orphans(10).await.unwrap();
    assert_eq!(taken.len(), 1);
    // ... and A gets a new session on its own and works on.
    eventually(Duration::from_secs(5), "a new session lease", || {
        let a = a.clone();
        async move { a.session_alive() }
    })
    .await;
    let i2 = inv("default.f", None);
    let waited = eventually(Duration::from_secs(5), "create after the loss", || {
        let (a, i2) = (a.clone(), i2.clone());
        async move { a.create(&i2).await.is_ok() }
    })
    .await;
    eprintln!("create worked again {waited:?} after the session lease was revoked");
    assert!(b.take_orphans(10).await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_are_failed_records_newest_first() {
    need_etcd!();
    let etcd = cluster(1).await;
    let s = store(&etcd).await;
    let mut failed = Vec::new();
    for (function, at) in [
        ("default.f", 1_000),
        ("default.f", 3_000),
        ("default.g", 4_000),
        ("default.f", 2_000),
    ] {
        let i = inv(function, None);
        s.create(&i).await.unwrap();
        let mut f = finished(i, AsyncState::Failed, r#"{"error":"boom"}"#);
        f.finished_unix_ms = Some(at);
        assert!(s.finish(&f).await.unwrap());
        failed.push(f);
    }
    let ok = inv("default.f", None);
    s.create(&ok).await.unwrap();
    assert!(s
        .finish(&finished(ok, AsyncState::Succeeded, "{}"))
        .await
        .unwrap());
    s.create(&inv("default.f", None)).await.unwrap(); // still running

    let only_f = DeadLetterFilter {
        namespace: None,
        function: Some("default.f".into()),
    };
    let got = s.dead_letters(&only_f, 10).await.unwrap();
    let at: Vec<u64> = got.iter().filter_map(|i| i.finished_unix_ms).collect();
    assert_eq!(at, vec![3_000, 2_000, 1_000]);
    assert!(got.iter().all(|i| i.state == AsyncState::Failed));
    assert_eq!(got[0], failed[1]);
    let two = s.dead_letters(&only_f, 2).await.unwrap();
    assert_eq!(two, got[..2].to_vec());
    let all = s
        .dead_letters(&DeadLetterFilter::default(), 10)
        .await
        .unwrap();
    assert_eq!(all.len(), 4);
    assert_eq!(all[0].function, "default.g");
    assert!(s
        .dead_letters(
            &DeadLetterFilter {
                namespace: None,
                function: Some("nope".into()),
            },
            10,
        )
        .await
        .unwrap()
        .is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finished_records_expire_by_their_retention_lease() {
    need_etcd!();
    let etcd = cluster(1).await;
    let s = store(&etcd).await.with_retention(Duration::from_secs(2));
    let done = inv("default.f", Some("once"));
    let running = inv("default.f", None);
    s.create(&done).await.unwrap();
    s.create(&running).await.unwrap();
    let finished_at = Instant::now();
    assert!(s
        .finish(&finished(done.clone(), AsyncState::Succeeded, "{}"))
        .await
        .unwrap());
    assert!(s.get(&done.id).await.unwrap().is_some());
    let waited = eventually(
        Duration::from_secs(10),
        "the finished record expires",
        || {
            let (s, id) = (s.clone(), done.id.clone());
            async move { s.get(&id).await.unwrap().is_none() }
        },
    )
    .await;
    eprintln!("a finished record with 2 s retention went after {waited:?}");
    assert!(
        finished_at.elapsed() >= Duration::from_secs(2),
        "not before the retention"
    );
    // Its idempotency key went with it; the unfinished one stays.
    assert_eq!(
        s.create(&inv("default.f", Some("once"))).await.unwrap(),
        Created::New
    );
    assert!(s.get(&running.id).await.unwrap().is_some());

    // `expire` removes finished records older than its cutoff (and nothing unfinished).
    let long = store(&etcd).await;
    let old = inv("default.f", Some("old"));
    long.create(&old).await.unwrap();
    let mut f = finished(old.clone(), AsyncState::Failed, "{}");
    f.finished_unix_ms = Some(1_000);
    assert!(long.finish(&f).await.unwrap());
    assert_eq!(long.expire(500).await.unwrap(), 0);
    assert_eq!(long.expire(unix_ms()).await.unwrap(), 1);
    assert_eq!(long.get(&old.id).await.unwrap(), None);
    assert!(long.get(&running.id).await.unwrap().is_some());
    assert_eq!(
        long.create(&inv("default.f", Some("old"))).await.unwrap(),
        Created::New
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn functions_code_and_their_watch() {
    need_etcd!();
    let etcd = cluster(1).await;
    let s = store(&etcd).await;
    let mut rx = s.watch_functions();
    assert_eq!(next(&mut rx).await, Change::Snapshot(vec![]));

    // Code over two chunks (and a partial third).
    let code: Vec<u8> = (0..CODE_CHUNK_BYTES * 2 + 1234)
        .map(|i| (i * 7 % 251) as u8)
        .collect();
    let spec = serde_json::json!({"runtime": "python", "memory_mb": 128});
    let a1 = s
        .put_function("default.a", &spec, Some(&code))
        .await
        .unwrap();
    let cref = a1.code.clone().unwrap();
    assert_eq!(cref.bytes, code.len() as u64);
    assert_eq!(next(&mut rx).await, Change::Put(a1.clone()));
    assert_eq!(s.code(&cref).await.unwrap(), code);

    let spec2 = serde_json::json!({"runtime": "python", "memory_mb": 256});
    let a2 = s
        .put_function("default.a", &spec2, Some(&code))
        .await
        .unwrap();
    assert!(a2.version > a1.version, "{} > {}", a2.version, a1.version);
    assert_eq!(next(&mut rx).await, Change::Put(a2.clone()));
    let b = s
        .put_function("default.b", &spec, Some(&code))
        .await
        .unwrap();
    assert_eq!(b.code, a2.code, "the same archive is stored once");
    assert_eq!(next(&mut rx).await, Change::Put(b.clone()));

    // A watch started later begins with everything there is.
    let mut late = s.watch_functions();
    match next(&mut late).await {
        Change::Snapshot(mut all) => {
            all.sort_by(|x, y| x.key.cmp(&y.key));
            assert_eq!(all, vec![a2.clone(), b.clone()]);
        }
        other => panic!("expected a snapshot, got {other:?}"),
    }

    // Deleting one of two users keeps the code; deleting the last removes it.
    assert!(s.delete_function("default.a").await.unwrap());
    assert_eq!(next(&mut rx).await, Change::Delete("default.a".into()));
    assert!(!s.delete_function("default.a").await.unwrap());
    assert_eq!(s.code(&cref).await.unwrap(), code);
    assert!(s.delete_function("default.b").await.unwrap());
    assert_eq!(next(&mut rx).await, Change::Delete("default.b".into()));
    assert!(matches!(
        s.code(&cref).await,
        Err(StoreError::Corrupt { .. })
    ));
    let mut raw = raw(&etcd).await;
    let left = raw
        .get(
            format!("{PREFIX}/code/"),
            Some(
                etcd_client::GetOptions::new()
                    .with_prefix()
                    .with_count_only(),
            ),
        )
        .await
        .unwrap();
    assert_eq!(left.count(), 0, "unreferenced code leaves nothing behind");

    // Putting the same code again after it was collected stores it again.
    let c = s
        .put_function("default.c", &spec, Some(&code))
        .await
        .unwrap();
    assert_eq!(s.code(c.code.as_ref().unwrap()).await.unwrap(), code);
    assert_eq!(next(&mut rx).await, Change::Put(c.clone()));

    // A tampered chunk is detected.
    raw.put(
        format!("{PREFIX}/code/{}/0001", cref.sha256),
        vec![0u8; 10],
        None,
    )
    .await
    .unwrap();
    assert!(matches!(
        s.code(&cref).await,
        Err(StoreError::Corrupt { .. })
    ));

    // Functions without code, and the size bound on code.
    let d = s.put_function("default.d", &spec, None).await.unwrap();
    assert_eq!(d.code, None);
    assert_eq!(next(&mut rx).await, Change::Put(d));
    let huge = vec![0u8; MAX_CODE_BYTES + 1];
    assert!(matches!(
        s.put_function("default.e", &spec, Some(&huge)).await,
        Err(StoreError::TooLarge { .. })
    ));
    assert!(matches!(
        s.put_function("a/b", &spec, None).await,
        Err(StoreError::Config(_))
    ));
}

fn member(name: &str) -> MemberRecord {
    MemberRecord {
        name: name.into(),
        url: format!("http://127.0.0.1:1/{name}"),
        incarnation: new_id(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_come_and_go() {
    need_etcd!();
    let etcd = cluster(1).await;
    let s = store(&etcd).await;
    let mut workers = s.watch_members(MemberKind::Worker);
    assert_eq!(next(&mut workers).await, Change::Snapshot(vec![]));

    let w1 = member("w1");
    let m1 = s.join(MemberKind::Worker, &w1, 1000).await.unwrap();
    assert!(m1.is_alive());
    assert_eq!(next(&mut workers).await, Change::Put(w1.clone()));
    let mut controllers = s.watch_members(MemberKind::Controller);
    assert_eq!(next(&mut controllers).await, Change::Snapshot(vec![]));

    // It stays while kept alive (well past its TTL).
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(m1.is_alive());
    assert!(workers.try_recv().is_err(), "no change while kept alive");

    // Leaving is seen at once.
    let t = Instant::now();
    m1.leave().await;
    assert_eq!(next(&mut workers).await, Change::Delete("w1".into()));
    eprintln!("leave seen after {:?}", t.elapsed());
    assert!(t.elapsed() < Duration::from_secs(1));

    // A member that stops keeping its lease alive (its process died) goes after its TTL.
    let w2 = member("w2");
    let endpoints = etcd.http_endpoints();
    let w2c = w2.clone();
    on_own_runtime(endpoints, |s| async move {
        let m = s.join(MemberKind::Worker, &w2c, 1000).await.unwrap();
        std::mem::forget(m);
        std::mem::forget(s);
    })
    .join()
    .unwrap();
    assert_eq!(next(&mut workers).await, Change::Put(w2.clone()));
    let t = Instant::now();
    assert_eq!(next(&mut workers).await, Change::Delete("w2".into()));
    eprintln!("a dead member (TTL 1 s) went after {:?}", t.elapsed());
    assert!(t.elapsed() < Duration::from_secs(4));

    // A member whose lease was lost (as after a freeze) comes back on its own.
    let w3 = member("w3");
    let m3 = s.join(MemberKind::Worker, &w3, 1000).await.unwrap();
    assert_eq!(next(&mut workers).await, Change::Put(w3.clone()));
    let mut raw = raw(&etcd).await;
    let kv = raw
        .get(format!("{PREFIX}/members/workers/w3"), None)
        .await
        .unwrap();
    raw.lease_revoke(kv.kvs()[0].lease()).await.unwrap();
    assert_eq!(next(&mut workers).await, Change::Delete("w3".into()));
    let t = Instant::now();
    assert_eq!(next(&mut workers).await, Change::Put(w3.clone()));
    eprintln!(
        "a member whose lease was revoked re-appeared after {:?}",
        t.elapsed()
    );
    eventually(Duration::from_secs(1), "alive again", || {
        let alive = m3.is_alive();
        async move { alive }
    })
    .await;

    // Dropping a membership revokes it too.
    drop(m3);
    assert_eq!(next(&mut workers).await, Change::Delete("w3".into()));
    assert!(controllers.try_recv().is_err(), "kinds are apart");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_three_member_cluster_survives_losing_any_one() {
    need_etcd!();
    let mut etcd = cluster(3).await;
    let a = store(&etcd).await;
    let b = store(&etcd).await;
    let mut functions = b.watch_functions();
    assert_eq!(next(&mut functions).await, Change::Snapshot(vec![]));
    let spec = serde_json::json!({"runtime": "python"});
    for down in 0..etcd.len() {
        etcd.kill(down).unwrap();
        let t = Instant::now();
        let i = inv("default.f", Some(&format!("k{down}")));
        assert_eq!(
            a.create(&i).await.unwrap(),
            Created::New,
            "member {down} down"
        );
        assert!(b
            .finish(&finished(i.clone(), AsyncState::Succeeded, "{}"))
            .await
            .unwrap());
        assert_eq!(
            a.get(&i.id).await.unwrap().unwrap().state,
            AsyncState::Succeeded
        );
        let f = a
            .put_function(&format!("default.f{down}"), &spec, Some(b"code"))
            .await
            .unwrap();
        // The watch goes on (or starts over with a snapshot) through the others.
        loop {
            match next(&mut functions).await {
                Change::Put(p) if p == f => break,
                Change::Snapshot(all) if all.contains(&f) => break,
                _ => {}
            }
        }
        eprintln!(
            "member {down} down: create, finish, put and watch took {:?}",
            t.elapsed()
        );
        assert!(
            t.elapsed() < Duration::from_secs(8),
            "a lost member costs at most a retry or two"
        );
        etcd.restart(down).unwrap();
        etcd.wait_ready().await.unwrap();
    }
    assert!(a.session_alive() && b.session_alive());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_member_reappears_on_its_own() {
    need_etcd!();
    let etcd = cluster(1).await;
    let s = store(&etcd).await;
    let mut workers = s.watch_members(MemberKind::Worker);
    assert_eq!(next(&mut workers).await, Change::Snapshot(vec![]));

    // The member lives on a runtime of its own whose thread is blocked for 3 s: every task on
    // it, the keep-alive included, stops as under SIGSTOP.
    let endpoints = etcd.http_endpoints();
    let w = member("frozen");
    let wc = w.clone();
    let (report, seen) = std::sync::mpsc::channel();
    let frozen = on_own_runtime(endpoints, |s| async move {
        let m = s.join(MemberKind::Worker, &wc, 1000).await.unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        std::thread::sleep(Duration::from_secs(3)); // frozen
        report
            .send(("alive right after the thaw", m.is_alive()))
            .unwrap();
        let t = Instant::now();
        while !m.is_alive() && t.elapsed() < Duration::from_secs(5) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        report.send(("alive again", m.is_alive())).unwrap();
        m.leave().await;
        s.close().await;
    });
    assert_eq!(next(&mut workers).await, Change::Put(w.clone()));
    let t = Instant::now();
    assert_eq!(next(&mut workers).await, Change::Delete("frozen".into()));
    eprintln!("the frozen member went after {:?}", t.elapsed());
    let t = Instant::now();
    assert_eq!(next(&mut workers).await, Change::Put(w.clone()));
    eprintln!("and came back {:?} later", t.elapsed());
    frozen.join().unwrap();
    assert_eq!(seen.recv().unwrap(), ("alive right after the thaw", false));
    assert_eq!(seen.recv().unwrap(), ("alive again", true));
    assert_eq!(next(&mut workers).await, Change::Delete("frozen".into()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connecting_to_nothing_fails_in_bounded_time() {
    need_etcd!();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let t = Instant::now();
    let got = EtcdStore::connect(&[format!("http://127.0.0.1:{port}")], PREFIX, 1000).await;
    assert!(
        matches!(got, Err(StoreError::Unavailable(_))),
        "{:?}",
        got.err()
    );
    eprintln!("connecting to nothing failed after {:?}", t.elapsed());
    assert!(t.elapsed() < Duration::from_secs(5));
    assert!(matches!(
        EtcdStore::connect(&[], PREFIX, 1000).await,
        Err(StoreError::Config(_))
    ));
}

// ---- etcd secured (issue 31): TLS, client certificates, users, sealed secrets ----

use hearth_service::store::etcd::EtcdCredentials;
use hearth_service::store::local_etcd::LocalEtcdTls;
use hearth_service::store::seal::Sealer;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};

/// A private CA, etcd's server certificate for 127.0.0.1 and a client certificate, as PEM
/// files; and a client certificate from another CA.
struct Pki {
    dir: tempfile::TempDir,
}

fn ca(name: &str) -> (rcgen::Certificate, KeyPair) {
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, format!("{name} {}", new_id()));
    let key = KeyPair::generate().unwrap();
    (ca.self_signed(&key).unwrap(), key)
}

fn leaf(sans: &[&str], cn: &str, issuer: &(rcgen::Certificate, KeyPair)) -> (String, String) {
    let mut p =
        CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
    p.distinguished_name.push(DnType::CommonName, cn);
    let key = KeyPair::generate().unwrap();
    let cert = p.signed_by(&key, &issuer.0, &issuer.1).unwrap();
    (cert.pem(), key.serialize_pem())
}

impl Pki {
    fn new() -> Pki {
        let dir = tempfile::Builder::new()
            .prefix("hearth-etcd-pki-")
            .tempdir()
            .unwrap();
        let the_ca = ca("Hearth etcd test CA");
        let other_ca = ca("Another CA");
        let w = |name: &str, text: &str| std::fs::write(dir.path().join(name), text).unwrap();
        w("ca.pem", &the_ca.0.pem());
        let (c, k) = leaf(&["127.0.0.1", "localhost"], "etcd server", &the_ca);
        w("server.pem", &c);
        w("server-key.pem", &k);
        let (c, k) = leaf(&[], "hearth-client", &the_ca);
        w("client.pem", &c);
        w("client-key.pem", &k);
        let (c, k) = leaf(&[], "hearth-client", &other_ca);
        w("rogue.pem", &c);
        w("rogue-key.pem", &k);
        Pki { dir }
    }

    fn read(&self, name: &str) -> Vec<u8> {
        std::fs::read(self.dir.path().join(name)).unwrap()
    }

    fn tls(&self) -> LocalEtcdTls {
        LocalEtcdTls {
            ca: self.dir.path().join("ca.pem"),
            cert: self.dir.path().join("server.pem"),
            key: self.dir.path().join("server-key.pem"),
            client_cert_auth: true,
        }
    }

    /// Credentials: the CA, a client certificate (`client` or `rogue`) and a user.
    fn creds(&self, cert: Option<&str>, user: Option<(&str, &str)>) -> EtcdCredentials {
        EtcdCredentials {
            ca_pem: Some(self.read("ca.pem")),
            identity: cert.map(|c| {
                (
                    self.read(&format!("{c}.pem")),
                    self.read(&format!("{c}-key.pem")),
                )
            }),
            user: user.map(|(u, p)| (u.to_string(), p.to_string())),
        }
    }
}

/// etcd over TLS with client certificates and users: `root`, `controller` (read-write on
/// the cluster's prefix) and `worker-w1` (read-write on its own member key only), the roles
/// deploy/etcd/setup-auth.sh creates.
async fn secured() -> (LocalEtcd, Pki) {
    let pki = Pki::new();
    let mut etcd = LocalEtcd::start_with(1, Some(pki.tls())).unwrap();
    etcd.set_admin_identity(pki.read("client.pem"), pki.read("client-key.pem"));
    etcd.wait_ready().await.unwrap();
    etcd.enable_auth("root-secret").await.unwrap();
    etcd.add_user(
        "controller",
        "controller-secret",
        &[("/hearth/", true, true)],
    )
    .await
    .unwrap();
    etcd.add_user(
        "worker-w1",
        "worker-secret",
        &[("/hearth/members/workers/w1", false, true)],
    )
    .await
    .unwrap();
    (etcd, pki)
}

/// A raw client with `creds` (None: it could not even connect).
async fn raw_with(
    etcd: &LocalEtcd,
    creds: &EtcdCredentials,
) -> Result<etcd_client::Client, String> {
    let endpoints = etcd.http_endpoints();
    let opts = etcd_client::ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(2))
        .with_timeout(Duration::from_secs(3));
    let opts = creds.apply(opts, &endpoints).map_err(|e| e.to_string())?;
    etcd_client::Client::connect(endpoints, Some(opts))
        .await
        .map_err(|e| e.to_string())
}

/// Whether a raw get of `key` (as a prefix) is refused.
async fn get_refused(etcd: &LocalEtcd, creds: &EtcdCredentials, key: &str) -> bool {
    let Ok(mut c) = raw_with(etcd, creds).await else {
        return true;
    };
    c.get(key, Some(etcd_client::GetOptions::new().with_prefix()))
        .await
        .is_err()
}

async fn put_refused(etcd: &LocalEtcd, creds: &EtcdCredentials, key: &str, value: &str) -> bool {
    let Ok(mut c) = raw_with(etcd, creds).await else {
        return true;
    };
    c.put(key, value, None).await.is_err()
}

fn env_spec(secret: &str) -> serde_json::Value {
    serde_json::json!({"runtime": "python3.12", "handler": "main.handler", "env": {"DB_PASSWORD": secret}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secured_etcd_refuses_strangers_and_keeps_workers_to_their_own_key() {
    need_etcd!();
    let (etcd, pki) = secured().await;

    // The controller, with its client certificate and user, works through it.
    let controller = EtcdStore::connect_with(
        &etcd.http_endpoints(),
        PREFIX,
        1000,
        &pki.creds(Some("client"), Some(("controller", "controller-secret"))),
    )
    .await
    .expect("the controller connects");
    controller
        .seal_with(Sealer::from_cluster_key(
            "hearth_cluster_test_key_0123456789",
        ))
        .unwrap();
    controller
        .put_function(
            "f",
            &env_spec("hunter2-in-env"),
            Some(b"code with API-TOKEN-31"),
        )
        .await
        .unwrap();
    let i = inv("f", Some("idem"));
    assert_eq!(controller.create(&i).await.unwrap(), Created::New);
    controller
        .put_doc(
            "keys",
            "k1",
            &serde_json::json!({"role": "admin", "namespace": "*"}),
        )
        .await
        .unwrap();

    // Strangers: no client certificate (refused at the TLS handshake), another CA's
    // certificate, plain HTTP to the TLS port, a certificate but no user, a wrong password.
    let strangers = [
        ("no certificate", pki.creds(None, None)),
        ("another CA's certificate", pki.creds(Some("rogue"), None)),
        ("a certificate but no user", pki.creds(Some("client"), None)),
        (
            "a wrong password",
            pki.creds(Some("client"), Some(("controller", "guess"))),
        ),
        (
            "the right password without a certificate",
            pki.creds(None, Some(("controller", "controller-secret"))),
        ),
    ];
    // (The same checks pass for the controller's own credentials: the refusals are theirs.)
    let controller_creds = pki.creds(Some("client"), Some(("controller", "controller-secret")));
    assert!(!get_refused(&etcd, &controller_creds, "/hearth/").await);
    assert!(!put_refused(&etcd, &controller_creds, "/hearth/scratch", "{}").await);
    for (who, creds) in &strangers {
        assert!(
            get_refused(&etcd, creds, "/hearth/").await,
            "{who} read the registry"
        );
        assert!(
            put_refused(&etcd, creds, "/hearth/docs/keys/evil", "{}").await,
            "{who} wrote a key record"
        );
    }
    let plain: Vec<String> = etcd
        .http_endpoints()
        .iter()
        .map(|e| e.replace("https://", "http://"))
        .collect();
    let plain_client = etcd_client::Client::connect(
        plain,
        Some(
            etcd_client::ConnectOptions::new()
                .with_connect_timeout(Duration::from_secs(2))
                .with_timeout(Duration::from_secs(3)),
        ),
    )
    .await;
    if let Ok(mut c) = plain_client {
        assert!(
            c.get("/hearth/", None).await.is_err(),
            "plain HTTP read etcd"
        );
    }

    // A worker's user publishes its own membership and nothing else.
    let worker_creds = pki.creds(Some("client"), Some(("worker-w1", "worker-secret")));
    let worker = EtcdStore::connect_with(&etcd.http_endpoints(), PREFIX, 1000, &worker_creds)
        .await
        .expect("a worker connects");
    let me = MemberRecord {
        name: "w1".into(),
        url: "https://10.0.0.1:7878".into(),
        incarnation: "i1".into(),
    };
    let membership = worker
        .join(MemberKind::Worker, &me, 2000)
        .await
        .expect("the worker publishes itself");
    let other = MemberRecord {
        name: "w2".into(),
        ..me.clone()
    };
    assert!(
        worker.join(MemberKind::Worker, &other, 2000).await.is_err(),
        "a worker published another worker"
    );
    for prefix in [
        "/hearth/functions/",
        "/hearth/inv/",
        "/hearth/code/",
        "/hearth/docs/",
        "/hearth/members/workers/w2",
    ] {
        assert!(
            get_refused(&etcd, &worker_creds, prefix).await,
            "a worker read {prefix}"
        );
    }
    for key in [
        "/hearth/docs/keys/evil",
        "/hearth/functions/f",
        "/hearth/members/controllers/evil",
        "/hearth/members/workers/w2",
    ] {
        assert!(
            put_refused(&etcd, &worker_creds, key, "{}").await,
            "a worker wrote {key}"
        );
    }
    // The controller sees the worker.
    let mut workers = controller.watch_members(MemberKind::Worker);
    match next(&mut workers).await {
        Change::Snapshot(m) => assert_eq!(m, vec![me.clone()]),
        other => panic!("{other:?}"),
    }
    membership.leave().await;

    // What etcd holds: no env value, no arguments, no key record in clear.
    let mut admin = etcd.admin_raw().await.unwrap();
    let all = admin
        .get(
            "/hearth/",
            Some(etcd_client::GetOptions::new().with_prefix()),
        )
        .await
        .unwrap();
    let mut seen = 0;
    for kv in all.kvs() {
        let v = String::from_utf8_lossy(kv.value());
        let k = kv.key_str().unwrap();
        assert!(
            !v.contains("hunter2-in-env"),
            "{k} holds the env value in clear"
        );
        assert!(
            !v.contains("DB_PASSWORD"),
            "{k} holds the env name in clear"
        );
        assert!(!v.contains("API-TOKEN-31"), "{k} holds the code in clear");
        assert!(
            !v.contains(r#""n":1"#) && !v.contains("eyJuIjoxfQ"),
            "{k} holds the arguments"
        );
        assert!(!v.contains("admin"), "{k} holds a key record in clear");
        if k.starts_with("/hearth/functions/")
            || k.starts_with("/hearth/inv/")
            || k.starts_with("/hearth/docs/keys/")
            || (k.starts_with("/hearth/code/") && !k.ends_with("/meta"))
        {
            assert!(v.starts_with("hearth-sealed-v1:"), "{k} is not sealed");
            seen += 1;
        }
    }
    assert_eq!(
        seen, 4,
        "the function, its code, the invocation and the key record"
    );
    // ...and the controller reads them back.
    assert_eq!(controller.get(&i.id).await.unwrap().unwrap(), i);
    let mut functions = controller.watch_functions();
    match next(&mut functions).await {
        Change::Snapshot(f) => {
            assert_eq!(f[0].spec["env"]["DB_PASSWORD"], "hunter2-in-env");
            assert_eq!(
                controller.code(f[0].code.as_ref().unwrap()).await.unwrap(),
                b"code with API-TOKEN-31"
            );
        }
        other => panic!("{other:?}"),
    }
    controller.close().await;
    worker.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_sealed_with_another_cluster_key_are_an_error_naming_the_cause() {
    need_etcd!();
    let etcd = cluster(1).await;
    let ours = store(&etcd).await;
    ours.seal_with(Sealer::from_cluster_key(
        "hearth_cluster_key_one_0123456789",
    ))
    .unwrap();
    assert!(ours.seal_with(Sealer::from_cluster_key("again")).is_err());
    let i = inv("f", None);
    ours.create(&i).await.unwrap();
    ours.put_function("f", &env_spec("s3cret"), None)
        .await
        .unwrap();
    ours.put_function("g", &env_spec("s3cret"), None)
        .await
        .unwrap();

    let theirs = store(&etcd).await;
    theirs
        .seal_with(Sealer::from_cluster_key(
            "hearth_cluster_key_two_0123456789",
        ))
        .unwrap();
    let e = theirs.get(&i.id).await.unwrap_err().to_string();
    assert!(e.contains("another cluster key"), "{e}");
    assert!(!e.contains("s3cret"));
    // Unreadable function records are skipped, not served as garbage.
    let mut f = theirs.watch_functions();
    assert_eq!(next(&mut f).await, Change::Snapshot(vec![]));

    // Without any key a sealed record is an error too; a clear record under a sealing store
    // (written by something that is not a controller of this cluster) is refused.
    let keyless = store(&etcd).await;
    let e = keyless.get(&i.id).await.unwrap_err().to_string();
    assert!(e.contains("no cluster key"), "{e}");
    let j = inv("f", None);
    keyless.create(&j).await.unwrap();
    let e = ours.get(&j.id).await.unwrap_err().to_string();
    assert!(e.contains("not sealed"), "{e}");

    // A sealed record moved to another key does not open.
    let mut c = raw(&etcd).await;
    let f_value = c.get("/hearth/functions/f", None).await.unwrap().kvs()[0]
        .value()
        .to_vec();
    c.put("/hearth/functions/g", f_value, None).await.unwrap();
    let mut f = ours.watch_functions();
    match next(&mut f).await {
        Change::Snapshot(fs) => {
            assert_eq!(fs.iter().map(|f| f.key.as_str()).collect::<Vec<_>>(), ["f"])
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_an_older_version_wrote_in_clear_are_sealed_at_upgrade() {
    need_etcd!();
    let etcd = cluster(1).await;
    // An older controller: everything in clear.
    let old = store(&etcd).await.with_retention(Duration::from_secs(60));
    let old_code = old
        .put_function("f", &env_spec("old-secret"), Some(b"code"))
        .await
        .unwrap()
        .code
        .unwrap();
    let running = inv("f", Some("k"));
    old.create(&running).await.unwrap();
    let mut finished = inv("f", None);
    old.create(&finished).await.unwrap();
    finished.state = AsyncState::Succeeded;
    finished.answer = Some("old-answer".into());
    finished.finished_unix_ms = Some(unix_ms());
    assert!(old.finish(&finished).await.unwrap());
    old.put_doc("keys", "k1", &serde_json::json!({"role": "admin"}))
        .await
        .unwrap();
    old.put_doc("config", "balance", &serde_json::json!({"balance": "ch"}))
        .await
        .unwrap();
    let lease_before = raw(&etcd)
        .await
        .get(format!("/hearth/inv/{}", finished.id), None)
        .await
        .unwrap()
        .kvs()[0]
        .lease();
    assert_ne!(lease_before, 0);

    // The upgraded controller seals them, and reads them back.
    let new = store(&etcd).await;
    new.seal_with(Sealer::from_cluster_key(
        "hearth_cluster_upgrade_key_0123456789",
    ))
    .unwrap();
    // The function, its code chunk, two invocations, the key record.
    // Code an older version wrote in clear is read as it is (its SHA-256 checks it)...
    assert_eq!(new.code(&old_code).await.unwrap(), b"code");
    // ...and sealed with the rest: the function, its code chunk, two invocations, a key.
    assert_eq!(new.seal_clear_records().await.unwrap(), 5);
    assert_eq!(new.seal_clear_records().await.unwrap(), 0, "once");
    let mut c = raw(&etcd).await;
    let all = c
        .get(
            "/hearth/",
            Some(etcd_client::GetOptions::new().with_prefix()),
        )
        .await
        .unwrap();
    for kv in all.kvs() {
        let v = String::from_utf8_lossy(kv.value());
        assert!(
            !v.contains("old-secret") && !v.contains("old-answer"),
            "{:?}",
            kv.key_str()
        );
    }
    let sealed_inv = c
        .get(format!("/hearth/inv/{}", finished.id), None)
        .await
        .unwrap();
    assert_eq!(
        sealed_inv.kvs()[0].lease(),
        lease_before,
        "its retention lease is kept"
    );
    let cfg = c.get("/hearth/docs/config/balance", None).await.unwrap();
    assert!(
        cfg.kvs()[0].value().starts_with(b"{"),
        "the settings stay in clear"
    );
    assert_eq!(new.get(&running.id).await.unwrap().unwrap(), running);
    assert_eq!(new.get(&finished.id).await.unwrap().unwrap(), finished);
    let mut f = new.watch_functions();
    match next(&mut f).await {
        Change::Snapshot(fs) => {
            assert_eq!(fs[0].spec["env"]["DB_PASSWORD"], "old-secret");
            assert_eq!(
                new.code(fs[0].code.as_ref().unwrap()).await.unwrap(),
                b"code"
            );
        }
        other => panic!("{other:?}"),
    }
    let mut docs = new.watch_docs("keys");
    match next(&mut docs).await {
        Change::Snapshot(d) => assert_eq!(d[0].value["role"], "admin"),
        other => panic!("{other:?}"),
    }
}

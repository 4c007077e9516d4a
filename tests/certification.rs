//! Writes through two servers at once: on a Galera cluster, two nodes of it (a node certifies
//! a transaction by its primary key and its unique keys, and fails one of two that share a
//! key); on one server, two connections (row locks referee). Writes of different jobs must
//! not meet; two claims on the same thing (a slot of a concurrency key, a live unique key)
//! must, every time: never a second holder.
//!
//! Each race runs many rounds, half of them with both sides writing and committing at the same
//! moment, half with one side's transaction held open while the other commits (see
//! [`Timing`]).

use crate::common;
use crate::common::TestDb;
use myjob::store::jobs::admin::{self, Refused};
use myjob::store::jobs::keys::{self, Referee};
use myjob::store::jobs::JobId;
use mysql_async::prelude::*;
use mysql_async::{Conn, Opts, Params, Value};
use tokio::sync::Barrier;

/// Rounds of each race: the bar is 100 without a second holder.
const ROUNDS: usize = 100;

/// A connection through node `i` of the cluster (the one server otherwise). On a Galera node
/// its reads wait for the node to have applied what the cluster committed before them, so
/// that a race starts from rows every node has.
async fn through(db: &TestDb, i: usize) -> Conn {
    let mut conn = Conn::new(Opts::from_url(&db.node_url(i)).unwrap())
        .await
        .unwrap();
    // MySQL has no such variable (1193): nothing to wait for on one server.
    let _ = conn.query_drop("SET SESSION wsrep_sync_wait = 1").await;
    conn
}

/// How many rows of `myjob_jobs` match `where_`, read on `conn` (one of [`through`]'s: on a
/// Galera node, after the other node's commits).
async fn count_on(conn: &mut Conn, where_: &str) -> u64 {
    conn.query_first(format!("SELECT COUNT(*) FROM myjob_jobs WHERE {where_}"))
        .await
        .unwrap()
        .unwrap()
}

/// What one side of a race ended with: committed, or the server's error.
type Side = Result<(), String>;

/// What one side of a race does.
enum Move {
    /// These statements (each with its parameters) in one transaction.
    Statements(Vec<(String, Vec<Value>)>),
    /// `myjob retry` of this failed job, through the library's own transition.
    Retry(u64),
    /// The library's admission of the next blocked job of this key of queue `keyed` into
    /// slot 1, refereed as the server says.
    HandOff(Vec<u8>, Referee),
}

/// When the two sides of a race commit.
#[derive(Debug, Clone, Copy)]
enum Timing {
    /// Both write, then both commit, at the same moment.
    Together,
    /// The first side writes and holds its transaction open while the second writes and
    /// commits; then the first commits. On a cluster the second's write set reaches the first
    /// one's node while it is still open: with the indexes alone, both admissions into one
    /// slot committed once in two such races.
    SecondCommitsFirst,
}

impl Timing {
    /// Half the rounds each way.
    fn of_round(r: usize) -> Timing {
        match r % 2 {
            0 => Timing::Together,
            _ => Timing::SecondCommitsFirst,
        }
    }
}

/// BEGIN and `statements` (each with its parameters) on `conn`; on an error, rolls back.
async fn write(conn: &mut Conn, statements: Vec<(String, Vec<Value>)>) -> Side {
    let mut result = conn.query_drop("BEGIN").await;
    for (sql, params) in statements {
        if result.is_err() {
            break;
        }
        result = conn.exec_drop(sql, Params::Positional(params)).await;
    }
    if result.is_err() {
        let _ = conn.query_drop("ROLLBACK").await;
    }
    result.map_err(|e| e.to_string())
}

/// COMMIT on `conn`; on an error, rolls back.
async fn commit(conn: &mut Conn) -> Side {
    let result = conn.query_drop("COMMIT").await;
    if result.is_err() {
        let _ = conn.query_drop("ROLLBACK").await;
    }
    result.map_err(|e| e.to_string())
}

/// Does `mv` on `conn`, whole; returns how it ended.
async fn run(conn: &mut Conn, mv: Move) -> Side {
    match mv {
        Move::Statements(statements) => {
            write(conn, statements).await?;
            commit(conn).await
        }
        Move::Retry(id) => match admin::retry(conn, &[JobId::new(id)]).await {
            Ok(Ok(1)) => Ok(()),
            Ok(Ok(n)) => Err(format!("retried {n} jobs")),
            // The key taken by the other side, as its check saw it: a loss to the other.
            Ok(Err(refused @ Refused::UniqueKey { .. })) => Err(format!("1062 ({refused:?})")),
            Ok(Err(refused)) => Err(format!("refused: {refused:?}")),
            Err(e) => Err(format!("{e:#}")),
        },
        Move::HandOff(key, referee) => {
            match keys::hand_off(conn, "keyed", &key, 1, referee).await {
                Ok(true) => Ok(()),
                // hand_off says a race lost to another admission (1062, 1213 or 1205) thus.
                Ok(false) => Err("1062 (the hand-off lost its race)".to_owned()),
                Err(e) => Err(format!("{e:#}")),
            }
        }
    }
}

/// Runs one race, side a through node 0 and side b through node 1, timed by `timing`. With
/// [`Timing::SecondCommitsFirst`], side a's move is statements.
async fn race(
    a: &mut Conn,
    b: &mut Conn,
    a_move: Move,
    b_move: Move,
    timing: Timing,
) -> (Side, Side) {
    match timing {
        Timing::Together => {
            let barrier = Barrier::new(2);
            tokio::join!(
                async {
                    barrier.wait().await;
                    run(a, a_move).await
                },
                async {
                    barrier.wait().await;
                    run(b, b_move).await
                }
            )
        }
        Timing::SecondCommitsFirst => {
            let Move::Statements(statements) = a_move else {
                panic!("the first side of a staggered race writes statements");
            };
            let (wrote, go) = tokio::sync::oneshot::channel::<()>();
            let (ra, (rb, b_done)) = tokio::join!(
                async {
                    let written = write(a, statements).await;
                    let _ = wrote.send(());
                    written?;
                    // Time for the other side to commit, and its write set to reach this
                    // node; on one server it waits for this side's locks instead.
                    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
                    let committing = std::time::Instant::now();
                    commit(a).await.map(|()| committing)
                },
                async {
                    let _ = go.await;
                    let side = run(b, b_move).await;
                    (side, std::time::Instant::now())
                }
            );
            // On a cluster the round is the race it claims only if the second side was done
            // before the first committed; on one server it waits for the first's locks.
            if let Ok(committing) = ra {
                if common::nodes().len() > 1 {
                    assert!(
                        b_done < committing,
                        "the second side was not done in 300 ms"
                    );
                }
            }
            (ra.map(|_| ()), rb)
        }
    }
}

/// Round `r` of a race (timed by [`Timing::of_round`]), each side's loss checked to be to the
/// other (`what` names the sides in a failure).
async fn round(
    conns: (&mut Conn, &mut Conn),
    moves: (Move, Move),
    r: usize,
    what: [&str; 2],
) -> (Side, Side) {
    let (ra, rb) = race(conns.0, conns.1, moves.0, moves.1, Timing::of_round(r)).await;
    assert_lost_to_the_other(&ra, what[0]);
    assert_lost_to_the_other(&rb, what[1]);
    (ra, rb)
}

/// A lost side must have lost to the other: a duplicate (1062) on one server, a deadlock
/// (1213, Galera's word for a failed certification) on a cluster.
fn assert_lost_to_the_other(side: &Side, what: &str) {
    if let Err(e) = side {
        assert!(
            e.contains("1062") || e.contains("1213"),
            "{what}: a side failed for another reason: {e}"
        );
    }
}

/// Two writers, one through each node, each in 1,000 transactions of its own jobs of one queue:
/// a producer's INSERT of a plain job and of a job with a unique key of its own, and the end
/// of a job it claimed. No two of these writes are about the same job, key or slot, so none
/// may fail: on the old indexes over `(queue, NULL)` a Galera cluster failed 15 to 60 % of
/// them.
#[tokio::test(flavor = "multi_thread")]
async fn writes_of_different_jobs_through_two_nodes_never_conflict() {
    const TRANSACTIONS: usize = 1000;
    let db = TestDb::new("cert_writers").await;
    // Each writer's jobs to end: claimed, as a claim leaves them.
    db.insert_rows(
        "(queue, payload, status, batch_id, attempts, claimed_at)",
        "('q', 'x', 'claimed', 7, 1, NOW(6))",
        2 * TRANSACTIONS,
    )
    .await;
    let ids: Vec<u64> = db
        .conn()
        .await
        .query("SELECT id FROM myjob_jobs ORDER BY id")
        .await
        .unwrap();
    let mut writers = Vec::new();
    for w in 0..2 {
        let mut conn = through(&db, w).await;
        let mine: Vec<u64> = ids.iter().copied().skip(w).step_by(2).collect();
        let _: Vec<u64> = conn
            .query("SELECT id FROM myjob_jobs ORDER BY id")
            .await
            .unwrap();
        writers.push(tokio::spawn(async move {
            let mut lost = Vec::new();
            for (t, id) in mine.into_iter().enumerate() {
                let run = async {
                    conn.query_drop("BEGIN").await?;
                    conn.exec_drop(
                        "INSERT INTO myjob_jobs (queue, payload) VALUES ('q', 'new')",
                        (),
                    )
                    .await?;
                    conn.exec_drop(
                        "INSERT INTO myjob_jobs (queue, payload, unique_key) VALUES ('q', 'u', ?)",
                        (format!("w{w}-{t}"),),
                    )
                    .await?;
                    conn.exec_drop(
                        "UPDATE myjob_jobs SET status = 'done', finished_at = NOW(6) \
                         WHERE id = ? AND batch_id = 7 AND status = 'claimed'",
                        (id,),
                    )
                    .await?;
                    conn.query_drop("COMMIT").await
                };
                if let Err(e) = run.await {
                    let _ = conn.query_drop("ROLLBACK").await;
                    lost.push(e.to_string());
                }
            }
            lost
        }));
    }
    let mut lost = Vec::new();
    for w in writers {
        lost.extend(w.await.unwrap());
    }
    eprintln!(
        "{} of {} transactions of two writers lost: {:?}",
        lost.len(),
        2 * TRANSACTIONS,
        lost.iter().take(3).collect::<Vec<_>>()
    );
    assert!(lost.is_empty(), "{} transactions lost", lost.len());
    // Read after both writers' commits, whichever node they went through.
    let mut check = through(&db, 0).await;
    let all = 2 * TRANSACTIONS as u64;
    assert_eq!(count_on(&mut check, "status = 'done'").await, all);
    assert_eq!(count_on(&mut check, "payload = 'new'").await, all);
    assert_eq!(count_on(&mut check, "unique_key LIKE 'w%'").await, all);
}

/// Two admissions into slot 1 of one key, one through each node, at the same moment, a hundred
/// times (a fresh key each round): the library's hand-off of the key's first blocked job on
/// one side, the same writes of its second job on the other. Exactly one commits, and the
/// slot has one holder.
#[tokio::test(flavor = "multi_thread")]
async fn two_admissions_into_one_slot_leave_one_holder_every_time() {
    let db = TestDb::new("cert_slots").await;
    // Two jobs of each key k0..k99, blocked.
    db.insert_keyed(2 * ROUNDS, ROUNDS).await;
    let mut a = through(&db, 0).await;
    let mut b = through(&db, 1).await;
    let referee = Referee::of(&myjob::db::ServerId::of(&mut b).await.unwrap());
    let mut wins = [0, 0];
    for r in 0..ROUNDS {
        let key = format!("k{r}");
        let second: u64 = a
            .exec_first(
                "SELECT MAX(id) FROM myjob_jobs WHERE concurrency_key = ?",
                (key.as_bytes(),),
            )
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            count_on(&mut b, &format!("concurrency_key = '{key}'")).await,
            2
        );
        // What keys::hand_off writes, of a job chosen here: the job, then (on a cluster) the
        // slot's anchor.
        let mut statements = vec![(
            "UPDATE myjob_jobs SET status = 'pending', slot = 1 \
             WHERE id = ? AND status = 'blocked'"
                .to_owned(),
            vec![second.into()],
        )];
        if referee == Referee::Certification {
            statements.push((
                keys::ANCHOR.to_owned(),
                vec!["keyed".into(), key.as_bytes().into(), 1u16.into()],
            ));
        }
        let (ra, rb) = round(
            (&mut a, &mut b),
            (
                Move::Statements(statements),
                Move::HandOff(key.clone().into_bytes(), referee),
            ),
            r,
            ["the admission", "the hand-off"],
        )
        .await;
        let holders = count_on(
            &mut a,
            &format!("concurrency_key = '{key}' AND status = 'pending' AND slot = 1"),
        )
        .await;
        assert_eq!(holders, 1, "round {r}: slot 1 of {key} ({ra:?}, {rb:?})");
        assert!(
            ra.is_ok() != rb.is_ok(),
            "round {r}: exactly one admission commits ({ra:?}, {rb:?})"
        );
        wins[usize::from(rb.is_ok())] += 1;
    }
    eprintln!(
        "{ROUNDS} slot races: the admission won {}, the hand-off {}",
        wins[0], wins[1]
    );
}

/// A unique key raced through two nodes, a hundred rounds of each (a fresh key each round):
/// two producers' INSERTs; a producer's INSERT against an operator's retry of a failed job
/// with the key; and two retries of two failed jobs with the key. Each round leaves one live
/// job with the key, and in the races of two inserts, exactly one committed. The held-open
/// side of a staggered round is the retry's own statement where there is a retry.
#[tokio::test(flavor = "multi_thread")]
async fn a_unique_key_raced_through_two_nodes_stays_unique_every_time() {
    let db = TestDb::new("cert_unique").await;
    let mut a = through(&db, 0).await;
    let mut b = through(&db, 1).await;
    const INSERT: &str = "INSERT INTO myjob_jobs (queue, payload, unique_key) VALUES ('q', ?, ?)";
    let insert = |who: &str, key: &str| {
        Move::Statements(vec![(INSERT.to_owned(), vec![who.into(), key.into()])])
    };
    let live = "AND status NOT IN ('done', 'failed', 'cancelled')";
    for r in 0..ROUNDS {
        let key = format!("u{r}");
        let (ra, rb) = round(
            (&mut a, &mut b),
            (insert("a", &key), insert("b", &key)),
            r,
            ["the first insert", "the second insert"],
        )
        .await;
        let n = count_on(&mut a, &format!("unique_key = '{key}'")).await;
        assert_eq!(n, 1, "round {r}: {n} jobs with key {key} ({ra:?}, {rb:?})");
        assert!(ra.is_ok() != rb.is_ok(), "round {r}: {ra:?}, {rb:?}");
    }
    // A retry's move: held open as its own statement when the round is staggered.
    let retry = |id: u64, r: usize| match Timing::of_round(r) {
        Timing::Together => Move::Retry(id),
        Timing::SecondCommitsFirst => Move::Statements(vec![admin::to_pending_statement(
            &[JobId::new(id)],
            "UPDATE",
        )]),
    };
    for r in 0..2 * ROUNDS {
        let key = format!("r{r}");
        let failed = |n: &str| {
            format!(
                "INSERT INTO myjob_jobs (queue, payload, unique_key, status, finished_at) \
                 VALUES ('q', '{n}', '{key}', 'failed', NOW(6))"
            )
        };
        let first = db.insert_sql(&failed("old")).await;
        let moves = if r < ROUNDS {
            (retry(first, r), insert("new", &key))
        } else {
            let second = db.insert_sql(&failed("older")).await;
            (retry(first, r), Move::Retry(second))
        };
        assert!(count_on(&mut b, &format!("unique_key = '{key}'")).await >= 1);
        let (ra, rb) = round((&mut a, &mut b), moves, r, ["the retry", "the other"]).await;
        let n = count_on(&mut a, &format!("unique_key = '{key}' {live}")).await;
        assert!(
            n <= 1,
            "round {r}: {n} live jobs with key {key} ({ra:?}, {rb:?})"
        );
        assert!(
            ra.is_ok() || rb.is_ok(),
            "round {r}: neither won ({ra:?}, {rb:?})"
        );
    }
}

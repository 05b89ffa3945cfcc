//! The conditional-update recipe on SQLite, run with the exact SQL that `latchkey_fence::sql`
//! ships, including the lost update it prevents.

use latchkey_fence::sql::{
    classify_no_row, token_to_sql, FencedWrite, FENCED_INSERT, FENCED_UPDATE, READ_FENCE,
    SQLITE_CREATE_TABLE,
};
use rusqlite::{named_params, Connection, OptionalExtension, TransactionBehavior};

/// The recipe as an application would write it: update, and if no row changed, read the fence
/// in the same transaction to say why.
fn fenced_update(conn: &mut Connection, id: &str, value: &str, token: u64) -> FencedWrite {
    let sql_token = token_to_sql(token).expect("token fits in SQL");
    // IMMEDIATE takes the write lock up front, so the read below sees what the update saw.
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .expect("begin");
    let changed = tx
        .execute(
            FENCED_UPDATE,
            named_params! { ":id": id, ":value": value, ":token": sql_token },
        )
        .expect("update");
    let outcome = if changed == 1 {
        FencedWrite::Applied
    } else {
        let fence: Option<i64> = tx
            .query_row(READ_FENCE, named_params! { ":id": id }, |row| row.get(0))
            .optional()
            .expect("read fence");
        classify_no_row(token, fence)
    };
    tx.commit().expect("commit");
    outcome
}

/// Create-or-update, fenced: the upsert changes no row when the token is stale.
fn fenced_upsert(conn: &Connection, id: &str, value: &str, token: u64) -> bool {
    let changed = conn
        .execute(
            FENCED_INSERT,
            named_params! { ":id": id, ":value": value, ":token": token_to_sql(token).expect("fits") },
        )
        .expect("upsert");
    changed == 1
}

fn open() -> Connection {
    let conn = Connection::open_in_memory().expect("sqlite");
    conn.execute(SQLITE_CREATE_TABLE, []).expect("create table");
    conn
}

fn read(conn: &Connection, id: &str) -> (String, i64) {
    conn.query_row(
        "SELECT value, fence FROM fenced_kv WHERE id = ?1",
        [id],
        |row| Ok((row.get(0)?, row.get(1)?)),
    )
    .expect("row exists")
}

#[test]
fn a_paused_old_holder_cannot_overwrite_the_new_holders_write() {
    let mut conn = open();
    assert!(fenced_upsert(&conn, "balance", "100", 1));

    // Holder A got token 2, read the balance, then paused past its lease.
    let a_token = 2;
    // Holder B got the lock with token 3 and wrote.
    assert_eq!(
        fenced_update(&mut conn, "balance", "150", 3),
        FencedWrite::Applied
    );
    // A resumes and writes what it computed from the old value: the lost update.
    assert_eq!(
        fenced_update(&mut conn, "balance", "120", a_token),
        FencedWrite::Stale { highest: 3 }
    );
    assert_eq!(
        read(&conn, "balance"),
        ("150".to_owned(), 3),
        "B's write is kept"
    );

    // Without the fence condition the same late write would have gone through.
    conn.execute(
        "UPDATE fenced_kv SET value = '120' WHERE id = 'balance'",
        [],
    )
    .expect("unfenced update");
    assert_eq!(
        read(&conn, "balance").0,
        "120",
        "the unfenced write loses B's update"
    );
}

#[test]
fn equal_token_is_accepted_and_lower_rejected() {
    let mut conn = open();
    assert!(fenced_upsert(&conn, "k", "v1", 5));
    assert_eq!(fenced_update(&mut conn, "k", "v2", 5), FencedWrite::Applied);
    assert_eq!(
        fenced_update(&mut conn, "k", "v3", 4),
        FencedWrite::Stale { highest: 5 }
    );
    assert_eq!(fenced_update(&mut conn, "k", "v4", 6), FencedWrite::Applied);
    assert_eq!(read(&conn, "k"), ("v4".to_owned(), 6));
}

#[test]
fn a_missing_row_is_told_apart_from_a_stale_token() {
    let mut conn = open();
    assert_eq!(
        fenced_update(&mut conn, "nope", "v", 1),
        FencedWrite::Missing
    );
    assert!(
        fenced_upsert(&conn, "nope", "v", 1),
        "creating it is fenced too"
    );
    assert_eq!(read(&conn, "nope"), ("v".to_owned(), 1));
}

#[test]
fn the_fenced_upsert_does_not_overwrite_a_newer_row() {
    let conn = open();
    assert!(fenced_upsert(&conn, "k", "new", 9));
    assert!(!fenced_upsert(&conn, "k", "stale", 8));
    assert_eq!(read(&conn, "k"), ("new".to_owned(), 9));
    assert!(fenced_upsert(&conn, "k", "same holder", 9));
    assert_eq!(read(&conn, "k"), ("same holder".to_owned(), 9));
}

#[test]
fn the_largest_tokens_keep_their_order_in_sql() {
    let mut conn = open();
    let big = i64::MAX as u64;
    assert!(fenced_upsert(&conn, "k", "v", big - 1));
    assert_eq!(
        fenced_update(&mut conn, "k", "w", big),
        FencedWrite::Applied
    );
    assert_eq!(
        fenced_update(&mut conn, "k", "x", big - 1),
        FencedWrite::Stale { highest: big }
    );
    assert!(
        token_to_sql(big + 1).is_err(),
        "would wrap negative and compare lower"
    );
}

//! The conditional-update recipe: keep the fencing token in the row it protects.
//!
//! When the resource is a database, it can do the check itself, atomically with the write, and
//! no gate is needed: each fenced row carries a `fence` column holding the token of its last
//! writer, and every write is
//!
//! ```sql
//! UPDATE fenced_kv SET value = :value, fence = :token WHERE id = :id AND fence <= :token
//! ```
//!
//! One row updated: the write is applied. No row updated means one of two things, told apart
//! by reading the row (in the same transaction, so the answer matches the update):
//! - the row is missing: create it with [`FENCED_INSERT`], which is itself fenced (an upsert
//!   that only overwrites a row whose fence is not higher), or report "not found";
//! - the row's fence is higher: the token is stale, a newer holder has written; stop, do not
//!   retry with the same token.
//!
//! Never delete a fenced row: its fence would go with it, and a stale holder could re-create
//! it. Mark it deleted (a tombstone column) and keep the fence.
//!
//! SQLite and PostgreSQL store at most a signed 64-bit integer, so a token above `i64::MAX` is
//! refused by [`token_to_sql`] rather than wrapped into a negative number that would compare
//! lower. The statements below use SQLite's `:name` parameters; `docs/fencing.md` has the
//! PostgreSQL spelling. `tests/sql_recipe.rs` runs them against SQLite.

/// The example table: any table works, given a `fence` column that is never null.
pub const SQLITE_CREATE_TABLE: &str = "CREATE TABLE IF NOT EXISTS fenced_kv (
    id    TEXT PRIMARY KEY,
    value TEXT NOT NULL,
    fence INTEGER NOT NULL
)";

/// The fenced write. Parameters `:id`, `:value`, `:token`.
pub const FENCED_UPDATE: &str =
    "UPDATE fenced_kv SET value = :value, fence = :token WHERE id = :id AND fence <= :token";

/// Read after an update that changed no row, to tell a missing row from a stale token.
pub const READ_FENCE: &str = "SELECT fence FROM fenced_kv WHERE id = :id";

/// Create-or-update, fenced: inserts a missing row, and overwrites an existing one only if its
/// fence is not higher. Changes no row when the token is stale.
pub const FENCED_INSERT: &str =
    "INSERT INTO fenced_kv (id, value, fence) VALUES (:id, :value, :token)
    ON CONFLICT (id) DO UPDATE SET value = excluded.value, fence = excluded.fence
    WHERE fenced_kv.fence <= excluded.fence";

/// What a fenced write did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FencedWrite {
    /// The row was written.
    Applied,
    /// The row's fence is higher: the writer's token is stale.
    Stale { highest: u64 },
    /// There is no row with this id.
    Missing,
    /// The update changed nothing yet the row now allows the token: another transaction changed
    /// the row between the two statements. Run both in one transaction (as the test does), or
    /// retry.
    Raced,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("fencing token {0} is larger than the largest SQL integer ({max})", max = i64::MAX)]
pub struct TokenOutOfRange(pub u64);

/// The token as an SQL integer; refused rather than wrapped if it does not fit.
pub fn token_to_sql(token: u64) -> Result<i64, TokenOutOfRange> {
    i64::try_from(token).map_err(|_| TokenOutOfRange(token))
}

/// Reads the answer of [`READ_FENCE`] after [`FENCED_UPDATE`] changed no row.
pub fn classify_no_row(token: u64, current_fence: Option<i64>) -> FencedWrite {
    match current_fence {
        None => FencedWrite::Missing,
        Some(fence) => match u64::try_from(fence) {
            Ok(highest) if highest > token => FencedWrite::Stale { highest },
            _ => FencedWrite::Raced,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_row_is_missing_higher_fence_is_stale_else_raced() {
        assert_eq!(classify_no_row(5, None), FencedWrite::Missing);
        assert_eq!(
            classify_no_row(5, Some(7)),
            FencedWrite::Stale { highest: 7 }
        );
        assert_eq!(classify_no_row(5, Some(5)), FencedWrite::Raced);
        assert_eq!(classify_no_row(5, Some(-1)), FencedWrite::Raced);
    }

    #[test]
    fn tokens_beyond_i64_are_refused_not_wrapped() {
        assert_eq!(token_to_sql(7), Ok(7));
        assert_eq!(token_to_sql(i64::MAX as u64), Ok(i64::MAX));
        assert_eq!(
            token_to_sql(i64::MAX as u64 + 1),
            Err(TokenOutOfRange(i64::MAX as u64 + 1))
        );
    }
}

//! How a fencing token travels from the lock holder to the resource.
//!
//! - `latchkey lock NAME -- CMD` runs `CMD` with [`LOCK_ENV`] and [`TOKEN_ENV`] set.
//! - Over HTTP the holder sends them as the [`LOCK_HEADER`] and [`TOKEN_HEADER`] request
//!   headers; a fenced service answers a stale token with `409 Conflict` and the highest token
//!   it has admitted in [`HIGHEST_HEADER`].
//!
//! The token is a plain decimal `u64`, so it reads the same in a shell, a header and SQL.

/// Request header naming the lock the write is made under.
pub const LOCK_HEADER: &str = "latchkey-lock";
/// Request header carrying the fencing token, decimal.
pub const TOKEN_HEADER: &str = "latchkey-token";
/// Response header of a rejection: the highest token the resource has admitted for the lock.
pub const HIGHEST_HEADER: &str = "latchkey-highest";
/// Environment variable with the lock name, set for the child of `latchkey lock`.
pub const LOCK_ENV: &str = "LATCHKEY_LOCK";
/// Environment variable with the fencing token, set for the child of `latchkey lock`.
pub const TOKEN_ENV: &str = "LATCHKEY_TOKEN";

/// Longest decimal `u64` (18446744073709551615).
const TOKEN_DIGITS_MAX: usize = 20;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenParseError {
    #[error("fencing token is empty")]
    Empty,
    #[error("fencing token {0:?} is not a decimal number")]
    NotDecimal(String),
    #[error("fencing token {0:?} does not fit in 64 bits")]
    TooLarge(String),
}

/// Parses a token as sent in [`TOKEN_HEADER`] or [`TOKEN_ENV`]: decimal digits only, with
/// surrounding spaces or tabs ignored (HTTP allows them around a header value). Signs,
/// underscores and hex are refused so that every party reads the same number.
pub fn parse_token(value: &str) -> Result<u64, TokenParseError> {
    let digits = value.trim_matches(|c| c == ' ' || c == '\t');
    if digits.is_empty() {
        return Err(TokenParseError::Empty);
    }
    // Bounded before anything else so an error never echoes a huge input back.
    let shown = || {
        digits
            .chars()
            .take(TOKEN_DIGITS_MAX + 4)
            .collect::<String>()
    };
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(TokenParseError::NotDecimal(shown()));
    }
    digits
        .parse::<u64>()
        .map_err(|_| TokenParseError::TooLarge(shown()))
}

/// The value to send in [`TOKEN_HEADER`].
pub fn format_token(token: u64) -> String {
    token.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_plain_decimal_and_round_trips() {
        assert_eq!(parse_token("42"), Ok(42));
        assert_eq!(parse_token(" 42\t"), Ok(42));
        assert_eq!(parse_token(&format_token(u64::MAX)), Ok(u64::MAX));
    }

    #[test]
    fn refuses_anything_else() {
        assert_eq!(parse_token(""), Err(TokenParseError::Empty));
        assert_eq!(parse_token("  "), Err(TokenParseError::Empty));
        for bad in ["+5", "-5", "0x10", "1_000", "4 2", "٣"] {
            assert!(
                matches!(parse_token(bad), Err(TokenParseError::NotDecimal(_))),
                "{bad}"
            );
        }
        assert!(matches!(
            parse_token("18446744073709551616"),
            Err(TokenParseError::TooLarge(_))
        ));
    }
}

//! Durations on the command line: `250ms`, `1.5s`, `1m30s`, `2h`, or a bare `0`.
//!
//! Parsed by humantime, the maintained parser of the same `1h 30m` format systemd and many Rust
//! tools use (it also takes days and weeks, harmless here: a TTL is bounded below, and a wait of
//! a week is a wait). A bare number other than `0` stays refused, as before: `--wait 5` is
//! ambiguous (seconds? milliseconds?).

use std::time::Duration;

use latchkey_core::limits::{SESSION_TTL_MS_MAX, SESSION_TTL_MS_MIN};

/// Parses a humantime duration (`500ms`, `1.5s`, `1m30s`, `2h`); a bare `0` is zero.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    humantime::parse_duration(text)
        .map_err(|e| format!("{text:?}: {e}; write e.g. 250ms, 1.5s, 1m30s or 2h"))
}

/// A session TTL: a duration within the server's limits (1 s to 1 h).
pub fn parse_ttl(text: &str) -> Result<Duration, String> {
    let ttl = parse_duration(text)?;
    let ms = ttl.as_millis();
    if ms < u128::from(SESSION_TTL_MS_MIN) || ms > u128::from(SESSION_TTL_MS_MAX) {
        return Err(format!(
            "{text:?} is outside the allowed TTL range {}s..={}s",
            SESSION_TTL_MS_MIN / 1000,
            SESSION_TTL_MS_MAX / 1000
        ));
    }
    Ok(ttl)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_documented_forms() {
        let ms = Duration::from_millis;
        let cases = [
            // What the hand-written parser took before humantime.
            ("0", ms(0)),
            ("0s", ms(0)),
            ("500ms", ms(500)),
            ("15s", ms(15_000)),
            ("2m", ms(120_000)),
            ("1h", ms(3_600_000)),
            (" 200ms ", ms(200)),
            // New with humantime (issue #14).
            ("1.5s", ms(1_500)),
            ("1m30s", ms(90_000)),
            ("250ms", ms(250)),
            ("1h 30m", ms(5_400_000)),
        ];
        for (text, want) in cases {
            assert_eq!(parse_duration(text), Ok(want), "{text}");
        }
    }

    #[test]
    fn rejects_what_it_does_not_understand() {
        for text in ["", "15", "s", "-1s", "5 parsecs", "99999999999999999999s"] {
            let e = parse_duration(text).unwrap_err();
            assert!(e.contains("write e.g."), "{text}: {e}");
        }
        assert!(parse_duration("18446744073709551615h").is_err());
    }

    #[test]
    fn ttl_must_be_within_limits() {
        assert!(parse_ttl("999ms").is_err());
        assert!(parse_ttl("1s").is_ok());
        assert!(parse_ttl("1.5s").is_ok());
        assert!(parse_ttl("1h").is_ok());
        assert!(parse_ttl("61m").is_err());
    }
}

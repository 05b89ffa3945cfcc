//! Durations on the command line: `500ms`, `15s`, `2m`, `1h`, or `0`.
//!
//! A dozen lines do not justify a dependency (humantime would add calendar units we do not
//! want in a lock timeout).

use std::time::Duration;

use latchkey_core::limits::{SESSION_TTL_MS_MAX, SESSION_TTL_MS_MIN};

/// Parses `<digits><unit>` with unit `ms`, `s`, `m` or `h`; a bare `0` is zero.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("{text:?} has no unit; write e.g. 500ms, 15s, 2m or 1h"))?;
    let (number, unit) = text.split_at(split);
    let n: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} does not start with a whole number"))?;
    let ms_per_unit = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        _ => {
            return Err(format!(
                "unknown unit {unit:?} in {text:?}; use ms, s, m or h"
            ))
        }
    };
    let ms = n
        .checked_mul(ms_per_unit)
        .ok_or_else(|| format!("{text:?} is too long"))?;
    Ok(Duration::from_millis(ms))
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
            ("0", ms(0)),
            ("0s", ms(0)),
            ("500ms", ms(500)),
            ("15s", ms(15_000)),
            ("2m", ms(120_000)),
            ("1h", ms(3_600_000)),
            (" 200ms ", ms(200)),
        ];
        for (text, want) in cases {
            assert_eq!(parse_duration(text), Ok(want), "{text}");
        }
    }

    #[test]
    fn rejects_what_it_does_not_understand() {
        for text in [
            "",
            "15",
            "s",
            "1.5s",
            "-1s",
            "10d",
            "5 s",
            "99999999999999999999s",
        ] {
            assert!(parse_duration(text).is_err(), "{text}");
        }
        assert!(parse_duration("18446744073709551615h").is_err());
    }

    #[test]
    fn ttl_must_be_within_limits() {
        assert!(parse_ttl("999ms").is_err());
        assert!(parse_ttl("1s").is_ok());
        assert!(parse_ttl("1h").is_ok());
        assert!(parse_ttl("61m").is_err());
    }
}

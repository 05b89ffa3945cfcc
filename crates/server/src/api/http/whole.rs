//! The integers of a request body: any JSON number whose value is whole and in the field's
//! range, however it is spelled (`2`, `2.0`, `2e0`, `-0`). JSON Schema's `integer`, which
//! `docs/openapi.json` states, is a value, not a spelling, and a JSON encoder may write a whole
//! float as `2.0`; serde's `u64` takes digits alone. The value is read from the number's text,
//! exactly: `1e19` is 10^19, `1.5` and `18446744073709551616` are refused.

use serde::de::Error;
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;

/// The integer types of request fields, with their largest value.
pub trait Bounded: TryFrom<u64> {
    const MAX: u64;
}

impl Bounded for u64 {
    const MAX: u64 = u64::MAX;
}

impl Bounded for u32 {
    const MAX: u64 = u32::MAX as u64;
}

pub fn deserialize<'de, D: Deserializer<'de>, T: Bounded>(d: D) -> Result<T, D::Error> {
    let raw = <Box<RawValue>>::deserialize(d)?;
    of(raw.get()).map_err(D::Error::custom)
}

/// An optional field: absent or `null` is `None`.
pub fn option<'de, D: Deserializer<'de>, T: Bounded>(d: D) -> Result<Option<T>, D::Error> {
    let raw = <Option<Box<RawValue>>>::deserialize(d)?;
    raw.map(|raw| of(raw.get()))
        .transpose()
        .map_err(D::Error::custom)
}

fn of<T: Bounded>(text: &str) -> Result<T, String> {
    parse(text, T::MAX)
        .and_then(|v| T::try_from(v).ok())
        .ok_or_else(|| format!("{text} is not a whole number from 0 to {}", T::MAX))
}

/// The value of the JSON number `text` when it is whole and at most `max`. JSON's grammar
/// is `-? int (. frac)? ([eE] [+-]? exp)?`; anything else (a string, `null`) is `None`.
pub(super) fn parse(text: &str, max: u64) -> Option<u64> {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let (negative, unsigned) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (mantissa, exponent) = match unsigned.split_once(['e', 'E']) {
        Some((m, e)) => (m, Some(e)),
        None => (unsigned, None),
    };
    let (int, frac) = match mantissa.split_once('.') {
        Some((int, frac)) if digits(frac) => (int, frac),
        Some(_) => return None,
        None => (mantissa, ""),
    };
    if !digits(int) {
        return None;
    }
    // An exponent past a million only says "zero" or "out of range" either way.
    let exponent: i64 = match exponent {
        None => 0,
        Some(e) => {
            let (sign, magnitude) = match e.strip_prefix('-') {
                Some(m) => (-1, m),
                None => (1, e.strip_prefix('+').unwrap_or(e)),
            };
            if !digits(magnitude) {
                return None;
            }
            sign * magnitude.parse::<i64>().unwrap_or(i64::MAX).min(1_000_000)
        }
    };
    // The value is `significant * 10^scale`.
    let all = format!("{int}{frac}");
    let mut significant = all.trim_start_matches('0');
    if significant.is_empty() {
        return Some(0);
    }
    let mut scale = exponent - frac.len() as i64;
    while scale < 0 && significant.ends_with('0') {
        significant = &significant[..significant.len() - 1];
        scale += 1;
    }
    if negative || scale < 0 || significant.len() as i64 + scale > 20 {
        return None;
    }
    let value = significant.parse::<u128>().ok()? * 10u128.pow(scale as u32);
    u64::try_from(value).ok().filter(|v| *v <= max)
}

//! A secret's one spelling, the one the server gives (`docs/openapi.json`'s pattern for it):
//! decimal digits without a sign or leading zeros. `u64::from_str` alone would also take
//! `+7` and `007`, which the document calls invalid.

use serde::{Deserialize, Deserializer, Serializer};

pub fn serialize<S: Serializer>(v: &u64, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&v.to_string())
}

pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    let text = String::deserialize(d)?;
    match text.parse::<u64>() {
        Ok(v) if v.to_string() == text => Ok(v),
        _ => Err(serde::de::Error::custom(format!(
            "{text:?} is not a secret: the decimal digits of a 64-bit number, without sign \
             or leading zeros, as the session was given"
        ))),
    }
}

//! Byte layouts of the embedded store's records (little-endian, length-prefixed).
//!
//! - current value (`kv` table, keyed by key): `create_revision i64 | mod_revision i64 | value`
//! - history entry (`log` table, keyed by revision):
//!   `kind u8 | create_revision i64 | key_len u32 | key | value_len u32 | value | prev?`
//!   where `prev` is `1 u8 | create i64 | mod i64 | value` or `0 u8`.

use crate::{Error, Event, EventKind, KeyValue, Result};
use bytes::Bytes;

const PUT: u8 = 1;
const DELETE: u8 = 2;

/// Encodes a current value record.
pub(super) fn encode_value(create_revision: i64, mod_revision: i64, value: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + value.len());
    out.extend_from_slice(&create_revision.to_le_bytes());
    out.extend_from_slice(&mod_revision.to_le_bytes());
    out.extend_from_slice(value);
    out
}

/// Decodes a current value record of `key`.
pub(super) fn decode_value(key: &[u8], raw: &[u8]) -> Result<KeyValue> {
    let mut r = Reader(raw);
    let create_revision = r.i64()?;
    let mod_revision = r.i64()?;
    Ok(KeyValue {
        key: key_string(key)?,
        value: Bytes::copy_from_slice(r.0),
        create_revision,
        mod_revision,
    })
}

/// Encodes the history entry of an event.
pub(super) fn encode_event(event: &Event) -> Vec<u8> {
    let kv = &event.kv;
    let prev_len = event.prev.as_ref().map_or(0, |p| p.value.len() + 16);
    let mut out = Vec::with_capacity(26 + kv.key.len() + kv.value.len() + prev_len);
    out.push(match event.kind {
        EventKind::Put => PUT,
        EventKind::Delete => DELETE,
        EventKind::Progress => unreachable!("a watch's progress is never stored"),
    });
    out.extend_from_slice(&kv.create_revision.to_le_bytes());
    put_bytes(&mut out, kv.key.as_bytes());
    put_bytes(&mut out, &kv.value);
    match &event.prev {
        Some(prev) => {
            out.push(1);
            out.extend_from_slice(&prev.create_revision.to_le_bytes());
            out.extend_from_slice(&prev.mod_revision.to_le_bytes());
            out.extend_from_slice(&prev.value);
        }
        None => out.push(0),
    }
    out
}

/// Decodes the history entry written at `revision`.
pub(super) fn decode_event(revision: u64, raw: &[u8]) -> Result<Event> {
    let mut r = Reader(raw);
    let kind = match r.u8()? {
        PUT => EventKind::Put,
        DELETE => EventKind::Delete,
        other => return Err(Error::Corrupt(format!("unknown event kind {other}"))),
    };
    let create_revision = r.i64()?;
    let key = key_string(r.bytes()?)?;
    let value = Bytes::copy_from_slice(r.bytes()?);
    let prev = match r.u8()? {
        0 => None,
        _ => {
            let create_revision = r.i64()?;
            let mod_revision = r.i64()?;
            Some(KeyValue {
                key: key.clone(),
                value: Bytes::copy_from_slice(r.0),
                create_revision,
                mod_revision,
            })
        }
    };
    Ok(Event {
        kind,
        kv: KeyValue {
            key,
            value,
            create_revision,
            mod_revision: revision as i64,
        },
        prev,
    })
}

/// Reads only the key of a history entry (cheap filter before a full decode).
pub(super) fn event_key(raw: &[u8]) -> Result<&[u8]> {
    let mut r = Reader(raw);
    r.u8()?;
    r.i64()?;
    r.bytes()
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u32).to_le_bytes());
    out.extend_from_slice(b);
}

fn key_string(key: &[u8]) -> Result<String> {
    String::from_utf8(key.to_vec()).map_err(|_| Error::Corrupt("key is not UTF-8".into()))
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if self.0.len() < n {
            return Err(Error::Corrupt("record is truncated".into()));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }
    fn i64(&mut self) -> Result<i64> {
        Ok(i64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
    fn bytes(&mut self) -> Result<&'a [u8]> {
        let len = u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes"));
        self.take(len as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(key: &str, value: &str, c: i64, m: i64) -> KeyValue {
        KeyValue {
            key: key.into(),
            value: Bytes::from(value.to_owned()),
            create_revision: c,
            mod_revision: m,
        }
    }

    #[test]
    fn events_round_trip_with_and_without_prev() {
        for event in [
            Event {
                kind: EventKind::Put,
                kv: kv("/a", "v2", 3, 7),
                prev: Some(kv("/a", "v1", 3, 3)),
            },
            Event {
                kind: EventKind::Delete,
                kv: kv("/b", "", 0, 9),
                prev: None,
            },
        ] {
            let raw = encode_event(&event);
            assert_eq!(
                decode_event(event.kv.mod_revision as u64, &raw).unwrap(),
                event
            );
            assert_eq!(event_key(&raw).unwrap(), event.kv.key.as_bytes());
        }
    }

    #[test]
    fn values_round_trip_and_truncation_is_an_error() {
        let raw = encode_value(4, 5, b"hello");
        assert_eq!(decode_value(b"/k", &raw).unwrap(), kv("/k", "hello", 4, 5));
        assert!(matches!(
            decode_value(b"/k", &raw[..10]),
            Err(Error::Corrupt(_))
        ));
    }
}

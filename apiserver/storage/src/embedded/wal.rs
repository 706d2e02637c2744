//! The embedded store's write-ahead log: one append-only file (`store.wal`) next to the redb
//! file. Each group commit appends one checksummed record with the batch's events and fsyncs
//! only that (a sequential write); redb is then committed without an fsync. A checkpoint (one
//! durable redb commit) makes everything logged so far part of the B-tree file, after which the
//! log is emptied. On open, records newer than the B-tree's revision are applied again; a torn
//! tail (a record cut short or failing its checksum) is cut off.
//!
//! Record layout (little-endian): `len u32 | crc32 u32 | payload`, the checksum over the
//! payload; payload: `revision i64 | compacted i64 | count u32 | count × (len u32 | event)`,
//! each event in the history table's layout ([`codec::encode_event`]) with its revision.

use super::codec;
use crate::{Error, Event, Result};
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// The log's file name inside the store's folder.
pub(super) const FILE: &str = "store.wal";

/// Bytes of a record's frame before its payload.
const FRAME: usize = 8;
/// Records larger than this are treated as a torn tail (no batch comes near it).
const MAX_RECORD: usize = 1 << 30;

/// One logged group commit.
#[derive(Debug, PartialEq)]
pub(super) struct Record {
    /// The store's revision after the batch.
    pub revision: i64,
    /// The logical compaction floor after the batch.
    pub compacted: i64,
    /// The batch's changes, in revision order.
    pub events: Vec<Event>,
}

/// The open log.
pub(super) struct Wal {
    file: File,
    path: PathBuf,
    len: u64,
    buf: Vec<u8>,
}

/// What opening the log found.
pub(super) struct Recovered {
    pub wal: Wal,
    pub records: Vec<Record>,
    /// Bytes cut off a torn tail (0 when the log ended cleanly).
    pub torn_bytes: u64,
}

fn io(what: String) -> impl FnOnce(std::io::Error) -> Error {
    move |source| Error::Io { what, source }
}

impl Wal {
    /// Opens (or creates) the log in `dir`, reads every whole record and cuts a torn tail.
    pub fn open(dir: &Path) -> Result<Recovered> {
        let path = dir.join(FILE);
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io(format!("opening {}", path.display())))?;
        let mut raw = Vec::new();
        file.read_to_end(&mut raw)
            .map_err(io(format!("reading {}", path.display())))?;
        let (records, good) = parse(&raw)?;
        let torn_bytes = (raw.len() - good) as u64;
        if torn_bytes > 0 {
            tracing::warn!(
                path = %path.display(),
                offset = good,
                bytes = torn_bytes,
                "cutting a torn tail off the write-ahead log"
            );
            file.set_len(good as u64)
                .and_then(|()| file.sync_all())
                .map_err(io(format!("cutting the torn tail of {}", path.display())))?;
        }
        file.seek(SeekFrom::Start(good as u64))
            .map_err(io(format!("seeking in {}", path.display())))?;
        Ok(Recovered {
            wal: Wal {
                file,
                path,
                len: good as u64,
                buf: Vec::new(),
            },
            records,
            torn_bytes,
        })
    }

    /// Appends one record and waits until it is on disk.
    pub fn append(&mut self, revision: i64, compacted: i64, events: &[Event]) -> Result<()> {
        let buf = &mut self.buf;
        buf.clear();
        buf.extend_from_slice(&[0; FRAME]);
        buf.extend_from_slice(&revision.to_le_bytes());
        buf.extend_from_slice(&compacted.to_le_bytes());
        buf.extend_from_slice(&(events.len() as u32).to_le_bytes());
        for event in events {
            let raw = codec::encode_event(event);
            buf.extend_from_slice(&event.kv.mod_revision.to_le_bytes());
            buf.extend_from_slice(&(raw.len() as u32).to_le_bytes());
            buf.extend_from_slice(&raw);
        }
        let payload_len = (buf.len() - FRAME) as u32;
        let crc = crc32fast::hash(&buf[FRAME..]);
        buf[..4].copy_from_slice(&payload_len.to_le_bytes());
        buf[4..FRAME].copy_from_slice(&crc.to_le_bytes());
        let written = self
            .file
            .write_all(buf)
            .and_then(|()| self.file.sync_data());
        if let Err(source) = written {
            // Leave no half record behind for the next append to follow.
            let _ = self.file.set_len(self.len);
            let _ = self.file.seek(SeekFrom::Start(self.len));
            return Err(Error::Io {
                what: format!("appending to {}", self.path.display()),
                source,
            });
        }
        self.len += buf.len() as u64;
        Ok(())
    }

    /// Bytes in the log.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Empties the log once everything in it is durable elsewhere. Needs no fsync of its own:
    /// the next append's fsync makes the new length durable, and records a crash brings back
    /// are older than the checkpoint, so recovery skips them.
    pub fn reset(&mut self) -> Result<()> {
        self.file
            .set_len(0)
            .and_then(|()| self.file.seek(SeekFrom::Start(0)).map(drop))
            .map_err(io(format!("emptying {}", self.path.display())))?;
        self.len = 0;
        Ok(())
    }
}

/// Parses whole, intact records from the start; returns them and the length they cover.
fn parse(raw: &[u8]) -> Result<(Vec<Record>, usize)> {
    let mut records = Vec::new();
    let mut at = 0;
    while raw.len() - at >= FRAME {
        let len = u32::from_le_bytes(raw[at..at + 4].try_into().expect("4 bytes")) as usize;
        let crc = u32::from_le_bytes(raw[at + 4..at + FRAME].try_into().expect("4 bytes"));
        let end = at + FRAME + len;
        if len > MAX_RECORD || end > raw.len() {
            break;
        }
        let payload = &raw[at + FRAME..end];
        if crc32fast::hash(payload) != crc {
            break;
        }
        records.push(decode(payload)?);
        at = end;
    }
    Ok((records, at))
}

fn decode(payload: &[u8]) -> Result<Record> {
    let bad = || Error::Corrupt("write-ahead log record is malformed".into());
    let mut r = payload;
    let mut take = |n: usize| -> Result<&[u8]> {
        if r.len() < n {
            return Err(bad());
        }
        let (head, rest) = r.split_at(n);
        r = rest;
        Ok(head)
    };
    let i64_at = |b: &[u8]| i64::from_le_bytes(b.try_into().expect("8 bytes"));
    let u32_at = |b: &[u8]| u32::from_le_bytes(b.try_into().expect("4 bytes"));
    let revision = i64_at(take(8)?);
    let compacted = i64_at(take(8)?);
    let count = u32_at(take(4)?);
    let mut events = Vec::with_capacity(count.min(4096) as usize);
    for _ in 0..count {
        let rev = i64_at(take(8)?);
        let len = u32_at(take(4)?) as usize;
        events.push(codec::decode_event(rev as u64, take(len)?)?);
    }
    Ok(Record {
        revision,
        compacted,
        events,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{EventKind, KeyValue};
    use bytes::Bytes;

    fn put(key: &str, rev: i64) -> Event {
        Event {
            kind: EventKind::Put,
            kv: KeyValue {
                key: key.into(),
                value: Bytes::from(format!("value of {key}")),
                create_revision: rev,
                mod_revision: rev,
            },
            prev: None,
        }
    }

    #[test]
    fn records_round_trip_and_a_torn_tail_is_cut() {
        let dir = tempfile::tempdir().unwrap();
        let mut wal = Wal::open(dir.path()).unwrap().wal;
        wal.append(2, 0, &[put("/a", 1), put("/b", 2)]).unwrap();
        wal.append(3, 1, &[put("/c", 3)]).unwrap();
        let whole = wal.len();
        // A third record cut in the middle, as a crash during the write leaves it.
        wal.append(4, 1, &[put("/d", 4)]).unwrap();
        drop(wal);
        let path = dir.path().join(FILE);
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(whole + 11)
            .unwrap();

        let got = Wal::open(dir.path()).unwrap();
        assert_eq!(got.torn_bytes, 11);
        assert_eq!(got.records.len(), 2);
        assert_eq!(got.records[0].events, vec![put("/a", 1), put("/b", 2)]);
        assert_eq!(got.records[1].revision, 3);
        assert_eq!(got.records[1].compacted, 1);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), whole);

        // Appends after the cut follow the last whole record.
        let mut wal = got.wal;
        wal.append(4, 1, &[put("/e", 4)]).unwrap();
        drop(wal);
        let again = Wal::open(dir.path()).unwrap();
        assert_eq!(again.torn_bytes, 0);
        assert_eq!(again.records.len(), 3);
        assert_eq!(again.records[2].events, vec![put("/e", 4)]);
    }

    #[test]
    fn a_flipped_bit_ends_the_log_there() {
        let dir = tempfile::tempdir().unwrap();
        let mut wal = Wal::open(dir.path()).unwrap().wal;
        wal.append(1, 0, &[put("/a", 1)]).unwrap();
        let first = wal.len();
        wal.append(2, 0, &[put("/b", 2)]).unwrap();
        drop(wal);
        let path = dir.path().join(FILE);
        let mut raw = std::fs::read(&path).unwrap();
        let last = raw.len() - 3;
        raw[last] ^= 0x10;
        std::fs::write(&path, &raw).unwrap();
        let got = Wal::open(dir.path()).unwrap();
        assert_eq!(got.records.len(), 1);
        assert_eq!(got.torn_bytes, raw.len() as u64 - first);

        let mut wal = got.wal;
        wal.reset().unwrap();
        assert_eq!(wal.len(), 0);
        drop(wal);
        assert!(Wal::open(dir.path()).unwrap().records.is_empty());
    }
}

//! Giving start-up's code back once `minik8s up` has settled.
//!
//! Starting a control plane runs about 9 MiB of this binary's code once (argument parsing,
//! the PKI, every kind's strategy, CRD and role bootstrap, informers' first lists); idling
//! keeps running about 4 MiB of it (Lease renewals, discovery refreshes, watches). Every page
//! start-up touched stays mapped, and counted in the process's resident size, until the
//! kernel needs the memory. The linker lays the idle functions out first and start-up's after
//! them (`startup.order`, `hack/order-symbols.sh`), so once start-up is over [`Plan::release`]
//! unmaps the binary's read-only pages (`madvise(MADV_DONTNEED)`), as the kernel frees its own
//! `__init` sections after boot: the idle code faults back in (minor faults, from the page
//! cache) as a few dense megabytes, and start-up's stays out unless something runs it again.
//! The pages stay in the page cache, where they cost what any clean file page costs.
//!
//! Only pages of the executable's private, read-only mappings that are still pages of the file
//! (`/proc/self/pagemap`) are given back: dropping one changes no byte the program can read.
//! Pages the loader copied to relocate them (the GOT, under RELRO) are anonymous and stay; no
//! one can write a read-only mapping to make more of them (a debugger's breakpoints aside).

use std::io::{self, Read, Seek, SeekFrom};
use std::time::Duration;

/// How long after `minik8s up` is ready start-up is taken to be over: its components have
/// listed and begun watching, its node registered.
pub const SETTLE: Duration = Duration::from_secs(10);

/// How often the binary's pages are given back again after that. A path that runs rarely
/// (a compaction, a watch made again) faults its code in with the kernel's 64 KiB
/// fault-around window, start-up's neighbouring code included; given back, only what runs
/// again comes back, as one minor fault per window from the page cache.
pub const AGAIN: Duration = Duration::from_secs(60);

/// Why the start-up code could not be given back.
#[derive(Debug, thiserror::Error)]
pub enum ReleaseError {
    /// Reading the process's own mappings or status.
    #[error("reading {path}")]
    Read {
        /// Which file under /proc/self.
        path: &'static str,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// The kernel refused the advice.
    #[error("madvise(MADV_DONTNEED) on {start:#x}+{len:#x}")]
    Advise {
        /// Start of the range.
        start: usize,
        /// Its length.
        len: usize,
        /// The error.
        #[source]
        source: io::Error,
    },
}

const PAGE: usize = 4096;

/// The binary's pages that may be given back, found by [`plan`] and unmapped by
/// [`Plan::release`].
#[derive(Debug)]
pub struct Plan {
    ranges: Vec<(usize, usize)>,
    /// The process's resident size (KiB) when planned.
    pub rss_kib: u64,
}

impl Plan {
    /// Bytes of address space the plan unmaps (resident or not).
    pub fn bytes(&self) -> usize {
        self.ranges.iter().map(|(start, end)| end - start).sum()
    }

    /// Unmaps the planned ranges; they fault back in from the page cache where they are run
    /// or read again.
    pub fn release(self) -> Result<(), ReleaseError> {
        for (start, end) in self.ranges {
            advise_dontneed(start, end - start).map_err(|source| ReleaseError::Advise {
                start,
                len: end - start,
                source,
            })?;
        }
        Ok(())
    }
}

/// The read-only, private mappings of `exe` in `/proc/self/maps`.
fn read_only_mappings(maps: &str, exe: &str) -> Vec<(usize, usize)> {
    maps.lines()
        .filter_map(|line| {
            // `start-end perms offset dev inode path`
            let mut fields = line.split_whitespace();
            let (start, end) = fields.next()?.split_once('-')?;
            let perms = fields.next()?.as_bytes();
            let path = fields.nth(3)?;
            let read_only_private =
                perms.len() == 4 && perms[0] == b'r' && perms[1] == b'-' && perms[3] == b'p';
            let start = usize::from_str_radix(start, 16).ok()?;
            let end = usize::from_str_radix(end, 16).ok()?;
            (read_only_private && path == exe && end > start).then_some((start, end))
        })
        .collect()
}

/// Adds to `out` the parts of the mapping `start..` whose pagemap `entries` (one per page) are
/// not copied (anonymous) pages: present anonymous pages and swapped ones stay. A part that
/// goes on from `out`'s last range extends it.
fn file_ranges(
    start: usize,
    entries: impl IntoIterator<Item = u64>,
    out: &mut Vec<(usize, usize)>,
) {
    const PRESENT: u64 = 1 << 63;
    const SWAPPED: u64 = 1 << 62;
    const FILE: u64 = 1 << 61;
    for (i, e) in entries.into_iter().enumerate() {
        let copied = e & SWAPPED != 0 || (e & PRESENT != 0 && e & FILE == 0);
        if copied {
            continue;
        }
        let page = start + i * PAGE;
        match out.last_mut() {
            Some((_, end)) if *end == page => *end = page + PAGE,
            _ => out.push((page, page + PAGE)),
        }
    }
}

fn read(path: &'static str) -> Result<String, ReleaseError> {
    std::fs::read_to_string(path).map_err(|source| ReleaseError::Read { path, source })
}

/// Finds the binary's pages that are still pages of its file.
pub fn plan() -> Result<Plan, ReleaseError> {
    const PAGEMAP: &str = "/proc/self/pagemap";
    let exe = std::fs::read_link("/proc/self/exe").map_err(|source| ReleaseError::Read {
        path: "/proc/self/exe",
        source,
    })?;
    let maps = read("/proc/self/maps")?;
    let rss_kib = read("/proc/self/status")?
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    let pagemap_err = |source| ReleaseError::Read {
        path: PAGEMAP,
        source,
    };
    let mut pagemap = std::fs::File::open(PAGEMAP).map_err(pagemap_err)?;
    let mut ranges = Vec::new();
    // Read in chunks: the whole binary's entries would be a megabyte or two of heap, and
    // this runs again every `AGAIN`.
    const CHUNK: usize = 8192 * PAGE;
    let mut raw = vec![0u8; CHUNK / PAGE * 8];
    for (start, end) in read_only_mappings(&maps, &exe.to_string_lossy()) {
        for from in (start..end).step_by(CHUNK) {
            let raw = &mut raw[..(end.min(from + CHUNK) - from) / PAGE * 8];
            pagemap
                .seek(SeekFrom::Start((from / PAGE * 8) as u64))
                .and_then(|_| pagemap.read_exact(raw))
                .map_err(pagemap_err)?;
            let entries = raw
                .chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default()));
            file_ranges(from, entries, &mut ranges);
        }
    }
    Ok(Plan { ranges, rss_kib })
}

/// `madvise(start, len, MADV_DONTNEED)` on a range [`plan`] chose.
#[allow(unsafe_code)]
fn advise_dontneed(start: usize, len: usize) -> io::Result<()> {
    // SAFETY: `start..start + len` lies in a private, read-only mapping of the executable
    // file, and each of its pages is either not resident or an unmodified page of the file
    // (not copied on write: `file_ranges`); read-only, it cannot be written to become one.
    // MADV_DONTNEED removes the pages from this process's page tables only; the next access
    // maps the same file bytes again, so no memory any reference points to changes. No Rust
    // object owns this memory.
    let rc = unsafe { libc::madvise(start as *mut libc::c_void, len, libc::MADV_DONTNEED) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
00200000-00fd8000 r--p 00000000 fe:01 123 /usr/bin/minik8s
00fd8000-0485a000 r-xp 00dd7000 fe:01 123 /usr/bin/minik8s
0485a000-04ad4000 r--p 04658000 fe:01 123 /usr/bin/minik8s
04ad4000-04adc000 rw-p 048d1000 fe:01 123 /usr/bin/minik8s
04adc000-04ae0000 rw-p 00000000 00:00 0 
7f0000000000-7f0000001000 r--p 00000000 fe:01 99 /usr/lib/x86_64-linux-gnu/libc.so.6
";

    #[test]
    fn only_the_binarys_read_only_mappings() {
        assert_eq!(
            read_only_mappings(MAPS, "/usr/bin/minik8s"),
            vec![
                (0x200000, 0xfd8000),
                (0xfd8000, 0x485a000),
                (0x485a000, 0x4ad4000)
            ]
        );
        assert!(read_only_mappings(MAPS, "/usr/bin/other").is_empty());
    }

    #[test]
    fn copied_and_swapped_pages_stay() {
        let file = (1 << 63) | (1 << 61);
        let copied = 1 << 63;
        let swapped = 1 << 62;
        let absent = 0;
        let entries = [file, absent, copied, file, swapped, absent, file];
        let mut ranges = Vec::new();
        file_ranges(0x1000, entries, &mut ranges);
        assert_eq!(
            ranges,
            vec![(0x1000, 0x3000), (0x4000, 0x5000), (0x6000, 0x8000)]
        );
    }

    #[test]
    fn releasing_keeps_the_process_running() {
        // The test binary gives its own code back and goes on running it.
        let plan = plan().expect("plan");
        assert!(plan.bytes() > 0, "{plan:?}");
        // Read in chunks, the ranges still come sorted, apart, and whole across chunks.
        for pair in plan.ranges.windows(2) {
            assert!(pair[0].1 < pair[1].0, "{pair:?}");
        }
        plan.release().expect("release");
        let again = super::plan().expect("plan again");
        assert!(again.bytes() > 0);
        again.release().expect("release again");
    }
}

//! The tests `ramd bench` knows and the profiles that group them (pure).
//!
//! Each test is what fio calls a job, named after its workload
//! (`randread-4k-qd1`): an access pattern, a block size, I/Os in flight
//! per job, and jobs (threads, each with its own connection or file
//! handle). They follow the seed articles: 4 KiB random I/O at QD1 (what
//! ioping measures: latency), at QD32, the OLTP job (`randrw`, 4 KiB,
//! QD64 x 4 jobs), 1 MiB sequential reads and writes at QD1 (what `dd`
//! does), and a file-level test (many small files created, written, read
//! back and deleted, as iozone and a compiler do) for directories.
//!
//! Profiles pick from the catalogue and set how long each test runs:
//!
//! ```text
//!  quick  4k QD1 read/write, 4k QD32 mixed, 1M read/write, files   3 s each
//!  full   every test                                               8 s each
//!  db     4k QD1 read/write/mixed, QD32 mixed, OLTP               10 s each
//!  build  files, 4k QD1 read, 1M read/write                       10 s each
//! ```
//!
//! `quick` against one drive and one directory measures 6 tests of 3 s on
//! each (the drive skips the file-level one): 33 s plus the preparation,
//! well under a minute.

use std::time::Duration;

/// How a test moves through its working set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pattern {
    RandRead,
    RandWrite,
    /// Random reads and writes, `read_pct` percent reads.
    RandRw,
    SeqRead,
    SeqWrite,
    /// Small files in a directory: create + write, read back, delete.
    Files,
}

impl Pattern {
    /// fio's `rw` name (`files` for the file-level test).
    pub fn fio_name(self) -> &'static str {
        match self {
            Pattern::RandRead => "randread",
            Pattern::RandWrite => "randwrite",
            Pattern::RandRw => "randrw",
            Pattern::SeqRead => "read",
            Pattern::SeqWrite => "write",
            Pattern::Files => "files",
        }
    }

    /// Whether the test writes (and so needs `--destructive` on data
    /// the user cares about).
    pub fn writes(self) -> bool {
        !matches!(self, Pattern::RandRead | Pattern::SeqRead)
    }

    pub fn is_random(self) -> bool {
        matches!(
            self,
            Pattern::RandRead | Pattern::RandWrite | Pattern::RandRw
        )
    }
}

/// One test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TestSpec {
    pub name: &'static str,
    pub description: &'static str,
    pub pattern: Pattern,
    /// Percent of reads (100 for reads, 0 for writes, fio's `rwmixread`
    /// for `randrw`).
    pub read_pct: u32,
    /// Bytes per I/O (per file for `files`).
    pub block_bytes: u64,
    pub iodepth: u32,
    pub jobs: u32,
}

const K4: u64 = 4096;
const M1: u64 = 1 << 20;

const fn test(
    name: &'static str,
    description: &'static str,
    pattern: Pattern,
    read_pct: u32,
    block_bytes: u64,
    iodepth: u32,
    jobs: u32,
) -> TestSpec {
    TestSpec {
        name,
        description,
        pattern,
        read_pct,
        block_bytes,
        iodepth,
        jobs,
    }
}

/// Every test, in the order a profile runs them.
pub const CATALOGUE: &[TestSpec] = &[
    test(
        "randread-4k-qd1",
        "4 KiB random reads, one at a time (ioping-like latency)",
        Pattern::RandRead,
        100,
        K4,
        1,
        1,
    ),
    test(
        "randwrite-4k-qd1",
        "4 KiB random writes, one at a time",
        Pattern::RandWrite,
        0,
        K4,
        1,
        1,
    ),
    test(
        "randrw-4k-qd1",
        "4 KiB random reads and writes (50/50), one at a time",
        Pattern::RandRw,
        50,
        K4,
        1,
        1,
    ),
    test(
        "randread-4k-qd32",
        "4 KiB random reads, 32 in flight",
        Pattern::RandRead,
        100,
        K4,
        32,
        1,
    ),
    test(
        "randwrite-4k-qd32",
        "4 KiB random writes, 32 in flight",
        Pattern::RandWrite,
        0,
        K4,
        32,
        1,
    ),
    test(
        "randrw-4k-qd32",
        "4 KiB random reads and writes (50/50), 32 in flight",
        Pattern::RandRw,
        50,
        K4,
        32,
        1,
    ),
    test(
        "oltp-4k-qd64x4",
        "the OLTP job: 4 KiB random reads and writes (50/50), 64 in flight on each of 4 jobs",
        Pattern::RandRw,
        50,
        K4,
        64,
        4,
    ),
    test(
        "seqread-1m",
        "1 MiB sequential reads, one at a time (dd-like)",
        Pattern::SeqRead,
        100,
        M1,
        1,
        1,
    ),
    test(
        "seqwrite-1m",
        "1 MiB sequential writes, one at a time (dd-like)",
        Pattern::SeqWrite,
        0,
        M1,
        1,
        1,
    ),
    test(
        "files-4k",
        "small files: create and write 4 KiB, read back, delete (iozone-like; directories only)",
        Pattern::Files,
        50,
        K4,
        1,
        1,
    ),
];

/// A named set of tests with a default runtime.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Profile {
    /// A first look, well under a minute: latency, a mixed load,
    /// throughput, small files.
    Quick,
    /// Every test.
    Full,
    /// What databases do: small random I/O, QD1 to the OLTP job.
    Db,
    /// What builds do: small files, small reads, large sequential I/O.
    Build,
}

impl Profile {
    pub fn name(self) -> &'static str {
        match self {
            Profile::Quick => "quick",
            Profile::Full => "full",
            Profile::Db => "db",
            Profile::Build => "build",
        }
    }

    /// The names of its tests, in catalogue order.
    fn test_names(self) -> &'static [&'static str] {
        match self {
            Profile::Quick => &[
                "randread-4k-qd1",
                "randwrite-4k-qd1",
                "randrw-4k-qd32",
                "seqread-1m",
                "seqwrite-1m",
                "files-4k",
            ],
            Profile::Full => &[
                "randread-4k-qd1",
                "randwrite-4k-qd1",
                "randrw-4k-qd1",
                "randread-4k-qd32",
                "randwrite-4k-qd32",
                "randrw-4k-qd32",
                "oltp-4k-qd64x4",
                "seqread-1m",
                "seqwrite-1m",
                "files-4k",
            ],
            Profile::Db => &[
                "randread-4k-qd1",
                "randwrite-4k-qd1",
                "randrw-4k-qd1",
                "randrw-4k-qd32",
                "oltp-4k-qd64x4",
            ],
            Profile::Build => &["randread-4k-qd1", "seqread-1m", "seqwrite-1m", "files-4k"],
        }
    }

    pub fn tests(self) -> Vec<TestSpec> {
        self.test_names()
            .iter()
            .map(|n| find(n).expect("profiles name catalogue tests"))
            .collect()
    }

    /// How long each test runs on each target unless `--runtime` says.
    pub fn default_runtime(self) -> Duration {
        Duration::from_secs(match self {
            Profile::Quick => 3,
            Profile::Full => 8,
            Profile::Db | Profile::Build => 10,
        })
    }

    /// Bytes the block tests spread over unless `--size` says.
    pub fn default_working_set_bytes(self) -> u64 {
        match self {
            Profile::Quick => 256 << 20,
            _ => 1 << 30,
        }
    }
}

/// The catalogue's test of that name.
pub fn find(name: &str) -> Option<TestSpec> {
    CATALOGUE.iter().find(|t| t.name == name).copied()
}

/// The catalogue's names, for error messages and `--help`.
pub fn names() -> Vec<&'static str> {
    CATALOGUE.iter().map(|t| t.name).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles_name_catalogue_tests_in_order() {
        for p in [Profile::Quick, Profile::Full, Profile::Db, Profile::Build] {
            let tests = p.tests();
            assert!(!tests.is_empty());
            let positions: Vec<usize> = tests
                .iter()
                .map(|t| CATALOGUE.iter().position(|c| c == t).unwrap())
                .collect();
            assert!(positions.windows(2).all(|w| w[0] < w[1]), "{p:?}");
        }
        assert_eq!(Profile::Full.tests().len(), CATALOGUE.len());
    }

    #[test]
    fn catalogue_is_consistent() {
        for t in CATALOGUE {
            assert!(t
                .name
                .contains(if t.block_bytes == M1 { "1m" } else { "4k" }));
            assert_eq!(
                t.read_pct == 100,
                !t.pattern.writes() && t.pattern != Pattern::Files
            );
            if t.pattern.is_random() {
                assert!(t.name.contains(&format!("qd{}", t.iodepth)), "{}", t.name);
            }
            assert!(t.iodepth >= 1 && t.jobs >= 1);
        }
        assert_eq!(find("oltp-4k-qd64x4").unwrap().jobs, 4);
        assert!(find("nope").is_none());
    }

    #[test]
    fn quick_stays_well_under_a_minute_for_two_targets() {
        let p = Profile::Quick;
        let total = p.default_runtime() * (p.tests().len() as u32) * 2;
        assert!(total <= Duration::from_secs(40), "{total:?}");
    }
}

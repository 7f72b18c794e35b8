//! Conversions from the directory manager's types into `wire::dirs`.
//!
//! Invariant: each wire type serializes exactly as the internal type it
//! mirrors (the unit test below compares the JSON), so moving `dirsync`'s
//! types behind the wire types changed nothing a client sees. They live
//! here, on the server side, so `wire` (and so the client and the CLI)
//! never links `dirsync`.

use crate::api::wire::dirs::{
    DirInfo, DirOrigin, DirStatus, MountMode, RecoveryCopy, StopOutcome, SyncReport, SyncTotals,
    Usage, UsageLevel,
};
use crate::dirsync::guard;
use crate::dirsync::manager;
use crate::dirsync::mounts;
use crate::dirsync::recovery;
use crate::dirsync::state;
use crate::dirsync::sync;

impl From<mounts::MountMode> for MountMode {
    fn from(m: mounts::MountMode) -> Self {
        match m {
            mounts::MountMode::Tmpfs => MountMode::Tmpfs,
            mounts::MountMode::Overlay => MountMode::Overlay,
        }
    }
}

impl From<manager::DirStatus> for DirStatus {
    fn from(s: manager::DirStatus) -> Self {
        match s {
            manager::DirStatus::Activating => DirStatus::Activating,
            manager::DirStatus::Active => DirStatus::Active,
            manager::DirStatus::Failed => DirStatus::Failed,
        }
    }
}

impl From<guard::UsageLevel> for UsageLevel {
    fn from(l: guard::UsageLevel) -> Self {
        match l {
            guard::UsageLevel::Ok => UsageLevel::Ok,
            guard::UsageLevel::Warning => UsageLevel::Warning,
            guard::UsageLevel::Critical => UsageLevel::Critical,
            guard::UsageLevel::Full => UsageLevel::Full,
        }
    }
}

impl From<guard::Usage> for Usage {
    fn from(u: guard::Usage) -> Self {
        Usage {
            used_bytes: u.used_bytes,
            total_bytes: u.total_bytes,
            used_inodes: u.used_inodes,
            total_inodes: u.total_inodes,
        }
    }
}

impl From<sync::SyncReport> for SyncReport {
    fn from(r: sync::SyncReport) -> Self {
        SyncReport {
            entries_scanned: r.entries_scanned,
            unchanged: r.unchanged,
            files_copied: r.files_copied,
            bytes_copied: r.bytes_copied,
            links_made: r.links_made,
            specials_made: r.specials_made,
            dirs_created: r.dirs_created,
            entries_deleted: r.entries_deleted,
            dir_attrs_set: r.dir_attrs_set,
            xattrs_dropped: r.xattrs_dropped,
            retries: r.retries,
            changed_during_sync: r.changed_during_sync,
            conflicts: r.conflicts,
            duration_ms: r.duration_ms,
        }
    }
}

impl From<recovery::RecoveryCopy> for RecoveryCopy {
    fn from(c: recovery::RecoveryCopy) -> Self {
        RecoveryCopy {
            path: c.path,
            created_unix_s: c.created_unix_s,
        }
    }
}

impl From<state::DirOrigin> for DirOrigin {
    fn from(o: state::DirOrigin) -> Self {
        match o {
            state::DirOrigin::Api => DirOrigin::Api,
            state::DirOrigin::Config { file } => DirOrigin::Config { file },
        }
    }
}

impl From<manager::SyncTotals> for SyncTotals {
    fn from(t: manager::SyncTotals) -> Self {
        SyncTotals {
            syncs: t.syncs,
            failed_syncs: t.failed_syncs,
            files_copied: t.files_copied,
            bytes_copied: t.bytes_copied,
            entries_deleted: t.entries_deleted,
            files_skipped_changing: t.files_skipped_changing,
            duration_ms: t.duration_ms,
        }
    }
}

impl From<manager::DirInfo> for DirInfo {
    fn from(d: manager::DirInfo) -> Self {
        DirInfo {
            path: d.path,
            id: d.id,
            mode: d.mode.into(),
            size_limit_bytes: d.size_limit_bytes,
            sync_interval_ms: d.sync_interval_ms,
            status: d.status.into(),
            usage: d.usage.map(Usage::from),
            usage_percent: d.usage_percent,
            usage_level: d.usage_level.map(UsageLevel::from),
            last_sync_unix_ms: d.last_sync_unix_ms,
            last_sync: d.last_sync.map(SyncReport::from),
            last_error: d.last_error,
            recovery_copies: d.recovery_copies.into_iter().map(Into::into).collect(),
            notes: d.notes,
            origin: d.origin.into(),
            totals: d.totals.into(),
        }
    }
}

impl From<manager::StopOutcome> for StopOutcome {
    fn from(o: manager::StopOutcome) -> Self {
        match o {
            manager::StopOutcome::Released {
                report,
                lazy_unmount,
                still_open,
                kept_until_closed,
            } => StopOutcome::Released {
                report: report.into(),
                lazy_unmount,
                still_open,
                kept_until_closed,
            },
            manager::StopOutcome::HandedOver { report } => StopOutcome::HandedOver {
                report: report.into(),
            },
            manager::StopOutcome::Inactive => StopOutcome::Inactive,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use serde::Serialize;

    use super::*;

    fn report() -> sync::SyncReport {
        sync::SyncReport {
            entries_scanned: 3,
            files_copied: 1,
            bytes_copied: 4096,
            changed_during_sync: vec![PathBuf::from("a.log")],
            conflicts: vec![PathBuf::from("b")],
            duration_ms: 7,
            ..sync::SyncReport::default()
        }
    }

    /// The wire types serialize exactly as the manager's types do.
    #[test]
    fn same_json_as_the_internal_types() {
        let info = manager::DirInfo {
            path: PathBuf::from("/var/log"),
            id: "log-1".into(),
            mode: mounts::MountMode::Overlay,
            size_limit_bytes: Some(1 << 20),
            sync_interval_ms: 600_000,
            status: manager::DirStatus::Active,
            usage: Some(guard::Usage {
                used_bytes: 1,
                total_bytes: 2,
                used_inodes: 3,
                total_inodes: 4,
            }),
            usage_percent: Some(75),
            usage_level: Some(guard::UsageLevel::Warning),
            last_sync_unix_ms: Some(5),
            last_sync: Some(report()),
            last_error: Some("oops".into()),
            recovery_copies: vec![recovery::RecoveryCopy {
                path: PathBuf::from("/r"),
                created_unix_s: 9,
            }],
            notes: vec!["n".into()],
            origin: state::DirOrigin::Config {
                file: PathBuf::from("/etc/ramd.toml"),
            },
            totals: manager::SyncTotals {
                syncs: 1,
                ..manager::SyncTotals::default()
            },
        };
        assert_eq!(json(&info.clone()), json(&DirInfo::from(info)));
        for o in [
            manager::StopOutcome::Released {
                report: report(),
                lazy_unmount: true,
                still_open: vec!["1 (sh): cwd /var/log".into()],
                kept_until_closed: Some(PathBuf::from("/k")),
            },
            manager::StopOutcome::Released {
                report: report(),
                lazy_unmount: false,
                still_open: vec![],
                kept_until_closed: None,
            },
            manager::StopOutcome::HandedOver { report: report() },
            manager::StopOutcome::Inactive,
        ] {
            assert_eq!(json(&o.clone()), json(&StopOutcome::from(o)));
        }
    }

    fn json<T: Serialize>(v: &T) -> serde_json::Value {
        serde_json::to_value(v).unwrap()
    }
}

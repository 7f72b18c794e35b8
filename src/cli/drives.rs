//! Drive commands: `ramd create`, `list`, `resize`, `lock`, `unlock`,
//! `access`, `delete` (a persistent drive's extra steps are in `persist`).
//!
//! Like every client command, they speak only `api::client` and
//! `api::wire`: the daemon decides, the command prints its answer.

use super::{absolute_text, arg_name, daemon, notice, output, persist, print_json};
use super::{ArgError, CliError, JsonFlag};
use crate::api::client::{Client, ClientError};
use crate::api::wire::caches::PatchCache;
use crate::api::wire::drives::{AccessPatch, CreateDrive, DriveAccess, DriveInfo, PatchDrive};
use crate::api::wire::values::{DurationValue, SizeValue};
use crate::size::format_size;

/// `ramd create`'s flags, as parsed.
pub(crate) struct CreateArgs {
    pub name: String,
    pub size: Option<String>,
    pub mem_limit: Option<String>,
    /// `lz4`, `zstd[:LEVEL]`, `lz4+zstd[:LEVEL]` or `off` (checked by the daemon).
    pub compress: Option<String>,
    pub read_only: bool,
    pub overcommit: bool,
    pub lock_memory: bool,
    pub persist: persist::PersistArgs,
    pub access: AccessArgs,
    pub json: bool,
}

/// Who may see a drive or cache over NBD and NVMe/TCP: the flags of
/// `ramd create`, `ramd cache create` and `ramd access` (docs/tls.md, "Who
/// may see an export").
#[derive(clap::Args, Debug, Clone, Default)]
pub struct AccessArgs {
    /// Only clients with this certificate identity (CN or first SAN, or
    /// an NVMe host NQN) may see it; repeatable.
    #[arg(long = "allow-identity", value_name = "ID", value_parser = arg_identity)]
    pub allow_identities: Vec<String>,
    /// This identity may see it, read-only; repeatable.
    #[arg(long = "read-only-identity", value_name = "ID", value_parser = arg_identity)]
    pub read_only_identities: Vec<String>,
    /// Only clients from this network may see it: a CIDR
    /// (10.0.0.0/8, 127.0.0.1/32) or "unix" for the unix socket;
    /// repeatable.
    #[arg(long = "allow-network", value_name = "CIDR", value_parser = arg_network)]
    pub allow_networks: Vec<String>,
}

impl AccessArgs {
    pub(crate) fn is_empty(&self) -> bool {
        self.allow_identities.is_empty()
            && self.read_only_identities.is_empty()
            && self.allow_networks.is_empty()
    }

    pub(crate) fn rules(self) -> DriveAccess {
        DriveAccess {
            allow_identities: self.allow_identities,
            read_only_identities: self.read_only_identities,
            allow_networks: self.allow_networks,
        }
    }
}

/// An identity argument: not empty (the daemon's rule).
fn arg_identity(text: &str) -> Result<String, ArgError> {
    daemon::check_identity(text)?;
    Ok(text.to_owned())
}

/// A network argument: a CIDR or `unix` (the daemon's parser).
fn arg_network(text: &str) -> Result<String, ArgError> {
    daemon::check_network(text)?;
    Ok(text.to_owned())
}

/// `ramd create`: the request from the flags, then [`create`].
pub(crate) fn create_from(c: &Client, a: CreateArgs) -> Result<(), CliError> {
    let req = CreateDrive {
        name: a.name,
        size: a.size.as_deref().map(size_value),
        mem_limit: a.mem_limit.as_deref().map(size_value),
        compress: a.compress,
        read_only: a.read_only,
        overcommit: a.overcommit,
        lock_memory: a.lock_memory,
        persist: a.persist.persist,
        durability: a.persist.durability.clone(),
        sync_interval: a.persist.sync_interval.clone().map(DurationValue::Text),
        encrypt: a.persist.encrypt,
        key_file: absolute_text(a.persist.key_file.as_deref())?,
        access: (!a.access.is_empty()).then(|| a.access.rules()),
    };
    create(c, &req, a.json, a.persist.no_wait)
}

/// `ramd create`.
fn create(c: &Client, req: &CreateDrive, json: bool, no_wait: bool) -> Result<(), CliError> {
    let d = c.create_drive(req)?;
    if d.persist.is_some() {
        return persist::after_create(c, d, json, no_wait);
    }
    if json {
        return print_json(&d);
    }
    println!(
        "created {} ({}{}{}{}) at {}",
        d.name,
        format_size(d.size_bytes),
        match &d.compression {
            Some(c) => format!(", compressed {}", c.algorithm),
            None => String::new(),
        },
        if d.lock_memory { ", locked in RAM" } else { "" },
        if d.read_only { ", read-only" } else { "" },
        d.uri
    );
    println!(
        "attach as a file: mkdir -p /mnt/{n} && ramd attach {n} /mnt/{n}",
        n = d.name
    );
    Ok(())
}

/// `ramd list`.
pub(crate) fn list(c: &Client, json: bool) -> Result<(), CliError> {
    let list = c.list_drives()?;
    if json {
        return print_json(&list);
    }
    print!("{}", output::drive_list(&list.drives));
    // Caches have their own columns: point to them.
    let caches = c.list_caches().map_or(0, |l| l.caches.len());
    if caches > 0 {
        println!(
            "and {caches} cache{} (ramd cache list)",
            if caches == 1 { "" } else { "s" }
        );
    }
    Ok(())
}

/// `ramd resize`.
pub(crate) fn resize(
    c: &Client,
    name: &str,
    size: &str,
    force: bool,
    json: bool,
) -> Result<(), CliError> {
    let req = PatchDrive {
        size: Some(size_value(size)),
        force,
        ..Default::default()
    };
    patch(c, name, &req, json, |d| {
        format!(
            "{} is now {} (NBD clients see it when they reconnect)",
            d.name,
            format_size(d.size_bytes)
        )
    })
}

/// `ramd lock` / `ramd unlock`.
pub(crate) fn set_read_only(
    c: &Client,
    name: &str,
    lock: bool,
    json: bool,
) -> Result<(), CliError> {
    let req = PatchDrive {
        read_only: Some(lock),
        ..Default::default()
    };
    patch(c, name, &req, json, |d| {
        let mode = if d.read_only { "read-only" } else { "writable" };
        format!("{} is {mode}", d.name)
    })
}

/// `ramd access`: shows or sets who may see a drive over NBD.
#[derive(clap::Args, Debug)]
pub struct AccessCommand {
    #[arg(value_parser = arg_name)]
    pub name: String,
    #[command(flatten)]
    pub rules: AccessArgs,
    /// Remove every rule: the drive is open to every client that reaches
    /// a listener.
    #[arg(long, conflicts_with_all = ["allow_identities", "read_only_identities", "allow_networks"])]
    pub open: bool,
    #[command(flatten)]
    pub out: JsonFlag,
}

/// `ramd access NAME [RULES] [--open]`: without rules, shows the rules of
/// the drive or cache NAME (they share one namespace); with them, it gets
/// exactly these rules (a list not given becomes empty).
pub(crate) fn access(c: &Client, a: AccessCommand) -> Result<(), CliError> {
    // Drives and caches share one namespace: a drive first, else a cache.
    // (No such cache either: the drive's "not found" is the answer.)
    let (is_cache, current) = match c.drive(&a.name) {
        Ok(d) => (false, d.access),
        Err(no_drive @ ClientError::Api { status: 404, .. }) => match c.cache(&a.name) {
            Ok(k) => (true, k.access),
            Err(_) => return Err(no_drive.into()),
        },
        Err(e) => return Err(e.into()),
    };
    let (name, json) = (a.name.clone(), a.out.json);
    let show = |name: &str, rules: &DriveAccess| -> Result<(), CliError> {
        if json {
            return print_json(rules);
        }
        println!("{name}: {}", output::access_text(rules));
        Ok(())
    };
    if a.rules.is_empty() && !a.open {
        return show(&name, &current);
    }
    let rules = a.rules.rules();
    let change = AccessPatch {
        allow_identities: Some(rules.allow_identities),
        read_only_identities: Some(rules.read_only_identities),
        allow_networks: Some(rules.allow_networks),
    };
    if is_cache {
        let req = PatchCache {
            access: Some(change),
        };
        let info = c.patch_cache(&name, &req)?;
        if json {
            return print_json(&info);
        }
        notice(&info.notice);
        return show(&name, &info.access);
    }
    let req = PatchDrive {
        access: Some(change),
        ..Default::default()
    };
    patch(c, &name, &req, json, |d| {
        format!("{}: {}", d.name, output::access_text(&d.access))
    })
}

/// Patches a drive and prints the result: JSON, or the daemon's notice and
/// what `line` says about the drive.
fn patch(
    c: &Client,
    name: &str,
    req: &PatchDrive,
    json: bool,
    line: impl FnOnce(&DriveInfo) -> String,
) -> Result<(), CliError> {
    let d = c.patch_drive(name, req)?;
    if json {
        return print_json(&d);
    }
    notice(&d.notice);
    println!("{}", line(&d));
    Ok(())
}

/// `ramd delete`.
pub(crate) fn delete(
    c: &Client,
    name: &str,
    force: bool,
    keep_data: bool,
    json: bool,
) -> Result<(), CliError> {
    let r = c.delete_drive_with(name, force, keep_data)?;
    if json {
        return print_json(&r);
    }
    notice(&r.notice);
    persist::after_delete(&r);
    if r.closed_connections > 0 {
        println!(
            "deleted {} (closed {} connection{})",
            r.name,
            r.closed_connections,
            if r.closed_connections == 1 { "" } else { "s" }
        );
    } else {
        println!("deleted {}", r.name);
    }
    Ok(())
}

fn size_value(text: &str) -> SizeValue {
    SizeValue::Text(text.to_owned())
}

//! Attachment commands: `ramd attach NAME MOUNTPOINT`, `ramd attach NAME
//! --ublk`, `ramd attach --list`, `ramd detach MOUNTPOINT|NAME|/dev/ublkbN`
//! (drives as FUSE files mounted by the daemon, or as ublk block devices).
//!
//! Paths are made absolute here: the daemon has its own working directory.

use super::{absolute, output, print_json, CliError};
use crate::api::client::Client;
use crate::api::wire::attachments::{AttachKind, CreateAttachment};

/// `ramd attach --list`.
pub(crate) fn attach_list(c: &Client, json: bool) -> Result<(), CliError> {
    let l = c.attachments()?;
    if json {
        return print_json(&l);
    }
    if l.attachments.is_empty() {
        println!("no attachments");
        return Ok(());
    }
    let mut t = output::table(&["ID", "DRIVE", "MOUNTPOINT", "FILE", "PATH"], &[0]);
    for a in &l.attachments {
        let mountpoint = if a.mountpoint.is_empty() {
            "-".to_owned()
        } else {
            a.mountpoint.clone()
        };
        t.add_row(vec![
            a.id.to_string(),
            a.drive.clone(),
            mountpoint,
            a.file.clone(),
            format!("{} ({} queues)", a.path, a.queues),
        ]);
    }
    print!("{}", output::render(&t));
    Ok(())
}

/// `ramd attach NAME MOUNTPOINT`.
pub(crate) fn attach(
    c: &Client,
    drive: String,
    mountpoint: &std::path::Path,
    force: bool,
    json: bool,
) -> Result<(), CliError> {
    let mp = absolute(mountpoint)?;
    let a = c.attach(&CreateAttachment {
        drive,
        mountpoint: mp.display().to_string(),
        kind: AttachKind::Fuse,
        force,
    })?;
    if json {
        return print_json(&a);
    }
    println!(
        "attached {} as {} ({}, {} queues)",
        a.drive, a.file, a.path, a.queues
    );
    println!("next: dev=$(losetup -f --show --direct-io=on {})", a.file);
    println!("      mkfs.ext4 \"$dev\" && mkdir -p /mnt/data && mount \"$dev\" /mnt/data");
    println!(
        "undo: umount /mnt/data; losetup -d \"$dev\"; ramd detach {}",
        a.mountpoint
    );
    Ok(())
}

/// `ramd attach NAME --ublk`: prints the device path alone (for
/// `dev=$(ramd attach db --ublk)`), or the attachment as JSON.
pub(crate) fn attach_ublk(c: &Client, drive: String, json: bool) -> Result<(), CliError> {
    let a = c.attach(&CreateAttachment {
        drive,
        mountpoint: String::new(),
        kind: AttachKind::Ublk,
        force: false,
    })?;
    if json {
        return print_json(&a);
    }
    println!("{}", a.file);
    Ok(())
}

/// `ramd detach MOUNTPOINT` (FUSE), or `ramd detach NAME|/dev/ublkbN`
/// (ublk).
pub(crate) fn detach(
    c: &Client,
    mountpoint: &std::path::Path,
    force: bool,
    json: bool,
) -> Result<(), CliError> {
    let list = c.attachments()?;
    let arg = mountpoint.to_string_lossy();
    if let Some(a) = list
        .attachments
        .iter()
        .find(|a| a.kind == AttachKind::Ublk && (a.drive == arg || a.file == arg))
    {
        let a = c.detach_with(a.id, force)?;
        if json {
            return print_json(&a);
        }
        println!("detached {} from {}", a.drive, a.file);
        return Ok(());
    }
    let want = match std::fs::canonicalize(mountpoint) {
        Ok(p) => p,
        Err(_) => absolute(mountpoint)?,
    };
    let Some(a) = list
        .attachments
        .iter()
        .find(|a| std::path::Path::new(&a.mountpoint) == want)
    else {
        return Err(CliError::NotAttached(want));
    };
    let a = c.detach(a.id)?;
    if json {
        return print_json(&a);
    }
    println!("detached {} from {}", a.drive, a.mountpoint);
    Ok(())
}

//! Attachment commands: `ramd attach NAME MOUNTPOINT`, `ramd attach
//! --list`, `ramd detach MOUNTPOINT` (drives as FUSE files, mounted by the
//! daemon).
//!
//! Paths are made absolute here: the daemon has its own working directory.

use super::{absolute, output, print_json, CliError};
use crate::api::client::Client;
use crate::api::wire::attachments::CreateAttachment;

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
        t.add_row(vec![
            a.id.to_string(),
            a.drive.clone(),
            a.mountpoint.clone(),
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

/// `ramd detach MOUNTPOINT`.
pub(crate) fn detach(c: &Client, mountpoint: &std::path::Path, json: bool) -> Result<(), CliError> {
    let want = match std::fs::canonicalize(mountpoint) {
        Ok(p) => p,
        Err(_) => absolute(mountpoint)?,
    };
    let list = c.attachments()?;
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
